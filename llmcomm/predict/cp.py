"""Context-parallel calls: ring attention over the CP group (Transformer Engine's ``cp_comm_type="p2p"``,
which Megatron-LM uses by default).

Each CP rank holds ``s/cp`` tokens of every sequence (two load-balanced halves). Attention needs every
rank's keys and values, passed around the CP ring: per transformer layer per micro-batch

* forward: ``cp - 1`` steps, each a send of this rank's current K and V block to the next CP rank and a recv
  from the previous one: ``KV = 2 · b · (s/cp) · (g·d/tp) · act`` bytes (``g`` KV heads of ``d`` channels,
  split over TP);
* backward (TransformerEngine ``AttnFuncWithCPAndKVP2P.backward``, transformer_engine/pytorch/attention/
  dot_product_attention/context_parallel.py): ``cp`` steps in the opposite direction (``send_dst =
  cp_global_ranks[(rank - 1) % cp]``, ``recv_src = (rank + 1) % cp``); step 0 sends K, V only (``KV``), steps
  ``1 .. cp-2`` K, V and dK, dV (``2·KV``), the last step dK, dV only (``KV``): the same ``2·(cp-1)·KV``
  bytes as ``cp - 1`` steps of ``2·KV``, in ``cp`` calls.

Peers are CP-group offsets ``+1``/``-1`` (wrapping); calls are tagged ``cp``.
"""

from __future__ import annotations

from ..vocab import PhaseName
from .calls import Call, Context


def kv_bytes(ctx: Context) -> int:
    """One rank's K and V block: ``b · (s/cp) · (n_kv/tp) · (d_k + d_v) · act``, which is
    ``2 · b · (s/cp) · (g·d/tp) · act`` for (grouped-query) attention. TE sends ``torch.cat((k.view(-1),
    v.view(-1)))`` (context_parallel.py ~1690). With multi-head latent attention K and V have every head
    (``n_kv = a``) and ``d_k = qk_head_dim + qk_pos_emb_head_dim``, ``d_v = v_head_dim`` (DeepSeek-V3: 128·(192
    + 128) channels per token, against 2·8·128 for LLaMA-3's GQA): MLA's compression does not reach the ring,
    which carries the up-projected K and V (:attr:`llmcomm.specs.ModelSpec.kv_heads`)."""
    m = ctx.model
    return ctx.tokens * (m.kv_heads // ctx.tp) * (m.q_head_dim + m.value_head_dim) * ctx.act


def _step(ctx: Context, phase: PhaseName, nbytes: int, layer: int, mb: int, to: int) -> list[Call]:
    """One ring step: send to CP offset ``to``, receive from ``-to``."""
    return [Call(phase, "cp", "send", "cp_p2p", nbytes, ctx.act_dtype, layer, mb, peer=to),
            Call(phase, "cp", "recv", "cp_p2p", nbytes, ctx.act_dtype, layer, mb, peer=-to)]


def ring_forward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """``cp - 1`` steps of ``KV`` to the next CP rank (TE ``AttnFuncWithCPAndKVP2P.forward``)."""
    out: list[Call] = []
    for _ in range(ctx.parallel.cp - 1):
        out += _step(ctx, "forward", kv_bytes(ctx), layer, mb, +1)
    return out


def ring_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """``cp`` steps to the previous CP rank: ``KV``, then ``cp - 2`` of ``2·KV``, then ``KV``
    (TE ``AttnFuncWithCPAndKVP2P.backward``: ``send_tensor[0]`` at ``i == 0``, ``send_tensor[1]`` at
    ``i == cp_size - 1``)."""
    cp = ctx.parallel.cp
    if cp == 1:
        return []
    kv = kv_bytes(ctx)
    out: list[Call] = []
    for i in range(cp):
        out += _step(ctx, "backward", kv if i in (0, cp - 1) else 2 * kv, layer, mb, -1)
    return out
