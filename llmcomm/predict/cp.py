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

Megatron-LM's ``--cp-comm-type`` (:attr:`llmcomm.specs.ParallelConfig.cp_comm_type`; arguments.py:3221, passed
through ``TEDotProductAttention``, core/extensions/transformer_engine.py:2153, to TE's
``attn_forward_func_with_cp``, context_parallel.py:4924, which dispatches at :5110-5139) picks one of three
kernels. Line numbers are TransformerEngine d0067d0's context_parallel.py; ``Q = tokens·(a/tp)·d_q·act``,
``K = tokens·(n_kv/tp)·d_q·act``, ``V = tokens·(n_kv/tp)·d_v·act``, ``O = tokens·(a/tp)·d_v·act`` (``tokens =
b·s/cp``, ``d_q`` = :attr:`~llmcomm.specs.ModelSpec.q_head_dim`, ``d_v`` = ``value_head_dim``). Per
transformer layer per micro-batch:

``p2p`` (``AttnFuncWithCPAndKVP2P``, :1356): the ring above. Forward loop :1698: step ``i < cp − 1`` sends the
  KV block it computes with to ``(rank + 1) % cp`` and receives the next (:1707, ``flash_attn_p2p_communicate``
  :96, isend/irecv or ``batch_isend_irecv``) while step ``i``'s attention runs; backward loop :2460: step ``i``
  sends (:2493) and waits for its receive (:2717) around step ``i``'s attention backward.
``all_gather`` (``AttnFuncWithCPAndKVAllGather``, :3014, "KV all-gather between CP ranks is exposed"):
  forward ``all_gather(K)``, ``all_gather(V)`` over the CP group (:3215-3216, ``gather_along_first_dim``,
  distributed.py:1668), each ``cp·K`` / ``cp·V`` gathered bytes; backward the same two gathers again (:3788-3789)
  and, after the two chunks' kernels, ``reduce_scatter(dK)``, ``reduce_scatter(dV)`` of the gathered size
  (:4122-4123, ``reduce_scatter_along_first_dim``, distributed.py:931; synchronous). dK, dV are in the forward's
  nominal dtype (:3768-3776).
``a2a`` (``AttnFuncWithCPAndQKVOA2A``, :4170, DeepSpeed-Ulysses): forward one ``all_to_all_single`` each of Q, K,
  V (:4339, ``flash_attn_a2a_communicate`` :387, issued back to back, each waited before attention) and one of
  O after it (:4485); backward one of dO (:4677) and one each of dQ, dK, dV (:4837). ``bytes`` is the whole
  tensor a rank sends (its own ``1/cp`` included, split evenly over the CP group): ``Q``, ``K``, ``V``, ``O``.
``a2a+p2p`` (hierarchical: a2a inside ``hierarchical_context_parallel_sizes[0]``, the p2p ring across): refused
  (rule ``cp-hierarchical`` of :mod:`llmcomm.rules`).

The all-gathers, reduce-scatters and all-to-alls run on the CP group (kind ``cp``).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigError
from ..vocab import OpName, PhaseName
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


# ------------------------------------------------------------------------------------------ all_gather, a2a
def head_bytes(ctx: Context) -> dict[str, int]:
    """One rank's ``q``, ``k``, ``v``, ``o`` tensors in bytes (module docstring): ``tokens · heads/tp · head dim ·
    act`` with ``a`` query heads, :attr:`~llmcomm.specs.ModelSpec.kv_heads` key/value heads, ``d_q`` for Q and K,
    ``d_v`` for V and O."""
    m, t, a = ctx.model, ctx.tokens, ctx.act
    qh, kvh = m.num_attention_heads // ctx.tp, m.kv_heads // ctx.tp
    return {"q": t * qh * m.q_head_dim * a, "k": t * kvh * m.q_head_dim * a,
            "v": t * kvh * m.value_head_dim * a, "o": t * qh * m.value_head_dim * a}


def _coll(ctx: Context, phase: PhaseName, op: OpName, nbytes: int, layer: int, mb: int) -> Call:
    return Call(phase, "cp", op, "cp", nbytes, ctx.act_dtype, layer, mb)


def allgather_forward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """``all_gather`` of K then V over the CP group, ``cp·K`` and ``cp·V`` gathered bytes (TE
    ``AttnFuncWithCPAndKVAllGather.forward``, context_parallel.py:3215-3216)."""
    cp = ctx.parallel.cp
    if cp == 1:
        return []
    hb = head_bytes(ctx)
    return [_coll(ctx, "forward", "all_gather", cp * hb["k"], layer, mb),
            _coll(ctx, "forward", "all_gather", cp * hb["v"], layer, mb)]


def allgather_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """K and V gathered again (:3788-3789), then ``reduce_scatter`` of dK and dV, ``cp·K`` and ``cp·V`` input
    bytes (:4122-4123)."""
    cp = ctx.parallel.cp
    if cp == 1:
        return []
    hb = head_bytes(ctx)
    return [_coll(ctx, "backward", "all_gather", cp * hb["k"], layer, mb),
            _coll(ctx, "backward", "all_gather", cp * hb["v"], layer, mb),
            _coll(ctx, "backward", "reduce_scatter", cp * hb["k"], layer, mb),
            _coll(ctx, "backward", "reduce_scatter", cp * hb["v"], layer, mb)]


def a2a_forward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """``all_to_all`` of Q, K, V before attention (:4339) and of O after it (:4485)."""
    if ctx.parallel.cp == 1:
        return []
    hb = head_bytes(ctx)
    return [_coll(ctx, "forward", "all_to_all", hb[x], layer, mb) for x in ("q", "k", "v", "o")]


def a2a_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """``all_to_all`` of dO before the attention backward (:4677) and of dQ, dK, dV after it (:4837)."""
    if ctx.parallel.cp == 1:
        return []
    hb = head_bytes(ctx)
    return [_coll(ctx, "backward", "all_to_all", hb[x], layer, mb) for x in ("o", "q", "k", "v")]


Generator = Callable[[Context, int, int], list[Call]]
GENERATORS: dict[str, tuple[Generator, Generator, str]] = {
    "p2p": (ring_forward, ring_backward, "cp_ring"),
    "all_gather": (allgather_forward, allgather_backward, "cp_all_gather"),
    "a2a": (a2a_forward, a2a_backward, "cp_a2a"),
}


def generators(ctx: Context) -> tuple[Generator, Generator, str]:
    """``(forward, backward, audit origin)`` of the configuration's ``cp_comm_type``."""
    kind = ctx.parallel.cp_comm_type
    if kind not in GENERATORS:
        raise ConfigError(f"cp_comm_type={kind!r} is not predicted (one of {tuple(GENERATORS)}; rule cp-hierarchical)")
    return GENERATORS[kind]


def attention_forward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """The CP calls inside core attention's forward for the configuration's ``cp_comm_type``."""
    return generators(ctx)[0](ctx, layer, mb)


def attention_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """The CP calls inside core attention's backward for the configuration's ``cp_comm_type``."""
    return generators(ctx)[1](ctx, layer, mb)
