"""Finding F5, shown rather than asserted: how the communication overhead of real training configurations
moves with the GPU utilization they reach and the effective bandwidth their collectives get.

For each configuration of :data:`CASES`, on each cluster, the shipped utilization and bandwidth models are
scaled by factors ``u`` (every compute time divided by ``u``: a faster or better-used GPU) and ``w`` (every
collective's time divided by ``w``: a faster network); :func:`sweep` records, per point, the breakdown of
:func:`~llmcomm.overhead.iteration_time` and the two variables as *achieved* quantities::

    utilization        = hardware FLOPs of one GPU's compute / (compute_s · peak FLOP/s)
                         (hardware FLOPs: forward, backward and recomputation of its stage, per micro-batch × m)
    effective bandwidth = bus bytes of the exposed communication / exposed_comm_s    (GB/s; nccl-tests bus bytes)

:func:`regress` fits ``comm_overhead ~ log2(utilization) + log2(effective bandwidth) + case`` by OLS
(statsmodels), with confidence intervals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from .. import step
from ..specs import Cluster, ModelSpec, ParallelConfig, load_cluster, load_model
from .iteration import TERMS, _resolve, iteration_time
from .utilization import Utilization

# published (or adapted, as marked) configurations of the catalogue's models (notebook 02 describes each)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "GPT-3 175B": ("gpt3-175b", {"tp": 8, "pp": 16, "dp": 12, "micro_batch": 1, "global_batch": 1536,
                                 "seq_len": 2048, "recompute": "full"}),
    # NeMo's Llama-3 70B layout without context parallelism (not modelled): CP folded into DP
    "LLaMA-3 70B": ("llama3-70b", {"tp": 4, "pp": 4, "vpp": 5, "dp": 8, "sp": True, "micro_batch": 1,
                                   "global_batch": 512, "seq_len": 8192, "distributed_optimizer": True,
                                   "recompute": "selective"}),
    "Mixtral 8x7B": ("mixtral-8x7b", {"tp": 1, "pp": 4, "dp": 16, "ep": 8, "micro_batch": 1, "global_batch": 256,
                                      "seq_len": 4096, "distributed_optimizer": True, "recompute": "selective"}),
}
CLUSTERS = ("a100-80g-hdr200", "h100-80g-ndr400", "h200-141g-ndr400")


def with_overlap(cases: Mapping[str, tuple[str, Mapping[str, Any]]] = CASES
                 ) -> dict[str, tuple[str, dict[str, Any]]]:
    """``cases`` with Megatron-LM's overlap flags on wherever the configuration allows them
    (:mod:`llmcomm.rules`), nothing else changed: ``overlap_grad_reduce`` always; ``overlap_param_gather`` with
    the distributed optimizer (Megatron-LM requires both, arguments.py); ``tp_comm_overlap`` with sequence
    parallelism and ``tp > 1`` (TransformerEngine userbuffers overlap the SP all-gathers / reduce-scatters; a
    configuration without SP keeps its TP all-reduces exposed, as Megatron-LM does)."""
    out = {}
    for label, (mname, kw) in cases.items():
        k = dict(kw, overlap_grad_reduce=True)
        if k.get("distributed_optimizer"):
            k["overlap_param_gather"] = True
        if k.get("sp") and k.get("tp", 1) > 1:
            k["tp_comm_overlap"] = True
        out[label] = (mname, k)
    return out
SCALES = (0.5, 0.71, 1.0, 1.41, 2.0)


class ScaledBandwidth:
    """A bandwidth model whose every call takes ``1/scale`` of the time (α and β both divided)."""

    def __init__(self, inner: Any, scale: float) -> None:
        self.inner, self.scale = inner, float(scale)

    def time(self, op: str, nbytes: Any, group_size: Any, ranks_per_node: Any = None) -> np.ndarray:
        return self.inner.time(op, nbytes, group_size, ranks_per_node) / self.scale

    def regime(self, op: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x_lo, a, b = self.inner.regime(op, n, k)
        return x_lo, a / self.scale, b / self.scale


def same_network(gpu_cluster: Cluster, network: Cluster) -> Cluster:
    """``gpu_cluster``'s GPUs on ``network``'s links (a constructed variant, named as such)."""
    return dataclasses.replace(gpu_cluster, name=f"{gpu_cluster.name}-on-{network.name}-network",
                               intra_node_bandwidth=network.intra_node_bandwidth,
                               inter_node_bandwidth=network.inter_node_bandwidth)


def hardware_flops(model: ModelSpec, parallel: ParallelConfig) -> float:
    """FLOPs one GPU executes per iteration, averaged over the pipeline: ``B·s·[(3 + ρ)·(linear + attention) +
    3·logits] / (tp·pp·dp)`` with ``ρ`` 1 for full recomputation, the attention share for selective, else 0."""
    s = parallel.sequence_length(model)
    f = model.forward_flops(s, model.padded_vocab_size(parallel.tp))
    rec = {"full": (f.linear + f.attention) * step.model_recomputed_share(model, parallel),  # block: its share
           "selective": f.attention, "none": 0.0}[parallel.recompute]
    per_token = 3 * (f.linear + f.attention) + rec + 3 * f.logits
    global_batch = parallel.num_microbatches * parallel.micro_batch * parallel.dp  # the resolved global batch
    return global_batch * s * per_token / (parallel.tp * parallel.pp * parallel.dp)


def breakdowns(cases: Mapping[str, tuple[str, Mapping[str, Any]]] = CASES,
               clusters: Iterable[Cluster | str] = CLUSTERS) -> pd.DataFrame:
    """One row per (case, cluster, term): seconds and share of the iteration under the shipped calibration."""
    rows = []
    for cl in clusters:
        cluster = load_cluster(cl) if isinstance(cl, str) else cl
        for label, (mname, kw) in cases.items():
            b = iteration_time(load_model(mname), ParallelConfig(**kw), cluster)
            f = b.to_frame().assign(case=label, cluster=cluster.name, total_s=b.total_s,
                                    comm_overhead=b.comm_overhead)
            rows.append(f)
    return pd.concat(rows, ignore_index=True)


def sweep(cases: Mapping[str, tuple[str, Mapping[str, Any]]] = CASES, clusters: Iterable[Cluster | str] = CLUSTERS,
          compute_scales: Sequence[float] = SCALES, bandwidth_scales: Sequence[float] = SCALES,
          utilization: Utilization | None = None) -> pd.DataFrame:
    """The breakdown of every case on every cluster for every pair of scale factors (module docstring)."""
    rows = []
    for cl in clusters:
        cluster = load_cluster(cl) if isinstance(cl, str) else cl
        bw0, util0 = _resolve(cluster, None, utilization)
        for label, (mname, kw) in cases.items():
            model, par = load_model(mname), ParallelConfig(**kw)
            flops = hardware_flops(model, par)
            for u in compute_scales:
                for w in bandwidth_scales:
                    b = iteration_time(model, par, cluster, ScaledBandwidth(bw0.bw, w), util0.scaled(u))
                    rows.append({"case": label, "cluster": cluster.name, "compute_scale": u,
                                 "bandwidth_scale": w, **{t: getattr(b, t) for t in TERMS},
                                 "total_s": b.total_s, "exposed_comm_s": b.exposed_comm_s,
                                 "comm_overhead": b.comm_overhead,
                                 "utilization": flops / (b.compute_s * cluster.peak_bf16_flops),
                                 # bus bytes of the stage critical under these very scales
                                 "effective_bandwidth_GBps": b.comm_bus_bytes / b.exposed_comm_s / 1e9})
    return pd.DataFrame(rows)


def regress(points: pd.DataFrame) -> Any:
    """OLS (statsmodels) of ``comm_overhead`` on ``log2(utilization)``, ``log2(effective bandwidth)`` and the
    case (fixed effects); returns the fitted results (``.params``, ``.conf_int()``, ``.rsquared``)."""
    import statsmodels.formula.api as smf

    d = points.assign(log2_utilization=np.log2(points["utilization"]),
                      log2_bandwidth=np.log2(points["effective_bandwidth_GBps"]))
    return smf.ols("comm_overhead ~ log2_utilization + log2_bandwidth + C(case)", data=d).fit()


def coefficient_table(res: Any) -> pd.DataFrame:
    ci = res.conf_int()
    return pd.DataFrame({"coef": res.params, "ci_low": ci[0], "ci_high": ci[1], "p_value": res.pvalues})
