"""Why the utilization fit puts ``θ_tp`` on its bound 0, and why no communication mechanism explains the vTrain
multi-node rows' TP-2 penalty: a tested diagnostic, not part of the formulation (nothing here changes a
prediction; nothing is fitted on the multi-node rows).

Three checks, each a function, all numbers from ``python -m llmcomm.overhead.tp_diagnosis``:

1. **The TP all-reduces are timed from vTrain's own measurements.** The ``vtrain-a100`` cluster's intra-node
   all-reduce is fitted on vTrain's nccl-tests tables of the same node (``vtrain/allreduce_lut/a100/
   AR_GPU{n}_1M_1024M_LUT``, 1 MiB–1 GiB; :mod:`llmcomm.overhead.bandwidth`, β × 1). Whatever NCCL 2.1x chose
   there — ring or tree, the LL/LL128/Simple protocol (LL128 hands over to Simple at a few MiB on NVSwitch,
   ``src/graph/tuning.cc``), the channel count a 2-, 4- or 8-GPU communicator gets, the per-call latency α, the
   busbw factor ``2(n−1)/n`` — is inside those measurements. :func:`allreduce_vs_measured` compares the kit's
   time with the measured one at the message sizes the rows issue (``b·s·h·2`` bytes: 25–805 MB multi-node,
   2–16 MiB single-node; below the tables' 1 MiB floor the nearest measured size): at most 4.4 %, 6.6 % and
   8.3 % off for 2, 4 and 8 GPUs, about the measurements' own size-to-size scatter (the 8-GPU table's busbw
   goes 166, 163, 201 GB/s at 24, 31, 63 MiB).
2. **Single-node: the residual is not monotonic in TP, so no per-pass TP cost fits it.** :func:`residual_by_tp`:
   signed mean error of the shipped fit per TP size (tp 1/2/4/8: −2 %, +2 %, +7 %, −12 %): tp 4 is predicted too
   slow, tp 8 too fast. ``θ_tp·log2(tp)`` (or any cost growing with ``tp``: :func:`unbounded_theta_tp`) cannot
   lower tp 4 and raise tp 8 at once; left unbounded it comes out slightly *negative* (−21 µs per ``log2 tp``
   per pass: the rows want TP cheaper, not dearer), so the bounded fit fixes it at 0. The tp-8 misses are the
   micro-batch-1 cells (−24 %), where Megatron-DeepSpeed's fused softmax falls back to five PyTorch kernels
   (:mod:`llmcomm.overhead.softmax_fallback`: ``b·a/tp = 2`` is not a multiple of 4); counted, the residual by TP
   is −2.1 %, +1.5 %, +5.3 %, −4.2 % and ``θ_tp`` is still on 0 (unbounded −35 µs). The tp-4 excess is the
   hidden-2,048 cells at micro-batch 1–2 (+17 %, +34 %), measured faster per micro-batch at micro-batch 2 than
   at 1 (:func:`microbatch_inversions`): no cost that grows with work or with TP can produce that. The bound
   is a finding about the data, not a mechanism.
3. **Multi-node: the TP-2 excess is larger than every byte the layout moves.** :func:`network_table`: for each
   row the bytes one GPU sends across nodes per iteration, counted generously (:func:`inter_node_bytes`: its
   whole ring share of the DP all-reduce with no intra-node reduction, and unpartitioned pipeline sends), timed
   at the per-GPU share of the node's stated 800 Gb/s at the kit's measured inter-node efficiency and with no
   overlap (``ceiling_s``); and its TP bytes (:func:`tp_bytes`) timed at PCIe 4.0 x16's 32 GB/s instead of
   NVLink (``tp_pcie_s``: as if the pair shared no NVLink at all). ``unexplained_s`` is the excess over the
   prediction less what those ceilings could add to what the kit already charges. On all six 39.1B tp-2 rows
   it stays positive, 1.6–8.1 s (excess 4.2–10.5 s): explained by traffic, the network would deliver 1.1–2.8
   GB/s per GPU (:func:`implied_bandwidth`) against the 7.8 GB/s the kit's inter-node fit gives, while the
   tp-4/tp-8 rows of the same DP size and ``tp·pp`` (the same parameters per GPU) imply 3.1–9.9 GB/s and send
   two to four times the DP bytes per node.

Placement (DeepSpeed's ``PipeModelDataParallelTopology``: axes ``pipe, data, model``, model fastest, as
Megatron-DeepSpeed's ``megatron/mpu`` groups: TP ranks consecutive, DP stride ``tp``): a node holds ``8/tp`` DP
ranks of each of its ``tp`` DP groups (:func:`dp_ranks_per_node`), so tp 2 puts 2 DP groups of 4 GPUs on a node,
tp 8 puts 8 groups of 1. Each group's ring crosses the node boundary once per channel, so the node sends
``(8/k)·2(D−1)/D·S`` bytes for the DP all-reduce (:func:`node_dp_bytes`): tp 2 sends a quarter of what tp 8 does
at the same parameters per GPU ``S``. With 4 NICs (800 Gb/s as 4 × HDR 200; 8 × HDR 100 changes only the
per-NIC figure) every layout spreads its groups over all NICs (GPUs 2j, 2j+1 share NIC j; a tp-2 DP group holds
GPUs 0, 2, 4, 6 or 1, 3, 5, 7). The placement therefore favours tp 2 on the network; it cannot be the penalty.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
import pandas as pd

from ..data import path as data_path
from ..ingest import ingest_bandwidth
from ..specs import load_cluster
from . import calibrate as C
from . import deepspeed_terms as D
from . import utilization as U
from .bandwidth import Bandwidth, BandwidthModel, bus_factor

LUT = "vtrain/allreduce_lut/a100/AR_GPU{n}_1M_1024M_LUT"
PCIE4_X16 = 32e9  # bytes/s one direction, PCI Express 4.0 x16 (16 GT/s × 16 lanes, 128b/130b)
CALLS_PER_LAYER = 6  # Megatron without SP: 2 all-reduces forward, 2 backward, 2 in the recomputed forward
ACT_BYTES = 2  # fp16 activations and gradients


def dp_ranks_per_node(tp: Any, dp: Any, gpus_per_node: int = 8) -> np.ndarray:
    """GPUs of one DP group on one node under ranks ``pipe·dp·tp + data·tp + model`` (module docstring):
    ``min(dp, max(gpus_per_node // tp, 1))``."""
    tp, dp = np.asarray(tp, dtype=np.int64), np.asarray(dp, dtype=np.int64)
    return np.minimum(dp, np.maximum(gpus_per_node // tp, 1))


def node_dp_bytes(params: Any, tp: Any, dp: Any, gpus_per_node: int = 8, grad_bytes: int = 2) -> np.ndarray:
    """Bytes one node sends across nodes in one DP all-reduce of ``params`` fp16 gradients per GPU: each of the
    ``gpus_per_node/k`` groups on it (``k`` = :func:`dp_ranks_per_node`) sends its ring share ``2(D−1)/D·S``
    once per node boundary; 0 where the group fits in the node."""
    k = dp_ranks_per_node(tp, dp, gpus_per_node)
    d = np.asarray(dp, dtype=np.float64)
    s = np.asarray(params, dtype=np.float64) * grad_bytes
    crosses = d > k
    return np.where(crosses, (gpus_per_node / k) * 2.0 * (d - 1.0) / d * s, 0.0)


def inter_node_bytes(params: Any, dp: Any, microbatches: Any, b: Any, s: Any, h: Any,
                     grad_bytes: int = 2) -> np.ndarray:
    """Generous count of the bytes one GPU sends across nodes per iteration: its whole ring share of the DP
    all-reduce, ``2(D−1)/D·S`` (no intra-node reduction), plus one activation forward and one gradient backward
    per micro-batch, ``2·m·b·s·h·2`` (unpartitioned: DeepSpeed sends ``1/tp`` of it when ``tp > 1``)."""
    d = np.asarray(dp, dtype=np.float64)
    dp_b = np.where(d > 1, 2.0 * (d - 1.0) / d * np.asarray(params, dtype=np.float64) * grad_bytes, 0.0)
    pp_b = 2.0 * np.asarray(microbatches, dtype=np.float64) * np.asarray(b, dtype=np.float64) * s * h * ACT_BYTES
    return dp_b + pp_b


def tp_bytes(tp: Any, layers_per_stage: Any, microbatches: Any, b: Any, s: Any, h: Any) -> np.ndarray:
    """Bus bytes of one GPU's TP all-reduces per iteration: ``6·(L/pp)·m·2(t−1)/t·b·s·h·2``
    (:data:`CALLS_PER_LAYER`; nccl-tests' busbw convention, :func:`llmcomm.overhead.bandwidth.bus_factor`)."""
    t = np.asarray(tp, dtype=np.int64)
    msg = np.asarray(b, dtype=np.float64) * s * h * ACT_BYTES
    return (CALLS_PER_LAYER * np.asarray(layers_per_stage, dtype=np.float64)
            * np.asarray(microbatches, dtype=np.float64) * bus_factor("all_reduce", t) * msg)


def implied_bandwidth(nbytes: Any, charged_s: Any, excess_s: Any) -> np.ndarray:
    """Bytes/s the network would deliver if a row's whole excess were its inter-node traffic:
    ``bytes / (charged + excess)``."""
    return np.asarray(nbytes, dtype=np.float64) / (np.asarray(charged_s) + np.maximum(np.asarray(excess_s), 0.0))


def allreduce_vs_measured(bw: BandwidthModel, sizes: Any, group_sizes: tuple[int, ...] = (2, 4, 8)
                          ) -> pd.DataFrame:
    """The kit's all-reduce seconds against vTrain's measured tables (:data:`LUT`, out-of-place time) at
    ``sizes`` bytes (nearest measured size, within the tables' 1 MiB–1 GiB): one row per group size and size
    with ``measured_s``, ``kit_s``, ``error`` (signed, fraction)."""
    rows = []
    for n in group_sizes:
        t = ingest_bandwidth([data_path(LUT.format(n=n))], op="all_reduce")
        t = t.drop_duplicates("bytes").sort_values("bytes")
        x, y = t["bytes"].to_numpy(np.float64), t["time_s"].to_numpy(np.float64)
        for size in np.asarray(sizes, dtype=np.float64):
            i = int(np.argmin(np.abs(x - size)))
            kit = float(bw.time("all_reduce", x[i], n))
            rows.append({"group_size": n, "bytes": x[i], "measured_s": y[i], "kit_s": kit,
                         "error": kit / y[i] - 1.0})
    return pd.DataFrame(rows)


def microbatch_inversions(rows: pd.DataFrame, microbatches: int = 2) -> pd.DataFrame:
    """Measured time ratio ``time(2b)/time(b)`` of rows that share shape, layout and ``microbatches`` micro-batches
    (vTrain's single-node runs: every cell has ``m = 2``), one row per cell and doubling; a ratio below 1 is a
    run that got faster when its work doubled. Columns ``hidden, layers, tp, dp, pp, micro_batch`` (the smaller
    size), ``ratio``."""
    r = rows.assign(m=rows["global_batch"] // (rows["dp"] * rows["micro_batch"]))
    r = r[r["m"] == microbatches]
    keys = ["hidden", "layers", "tp", "dp", "pp"]
    t = r.groupby([*keys, "micro_batch"])["time_s"].mean()
    out = []
    for (cell, g) in t.groupby(level=keys):
        g = g.droplevel(keys)
        for b in g.index:
            if 2 * b in g.index:
                out.append({**dict(zip(keys, cell, strict=True)), "micro_batch": b, "ratio": g[2 * b] / g[b]})
    return pd.DataFrame(out, columns=[*keys, "micro_batch", "ratio"])


def residual_by_tp(prep: C.Prepared, util: U.Utilization) -> pd.Series:
    """Signed mean relative error (predicted/measured − 1) of ``util`` on ``prep``'s rows, per TP size."""
    r = prep.rows.assign(err=C.predict(prep, util) / prep.rows["time_s"] - 1.0)
    return r.groupby("tp")["err"].mean()


def unbounded_theta_tp(prep: C.Prepared, floor: float = -1.0) -> U.Utilization:
    """The shipped fit with ``θ_tp``'s bound lowered to ``floor`` seconds (the others as :data:`calibrate.LOWER`):
    where the single-node rows put the TP cost when it may go negative."""
    return C.fit(prep, lower={**C.LOWER, "tp": floor})[0]


def network_table(pred: pd.DataFrame, multi: C.Prepared, gpus_per_node: int | None = None) -> pd.DataFrame:
    """Per multi-node row (``pred``: :func:`llmcomm.overhead.validation.validate`'s table of ``multi``'s rows, in
    order): placement, bytes, the ceilings of the module docstring and ``unexplained_s``."""
    g = gpus_per_node or load_cluster(C.CLUSTER).gpus_per_node
    bw = _bandwidth()
    probe = 1e9  # the kit's inter-node efficiency: a 1 GB all-reduce over 32 nodes, one GPU each
    eff_bw = bus_factor("all_reduce", 32) * probe / float(bw.time("all_reduce", probe, 32, 1))
    params, m = np.zeros(len(multi.rows)), np.zeros(len(multi.rows))
    for idx, st in multi.stages:
        params[idx], m[idx] = D.stage_params(st), st.m
    r = pred.reset_index(drop=True)
    if len(r) != len(params) or not np.array_equal(r["time_s"].to_numpy(), multi.rows["time_s"].to_numpy()):
        raise ValueError("network_table: pred and multi must hold the same rows in the same order")
    out = r[["group", "tp", "pp", "dp", "micro_batch", "time_s", "predicted_s"]].copy()
    out["microbatches"], out["params_per_gpu"] = m, params
    out["excess_s"] = r["time_s"] - r["predicted_s"]
    out["dp_ranks_per_node"] = dp_ranks_per_node(r["tp"], r["dp"], g)
    out["node_dp_gb"] = node_dp_bytes(params, r["tp"], r["dp"], g) / 1e9
    nbytes = inter_node_bytes(params, r["dp"], m, r["micro_batch"], r["seq_len"], r["hidden"])
    charged = r["dp_comm_s"] + r["pp_comm_s"]
    out["inter_node_gb"] = nbytes / 1e9
    out["ceiling_s"] = nbytes / eff_bw
    tb = tp_bytes(r["tp"], r["layers"] / r["pp"], m, r["micro_batch"], r["seq_len"], r["hidden"])
    out["tp_pcie_s"] = np.where(r["tp"] <= g, tb / PCIE4_X16, r["tp_comm_s"])
    out["charged_s"] = charged + r["tp_comm_s"]
    room = np.maximum(out["ceiling_s"] - charged, 0.0) + np.maximum(out["tp_pcie_s"] - r["tp_comm_s"], 0.0)
    out["unexplained_s"] = out["excess_s"] - room
    out["implied_gb_s"] = implied_bandwidth(nbytes, charged, out["excess_s"]) / 1e9
    out.attrs["effective_inter_node_bytes_per_s"] = eff_bw
    return out


def diagnose(cv: bool = False) -> dict[str, Any]:
    """Every number of the module docstring: TP timing errors, single-node residual by TP, the unbounded
    ``θ_tp``, and the multi-node network table with its 39.1B tp-2 summary."""
    from .validation import validate

    single, multi = D.prepared()
    shipped = U.Utilization.default()
    r = multi.rows
    sizes = np.unique(np.concatenate([(r["micro_batch"] * r["seq_len"] * r["hidden"] * ACT_BYTES).to_numpy(),
                                      (single.rows["micro_batch"] * single.rows["seq_len"] * single.rows["hidden"]
                                       * ACT_BYTES).to_numpy()]))
    ar = allreduce_vs_measured(_bandwidth(), sizes)
    free = unbounded_theta_tp(single)
    pred, _ = validate("vtrain-multi", utilization=shipped)
    net = network_table(pred, multi)
    tp2 = net[(net["group"] == "39.1B") & (net["tp"] == 2)]
    same = net[(net["group"] == "39.1B") & (net["dp"] == 32) & (net["tp"] * net["pp"] == 16)]
    return {"allreduce_max_abs_error": ar.groupby("group_size")["error"].apply(lambda e: float(e.abs().max())).to_dict(),
            "allreduce": ar,
            "single_residual_by_tp": residual_by_tp(single, shipped).to_dict(),
            "microbatch_inversions_by_tp": microbatch_inversions(single.rows).assign(inv=lambda t: t["ratio"] < 1)
            .groupby("tp")["inv"].agg(["sum", "count"]).to_dict(orient="index"),
            "unbounded_theta": dict(zip(U.FEATURES, free.coef, strict=True)),
            "unbounded_residual_by_tp": residual_by_tp(single, free).to_dict(),
            "network": net,
            "tp2_39b_excess_s": (float(tp2["excess_s"].min()), float(tp2["excess_s"].max())),
            "tp2_39b_unexplained_s": (float(tp2["unexplained_s"].min()), float(tp2["unexplained_s"].max())),
            "tp2_39b_implied_gb_s": (float(tp2["implied_gb_s"].min()), float(tp2["implied_gb_s"].max())),
            "same_shard_39b_dp32": same.sort_values(["micro_batch", "tp"]),
            "effective_inter_node_gb_s": net.attrs["effective_inter_node_bytes_per_s"] / 1e9}


def _bandwidth() -> BandwidthModel:
    """The shipped bandwidth model of the ``vtrain-a100`` cluster (what the fit and the validation use)."""
    return Bandwidth.default(load_cluster(C.CLUSTER))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    d = diagnose()
    with pd.option_context("display.width", 220, "display.max_columns", 30, "display.max_rows", 200):
        for k, v in d.items():
            if isinstance(v, pd.DataFrame):
                print(f"{k}:\n{v.round(3).to_string(index=False)}")
            else:
                print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
