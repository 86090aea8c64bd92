"""Expert-parallel calls of an MoE layer (Megatron-LM's ``MoEAlltoAllTokenDispatcher``) and routing input.

Per MoE layer per micro-batch, with ``T = local_tokens`` (``b·s/cp``, divided by ``tp`` under SP), ``k`` the
router's top-k, ``E`` experts, ``h`` hidden, ``act`` bytes per element, the EP group of ``ep`` ranks, expert
``e`` living on EP position ``e // (E/ep)``:

* forward: all-to-all *dispatch* (each rank sends each token's hidden state to the ranks of its k experts),
  experts, all-to-all *combine* (the outputs go back);
* backward: the combine's backward (same splits as the dispatch), then the dispatch's backward (same splits
  as the combine).

Split sizes: ``D[r, j] = Σ_{e on j} tokens(r → e)`` tokens; rank ``r`` sends ``D[r, j]·h·act`` bytes to peer
``j`` in a dispatch and ``D[j, r]·h·act`` in a combine. Under uniform routing ``tokens(r → e) = T·k/E`` so
every split is ``T·k·h·act/ep`` (rounded to whole bytes); ``bytes`` of an all-to-all is the sum of its splits
(what the rank sends, itself included).

With ``tp > 1`` (Megatron requires sequence parallelism then), the expert block gathers the dispatched tokens
over the TP group and scatters them back: all-gather and reduce-scatter of ``b·s/cp·k·h·act`` (expected
size), swapped in the backward. Shared experts add the TP calls of a dense MLP block.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..vocab import ROUTING_COLUMNS
from . import tp as tpmod
from .calls import Call, Context


def uniform_split_bytes(ctx: Context) -> int:
    """Expected bytes one rank sends to each EP peer (itself included) under uniform routing."""
    m = ctx.model
    return round(ctx.local_tokens * m.moe_router_topk * m.hidden_size * ctx.act / ctx.parallel.ep)


def _a2a(ctx: Context, phase: str, route: str, layer: int, mb: int) -> Call:
    return Call(phase, "ep", "all_to_all", "ep", uniform_split_bytes(ctx) * ctx.parallel.ep, ctx.act_dtype,
                layer, mb, route=route)


def _expert_tp(ctx: Context, phase: str, layer: int, mb: int) -> list[Call]:
    if ctx.tp == 1:
        return []
    m = ctx.model
    n = ctx.tokens * m.moe_router_topk * m.hidden_size * ctx.act
    # forward: gather then scatter; backward: the scatter's transpose (gather) then the gather's (scatter)
    return [Call(phase, "sp", op, "tp", n, ctx.act_dtype, layer, mb) for op in ("all_gather", "reduce_scatter")]


def moe_forward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """Dispatch, expert TP gather/scatter, combine; then the shared experts' TP calls."""
    ep = ctx.parallel.ep > 1
    out = [_a2a(ctx, "forward", "dispatch", layer, mb)] if ep else []
    out += _expert_tp(ctx, "forward", layer, mb)
    out += [_a2a(ctx, "forward", "combine", layer, mb)] if ep else []
    if ctx.model.num_shared_experts:
        out += tpmod.block_forward(ctx, layer, mb)
    return out


def moe_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """Shared experts' TP backward, then the combine's backward (dispatch-shaped), expert TP, and the
    dispatch's backward (combine-shaped)."""
    ep = ctx.parallel.ep > 1
    out = tpmod.block_backward(ctx, layer, mb) if ctx.model.num_shared_experts else []
    out += [_a2a(ctx, "backward", "dispatch", layer, mb)] if ep else []
    out += _expert_tp(ctx, "backward", layer, mb)
    out += [_a2a(ctx, "backward", "combine", layer, mb)] if ep else []
    return out


# ------------------------------------------------------------------------------------------ routing
def routing_counts(routing: pd.DataFrame | np.ndarray, ctx: Context, world: int) -> tuple[np.ndarray, int]:
    """Routing as a dense ``[layer, microbatch, src_rank, expert]`` token-count array and its iteration.

    ``routing`` is either that array (shape ``(num_layers, num_microbatches, world, num_experts)``, layers
    numbered globally, non-MoE layers ignored) or a DataFrame with ``ROUTING_COLUMNS`` (one iteration)."""
    m = ctx.model
    expect = (m.num_layers, ctx.num_microbatches, world, m.num_experts)
    iteration = 0
    if isinstance(routing, pd.DataFrame):
        missing = [c for c in ROUTING_COLUMNS if c not in routing.columns]
        if missing:
            raise ConfigError(f"routing lacks column(s) {missing}; expected columns {list(ROUTING_COLUMNS)}")
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
