"""FSDP (ZeRO-3) in the iteration time: the per-unit calls in closed form, their exposure under prefetching, and the
memory the gathered units take (issue 20, deliverable 6).

Both implementations Megatron-LM runs express the same mechanism, one *unit* (a transformer layer) at a time:

* Megatron-FSDP (``--use-megatron-fsdp``, ``--data-parallel-sharding-strategy optim_grads_params``, the default,
  megatron/training/arguments.py:3190; with ``--use-distributed-optimizer``, which v1 turns on itself,
  arguments.py:1128-1135): the units are ``TransformerLayer``/``MoETransformerLayer``
  (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:170-171); a forward pre-hook all-gathers a unit's
  parameters and prefetches the next unit's (megatron_fsdp.py:794-813, ``PrefetchOrder.FORWARD_PASS_ORDER``), the
  post-forward hook releases them (:977-998), the backward pre-hook gathers them again and prefetches the previous
  unit's (:918-931, ``BACKWARD_PASS_ORDER``), the post-backward hook reduce-scatters the gradients on every
  micro-batch (:707-770: "With gradient-sharding strategies, gradient reduction occurs on every backward
  propagation"). The prefetch size is one unit: ``suggested_communication_unit_size`` is twice a unit's elements
  and ``suggested_AG_prefetch_size`` half of it (:419-444) — double buffering, as its design note says
  (src/docs/runtime_schedule.md, "Double buffering": "drains its queue to a target length of one").
  A whole-layer recomputation gathers once for the recompute and the backward (megatron_fsdp.py:127-128).
* torch FSDP2 (``fully_shard``, torch/distributed/fsdp/_fully_shard/_fully_shard.py ``fully_shard`` docstring:
  "Before forward, FSDP all-gathers the sharded parameters ... If ``reshard_after_forward`` is ``True``, then FSDP
  frees the unsharded parameters after forward and re-all-gathers them in backward ... After gradient computation,
  FSDP frees the unsharded parameters and reduce-scatters the unsharded gradients"); Megatron wraps every
  ``TransformerLayer`` (and the embedding, the output layer, the root) with ``reshard_after_forward`` from
  ``--torch-fsdp2-no-reshard-after-forward`` (megatron/core/distributed/torch_fully_sharded_data_parallel.py:59-64,
  82-85, 130-148; arguments.py:3218), over the data-parallel group with CP (:77).

``fsdp_reshard_after_forward=False`` (torch's ``reshard_after_forward=False``, ZeRO-2 style parameters): the
units keep their gathered parameters from the forward to the backward, so the backward issues no all-gather —
what Llama 3 trained with ("we do not reshard after forward computation to avoid an extra all-gather
communication during backward passes", The Llama 3 Herd of Models, arXiv 2407.21783, §3.3.2).

Calls per micro-batch of a stage (:func:`comm_items`, equal to the predictor's
:func:`llmcomm.predict.dp.fsdp_unit_forward`/``fsdp_unit_backward`` call for call: ``tests/test_overhead_bytes.py``)::

    per layer unit:   forward  AG(P_unit·p)                         over dp·cp (experts: AG(P_e·p) over edp)
                      backward AG(P_unit·p) [reshard] + RS(P_unit·g)
    non-layer unit:   the stage's embedding / final norm / output layer, the same three calls, gathered first
                      (Megatron-FSDP: not a unit, gathered once per iteration and kept, RS every micro-batch)

Exposure per micro-batch (:func:`exposed`), units ``j = 1..N`` of one model chunk in the order they run, ``a_j``,
``a'_j`` the forward and backward all-gather seconds, ``r_j`` the reduce-scatter, ``c_j``, ``c'_j`` the unit's
forward and backward (with recomputation) compute; the communication runs on its own stream, one unit ahead::

    forward   E_f = a_1 + Σ_{j=2..N} max(0, a_j − c_{j−1})            unit j's all-gather under unit j−1's forward
    backward  E_b = a'_1 + Σ_{j=2..N} max(0, a'_j + r_{j−1} − c'_{j−1}) + r_N
              (unit j's prefetched all-gather and unit j−2's reduce-scatter under unit j−1's backward, on one
              communicator: the all-gathers and reduce-scatters of one DP group run in launch order,
              runtime_schedule.md "Prefetching")

Vectorized over the stage classes, each layer's neighbour is taken of its own kind (dense or MoE: exact for stages
of one kind), ``v`` chunks are ``v`` chains (each chunk's first gather and last reduce-scatter exposed: a chunk is
its own FSDP module), and the non-layer unit, whose compute is a lookup or comes after the layers, is exposed in
full. The MoE unit's expert part (over the expert-data-parallel group) is timed after its dense part (serial).
The exposed seconds join the stage's per-micro-batch time (so the pipeline and its bubble carry them) and
``dp_comm_s``; ``dp_comm_total_s`` adds every FSDP call's time.

Memory (:func:`unit_bytes`, in :func:`llmcomm.overhead.memory.model_state_bytes`): parameters, gradients and
optimizer state sharded over dp·cp (experts over edp), plus the units gathered at once — the one computing and the
one prefetched: ``2·P_unit`` parameters and, in the backward, ``2·P_unit`` unsharded gradients (the unit's own and
the one being reduce-scattered, Megatron-FSDP's ``param.get_main_grad()`` bucket, megatron_fsdp.py:635-660);
``P_unit`` the stage's largest unit; Megatron-FSDP also keeps its non-layer parameters gathered for the iteration
(``+ P_e``), and gathers them once per iteration (the ``e1`` call of :func:`comm_items`). Without resharding every unit of the stage stays gathered between its forward
and backward: ``P_stage`` parameters instead of ``2·P_unit``.

Not modelled: Megatron-FSDP's ``--create-all-gather-group`` (a second communicator letting an all-gather pass a
reduce-scatter), ``--suggested-communication-unit-size`` other than the default, HSDP/HFSDP outer groups, the
``optim``/``optim_grads`` strategies (ZeRO-1/2 are the distributed optimizer here), the post-step
``start_param_sync`` (the first micro-batch's gathers moved into the optimizer phase: same bytes), FP8 parameter
all-gathers (``fp8_param_gather``: the bytes stay ``param_dtype``'s, as the predictor's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import step
from . import moe_fold

UNITS = ("d", "m", "me", "e")  # dense layer, MoE layer (its dense part), MoE layer's experts, non-layer unit


def unit_parameters(model: Any, c: dict[str, np.ndarray], holds_first: np.ndarray, holds_last: np.ndarray
                    ) -> dict[str, np.ndarray]:
    """Parameters one rank gathers per unit (:data:`UNITS`): a dense layer's ``sharded + replicated``, an MoE
    layer's dense part (its experts too when they share the dense buffer, ``ep = 1``:
    :func:`llmcomm.predict.dp.experts_in_own_buffer`) and expert part, the stage's non-layer parameters
    (:func:`llmcomm.step.edge_parameters`)."""
    tp, ep, etp, pp = c["tp"], c["ep"], c["etp"], c["pp"]
    sh_d, _, rep_d = step.layer_split(model, tp, ep, etp, moe=False)
    sh_m, ex_m, rep_m = step.layer_split(model, tp, ep, etp, moe=True)
    fold = ~moe_fold.experts_in_own_buffer(model, c)  # ep = 1 and etp = tp: the experts share the dense buffer
    edge = step.edge_parameters(model, tp, pp, holds_first, holds_last)[0]
    return {"d": sh_d + rep_d, "m": sh_m + rep_m + np.where(fold, ex_m, 0), "me": np.where(fold, 0, ex_m),
            "e": np.asarray(edge, np.int64) * np.ones_like(tp)}


def comm_items(model: Any, c: dict[str, np.ndarray], holds_first: np.ndarray, holds_last: np.ndarray,
               nd: np.ndarray, nm: np.ndarray) -> list[Any]:
    """The FSDP calls of a stage class per micro-batch as :class:`~llmcomm.overhead.iteration.CommItem` rows (term
    ``fsdp``, ``unit`` = ``<ag_f|ag_b|rs_b>:<unit>``); none where ``fsdp`` is off or the group has one rank."""
    from .iteration import CommItem  # iteration imports this module inside comm_items

    n = len(c["tp"])
    on = np.asarray(c.get("fsdp", np.zeros(n, bool)), dtype=bool)
    if not np.count_nonzero(on):
        return []
    P = unit_parameters(model, c, holds_first, holds_last)
    dpcp = c["dp"] * c["cp"]
    edp = moe_fold.expert_dp(c)  # world / (etp·ep·pp)
    rpn_dp = c.get("k_dpcp", c["k_dp"])
    has_edge = (np.asarray(holds_first) | np.asarray(holds_last)) & (P["e"] > 0)
    count = {"d": nd * (P["d"] > 0), "m": nm * (P["m"] > 0), "me": nm * (P["me"] > 0),
             "e": has_edge.astype(np.int64)}
    reshard = np.asarray(c.get("fsdp_reshard", np.ones(n, bool)), dtype=bool)
    mfsdp = c["distributed_optimizer"].astype(np.int64)  # Megatron-FSDP: the non-layer unit stays gathered
    pby, gby = c["param_dtype"], c["grad_reduce_dtype"]
    items = []
    for u in UNITS:
        size, rpn = (edp, c["k_edp"]) if u == "me" else (dpcp, rpn_dp)
        live = on & (size > 1)
        k = count[u] * live
        keep = mfsdp if u == "e" else 0  # Megatron-FSDP's non-unit modules (llmcomm.predict.dp.fsdp_edge_forward)
        for tag, op, phase, nbytes, cnt in (("ag_f", "all_gather", "forward", P[u] * pby, k * (1 - keep)),
                                            ("ag_b", "all_gather", "backward", P[u] * pby,
                                             k * reshard * (1 - keep)),
                                            ("rs_b", "reduce_scatter", "backward", P[u] * gby, k)):
            items.append(CommItem("fsdp", "dp", op, phase, nbytes, cnt.astype(np.int64), size, rpn, "microbatch",
                                  unit=f"{tag}:{u}"))
        if u == "e":  # gathered once per iteration, on the first micro-batch
            items.append(CommItem("fsdp", "dp", "all_gather", "forward", P[u] * pby, (k * keep).astype(np.int64),
                                  size, rpn, "iteration", unit="ag_f:e1"))
    return items


def exposed(r: dict[str, Any], f_layer: tuple[np.ndarray, np.ndarray], b_layer: tuple[np.ndarray, np.ndarray],
            vpp: np.ndarray) -> np.ndarray:
    """Exposed FSDP seconds per micro-batch of one stage class (module docstring) from its per-call times
    ``r["fsdp:<tag>:<unit>"]`` (zero where absent), the forward and backward seconds of one dense and one MoE
    layer (``f_layer``, ``b_layer``) and the chunk count ``vpp``."""
    n = len(vpp)
    z = np.zeros(n)

    def t(tag: str, u: str) -> np.ndarray:
        return np.asarray(r.get(f"fsdp:{tag}:{u}", z), dtype=np.float64)

    nd, nm = (np.asarray(x, dtype=np.float64) for x in (r["q"]["nd"], r["q"]["nm"]))
    layers = np.maximum(nd + nm, 1.0)
    v = np.minimum(vpp.astype(np.float64), layers)
    first = {"d": v * nd / layers, "m": v * nm / layers}  # each chunk's first (and last) layer, by kind
    a = {"d": t("ag_f", "d"), "m": t("ag_f", "m") + t("ag_f", "me")}
    ab = {"d": t("ag_b", "d"), "m": t("ag_b", "m") + t("ag_b", "me")}
    rs = {"d": t("rs_b", "d"), "m": t("rs_b", "m") + t("rs_b", "me")}
    cf = {"d": f_layer[0], "m": f_layer[1]}
    cb = {"d": b_layer[0], "m": b_layer[1]}
    count = {"d": nd, "m": nm}
    # the non-layer unit: exposed in full ("e1": Megatron-FSDP's once-per-iteration gather, per micro-batch)
    out = t("ag_f", "e") + t("ag_b", "e") + t("rs_b", "e") + t("ag_f", "e1")
    for k in ("d", "m"):
        rest = count[k] - first[k]
        out = out + first[k] * (a[k] + ab[k] + rs[k])
        out = out + rest * (np.maximum(0.0, a[k] - cf[k]) + np.maximum(0.0, ab[k] + rs[k] - cb[k]))
    return out


def total(r: dict[str, Any], vpp: np.ndarray) -> np.ndarray:
    """Every FSDP call's seconds per micro-batch of a stage class, before any overlap."""
    return np.asarray(r.get("fsdp", np.zeros(len(vpp))), dtype=np.float64)


def unit_bytes(layer_unit: Any, edge_unit: Any, stage_params: Any, *, param_bytes: Any, grad_bytes: Any, fsdp: Any,
               reshard: Any = True, megatron_fsdp: Any = False) -> tuple[Any, Any]:
    """``(weights, gradients)`` bytes of the gathered units on top of the shards (module docstring), ``P_unit`` the
    largest of the layer unit and (torch FSDP2, which wraps it) the non-layer unit; Megatron-FSDP keeps its
    non-layer parameters ``P_e`` gathered (:func:`llmcomm.predict.dp.fsdp_edge_forward`)::

        weights   += fsdp · (reshard ? 2·P_unit [+ P_e, Megatron-FSDP] : P_stage) · p
        gradients += fsdp · 2·P_unit · g
    """
    f = np.asarray(fsdp, dtype=bool)
    mf = np.asarray(megatron_fsdp, dtype=bool)
    unit = np.where(mf, layer_unit, np.maximum(layer_unit, edge_unit))
    held = np.where(np.asarray(reshard, dtype=bool), 2 * unit + np.where(mf, edge_unit, 0), np.asarray(stage_params))
    return np.where(f, held * param_bytes, 0.0), np.where(f, 2 * unit * grad_bytes, 0.0)


def largest_unit(ctx: Any, stage: int) -> tuple[int, int]:
    """``(layer, non-layer)``: the most parameters one layer unit of ``stage`` gathers on one rank (its dense plus
    expert shards) and the stage's non-layer parameters, from the predictor's counts
    (:func:`llmcomm.predict.dp.layer_parameters`, :func:`llmcomm.predict.dp.edge_parameters`)."""
    from ..predict import dp

    units = [dp.layer_parameters(ctx, la) for la in ctx.stage_layers(stage)]
    return max((u.dense + u.expert for u in units), default=0), dp.edge_parameters(ctx, stage)[0]
