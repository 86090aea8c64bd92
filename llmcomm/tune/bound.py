"""A lower bound on the formulation's iteration time from a stage's compute and the communication no flag of the
row can hide, for the tuner's branch-and-bound (:func:`llmcomm.tune.search.tune`, rule ``lower-bound``).

The formulation (:func:`llmcomm.overhead.iteration.combine`) gives, per configuration, with ``S_k`` the seconds
of one micro-batch on stage class ``k`` (``first``; ``mid``, standing for the ``pp − 2`` middle stages, where
``pp ≥ 3``; ``last`` where ``pp ≥ 2``), ``m`` micro-batches and ``v`` virtual stages::

    total_s = m·S_crit + (Σ_r S_r − S_crit)/v + dp_exposed + optimizer_s,     S_crit = max_k S_k
    S_k     = C_k + X_k,   C_k = forward + backward + recompute (class_times),  X_k = tp + ep + pp + cp + fsdp

(``forward_s + backward_s + recompute_s + tp/ep/pp/cp_comm_s`` are ``m·`` the critical class's terms, ``bubble_s``
the second term, ``dp_comm_s = dp_exposed + m·fsdp``; ``Σ_r`` weights ``mid`` by ``pp − 2``). The bound is the
same expression with the exposed communication, the DP term and the optimizer at zero (but see below)::

    bound = m·C_crit + (Σ_r C_r − C_crit)/v = (m − 1/v)·max_k C_k + Σ_r C_r / v

Why ``bound ≤ total_s`` for every configuration:

1. every exposed communication term is ``≥ 0`` (a time, or ``max(0, ·)`` of one: the overlap functions of
   :mod:`llmcomm.overhead.overlap` and ``tp_overlap_exposed`` subtract at most the time they hide), so
   ``S_k ≥ C_k``; ``dp_exposed ≥ 0`` (a ``max`` with the first stage's reduction, itself ``≥ 0``) and
   ``optimizer_s ≥ 0``;
2. ``f(S) = (m − 1/v)·max_k S_k + Σ_r S_r / v`` is non-decreasing in each ``S_k``, since ``m ≥ 1 ≥ 1/v`` and the
   weights of ``Σ_r`` are ``≥ 0``; so ``f(S) ≥ f(C)``;
3. ``C_k`` is the formulation's own compute (the ``q`` features of :func:`llmcomm.overhead.iteration.stages`
   through :func:`~llmcomm.overhead.iteration.class_times` and the same utilization model), not a re-derivation.

The bound also keeps, per class, the TP, EP and pipeline seconds that no flag of the row hides: ``tp`` unless
``tp_comm_overlap`` (less, under SP, the backward collectives that may hide without it:
:func:`llmcomm.overhead.overlap.sp_backward_hideable`), ``ep`` unless ``moe_a2a_overlap``, ``pp`` unless ``overlap_p2p_comm`` with ``v > 1`` (the
only places :func:`~llmcomm.overhead.iteration.combine` and :func:`llmcomm.overhead.overlap.pipeline_and_moe`
change them; ``S_k`` then still holds them in full, so 1. holds with them in ``C_k``). Expert TP is read from
the row (``etp``), never taken equal to ``tp``.

``C_k`` and those seconds do not read the dimensions of :data:`NOT_COMPUTE` (they change the DP/CP calls,
sharding, memory and what overlaps, not the work of a micro-batch nor its TP/EP/pipeline calls), so they are
computed once per distinct value of the others (:func:`lower_bounds`). ``tests/test_tune.py`` checks
``bound ≤ total_s`` on every candidate of full spaces (dense and MoE, CP, FSDP, FP8, uneven stages, the
pipeline and all-to-all overlaps opened) and that the once-per-key seconds equal the per-row ones. The bound is multiplied by ``1 − 1e-9`` so that a configuration
without any communication (where ``bound`` and ``total_s`` are the same sum in another order) is never above
its time by a rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .. import step
from ..parallel_table import ParallelTable
from ..specs import Cluster, ModelSpec
from ..step import CLASSES
from .space import DIMENSIONS, row_codes

# dimensions the per-micro-batch compute of a stage does not read (llmcomm.overhead.iteration._compute reads
# micro-batch, sequence, tp, cp, ep, etp, SP, recomputation, fused attention, FP8 and the stage's layers),
# and the TP/EP/pipeline seconds before overlap do not read them either; named, not derived, so that a dimension
# added to the space later is in the key (safe) until it is shown not to matter. ``dp`` is in the key: on a
# given GPU count it follows from tp·cp·pp, so it costs nothing and the group placement may read it
NOT_COMPUTE = ("distributed_optimizer", "fsdp", "fp8_param_gather", "cp_comm_type", "tp_comm_overlap",
               "overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm", "moe_a2a_overlap")
ROUNDING = 1.0 - 1e-9


def compute_key(cands: pd.DataFrame) -> np.ndarray:
    """One integer per row, equal for rows equal in every dimension the stage compute reads (:data:`DIMENSIONS`
    without :data:`NOT_COMPUTE`; ``seq_len`` too where given)."""
    return row_codes(cands, [c for c in (*DIMENSIONS, "seq_len") if c in cands.columns and c not in NOT_COMPUTE])


def class_seconds(model: ModelSpec, cands: pd.DataFrame, cluster: Cluster, bandwidth: Any = None,
                  utilization: Any = None) -> dict[str, dict[str, np.ndarray]]:
    """``{class: {"compute": C_k, "tp": .., "ep": .., "pp": ..}}``: the formulation's forward + backward +
    recompute seconds of one micro-batch of each stage class (``first``, ``mid``, ``last``) and its TP, EP and
    pipeline seconds before any overlap (:func:`llmcomm.overhead.iteration.stages`' numbers, through
    :func:`~llmcomm.overhead.iteration.stage_compute`, which builds no other call), for each row of ``cands``
    (valid configurations)."""
    from ..overhead import iteration as it
    from ..overhead import overlap as _overlap

    t = ParallelTable.from_frame(cands.reset_index(drop=True), model)
    bw, util = it._resolve(cluster, bandwidth, utilization)
    st = it.stage_compute(model, t, cluster, bw)  # stages() without the DP, CP and FSDP calls: the same numbers
    util = it.combine_utilization(st, util)  # the model combine times the stages with
    fwd, bwd, rec = it.class_times(st.q, util)  # the stacked rows of the classes that exist (element-wise)
    # TP seconds nothing hides without tp_comm_overlap: SP's async backward collectives may hide up to
    # sp_backward_hideable (llmcomm.overhead.overlap.sp_backward_exposed), whatever the GEMMs
    tp_kept = st.sums["tp"] - _overlap.sp_backward_hideable(st.sums["ub_b"])
    per = {"compute": st.by_class(fwd + bwd + rec), "tp": st.by_class(tp_kept), "ep": st.by_class(st.sums["ep"]),
           "pp": st.by_class(st.sums["pp"])}
    out = {cls: {k: per[k][cls] for k in per} for cls in CLASSES}
    return out


def _flag(cands: pd.DataFrame, name: str) -> np.ndarray:
    return cands[name].to_numpy(bool) if name in cands else np.zeros(len(cands), bool)


def lower_bounds(model: ModelSpec, cands: pd.DataFrame, cluster: Cluster, bandwidth: Any = None,
                 utilization: Any = None, *, dedupe: bool = True, key: np.ndarray | None = None) -> np.ndarray:
    """The bound of the module docstring for each row of ``cands`` (needs ``pp``, ``vpp``, ``num_microbatches``
    or ``global_batch``/``micro_batch``/``dp``, and the dimensions the compute reads); ``dedupe``: the stage
    seconds once per :func:`compute_key` (``False``: per row, what the test compares against); ``key``: that key
    where the caller has it (the tuner: from the rows before the time-only flags, which it does not read)."""
    n = len(cands)
    if n == 0:
        return np.zeros(0)
    if dedupe:
        key = compute_key(cands) if key is None else key
        inv = pd.factorize(key)[0]  # hashed (the stage seconds are element-wise: any order of the keys)
        per = class_seconds(model, cands.iloc[step.first_rows(inv)], cluster, bandwidth, utilization)
        sec = {c: {k: v[inv] for k, v in d.items()} for c, d in per.items()}
    else:
        sec = class_seconds(model, cands, cluster, bandwidth, utilization)
    pp = cands["pp"].to_numpy(np.int64)
    v = cands["vpp"].to_numpy(np.int64).astype(np.float64)
    if "num_microbatches" in cands:
        m = cands["num_microbatches"].to_numpy(np.float64)
    else:
        m = (cands["global_batch"].to_numpy() // (cands["micro_batch"].to_numpy() * cands["dp"].to_numpy())
             ).astype(np.float64)
    # the communication no flag of the row hides (module docstring, 1.)
    keep_tp = ~_flag(cands, "tp_comm_overlap")
    keep_ep = ~_flag(cands, "moe_a2a_overlap")
    keep_pp = ~(_flag(cands, "overlap_p2p_comm") & (v > 1))
    C = {c: d["compute"] + np.where(keep_tp, d["tp"], 0.0) + np.where(keep_ep, d["ep"], 0.0)
         + np.where(keep_pp, d["pp"], 0.0) for c, d in sec.items()}
    has_mid, has_last = pp >= 3, pp >= 2
    cmax = np.maximum(C["first"], np.maximum(np.where(has_mid, C["mid"], -np.inf),
                                             np.where(has_last, C["last"], -np.inf)))
    csum = C["first"] + np.where(has_mid, (pp - 2) * C["mid"], 0.0) + np.where(has_last, C["last"], 0.0)
    return ROUNDING * (m * cmax + (csum - cmax) / v)
