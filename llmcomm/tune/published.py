"""F7 on today's recipes: the tuner's pick against NVIDIA's published DGX-H100 configurations.

For every row of the NeMo / Megatron-Bridge DGX-H100 tables (:mod:`llmcomm.overhead.nemo_rows`) whose model is
in the catalogue, :func:`recipe_table` runs the tuner at the row's GPU count, global batch, sequence length and
precision (a BF16 row: BF16 only; an FP8 row: FP8 only, ``hybrid`` — the tuner may not buy speed by changing the
numerics; a row of unstated precision: both), and sets its pick beside the published configuration::

    predicted speed-up = predicted(published configuration) / predicted(tuner's pick)       (both predicted)
    its range          = [lo(published) / hi(pick), hi(published) / lo(pick)]

with ``lo``/``hi`` the cost model's 90 % prediction interval (:mod:`llmcomm.overhead.interval`: the relative
residuals of its single-node calibration, applied to each prediction; the range assumes nothing about how the two
errors correlate, so it is the widest the interval allows). The published configuration is predicted by
:func:`llmcomm.overhead.validation.predict_nemo` — the one mapping of a published row onto the formulation; where
the formulation refuses it (a setting it does not model yet: context parallelism, FSDP, a flex dispatcher, ...)
the row says which, and there is no predicted speed-up. ``measured_over_pick`` = measured(published) /
predicted(pick) is also given: it mixes a measurement with a prediction (the formulation was fitted on neither,
:func:`llmcomm.overhead.validation.summary_nemo` reports its error on these rows), so it is labelled as such.

:func:`recipe_regret` is the measured check: where one table lists several configurations of one model at the
same GPUs, batch, sequence and precision (Qwen3-30B-A3B at pp1·ep16 and at pp2·vp12·ep8), the tuner ranks the
measured configurations by predicted time and its regret is ``measured(first by prediction) / measured(best) −
1``. Settings the formulation does not model are relaxed there (timed as if off, named in ``relaxed``) — the
ranking needs every configuration of the group predicted.

Where the tuner's pick is predicted *slower* than the published configuration, the published configuration is not
among the tuner's candidates; ``published_outside_space`` (:func:`outside_space`) says which bound or setting of
the space leaves it out (the memory budget, ``max_vpp``, the FP8 recipe, EP beyond DP without expert folding...),
so a loss is explained by the space, not left unexplained (a ``""`` there with a loss would be a tuner bug,
which notebook 08 checks).

Nothing here is fitted; the NeMo rows entered no fit (``summary_nemo``: ``fitted_on_these_rows: False``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..specs import load_cluster, load_model
from .report import label
from .search import tune
from .space import SearchSpace

CONFIG = ("tp", "pp", "cp", "vp", "ep", "mbs", "fsdp")  # the table's columns that make a configuration
# settings the formulation does not model that keep a group's configurations from being ranked (relaxed there);
# not recompute_modules: the formulation times every set but mla_up_proj, and the space holds the sets (issue 21)
RELAX = ("moe_flex_dispatcher_backend", "moe_a2a_overlap", "recompute_num_layers",
         "recompute_method", "moe_router_load_balancing_type", "overlap_p2p_comm", "first_last_layers_bf16",
         "cuda_graph_impl", "moe_router_dtype", "moe_shared_expert_overlap", "moe_permute_fusion",
         "moe_token_dispatcher_type")


def _fp8_values(precision: Any) -> tuple[str | None, ...] | None:
    """The tuner's FP8 values for a row's stated precision: BF16 only, FP8 (``hybrid``) only, or both (unstated)."""
    p = str(precision).upper() if isinstance(precision, str) else ""
    if p.startswith("BF16"):
        return (None,)
    if p.startswith("FP8"):
        return ("hybrid",)
    return None


def _published(relax: tuple[str, ...] = ()) -> pd.DataFrame:
    from ..overhead import nemo_rows, validation

    return validation.predict_nemo(nemo_rows.read(), relax=relax)


def recipe_table(rows: pd.DataFrame | None = None, **tune_kw: Any) -> pd.DataFrame:
    """One row per published DGX-H100 row with a catalogue model (module docstring): the published
    configuration, its measured and predicted time (or why it is refused), the tuner's pick with its predicted
    time and interval, the predicted speed-up and its range. ``rows``: a subset of
    :func:`llmcomm.overhead.validation.predict_nemo`'s table (default: all of them)."""
    from ..overhead import nemo_rows

    pub = _published() if rows is None else rows
    cluster = load_cluster(nemo_rows.CLUSTER)
    picks: dict[tuple[Any, ...], Any] = {}
    out = []
    for _, r in pub.iterrows():
        name = r["model_name"]
        if not name:
            continue
        key = (name, int(r["num_gpus"]), int(r["gbs"]), int(r["seq_len"]), _fp8_values(r["precision"]))
        if key not in picks:
            try:
                res = tune(load_model(name), key[1], cluster, key[2], key[3], space=SearchSpace(fp8=key[4]),
                           **tune_kw)
                picks[key] = res
            except Exception as e:  # a ConfigError (does not fit, no split): said in the row
                from ..errors import ConfigError

                if not isinstance(e, ConfigError):
                    raise
                picks[key] = str(e)
        res = picks[key]
        row: dict[str, Any] = {
            "container": r["container"], "model": name, "precision": r["precision"], "gpus": key[1],
            "global_batch": key[2], "seq_len": key[3],
            "published": _published_label(r), "published_measured_s": float(r["time_s"]),
            "published_pred_s": r["predicted_s"], "published_lo_s": r.get("total_s_lo", np.nan),
            "published_hi_s": r.get("total_s_hi", np.nan), "published_refused": r["refused"]}
        if r["refused"] == "" and isinstance(r.get("columns"), str) and r["columns"]:
            import ast

            cand = ast.literal_eval(r["columns"])  # predict_nemo's repr of the candidate row it timed
            row["published_outside_space"] = outside_space(
                load_model(name), cand, SearchSpace(fp8=key[4]), cluster, tune_kw.get("memory_fraction", 0.9))
        else:
            row["published_outside_space"] = ""
        if isinstance(res, str):
            row.update(tuner="", tuner_refused=res)
        else:
            b = res.best
            row.update(tuner=label(b), tuner_fp8=b["fp8"] or "bf16", tuner_pred_s=float(b["total_s"]),
                       tuner_lo_s=float(b.get("total_s_lo", np.nan)), tuner_hi_s=float(b.get("total_s_hi", np.nan)),
                       tuner_refused="", evaluated=res.stats["evaluated"], enumerated=res.stats["enumerated"],
                       tune_wall_s=res.stats["wall_s"])
        out.append(row)
    t = pd.DataFrame(out)
    for c in ("tuner_pred_s", "tuner_lo_s", "tuner_hi_s"):
        if c not in t:
            t[c] = np.nan
    t["predicted_speedup"] = t["published_pred_s"] / t["tuner_pred_s"]
    t["predicted_speedup_lo"] = t["published_lo_s"] / t["tuner_hi_s"]
    t["predicted_speedup_hi"] = t["published_hi_s"] / t["tuner_lo_s"]
    t["measured_over_pick"] = t["published_measured_s"] / t["tuner_pred_s"]
    return t


def outside_space(model: Any, cand: dict[str, Any], space: SearchSpace, cluster: Any,
                  memory_fraction: float = 0.9) -> str:
    """Why the published configuration ``cand`` (a candidate row as :func:`~llmcomm.overhead.validation.
    predict_nemo` times it, its ``columns``) is not among the candidates of the tuner's ``space`` on ``cluster``
    (``""``: nothing found; the space's rules themselves are :func:`~llmcomm.tune.space.refusals`' to name):

    * its memory (:func:`llmcomm.overhead.memory.memory_table`) above ``memory_fraction`` of the GPU's (the
      tuner's budget, ``tune(memory_fraction=)``);
    * a size above the space's bound (``max_vpp``, ``max_micro_batch``, ``max_cp``);
    * a MoE model's EP not dividing DP where the space has no explicit ``etp`` (MoE parallel folding,
      :func:`~llmcomm.tune.space.expert_shapes`);
    * a categorical dimension of the space (:data:`~llmcomm.tune.space.DIMENSIONS`) at a value the space does not
      hold (``overlap_p2p_comm`` on, where the default space keeps it off; a selective ``recompute_modules`` set
      outside the space's sets on the model, :func:`~llmcomm.tune.space.module_sets`);
    * any other :class:`~llmcomm.specs.ParallelConfig` field away from its default, which every row of the space
      keeps (``fp8_recipe=tensorwise``, ``create_attention_mask_in_dataloader=False``...), except Megatron's
      ``account_for_embedding/loss_in_pipeline_split`` at ``vpp = 1``, which the space holds as an uneven split
      (:mod:`llmcomm.tune.space`)."""
    import dataclasses

    from ..overhead.memory import memory_table
    from ..specs import ParallelConfig
    from .space import DIMENSIONS, SHAPE_COLUMNS, module_set, module_sets

    why = []
    mem = float(memory_table(model, pd.DataFrame([cand]))["total_bytes"].iloc[0])
    budget = memory_fraction * cluster.gpu_memory_bytes
    if mem > budget:
        why.append(f"memory {mem / 1e9:.1f} GB above the tuner's budget {budget / 1e9:.1f} GB "
                   f"({memory_fraction:.0%} of {cluster.gpu_memory_bytes / 1e9:.0f} GB)")
    for dim, bound in (("vpp", "max_vpp"), ("micro_batch", "max_micro_batch"), ("cp", "max_cp")):
        v, limit = int(cand.get(dim, 1)), int(getattr(space, bound))
        if v > limit:
            why.append(f"{dim} {v} above the space's {bound}={limit}")
    ep, dp = int(cand.get("ep", 1)), int(cand.get("dp", 1))
    if getattr(model, "is_moe", False) and space.etp is None and dp % ep:
        why.append(f"ep {ep} does not divide dp {dp}: EP over tp·cp·dp (MoE parallel folding) is in the space "
                   "only with an explicit etp (SearchSpace(etp=...), --constraints etp=1/2)")
    defaults = {f.name: f.default for f in dataclasses.fields(ParallelConfig)}
    derived = {"dp", "global_batch", "seq_len", "schedule"}  # set by the GPU count, the job and vpp
    for k, v in cand.items():
        if k in derived or k in SHAPE_COLUMNS or k not in defaults:
            continue  # the shape dimensions are the bounds' above
        if k == "recompute_modules":
            sets = module_sets(model, space)
            if cand.get("recompute") == "selective" and module_set(v) not in sets:
                shown = "/".join("default" if x is None else "+".join(x) for x in sets)
                why.append(f"recompute_modules={'+'.join(v)} (the space's module sets on {model.name}: {shown})")
        elif k in DIMENSIONS:
            held = getattr(space, k, None)
            if held is not None and v is not None and v not in held:  # None: unset (cp_comm_type at cp 1)
                why.append(f"{k}={v} (the space's {k}: {'/'.join(map(str, held))})")
        elif k.startswith("account_for_") and int(cand.get("vpp", 1)) == 1:
            continue
        elif v != defaults[k] and not (v in ((), None) and defaults[k] in ((), None)):
            why.append(f"{k}={v} (every row of the space keeps the default, {defaults[k]})")
    return "; ".join(why)


def _published_label(r: pd.Series) -> str:
    parts = [f"tp{int(r['tp'])}"] + [f"cp{int(r['cp'])}"] * (int(r["cp"]) > 1) + [f"pp{int(r['pp'])}"]
    parts += [f"v{int(r['vp'])}"] * (int(r["vp"]) > 1) + [f"ep{int(r['ep'])}"] * (int(r["ep"]) > 1)
    parts += [f"mb{int(r['mbs'])}"] + ["fsdp"] * (int(r["fsdp"]) > 0)
    return "·".join(parts)


def recipe_regret(relax: tuple[str, ...] = RELAX) -> pd.DataFrame:
    """Per group of published rows of one model, GPU count, batch, sequence and precision that holds more than one
    configuration (across the tables' releases: Qwen3-30B-A3B ran pp1·ep16 in 26.04–26.06 and pp2·vp12·ep8 in
    26.02): each configuration's measured time (the median over the releases that list it, ``containers``
    naming them — software differs between releases, so part of a difference is not the configuration's), the
    tuner's ranking by predicted time and its measured regret (module docstring; ``regret_fastest`` the same on
    each configuration's fastest release). Where fewer than two of the
    group's configurations can be predicted the row says what refuses them (``refused``) and has no regret."""
    pub = _published(relax)
    pub = pub[pub["model_name"] != ""].copy()
    pub["config"] = [_published_label(r) for _, r in pub.iterrows()]
    keys = ["model_name", "num_gpus", "gbs", "seq_len", "precision"]
    rows = []
    for k, g in pub.groupby(keys, dropna=False, sort=False):
        if g["config"].nunique() < 2:
            continue
        per = g.groupby("config", sort=False).agg(measured_s=("time_s", "median"), fastest_s=("time_s", "min"),
                                                   predicted_s=("predicted_s", "first"),
                                                   containers=("container", lambda c: ", ".join(map(str, c))),
                                                   refused=("refused", "first"))
        ok = per[per["predicted_s"].notna()]
        rec: dict[str, Any] = dict(zip(keys, k, strict=True))
        rec.update(configs=len(per), predicted=len(ok), relaxed="; ".join(sorted(set(g["relaxed"]) - {""})),
                   measured=", ".join(f"{c} {v:.2f} s ({per.loc[c, 'containers']})"
                                      for c, v in per["measured_s"].items()))
        if len(ok) < 2:
            rec.update(refused=" | ".join(f"{c}: {m}" for c, m in per.loc[per["predicted_s"].isna(), "refused"].items()))
            rows.append(rec)
            continue
        best, pick = ok["measured_s"].idxmin(), ok["predicted_s"].idxmin()
        rec.update(best=best, best_measured_s=float(ok.loc[best, "measured_s"]), pick=pick,
                   pick_measured_s=float(ok.loc[pick, "measured_s"]),
                   regret=float(ok.loc[pick, "measured_s"] / ok.loc[best, "measured_s"] - 1),
                   # the same on each configuration's fastest release (another view of the releases' spread)
                   regret_fastest=float(ok.loc[pick, "fastest_s"] / ok["fastest_s"].min() - 1),
                   ranking=" < ".join(ok.sort_values("predicted_s").index), refused="")
        rows.append(rec)
    return pd.DataFrame(rows)


__all__ = ["recipe_regret", "recipe_table"]
