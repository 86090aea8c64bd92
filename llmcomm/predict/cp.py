"""Context-parallel calls: ring attention over the CP group (Transformer Engine's ``cp_comm_type="p2p"``,
which Megatron-LM uses by default).

Each CP rank holds ``s/cp`` tokens of every sequence (two load-balanced halves). Attention needs every
rank's keys and values, passed around the CP ring: per transformer layer per micro-batch

* forward: ``cp - 1`` steps, each a send of this rank's current K and V block to the next CP rank and a recv
  from the previous one: ``KV = 2 · b · (s/cp) · (g·d/tp) · act`` bytes (``g`` KV heads of ``d`` channels,
  split over TP);
* backward: ``cp - 1`` steps, each a send (and recv) of K, V and their gradients: ``2·KV`` bytes.

Peers are CP-group offsets ``+1``/``-1`` (wrapping). An approximation of TE's schedule (which also folds the
last gradient exchange into the ring); calls are tagged ``cp``.
"""

from __future__ import annotations

from .calls import Call, Context


def kv_bytes(ctx: Context) -> int:
    """``2 · b · (s/cp) · (g·d/tp) · act``: one rank's K and V block."""
    m = ctx.model
    return 2 * ctx.tokens * (m.query_groups * m.head_dim // ctx.tp) * ctx.act


def _ring(ctx: Context, phase: str, nbytes: int, layer: int, mb: int) -> list[Call]:
    out: list[Call] = []
    for _ in range(ctx.parallel.cp - 1):
        out.append(Call(phase, "cp", "send", "cp_p2p", nbytes, ctx.act_dtype, layer, mb, peer=+1))
        out.append(Call(phase, "cp", "recv", "cp_p2p", nbytes, ctx.act_dtype, layer, mb, peer=-1))
    return out


def ring_forward(ctx: Context, layer: int, mb: int) -> list[Call]:
    return _ring(ctx, "forward", kv_bytes(ctx), layer, mb) if ctx.parallel.cp > 1 else []


def ring_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    return _ring(ctx, "backward", 2 * kv_bytes(ctx), layer, mb) if ctx.parallel.cp > 1 else []
