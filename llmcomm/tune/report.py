"""Tables that explain a tuner's choice: the predicted breakdown of named configurations side by side, and how
the best configuration moves with the GPU count and the cluster."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..specs import Cluster, ModelSpec, ParallelConfig, load_cluster
from .search import tune


def breakdowns(model: ModelSpec, configs: Mapping[str, ParallelConfig], cluster: Cluster,
               **kw: Any) -> pd.DataFrame:
    """Tidy ``config, term, seconds, kind, share`` of :func:`llmcomm.overhead.iteration_time` for each named
    configuration (e.g. the tuner's top picks, the rule of thumb, a published configuration)."""
    from ..overhead.iteration import iteration_time

    parts = []
    for label, par in configs.items():
        c = cluster if cluster.num_gpus is not None else cluster.for_world(par.world_size)
        parts.append(iteration_time(model, par, c, **kw).to_frame().assign(config=label))
    return pd.concat(parts, ignore_index=True)[["config", "term", "seconds", "kind", "share"]]


def best_by_scale(model: ModelSpec, gpus: Sequence[int], clusters: Sequence[str | Cluster], global_batch: int,
                  **kw: Any) -> pd.DataFrame:
    """The tuner's best configuration for each GPU count on each cluster: ``cluster, gpus, config, total_s,
    tflops_per_gpu, comm_overhead`` and the configuration's dimensions."""
    rows = []
    for c in clusters:
        cluster = load_cluster(c) if isinstance(c, str) else c
        for n in gpus:
            r = tune(model, n, cluster, global_batch, **kw)
            b = r.best
            rows.append({"cluster": cluster.name, "gpus": n, "config": label(b), "total_s": b["total_s"],
                         "tflops_per_gpu": b["tflops_per_gpu"], "comm_overhead": b["comm_overhead"],
                         **{k: b[k] for k in ("tp", "pp", "dp", "micro_batch", "vpp", "sp", "recompute",
                                              "distributed_optimizer")}})
    return pd.DataFrame(rows)


def _modules(r: pd.Series | Mapping[str, Any]) -> str:
    """``(layernorm+moe_act)``: a selective row's ``--recompute-modules`` other than Megatron-LM's default."""
    m = r.get("recompute_modules") if hasattr(r, "get") else None
    return f"({'+'.join(m)})" if isinstance(m, (tuple, list)) else ""


def label(r: pd.Series | Mapping[str, Any]) -> str:
    """A configuration in one short string: ``tp4·pp8·dp32·mb1·v6·sp·selective·dopt``; a context-parallel
    size, an expert-parallel size (``·ep32``, MoE), the selective modules other than Megatron's default
    (``·selective(moe_act+layernorm)``), uneven end stages (``·first7·last7``), an expert TP other
    than tp, FSDP, an unfused attention backend, FP8 (``·fp8-hybrid``, ``·fpg`` its parameter gather) and the
    overlap flags (``·tpo`` tp_comm_overlap, ``·ogr`` overlap_grad_reduce, ``·opg`` overlap_param_gather) are
    added where present."""
    from ..vocab import FUSED_ATTENTION_BACKENDS

    def opt(k: str) -> int:
        v = r.get(k, -1) if hasattr(r, "get") else -1
        return -1 if v is None or pd.isna(v) else int(v)

    cp = opt("cp")
    ends = "".join(f"·{n}{opt(k)}" for n, k in (("first", "num_layers_in_first_pipeline_stage"),
                                                ("last", "num_layers_in_last_pipeline_stage")) if opt(k) >= 0)
    ab = r.get("attention_backend", "auto") if hasattr(r, "get") else "auto"
    ct = r.get("cp_comm_type", "p2p") if hasattr(r, "get") else "p2p"
    return (f"tp{int(r['tp'])}{f'·cp{cp}' if cp > 1 else ''}{f'({ct})' if cp > 1 and ct != 'p2p' else ''}"
            f"·pp{int(r['pp'])}·dp{int(r['dp'])}"
            f"{f'·ep{ep}' if (ep := opt('ep')) > 1 else ''}"
            f"{f'·etp{et}' if (et := opt('etp')) >= 0 else ''}"
            f"·mb{int(r['micro_batch'])}·v{int(r['vpp'])}{ends}"
            f"{'·sp' if r['sp'] else ''}·{r['recompute']}{_modules(r)}{'·dopt' if r['distributed_optimizer'] else ''}"
            f"{'·fsdp' if r.get('fsdp', False) else ''}"
            f"{'' if ab in FUSED_ATTENTION_BACKENDS else f'·{ab}'}"
            f"{f'·fp8-{f8}' if (f8 := r.get('fp8')) is not None and not pd.isna(f8) else ''}"
            + "".join(f"·{short}" for short, k in (("fpg", "fp8_param_gather"), ("tpo", "tp_comm_overlap"),
                                                  ("ogr", "overlap_grad_reduce"), ("opg", "overlap_param_gather"),
                                                  ("p2p", "overlap_p2p_comm"), ("a2a", "moe_a2a_overlap"))
                      if bool(r.get(k, False))))


# the Breakdown terms of llmcomm.overhead.iteration_times, with the dimensions that move each (for --explain)
TERMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "forward_s": ("forward compute", ("tp", "cp", "pp", "micro_batch", "attention_backend", "fp8",
                                      "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")),
    "backward_s": ("backward compute", ("tp", "cp", "pp", "micro_batch", "attention_backend", "fp8",
                                        "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")),
    "recompute_s": ("recomputation", ("recompute", "tp", "pp", "micro_batch")),
    "tp_comm_s": ("tensor-parallel communication", ("tp", "sp", "micro_batch", "recompute", "pp",
                                                    "tp_comm_overlap")),
    "ep_comm_s": ("expert-parallel all-to-all", ("ep", "etp", "tp", "micro_batch")),
    "pp_comm_s": ("pipeline send/recv", ("pp", "vpp", "micro_batch", "sp", "tp")),
    "bubble_s": ("pipeline bubble", ("pp", "vpp", "micro_batch", "num_layers_in_first_pipeline_stage",
                                     "num_layers_in_last_pipeline_stage")),
    "dp_comm_s": ("data-parallel gradient reduction", ("dp", "cp", "tp", "pp", "distributed_optimizer", "fsdp",
                                                       "overlap_grad_reduce", "overlap_param_gather",
                                                       "fp8_param_gather")),
    "optimizer_s": ("optimizer step", ("distributed_optimizer", "fsdp", "dp", "tp", "pp")),
    "cp_comm_s": ("context-parallel KV exchange", ("cp", "cp_comm_type", "tp", "micro_batch", "recompute")),
}


def explain(best: pd.Series, other: pd.Series, n: int = 3) -> list[str]:
    """Why ``other`` is slower than ``best``, one sentence per term of the predicted breakdown, the ``n`` terms
    whose seconds differ most first, each naming the dimensions (of those that move that term) in which the two
    configurations differ."""
    diffs = sorted(((float(other[t]) - float(best[t]), t) for t in TERMS if t in best and t in other),
                   key=lambda x: -abs(x[0]))
    out = []
    for d, t in diffs[:n]:
        if d == 0:
            break
        what, dims = TERMS[t]
        moved = [f"{k} {_v(other[k])} vs {_v(best[k])}" for k in dims if k in best and best[k] != other[k]]
        why = f" ({', '.join(moved)})" if moved else " (same values of the dimensions that move it)"
        verb = "loses" if d > 0 else "gains"
        out.append(f"{what}: the runner-up {verb} {abs(d):.3f} s predicted ({float(other[t]):.3f} s against "
                   f"{float(best[t]):.3f} s){why}.")
    gap = float(other["total_s"]) - float(best["total_s"])
    out.append(f"In all the runner-up is {gap:.3f} s ({gap / float(best['total_s']):.1%}) slower per iteration, "
               "predicted.")
    return out


def _v(x: Any) -> str:
    return "unset" if isinstance(x, (int, float)) and not isinstance(x, bool) and x == -1 else str(x)


def search_cost(exhaustive: Any, pruned: Any) -> pd.DataFrame:
    """Candidates enumerated, pruned (by rule), evaluated and wall time of two :class:`TuneResult` searches."""
    rows = []
    for name, r in (("exhaustive", exhaustive), ("pruned", pruned)):
        s = r.stats
        rows.append({"search": name, "enumerated": s["enumerated"], "evaluated": s["evaluated"],
                     "pruned": s["pruned"], **{f"pruned: {k}": v for k, v in s["pruned_by_rule"].items()},
                     "wall_s": s["wall_s"], "best_s": r.best["total_s"]})
    return pd.DataFrame(rows).fillna(0)
