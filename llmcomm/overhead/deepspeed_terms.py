"""What Megatron-DeepSpeed's DeepSpeed engine (2022, the code vTrain measured) does per iteration beyond what the
formulation times, and what adding it does to the single-node fit and to the vTrain multi-node validation.

A diagnostic, not part of the formulation: :func:`whatif` adds the bytes below to each prepared row's
per-iteration HBM work (the optimizer term's ``bytes / HBM bandwidth`` of :func:`llmcomm.overhead.iteration.combine`,
which is where per-iteration element-wise work lives), refits the utilization model on the 1,440 single-node
runs (:func:`llmcomm.overhead.calibrate.fit`, the shipped method; nothing is fitted on the multi-node rows) and
reports the in-sample and leave-one-shape-out single-node errors and the multi-node MAPE and Spearman per model
group, before and after. Regenerate the numbers with ``python -m llmcomm.overhead.deepspeed_terms``.

Mechanisms (``P`` = parameters on the GPU of the stage holding the most, ``m`` = micro-batches per iteration)::

    gradient accumulation   6·P·(m − 1) bytes    (grad_accumulation_bytes)
    buffered all-reduce     12·P bytes, dp > 1   (allreduce_copy_bytes)

* **Gradient accumulation without fusion.** Megatron-DeepSpeed at 54f1cb7c (2022-09-27, microsoft/
  Megatron-DeepSpeed) has no ``--gradient-accumulation-fusion`` (``megatron/arguments.py`` does not define it; it
  arrived in Megatron-LM with the ``main_grad`` buffers DeepSpeed's engine does not use), so the weight gradient
  of every micro-batch after the first is a separate tensor that PyTorch's ``AccumulateGrad`` adds into the fp16
  ``param.grad``: read 2 + read 2 + write 2 bytes per parameter. Megatron-LM with
  ``gradient_accumulation_fusion`` (the NeMo rows) accumulates inside the wgrad GEMM and pays none of it.
* **DeepSpeed's buffered all-reduce.** The PipelineEngine's ``ReduceGrads`` instruction
  (``deepspeed/runtime/pipe/engine.py`` ``_exec_reduce_grads``: guarded by ``is_data_parallel`` in early
  releases, by ``pipeline_enable_backward_allreduce`` in later ones, which run it at dp = 1 too; counted here
  for dp > 1 only) calls ``DeepSpeedEngine.buffered_allreduce_fallback`` (``deepspeed/runtime/engine.py``,
  buckets of ``MEMORY_OPT_ALLREDUCE_SIZE = 500000000`` elements): ``allreduce_bucket`` flattens the bucket into
  a new buffer (read 2 + write 2), divides it by the DP size before the all-reduce (``postscale_gradients`` off
  by default: read 2 + write 2), and ``allreduce_and_copy`` copies the result back into each gradient
  (read 2 + write 2): 12 bytes per parameter. Megatron-LM's DDP all-reduces its contiguous grad buffer in place.

Checked and not missing: DeepSpeed's ``TrainSchedule`` (even stages forward on even steps, odd stages on odd
steps, each send issued at the start of the next step) simulated with blocking rendezvous sends gives exactly
1F1B's ``(m + p − 1)·(F + B)`` with free transfers and about ``4τ`` more per step with transfers of ``τ`` on a
middle stage, which the formulation's send + receive per direction already charges; the tied-embedding
gradient all-reduce, the fp16 found-inf and gradient-norm reductions and the Adam pass (40 bytes per parameter)
are in :mod:`llmcomm.overhead.iteration` already.

Both are real and both are small (about 1 % of a vTrain iteration: :func:`mechanism_seconds`). Neither can
produce the multi-node rows' TP-2/TP-4 excess: :func:`same_shard_rows` lists the 39.1B rows at the same DP size,
micro-batch and ``tp·pp`` (hence the same ``P`` and ``m``, so the same seconds of every mechanism above, of the
optimizer step, of the gradient-norm and loss-scale passes and of the DP all-reduce bytes), whose measured excess
over the prediction still spreads from under 1 s (TP 1, TP 8) to 4.6–8.8 s (TP 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import numpy as np
import pandas as pd

from ..specs import load_cluster
from . import calibrate as C
from . import iteration as it
from . import measured
from . import utilization as U

GRAD_ACCUMULATION_BYTES = 6  # per parameter per micro-batch after the first: read grad, read new, write grad (fp16)
ALLREDUCE_COPY_BYTES = 12    # per parameter per iteration: flatten (2+2), pre-divide (2+2), copy back (2+2)


def grad_accumulation_bytes(params: Any, microbatches: Any,
                            per_param: float = GRAD_ACCUMULATION_BYTES) -> np.ndarray:
    """HBM bytes per iteration of accumulating fp16 gradients outside the wgrad GEMM:
    ``per_param · P · (m − 1)`` (module docstring; the first micro-batch writes ``param.grad`` directly)."""
    p = np.asarray(params, dtype=np.float64)
    m = np.asarray(microbatches, dtype=np.float64)
    return per_param * p * np.maximum(m - 1.0, 0.0)


def allreduce_copy_bytes(params: Any, dp: Any, per_param: float = ALLREDUCE_COPY_BYTES) -> np.ndarray:
    """HBM bytes per iteration of DeepSpeed's ``buffered_allreduce_fallback`` around the DP all-reduce:
    ``per_param · P`` where ``dp > 1``, else 0 (module docstring)."""
    p = np.asarray(params, dtype=np.float64)
    return per_param * p * (np.asarray(dp) > 1)


def stage_params(st: it.Stages) -> np.ndarray:
    """Parameters on the GPU of the stage holding the most: what :func:`llmcomm.overhead.iteration.stages` times
    the optimizer with (``optimizer_bytes = ADAM_BYTES_PER_PARAM · P / shard``; vTrain's runs do not shard)."""
    return st.optimizer_bytes / it.ADAM_BYTES_PER_PARAM


def extra_bytes(st: it.Stages, dp: np.ndarray, per_microbatch: float, per_iteration: float) -> np.ndarray:
    """The mechanisms' bytes per iteration of prepared stages ``st`` (rows with DP sizes ``dp``)."""
    p = stage_params(st)
    return grad_accumulation_bytes(p, st.m, per_microbatch) + allreduce_copy_bytes(p, dp, per_iteration)


def with_extra_bytes(prep: C.Prepared, per_microbatch: float = GRAD_ACCUMULATION_BYTES,
                     per_iteration: float = ALLREDUCE_COPY_BYTES) -> C.Prepared:
    """``prep`` with :func:`extra_bytes` added to every row's per-iteration HBM work (its optimizer bytes)."""
    dp = prep.rows["dp"].to_numpy()
    out = [(idx, dataclasses.replace(st, optimizer_bytes=st.optimizer_bytes
                                     + extra_bytes(st, dp[idx], per_microbatch, per_iteration)))
           for idx, st in prep.stages]
    return C.Prepared(prep.rows, out)


def mechanism_seconds(prep: C.Prepared, per_microbatch: float = GRAD_ACCUMULATION_BYTES,
                      per_iteration: float = ALLREDUCE_COPY_BYTES) -> pd.DataFrame:
    """Per prepared row the seconds of each mechanism at the cluster's HBM bandwidth (``grad_accumulation_s``,
    ``allreduce_copy_s``) and their share of the measured time (``share``)."""
    ga = np.zeros(len(prep.rows))
    ar = np.zeros(len(prep.rows))
    dp = prep.rows["dp"].to_numpy()
    for idx, st in prep.stages:
        p = stage_params(st)
        ga[idx] = grad_accumulation_bytes(p, st.m, per_microbatch) / st.hbm
        ar[idx] = allreduce_copy_bytes(p, dp[idx], per_iteration) / st.hbm
    out = prep.rows.copy()
    out["grad_accumulation_s"], out["allreduce_copy_s"] = ga, ar
    out["share"] = (ga + ar) / out["time_s"]
    return out


def _multi_errors(prep: C.Prepared, util: U.Utilization) -> dict[str, Any]:
    from scipy.stats import spearmanr

    r = prep.rows.assign(predicted_s=C.predict(prep, util))
    r["ape"] = (r["predicted_s"] - r["time_s"]).abs() / r["time_s"]
    groups = {str(g): {"rows": int(len(d)), "mape": float(d["ape"].mean()),
                       "spearman": float(spearmanr(d["predicted_s"], d["time_s"]).statistic)}
              for g, d in r.groupby("group", sort=False)}
    return {"mape": float(r["ape"].mean()), "groups": groups,
            "min_group_spearman": min(g["spearman"] for g in groups.values())}


def evaluate(single: C.Prepared, multi: C.Prepared, cv: bool = True) -> dict[str, Any]:
    """Fit on ``single`` (the shipped method), then its in-sample and (with ``cv``) leave-one-shape-out errors,
    the coefficients with their status (``at bound`` where the fit fixed one at its physical bound) and the
    multi-node errors of ``multi`` under that fit."""
    util, _ = C.fit(single)
    out: dict[str, Any] = {"theta": dict(zip(U.FEATURES, util.coef, strict=True)),
                           "at_bound": [f for f, c in zip(U.FEATURES, util.coef, strict=True)
                                        if c == C.LOWER.get(f, 0.0)],
                           "single_in_sample": C.errors(C.predict(single, util), single.rows["time_s"].to_numpy()),
                           "multi": _multi_errors(multi, util), "utilization": util}
    if cv:
        folds = C.cross_validate(single)
        out["single_leave_one_shape_out_mape"] = float((folds["mape"] * folds["rows"]).sum() / folds["rows"].sum())
    return out


def result_row(e: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One what-if table row of :func:`evaluate`'s result ``e``: the refit's θ (``theta_<feature>``), the
    coefficients on their bound, single-node in-sample and leave-one-shape-out MAPE (NaN without ``cv``), ``extra``
    columns, multi-node MAPE and minimum group Spearman, then per group ``mape_<group>``, ``spearman_<group>``."""
    row: dict[str, Any] = {**{f"theta_{k}": v for k, v in e["theta"].items()}, "at_bound": ",".join(e["at_bound"]),
                           "single_mape": e["single_in_sample"]["mape"],
                           "single_loso_mape": e.get("single_leave_one_shape_out_mape", np.nan), **extra,
                           "multi_mape": e["multi"]["mape"], "multi_min_spearman": e["multi"]["min_group_spearman"]}
    for g, d in e["multi"]["groups"].items():
        row[f"mape_{g}"], row[f"spearman_{g}"] = d["mape"], d["spearman"]
    return row


def prepared() -> tuple[C.Prepared, C.Prepared]:
    """The single- and multi-node rows prepared with the shipped bandwidth model (:func:`calibrate.prepare`)."""
    cluster = load_cluster(C.CLUSTER)
    bw, _ = it._resolve(cluster, None, U.Utilization(coef=C.START))
    return (C.prepare(measured.read("single"), cluster, bw), C.prepare(measured.read("multi"), cluster, bw))


def whatif(cases: tuple[tuple[float, float], ...] = ((0.0, 0.0), (GRAD_ACCUMULATION_BYTES, 0.0),
                                                     (0.0, ALLREDUCE_COPY_BYTES),
                                                     (GRAD_ACCUMULATION_BYTES, ALLREDUCE_COPY_BYTES)),
           cv: bool = True) -> pd.DataFrame:
    """One row per ``(bytes per parameter per micro-batch, bytes per parameter per iteration)`` case: the refit's
    θ, which coefficients sit at their bound, single-node in-sample and leave-one-shape-out MAPE, multi-node
    MAPE, per-group MAPE and Spearman. ``(0, 0)`` is the shipped formulation."""
    single, multi = prepared()
    rows = []
    for per_mb, per_it in cases:
        e = evaluate(with_extra_bytes(single, per_mb, per_it), with_extra_bytes(multi, per_mb, per_it), cv)
        rows.append({"per_microbatch": per_mb, "per_iteration": per_it, **result_row(e)})
    return pd.DataFrame(rows)


def same_shard_rows(pred: pd.DataFrame) -> pd.DataFrame:
    """Rows of one model group that share DP size, micro-batch and ``tp·pp`` (so parameters per GPU and micro-batch
    count) but differ in TP, with ``excess_s = measured − predicted``: what any mechanism that depends only on
    ``P``, ``m``, ``b`` and ``dp`` cannot tell apart. ``pred``: :func:`llmcomm.overhead.validation.validate`'s
    table."""
    p = pred.assign(mp=pred["tp"] * pred["pp"], excess_s=pred["time_s"] - pred["predicted_s"])
    keys = ["group", "dp", "mp", "micro_batch"]
    n_tp = p.groupby(keys)["tp"].transform("nunique")
    cols = [*keys, "tp", "pp", "time_s", "predicted_s", "excess_s"]
    return p.loc[n_tp > 1, cols].sort_values([*keys, "tp"]).reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-cv", action="store_true", help="skip the leave-one-shape-out refits")
    args = ap.parse_args(argv)
    from .validation import validate

    with pd.option_context("display.width", 200, "display.max_columns", 40):
        print(whatif(cv=not args.no_cv).T.to_string())
        print(same_shard_rows(validate("vtrain-multi")[0]).round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
