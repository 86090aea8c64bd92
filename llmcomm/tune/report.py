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


def label(r: pd.Series | Mapping[str, Any]) -> str:
    """A configuration in one short string: ``tp4·pp8·dp32·mb1·v6·sp·selective·dopt``."""
    return (f"tp{int(r['tp'])}·pp{int(r['pp'])}·dp{int(r['dp'])}·mb{int(r['micro_batch'])}·v{int(r['vpp'])}"
            f"{'·sp' if r['sp'] else ''}·{r['recompute']}{'·dopt' if r['distributed_optimizer'] else ''}")


def search_cost(exhaustive: Any, pruned: Any) -> pd.DataFrame:
    """Candidates enumerated, pruned (by rule), evaluated and wall time of two :class:`TuneResult` searches."""
    rows = []
    for name, r in (("exhaustive", exhaustive), ("pruned", pruned)):
        s = r.stats
        rows.append({"search": name, "enumerated": s["enumerated"], "evaluated": s["evaluated"],
                     "pruned": s["pruned"], **{f"pruned: {k}": v for k, v in s["pruned_by_rule"].items()},
                     "wall_s": s["wall_s"], "best_s": r.best["total_s"]})
    return pd.DataFrame(rows).fillna(0)
