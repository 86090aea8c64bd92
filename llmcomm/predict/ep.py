"""Expert-parallel calls of an MoE layer (Megatron-LM's token dispatchers,
``megatron/core/transformer/moe/token_dispatcher.py``) and routing input.

Per MoE layer per micro-batch, with ``T = local_tokens`` (``b·s/cp``, divided by ``tp`` under SP), ``k`` the
router's top-k, ``E`` experts, ``h`` hidden, ``act`` bytes per element (the routing probabilities are in the
activation dtype unless ``moe_router_dtype`` is set: ``topk_routing_with_score_function`` returns
``probs.type_as(logits)``), ``etp`` the expert
tensor-parallel size, the EP group of ``ep`` ranks, expert ``e`` living on EP position ``e // (E/ep)``.

``moe_token_dispatcher_type="alltoall"`` (``MoEAlltoAllTokenDispatcher``), forward:

1. ``preprocess``: all-gather of the per-expert token counts (``E`` int64) over the ``etp × ep`` group
   (``gather_from_sequence_parallel_region(num_local_tokens_per_expert, group=self.tp_ep_group)``):
   ``etp·ep·E·8`` bytes gathered; no gradient, so nothing in the backward (only when ``etp·ep > 1``);
2. ``token_dispatch``: all-to-all *dispatch* of the tokens over EP, then the all-to-all of the routing
   probabilities with the same splits (``global_probs = all_to_all(self.ep_group, permuted_probs, ...)``);
3. ``dispatch_postprocess`` (``etp > 1``): all-gather over the expert-TP group of the received tokens
   (``etp·T·k·h·act`` gathered, expected size) and of their probabilities (``etp·T·k·act``);
4. experts; ``combine_preprocess`` (``etp > 1``): reduce-scatter of the expert output over expert-TP;
5. ``token_combine``: all-to-all *combine* over EP.

Backward, in reverse: the combine's backward (dispatch-shaped all-to-all), the reduce-scatter's (all-gather),
the two expert-TP all-gathers' (reduce-scatters: probabilities, then tokens), the probabilities' all-to-all
(combine-shaped), then the tokens' (combine-shaped).

``moe_token_dispatcher_type="allgather"`` (``MoEAllGatherTokenDispatcher.token_dispatch``/``token_combine``),
with ``n = etp·ep`` (the ``tp_ep`` group), when ``n > 1``: forward all-gathers over that group of the routing map
(``T·E`` booleans, no gradient: ``n·T·E`` bytes), of the probabilities (``n·T·E·act``) and of the hidden states
(``n·T·h·act``), then after the experts a reduce-scatter of ``n·T·h·act``; backward: all-gather
``n·T·h·act`` (the reduce-scatter's), reduce-scatter ``n·T·h·act`` (the hidden-state gather's) and
reduce-scatter ``n·T·E·act`` (the probabilities'). It moves ``n/k`` times the alltoall dispatcher's bytes.

``flex`` (DeepEP / HybridEP fused kernels) is refused: its traffic is not made of NCCL collectives. What its calls
would be, per MoE layer and micro-batch over the ``tp_ep`` group (token_dispatcher.py:1809-1840, fused_a2a.py:72-165
DeepEP, :358-520 HybridEP): forward one fused *dispatch* — the layout step (``get_dispatch_layout``: per-rank and
per-node token counts, ``is_token_in_rank``, exchanged with the data) then each token sent once to every node holding
one of its experts (RDMA, to the GPU of the same local index) and forwarded there once to every GPU holding one
(NVLink), with its top-k indices and fp32 weights — and one fused *combine*, the reverse with the expert outputs
summed per GPU and per node before they travel; backward the combine's backward (a dispatch-shaped transfer) and the
dispatch's (a combine-shaped one). Under uniform routing a token reaches ``ep·(1 − C(E − E/ep, k)/C(E, k))`` GPUs
instead of ``k`` copies. No op of the events table is a two-hop forwarded transfer, so these are not written.

Split sizes of the routed all-to-alls: ``D[r, j] = Σ_{e on j} tokens(r → e)`` tokens; rank ``r`` sends
``D[r, j]·h·act`` bytes (``D[r, j]·act`` for the probabilities) to peer ``j`` in a dispatch and ``D[j, r]·…``
in a combine. Under uniform routing ``tokens(r → e) = T·k/E`` so every split is ``T·k·h·act/ep`` (rounded to
whole bytes); ``bytes`` of an all-to-all is the sum of its splits (what the rank sends, itself included).

With ``aux_loss`` load balancing (``moe_aux_loss_coeff > 0``) the router all-reduces the per-expert token
counts (``E`` int64) over the ``tp × cp`` group in the forward (``TopKRouter._apply_aux_loss`` ->
``get_tokens_per_expert_and_token_count``, moe_utils.py); ``seq_aux_loss`` and ``global_aux_loss`` add theirs
(:func:`aux_loss_allreduce`), the expert-bias update one per iteration (:func:`expert_bias_allreduce`).
Shared experts add the TP calls of a dense MLP block, before the router in the forward and after the routed
path in the backward (:func:`moe_forward`).

``moe_router_dtype`` (``fp32``/``fp64``) puts the probabilities in that dtype, and with them every call that
carries them: the probabilities' all-to-alls and expert-TP all-gathers, the allgather dispatcher's
probabilities all-gather, and the reductions the dispatchers run in ``probs.dtype`` — the alltoall
dispatcher's expert-TP reduce-scatter in ``combine_preprocess`` (token_dispatcher.py ~824-833) and the
allgather dispatcher's ``token_combine`` reduce-scatter (~355-367) — with their backward all-gathers. The
token all-to-alls stay in the activation dtype (``combine_preprocess`` casts back before ``token_combine``).

With unequal split sizes the expert-TP all-gather and reduce-scatter are coalesced broadcasts and reduces,
not NCCL collectives (:func:`expert_tp_ops` states the rule); the expected-value prediction has equal
splits.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..vocab import ROUTING_COLUMNS, OpName, PhaseName, RouteName
from . import tp as tpmod
from .calls import Call, Context


def uniform_split_bytes(ctx: Context) -> int:
    """Expected bytes one rank sends to each EP peer (itself included) under uniform routing."""
    m = ctx.model
    return round(ctx.local_tokens * m.moe_router_topk * m.hidden_size * ctx.act / ctx.parallel.ep)


def uniform_probs_split_bytes(ctx: Context) -> int:
    """Expected bytes of routing probabilities one rank sends to each EP peer: ``T·k·p/ep`` (``p`` bytes of
    the probabilities' dtype, :attr:`Context.probs_bytes`)."""
    return round(ctx.local_tokens * ctx.model.moe_router_topk * ctx.probs_bytes / ctx.parallel.ep)


def _a2a(ctx: Context, phase: PhaseName, route: RouteName, layer: int, mb: int) -> Call:
    return Call(phase, "ep", "all_to_all", "ep", uniform_split_bytes(ctx) * ctx.parallel.ep, ctx.act_dtype,
                layer, mb, route=route)


def _probs_a2a(ctx: Context, phase: PhaseName, route: Literal["dispatch", "combine"], layer: int, mb: int) -> Call:
    return Call(phase, "ep", "all_to_all", "ep", uniform_probs_split_bytes(ctx) * ctx.parallel.ep,
                ctx.probs_dtype, layer, mb, route="probs_dispatch" if route == "dispatch" else "probs_combine")


def _expert_tp(ctx: Context, phase: PhaseName, layer: int, mb: int) -> list[Call]:
    """Expert-TP all-gathers of the received tokens and probabilities, and the reduce-scatter of the output
    (``dispatch_postprocess``/``combine_preprocess``), in issue order for ``phase``."""
    etp = ctx.parallel.expert_tp
    if etp == 1:
        return []
    m = ctx.model
    rows = ctx.local_tokens * etp * m.moe_router_topk  # tokens gathered over expert TP (expected size)
    tok, prb = rows * m.hidden_size * ctx.act, rows * ctx.probs_bytes
    dt, pdt = ctx.act_dtype, ctx.probs_dtype
    if phase == "forward":
        return [Call(phase, "sp", "all_gather", "etp", tok, dt, layer, mb),
                Call(phase, "sp", "all_gather", "etp", prb, pdt, layer, mb)]
    return [Call(phase, "sp", "reduce_scatter", "etp", prb, pdt, layer, mb),
            Call(phase, "sp", "reduce_scatter", "etp", tok, dt, layer, mb)]


def _expert_tp_out(ctx: Context, phase: PhaseName, layer: int, mb: int) -> list[Call]:
    """``combine_preprocess``'s expert-TP reduce-scatter (backward: all-gather), run in the probabilities'
    dtype: ``reduce_scatter_to_sequence_parallel_region(hidden_states.to(self.probs.dtype), ...)``
    (token_dispatcher.py ~824-833), so in fp32 under ``moe_router_dtype="fp32"``."""
    etp = ctx.parallel.expert_tp
    if etp == 1:
        return []
    m = ctx.model
    n = ctx.local_tokens * etp * m.moe_router_topk * m.hidden_size * ctx.probs_bytes
    op: OpName = "reduce_scatter" if phase == "forward" else "all_gather"
    return [Call(phase, "sp", op, "etp", n, ctx.probs_dtype, layer, mb)]


def expert_tp_ops(split_tokens: list[int], row_bytes: int, phase: str) -> list[tuple[str, int, int]]:
    """What ProcessGroupNCCL runs for the alltoall dispatcher's expert-TP all-gather (``phase="forward"``) or
    reduce-scatter with split sizes, as ``(op, bytes, root)`` (``root`` -1 for a collective).

    ``gather_from_sequence_parallel_region(..., output_split_sizes=...)`` and
    ``reduce_scatter_to_sequence_parallel_region(..., input_split_sizes=...)`` call
    ``torch.distributed.all_gather(list, ...)`` / ``reduce_scatter(out, list, ...)``
    (core/tensor_parallel/mappings.py ~147-154, ~187-196). ``ProcessGroupNCCL::allgather`` flattens the list
    into one ``ncclAllGather`` only when every tensor has the same size; otherwise it issues, inside one
    coalescing group, a broadcast from each rank ``i`` of its ``split_tokens[i]`` rows (``_broadcast_oop``);
    ``reduce_scatter`` likewise falls back to one reduce per rank ``i`` rooted at ``i`` (``_reduce_oop``)
    (pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, ``allgather`` / ``reduce_scatter``). The rule:

        equal splits:   one all_gather / reduce_scatter of ``Σ splits · row_bytes``
        unequal splits: ``etp`` broadcasts / reduces, the ``i``-th of ``split_tokens[i] · row_bytes``, root ``i``

    The predictor's expected-value calls (uniform routing) have equal splits, so they are the collective; a
    routed trace's splits differ per layer and micro-batch and are not expanded into per-root calls here."""
    sizes = [int(n) * row_bytes for n in split_tokens]
    if len(set(sizes)) <= 1:
        return [("all_gather" if phase == "forward" else "reduce_scatter", sum(sizes), -1)]
    op = "broadcast" if phase == "forward" else "reduce"
    return [(op, n, i) for i, n in enumerate(sizes)]


def _lb_coeff(ctx: Context, kind: str) -> float:
    """``TopKRouter.get_aux_loss_coeff``: the coefficient of balancing type ``kind`` (router.py ~388-401);
    one ``moe_aux_loss_coeff`` serves every listed type here."""
    p = ctx.parallel
    return p.moe_aux_loss_coeff if kind in p.load_balancing_types else 0.0


def aux_loss_allreduce(ctx: Context, layer: int, mb: int) -> list[Call]:
    """The router's token-count all-reduces in the forward (``TopKRouter.routing``, router.py ~805-833), each
    ``get_tokens_per_expert_and_token_count`` -> ``reduce_from_tensor_model_parallel_region`` of
    ``routing_map.sum(dim=0)`` (int64, moe_utils.py ~269-288), when its coefficient is > 0, in this order:

    * ``aux_loss``: ``E`` counts over ``tp × cp`` (``_apply_aux_loss``, ~410-448);
    * ``seq_aux_loss``: the routing map reshaped to ``(s, b·E)``, so ``b·E`` counts over ``tp × cp``
      (``_apply_seq_aux_loss``, ~450-505);
    * ``global_aux_loss``: ``E`` counts over ``tp × dp × cp`` (``_apply_global_aux_loss``, ~507-551)."""
    p = ctx.parallel
    E, b = ctx.model.num_experts, p.micro_batch
    out = []
    for kind, n, group, size in (("aux_loss", E, "tpcp", ctx.tp * p.cp), ("seq_aux_loss", b * E, "tpcp", ctx.tp * p.cp),
                                 ("global_aux_loss", E, "tpdpcp", ctx.tp * p.dp * p.cp)):
        if _lb_coeff(ctx, kind) > 0 and size > 1:
            out.append(Call("forward", "ep", "all_reduce", group, 8 * n, "int64", layer, mb))
    return out


def expert_bias_allreduce(ctx: Context, stage: int) -> list[Call]:
    """``moe_router_enable_expert_bias`` (aux-loss-free balancing, DeepSeek-V3): once per iteration in
    ``finalize_model_grads``, after the embedding all-reduces, ``_update_router_expert_bias`` stacks every local
    router's ``local_tokens_per_expert`` (fp32, ``E`` each) and ``get_updated_expert_bias`` all-reduces it over
    ``tp × dp × cp`` (core/distributed/finalize_model_grads.py ~334-371, ~690; moe_utils.py ~1198-1230):
    ``n·E·4`` bytes with ``n`` the stage's MoE layers."""
    p = ctx.parallel
    n = sum(ctx.moe_pattern[la] for la in ctx.stage_layers(stage))
    if not p.moe_router_enable_expert_bias or not n or ctx.tp * p.dp * p.cp == 1:
        return []
    return [Call("optimizer", "ep", "all_reduce", "tpdpcp", 4 * n * ctx.model.num_experts, "fp32")]


def _allgather_dispatcher(ctx: Context, phase: PhaseName, layer: int, mb: int, before: bool) -> list[Call]:
    """``MoEAllGatherTokenDispatcher`` calls before (``before``) or after the experts, over ``etp × ep``."""
    n = ctx.parallel.expert_tp * ctx.parallel.ep
    if n == 1:
        return []
    m, T, dt, pdt = ctx.model, ctx.local_tokens, ctx.act_dtype, ctx.probs_dtype
    hid, prb, rmap = n * T * m.hidden_size * ctx.act, n * T * m.num_experts * ctx.probs_bytes, n * T * m.num_experts
    out_ = n * T * m.hidden_size * ctx.probs_bytes  # token_combine reduce-scatters in the probs' dtype (~355-367)
    if phase == "forward":
        if before:
            return [Call(phase, "ep", "all_gather", "tpep", rmap, "bool", layer, mb),
                    Call(phase, "ep", "all_gather", "tpep", prb, pdt, layer, mb),
                    Call(phase, "ep", "all_gather", "tpep", hid, dt, layer, mb)]
        return [Call(phase, "ep", "reduce_scatter", "tpep", out_, pdt, layer, mb)]
    if before:
        return [Call(phase, "ep", "all_gather", "tpep", out_, pdt, layer, mb)]
    return [Call(phase, "ep", "reduce_scatter", "tpep", hid, dt, layer, mb),
            Call(phase, "ep", "reduce_scatter", "tpep", prb, pdt, layer, mb)]


def _check_dispatcher(ctx: Context) -> str:
    kind = ctx.parallel.moe_token_dispatcher_type
    if kind == "flex":
        raise ConfigError("moe_token_dispatcher_type='flex' (DeepEP/HybridEP fused kernels) is not predicted: "
                          "its traffic is not NCCL collectives (a token crosses RDMA once per destination node "
                          "and NVLink once per destination GPU, fused_a2a.py); use 'alltoall' or 'allgather'")
    return kind


def moe_forward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """The shared experts' TP calls, the router's token-count all-reduces, then the dispatcher's forward calls
    around the experts: ``MoELayer.forward`` computes ``shared_experts_compute(hidden_states)`` before
    ``route`` (core/transformer/moe/moe_layer.py ~660-662; without ``moe_shared_expert_overlap``, the
    default)."""
    kind = _check_dispatcher(ctx)
    out = tpmod.block_forward(ctx, layer, mb) if ctx.model.num_shared_experts else []
    out += aux_loss_allreduce(ctx, layer, mb)
    if kind == "allgather":
        out += _allgather_dispatcher(ctx, "forward", layer, mb, True)
        out += _allgather_dispatcher(ctx, "forward", layer, mb, False)
    else:
        p = ctx.parallel
        if p.ep * p.expert_tp > 1:
            n = p.ep * p.expert_tp * ctx.model.num_experts * 8
            out.append(Call("forward", "ep", "all_gather", "tpep", n, "int64", layer, mb))
        if p.ep > 1:
            out += [_a2a(ctx, "forward", "dispatch", layer, mb), _probs_a2a(ctx, "forward", "dispatch", layer, mb)]
        out += _expert_tp(ctx, "forward", layer, mb)
        out += _expert_tp_out(ctx, "forward", layer, mb)
        out += [_a2a(ctx, "forward", "combine", layer, mb)] if p.ep > 1 else []
    return out


def moe_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """The dispatcher's backward calls (see the module docstring), then the shared experts' TP backward:
    autograd runs the later-recorded routed path first (its nodes were created after the shared experts'),
    the shared experts last."""
    kind = _check_dispatcher(ctx)
    out: list[Call] = []
    if kind == "allgather":
        out += _allgather_dispatcher(ctx, "backward", layer, mb, True)
        out += _allgather_dispatcher(ctx, "backward", layer, mb, False)
    else:
        ep = ctx.parallel.ep > 1
        out += [_a2a(ctx, "backward", "dispatch", layer, mb)] if ep else []
        out += _expert_tp_out(ctx, "backward", layer, mb)
        out += _expert_tp(ctx, "backward", layer, mb)
        if ep:
            out += [_probs_a2a(ctx, "backward", "combine", layer, mb), _a2a(ctx, "backward", "combine", layer, mb)]
    if ctx.model.num_shared_experts:
        out += tpmod.block_backward(ctx, layer, mb)
    return out


# ------------------------------------------------------------------------------------------ routing
def check_routing_columns(routing: pd.DataFrame) -> None:
    """Raise :class:`ConfigError` naming the ``ROUTING_COLUMNS`` a routing table lacks."""
    missing = [c for c in ROUTING_COLUMNS if c not in routing.columns]
    if missing:
        raise ConfigError(f"routing lacks column(s) {missing}; expected columns {list(ROUTING_COLUMNS)}")


def routing_counts(routing: pd.DataFrame | np.ndarray, ctx: Context, world: int) -> tuple[np.ndarray, int]:
    """Routing as a dense ``[layer, microbatch, src_rank, expert]`` token-count array and its iteration.

    ``routing`` is either that array (shape ``(num_layers, num_microbatches, world, num_experts)``, layers
    numbered globally, non-MoE layers ignored) or a DataFrame with ``ROUTING_COLUMNS`` (one iteration)."""
    m = ctx.model
    expect = (m.num_layers, ctx.num_microbatches, world, m.num_experts)
    iteration = 0
    if isinstance(routing, pd.DataFrame):
        check_routing_columns(routing)
        its = pd.unique(routing["iteration"])
        if len(its) > 1:
            raise ConfigError(f"routing holds iterations {sorted(int(i) for i in its)}; pass one iteration")
        iteration = int(its[0]) if len(its) else 0
        idx = {c: routing[c].to_numpy(np.int64) for c in ROUTING_COLUMNS[1:]}
        for c, hi in (("layer", expect[0]), ("microbatch", expect[1]), ("src_rank", expect[2]),
                      ("expert", expect[3])):
            bad = (idx[c] < 0) | (idx[c] >= hi)
            if bad.any():
                raise ConfigError(f"routing column {c!r} has {int(idx[c][bad][0])} outside 0..{hi - 1}")
        if (idx["tokens"] < 0).any():
            raise ConfigError("routing has negative token counts")
        arr = np.zeros(expect, dtype=np.int64)
        np.add.at(arr, (idx["layer"], idx["microbatch"], idx["src_rank"], idx["expert"]), idx["tokens"])
        return arr, iteration
    arr = np.asarray(routing)
    if arr.shape != expect:
        raise ConfigError(f"routing array has shape {arr.shape}; expected {expect} "
                          "(num_layers, num_microbatches, world_size, num_experts)")
    if arr.dtype.kind not in "iuf" or (arr.dtype.kind == "f" and not np.all(np.mod(arr, 1) == 0)):
        raise ConfigError(f"routing array must hold whole token counts, got dtype {arr.dtype}")
    if (arr < 0).any():
        raise ConfigError(f"routing array of shape {arr.shape} has negative token counts")
    return arr.astype(np.int64), iteration


def peer_tokens(counts: np.ndarray, ep: int) -> np.ndarray:
    """``D[layer, mb, src, j]``: tokens ``src`` sends to EP position ``j`` (experts summed per position)."""
    L, M, W, E = counts.shape
    return counts.reshape(L, M, W, ep, E // ep).sum(axis=-1)
