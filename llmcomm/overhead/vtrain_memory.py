"""What the vTrain multi-node runs' memory says about the hardware and the optimizer they ran, and what each
reading does to the single-node fit and the multi-node validation: a tested diagnostic, not part of the
formulation (nothing here changes a shipped prediction; nothing is fitted on the multi-node rows).

**The question.** Under the kit's memory model (:func:`llmcomm.overhead.memory.memory_table`: Megatron's mixed
precision, 16 bytes per parameter without sharding, full-recompute activations of the micro-batches in flight)
43 of the 109 multi-node rows need more than the 40 GB the ``vtrain-a100`` cluster file assumes (its comment:
"vTrain states 'A100'; the 40 GB SXM4 part is assumed"). Either the parts were 80 GB, or the runs sharded the
optimizer (DeepSpeed ZeRO stage 1, the only stage DeepSpeed's PipelineEngine accepts), or partitioned the
checkpointed activations (DeepSpeed's ``partition_activations``), or the memory model overstates.

**What vTrain's public repository states** (github VIA-Research/vTrain at f8dda84, the release; no launch
script, no DeepSpeed JSON, no hostfile is published, and the paper's text could not be reached from here):

* ``data/README.md`` line 3: the data were collected with Megatron-DeepSpeed (nothing more).
* ``config/validation/multi/config_val_39B_2_16_16_2.json`` (every multi-node config alike): ``"gpu_name":
  "A100"``, ``"use_checkpoint": true``, ``"use_gradient_bucket": false``, ``"pipeline_scheduling": "1f1b"``,
  ``"inter_node_bandwidth": 800`` (Gb/s), ``"intra_node_bandwidth": 150`` (GB/s), ``"node_size": 8``: no memory
  size, no ZeRO stage, no optimizer setting.
* Its simulator of the same runs, ``src/predictor.py`` (``create_layer_graph``): the DP gradient all-reduce is one
  all-reduce of the stage's *whole* parameter bytes per pipeline rank (lines 283-303: ``param_size_by_rank``,
  ``CommNode(param_size_by_rank[rank])``, ``2(dp−1)/dp`` of it at the inter-node bandwidth for ``tp ≥ 8``), and
  the optimizer step is every layer's full weight update on every GPU (lines 305-316, ``ingredients["wu"]``,
  profiled from ``src/trainer.py`` lines 67-70 and 113-120: ``FusedAdam`` over all parameters, no partition).
  That is plain data parallelism with an unsharded Adam, not ZeRO-1 (which would all-gather updated
  parameters and update ``1/dp`` of them). vTrain models what it measured with this and reports 14.73 % MAPE.

**What the memory says** (:func:`memory_readings`, GB per GPU of the stage holding most):

* Without sharding the largest row needs 67.3 GB (175B, tp 4, pp 16, dp 8, micro-batch 4): every row fits an
  80 GB part, 43 do not fit 40 GB. The 3.6B tp-1, pp-1, dp-64 rows hold 57 GB of model states alone
  (3.56·10⁹ parameters × 16 B): on 40 GB parts they could only have run sharded.
* With ZeRO-1 (optimizer states ``12·P/dp``) 5 rows still need more than 40 GB (at most 47.7 GB), all through
  activations (39.1B tp 8, pp 16, micro-batch 24: 45 GB of checkpointed layer inputs alone, 16 micro-batches × 3
  layers × ``b·s·h·2`` = 805 MB); on 40 GB parts they would need partitioned activations too.

So the one reading that makes every row fit without a further assumption, and agrees with vTrain's own
simulator of the runs, is 80 GB parts, no ZeRO: the A100-SXM4-80GB (HBM2e, 2,039 GB/s against the 40 GB part's
1,555 GB/s, NVIDIA A100 datasheet; :data:`llmcomm.overhead.utilization.HBM_BANDWIDTH`).

The kit's reading of the runs (:data:`llmcomm.overhead.measured.RUN_SETTINGS`, applied by
:func:`llmcomm.overhead.measured.candidates`, which :func:`llmcomm.overhead.validation.predict_rows` times) is
checked setting by setting against these files and is not mis-read: ``distributed_optimizer: False`` (vTrain's
simulator: unsharded Adam, whole-stage all-reduce), ``recompute: "full"`` (``use_checkpoint: true``),
``schedule: "1f1b"``, no gradient bucketing (``overlap_grad_reduce`` off: ``use_gradient_bucket: false``),
``pipe_partitioned: True`` (DeepSpeed's PipelineEngine, :mod:`llmcomm.overhead.measured`), and the default rank
order ``tp-cp-ep-dp-pp`` (:data:`llmcomm.specs.DEFAULT_ORDER`: TP fastest, then DP, then PP, as DeepSpeed's
``PipeModelDataParallelTopology``, axes ``pipe, data, model``; :mod:`llmcomm.overhead.tp_diagnosis`). The GPU
part is the one assumption the data contradict.

**What each reading does to the fit** (:func:`whatif`; refit on the 1,440 single-node rows only, the shipped
method :func:`llmcomm.overhead.calibrate.fit`; regenerate with ``python -m llmcomm.overhead.vtrain_memory``):

* ``80gb``: both the single-node and the multi-node rows on the 80 GB part. The utilization's memory term is
  ``θ_mem·B/H``, so ``θ_mem`` absorbs ``H`` exactly; only the per-iteration HBM work the formulation times at
  ``bytes/H`` without ``θ_mem`` (the Adam step, the gradient-norm and loss-scale passes:
  :func:`llmcomm.overhead.iteration.combine`'s optimizer term) gets faster.
* ``80gb-multi``: the single-node node on the 40 GB part, the multi-node cluster on the 80 GB one (the
  utilization's stated carry-over rule: byte terms scale with the HBM bandwidth).
* ``zero1``: DeepSpeed ZeRO stage 1 on every run, single- and multi-node, timed as the formulation times a
  sharded optimizer (``distributed_optimizer``: the Adam step over ``P/dp``, the gradients reduce-scattered and
  the updated parameters all-gathered over DP: :func:`llmcomm.overhead.iteration.comm_items`), which is what
  DeepSpeed's ``stage_1_and_2.py`` moves per iteration (a reduce of each gradient partition to its owner, then an
  all-gather of the fp16 partitions). DeepSpeed's PipelineEngine accepts no higher stage (``deepspeed/runtime/
  pipe/engine.py``, ``PipelineEngine.__init__``: ``assert self.zero_optimization_stage() < 2``).
* ``last-stage-no-recompute``: vTrain's simulator's own reading of ``use_checkpoint`` (``src/predictor.py``
  lines 253-259: recompute nodes only ``if rank < pp - 1``, "Last rank worker dosen't perform recomputation"):
  no recompute pass on the last pipeline stage, hence none at all at ``pp = 1``
  (:func:`without_last_stage_recompute`). Not in DeepSpeed: ``deepspeed/runtime/pipe/module.py``
  ``PipelineModule.forward`` checkpoints every ``activation_checkpoint_interval`` layers that
  ``_is_checkpointable`` accepts, and for ``GPTModelPipe`` that test is the class name alone
  (``ParallelTransformerLayerPipe``), with no stage condition; tested because it is the measuring group's reading.

Measured (``python -m llmcomm.overhead.vtrain_memory``; single-node in-sample / leave-one-shape-out MAPE, multi-node
MAPE, 90 % interval coverage of the 109 multi-node rows under the refit's own single-node residual quantiles,
:func:`coverage`; per group MAPE / Spearman; ``validate("nemo-h100")`` MAPE under the refit θ)::

    reading                  θ_gemm θ_mem  single  LOSO   multi  cov   3.6B       18.4B      39.1B      175B       NeMo
    shipped                  1.091  1.18   6.18%  6.53%  8.41%  76%  11.6/0.96  6.8/0.66   9.3/0.62   3.7/0.91  12.9%
    80gb                     1.030  1.63   6.16%  6.37%  9.85%  73%  12.0/0.97  7.6/0.66  10.9/0.60   6.6/0.91  11.8%
    80gb-multi               1.091  1.18   6.18%  6.53% 12.50%  58%  16.0/0.97 10.7/0.66  13.3/0.63   7.7/0.89  12.9%
    zero1                    1.045  1.24   6.15%  6.44%  9.53%  73%  12.2/0.97  7.5/0.66  10.4/0.60   5.7/0.91  13.2%
    last-stage-no-recompute  1.235  1.46   8.35%  8.51% 10.28%  79%  15.5/0.93  8.4/0.86   9.8/0.60   6.1/0.93  13.4%

``θ_tp`` stays on its bound 0 in every reading; no other coefficient reaches a bound (``θ_gemm`` ≥ 1: 1.030 under
``80gb`` is the closest). The finding: the reading the memory supports (80 GB parts, no ZeRO) and the alternative
(ZeRO-1) both make the per-iteration HBM work the formulation times outside ``θ`` (the Adam step at ``bytes/H``)
smaller, the single-node fit answers with faster matmuls (``θ_gemm`` 1.09 → 1.03–1.05), and the multi-node rows,
already predicted too fast (their TP-2/TP-4 excess, :mod:`llmcomm.overhead.tp_diagnosis`), come out faster still:
multi-node MAPE 8.4 % → 9.5–12.5 %, the 18.4B and 39.1B Spearman unchanged or lower. vTrain's no-recompute-on-the-
last-stage reading raises the 18.4B Spearman to 0.86 but the single-node runs reject it (in-sample 6.2 % → 8.4 %).
None is shipped; the GPU part of ``data/clusters/vtrain-a100.yaml`` is left as it is (the lead's call: the memory
says 80 GB, the fit prefers the 40 GB part's bandwidth for the per-iteration term).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, UsageError
from ..specs import Cluster, load_cluster
from . import calibrate as C
from . import iteration as it
from . import measured
from . import utilization as U
from .deepspeed_terms import evaluate, result_row
from .memory import memory_table

GPU_80GB = "NVIDIA A100-SXM4-80GB"
READINGS = ("shipped", "80gb", "80gb-multi", "zero1", "last-stage-no-recompute")


def cluster_80gb(cluster: Cluster) -> Cluster:
    """``cluster`` with the 80 GB A100 part (its name picks 2,039 GB/s from :data:`U.HBM_BANDWIDTH`)."""
    if "A100" not in cluster.gpu:
        raise ConfigError(f"cluster {cluster.name}: gpu={cluster.gpu!r} is not an A100 (no 80 GB A100 part to swap in)")
    return dataclasses.replace(cluster, gpu=GPU_80GB, gpu_memory_bytes=80e9, hbm_bandwidth=None)


def candidates(rows: pd.DataFrame, zero1: bool = False) -> pd.DataFrame:
    """:func:`measured.candidates` of ``rows``, with the optimizer sharded over DP where ``zero1``."""
    out = measured.candidates(rows)
    if zero1:
        out["distributed_optimizer"] = True
    return out


def memory_readings(which: str = "multi") -> pd.DataFrame:
    """Per row of vTrain's ``which`` file: GB per GPU (the stage holding most) unsharded (``total_gb``) and with
    the optimizer states sharded over DP (``zero1_gb``), and the model states alone (``states_gb``)."""
    rows = measured.read(which)
    parts = []
    for zero1 in (False, True):
        tabs = []
        for model, g in measured.by_model(rows):
            m = memory_table(model, candidates(g, zero1))
            m.index = g.index
            tabs.append(m)
        parts.append(pd.concat(tabs).loc[rows.index])
    plain, z = parts
    out = rows[["group", "tp", "pp", "dp", "micro_batch"]].copy()
    out["states_gb"] = (plain["weights_bytes"] + plain["gradients_bytes"] + plain["optimizer_bytes"]) / 1e9
    out["activations_gb"] = plain["activations_bytes"] / 1e9
    out["total_gb"] = plain["total_bytes"] / 1e9
    out["zero1_gb"] = z["total_bytes"] / 1e9
    return out


def fits(mem: pd.DataFrame) -> dict[str, Any]:
    """How many rows of :func:`memory_readings` exceed 40 GB and 80 GB, unsharded and with ZeRO-1."""
    return {"rows": int(len(mem)), "over_40gb": int((mem["total_gb"] > 40).sum()),
            "over_80gb": int((mem["total_gb"] > 80).sum()), "max_gb": float(mem["total_gb"].max()),
            "zero1_over_40gb": int((mem["zero1_gb"] > 40).sum()), "zero1_max_gb": float(mem["zero1_gb"].max())}


def prepare(which: str, cluster: Cluster, zero1: bool = False) -> C.Prepared:
    """:func:`calibrate.prepare` of vTrain's ``which`` rows on ``cluster`` (shipped bandwidth model), with the
    optimizer sharded where ``zero1``."""
    bw, _ = it._resolve(cluster, None, U.Utilization(coef=C.START))
    rows = measured.read(which).reset_index(drop=True)
    out = []
    for model, g in measured.by_model(rows):
        t = it.candidate_table(model, candidates(g, zero1))
        out.append((g.index.to_numpy(), it.stages(model, t, cluster, bw)))
    return C.Prepared(rows, out)


def without_last_stage_recompute(prep: C.Prepared) -> C.Prepared:
    """``prep`` with no full recomputation on the last pipeline stage (the ``last`` stage class; at ``pp = 1``
    the one stage, which :func:`llmcomm.overhead.iteration.combine` times as ``first``): vTrain's simulator's
    reading (``src/predictor.py`` lines 253-259). Every other stage keeps its recompute pass."""
    out = []
    for idx, st in prep.stages:
        cls = {}
        for k, r in st.cls.items():
            q = dict(r["q"])
            if k == "last":
                q["full"] = np.zeros_like(q["full"])
            elif k == "first":
                q["full"] = np.where(st.pp == 1, 0.0, q["full"])
            cls[k] = {**r, "q": q}
        out.append((idx, dataclasses.replace(st, cls=cls, stacked=None)))
    return C.Prepared(prep.rows, out)


def reading(name: str) -> tuple[C.Prepared, C.Prepared]:
    """Single- and multi-node rows prepared under one of :data:`READINGS` (module docstring)."""
    if name not in READINGS:
        raise UsageError(f"reading={name!r} is not one of {list(READINGS)}")
    base = load_cluster(C.CLUSTER)
    big = cluster_80gb(base)
    single_c, multi_c = {"80gb": (big, big), "80gb-multi": (base, big)}.get(name, (base, base))
    z = name == "zero1"
    single, multi = prepare("single", single_c, z), prepare("multi", multi_c, z)
    if name == "last-stage-no-recompute":
        return without_last_stage_recompute(single), without_last_stage_recompute(multi)
    return single, multi


def coverage(single: C.Prepared, multi: C.Prepared, util: U.Utilization) -> float:
    """Share of the multi-node rows inside the 90 % interval :mod:`llmcomm.overhead.interval` would give under
    ``util``: the 5 % and 95 % quantiles of ``predicted/measured − 1`` on the single-node rows, and a multi-node
    row covered when its own ``predicted/measured − 1`` lies between them."""
    from .interval import QUANTILES

    r_single = C.predict(single, util) / single.rows["time_s"].to_numpy() - 1.0
    lo, hi = np.quantile(r_single, QUANTILES)
    r = C.predict(multi, util) / multi.rows["time_s"].to_numpy() - 1.0
    return float(((r >= lo) & (r <= hi)).mean())


def whatif(names: tuple[str, ...] = READINGS, cv: bool = True, nemo: bool = True) -> pd.DataFrame:
    """One row per reading: the refit's θ, the coefficients on their bound, single-node in-sample and
    leave-one-shape-out MAPE, multi-node MAPE, 90 % interval coverage (:func:`coverage`), per-group MAPE and
    Spearman, and (``nemo``) ``validate("nemo-h100")``'s MAPE under the refit θ."""
    rows = []
    for name in names:
        single, multi = reading(name)
        e = evaluate(single, multi, cv)
        util = e["utilization"]
        row: dict[str, Any] = {"reading": name, **result_row(e, multi_coverage_90=coverage(single, multi, util))}
        if nemo:
            from .validation import validate

            row["nemo_h100_mape"] = validate("nemo-h100", utilization=util)[1]["mape"]
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-cv", action="store_true", help="skip the leave-one-shape-out refits")
    args = ap.parse_args(argv)
    mem = memory_readings("multi")
    with pd.option_context("display.width", 200, "display.max_columns", 40):
        print(fits(mem))
        print(mem[mem["total_gb"] > 40].round(1).to_string())
        print(whatif(cv=not args.no_cv).T.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
