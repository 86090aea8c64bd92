"""Tensor-parallel calls (Megatron-LM's ``megatron/core/tensor_parallel``).

Per transformer layer per micro-batch, with ``A = act_bytes = b·s·h·act/cp`` (see :mod:`.calls`):

* without SP: forward 2 all-reduces of ``A`` (``reduce_from_tensor_model_parallel_region`` after the
  row-parallel attention projection and MLP output); backward 2 all-reduces of ``A`` (the column-parallel
  QKV and FC1 input gradients, ``copy_to_tensor_model_parallel_region``'s backward).
* with SP: forward all-gather ``A`` + reduce-scatter ``A`` for attention and again for the MLP; backward,
  per block in reverse: all-gather ``A`` (row-parallel output gradient, backward of the reduce-scatter),
  all-gather ``A`` (the column-parallel layer re-gathers its saved s/tp input for the weight gradient,
  ``LinearWithGradAccumulationAndAsyncCommunication.backward``), reduce-scatter ``A`` (input gradient).
* vocabulary-parallel embedding (``VocabParallelEmbedding.forward``, layers.py): forward all-reduce of ``A``
  (SP: reduce-scatter of ``A``, except with learned absolute positions, see :func:`embedding_forward`);
  backward nothing without SP (all-gather of ``A`` with SP).
* output layer (``ColumnParallelLinear``, its input copied to the TP region): forward nothing
  (SP: all-gather ``A``); backward all-reduce ``A`` of the input gradient (SP: all-gather + reduce-scatter,
  see :func:`output_backward`).
* vocabulary-parallel cross-entropy (``_VocabParallelCrossEntropy.forward``, cross_entropy.py): three fp32
  all-reduces of ``b·s/cp`` values each, in this order: logits max (``ReduceOp.MAX``), predicted logits,
  sum of exp-logits; nothing in backward (two with ``cross_entropy_loss_fusion``: :func:`cross_entropy`).
* multi-head latent attention (DeepSeek-V3) replaces the attention block's gathers by those of its
  compressed activations (:func:`attention_forward`, :func:`attention_backward`).

Under FP8 (``fp8`` set) the transformer blocks' SP all-gathers and reduce-scatters carry the bytes
TransformerEngine sends (:mod:`.fp8_wire`: the gathers FP8, ``A/act`` bytes plus any scales; the reduce-scatters
``A`` unless userbuffers' ``fp8_buf``; current scaling adds a 4-byte amax all-reduce before each gathered cast);
the embedding's and output layer's calls (Megatron's own, outside TE) stay in the activation dtype.

Every call is skipped when ``tp == 1``. The SP all-gathers and reduce-scatters are tagged ``sp`` (the TP group
carries them), the all-reduces ``tp``. Sources: NVIDIA/Megatron-LM ``megatron/core/tensor_parallel/
{layers.py, mappings.py, cross_entropy.py}``.
"""

from __future__ import annotations

from ..vocab import OpName, ParallelismName, PhaseName
from . import fp8_wire
from .calls import Call, Context


def _c(ctx: Context, phase: PhaseName, op: OpName, nbytes: int, layer: int, mb: int, dtype: str | None = None) -> Call:
    """A call on the TP group; sequence-parallel all-gathers/reduce-scatters are tagged ``sp``."""
    par: ParallelismName = "sp" if op in ("all_gather", "reduce_scatter") else "tp"
    return Call(phase, par, op, "tp", nbytes, dtype or ctx.act_dtype, layer, mb)


def _sp(ctx: Context, phase: PhaseName, op: OpName, kind: str, layer: int, mb: int, fprop: str = "",
        elements: int | None = None) -> list[Call]:
    """One SP collective of a transformer block, in the bytes and dtype TransformerEngine sends it under the
    configuration's FP8 recipe (:mod:`.fp8_wire`; the activation dtype without FP8), preceded by current
    scaling's amax all-reduce where the recipe has one. ``fprop``: the block's row-parallel userbuffers layer
    (``proj_fprop``, ``fc2_fprop``), whose ``fp8_buf`` decides the forward reduce-scatter's dtype; ``elements``
    of the gathered buffer (default ``T·h``; MLA's compressed widths)."""
    p = ctx.parallel
    fb = fprop in p.tp_comm_overlap_fp8_buf
    n = ctx.tokens * ctx.model.hidden_size if elements is None else elements
    nbytes, dtype = fp8_wire.nbytes(kind, n, ctx.act, p.fp8, p.fp8_recipe, p.tp_comm_overlap, fb)
    out = [_c(ctx, phase, op, nbytes, layer, mb, dtype)]
    if fp8_wire.amax_allreduce(kind, p.fp8, p.fp8_recipe):
        out.insert(0, Call(phase, "tp", "all_reduce", "tp", fp8_wire.AMAX_BYTES, "fp32", layer, mb))
    return out


def block_forward(ctx: Context, layer: int, mb: int, fprop: str = "fc2_fprop") -> list[Call]:
    """One attention or MLP block, forward: SP ``[AG, RS]``, else ``[AR]``. With SP the AG and RS bytes follow
    the FP8 recipe (:func:`_sp`, :mod:`.fp8_wire`: the AG in FP8, the RS in the activation dtype unless
    userbuffers' ``fp8_buf``; tensorwise: an amax all-reduce before the AG); ``fprop`` names the block's
    row-parallel layer for that (``proj_fprop`` for attention)."""
    if ctx.tp == 1:
        return []
    if ctx.sp:
        return (_sp(ctx, "forward", "all_gather", "fwd_ag", layer, mb)
                + _sp(ctx, "forward", "reduce_scatter", "fwd_rs", layer, mb, fprop))
    return [_c(ctx, "forward", "all_reduce", ctx.act_bytes, layer, mb)]


def block_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """One attention or MLP block, backward: SP ``[AG, AG, RS]``, else ``[AR]``; with SP in the FP8 recipe's bytes
    (:func:`_sp`: grad-output AG and input re-gather in FP8, dgrad RS in the activation dtype; tensorwise: an amax
    all-reduce before the grad-output AG)."""
    if ctx.tp == 1:
        return []
    if ctx.sp:
        return (_sp(ctx, "backward", "all_gather", "bwd_ag_grad", layer, mb)
                + _sp(ctx, "backward", "all_gather", "bwd_ag_input", layer, mb)
                + _sp(ctx, "backward", "reduce_scatter", "bwd_rs", layer, mb))
    return [_c(ctx, "backward", "all_reduce", ctx.act_bytes, layer, mb)]


def _mla_gathers(ctx: Context) -> list[int]:
    """Bytes of the SP all-gathers of MLA's compressed activations, in forward order: the rotary key part
    ``T·d_rope`` (``gather_from_sequence_parallel_region(k_pos_emb)``), then the inputs of the column-parallel
    up projections, ``T·q_lora`` (``linear_q_up_proj``; ``T·h`` for ``linear_q_proj`` without ``q_lora_rank``)
    and ``T·kv_lora`` (``linear_kv_up_proj``), ``T = b·s/cp`` (core/transformer/multi_latent_attention.py
    ~645-663 the duplicated down projections on the ``s/tp`` tokens, ~748-763 the k_pos_emb gather, ~865-875
    the up projections)."""
    m, t, a = ctx.model, ctx.tokens, ctx.act
    q = m.q_lora_rank if m.q_lora_rank is not None else m.hidden_size
    return [t * m.qk_pos_emb_head_dim * a, t * q * a, t * m.kv_lora_rank * a]


def attention_forward(ctx: Context, layer: int, mb: int) -> tuple[list[Call], list[Call]]:
    """The attention block's TP calls forward, split around core attention (the CP ring goes between).

    Standard: ``([AG A], [RS A])`` with SP, ``([], [AR A])`` without. Multi-head latent attention with SP
    (:func:`_mla_gathers`): ``([AG T·d_rope, AG T·q_lora, AG T·kv_lora], [RS A])`` — the down projections run
    on the sequence-parallel input without communication (TELinear ``duplicated``), so the gathers carry the
    compressed rank (DeepSeek-V3: 64 + 1536 + 512 = 2112 channels instead of h = 7168) rather than ``A``. MLA
    with TP and without SP is refused by the predictor (see :func:`llmcomm.predict._check_supported`). Under FP8
    the up projections' gathers (TE column-parallel linears, Megatron-LM gpt_layer_specs.py's MLA spec) and the
    projection's reduce-scatter follow :mod:`.fp8_wire`; the rotary-key gather is Megatron's own (activation
    dtype)."""
    if ctx.tp == 1:
        return [], []
    if not ctx.model.multi_latent_attention:
        t = block_forward(ctx, layer, mb, "proj_fprop")
        return t[:-1], t[-1:]
    rope, q, kv = _mla_gathers(ctx)  # FP8: the up projections are TE column-parallel linears (_sp), the
    # rotary-key gather Megatron's own (activation dtype)
    pre = [_c(ctx, "forward", "all_gather", rope, layer, mb)]
    for nb in (q, kv):
        pre += _sp(ctx, "forward", "all_gather", "fwd_ag", layer, mb, elements=nb // ctx.act)
    return pre, _sp(ctx, "forward", "reduce_scatter", "fwd_rs", layer, mb, "proj_fprop")


def attention_backward(ctx: Context, layer: int, mb: int) -> tuple[list[Call], list[Call]]:
    """The attention block's TP calls backward, split around core attention.

    Standard: ``([AG A], [AG A, RS A])`` with SP, ``([], [AR A])`` without. MLA with SP: ``([AG A], [AG
    T·kv_lora, RS T·kv_lora, AG T·q_lora, RS T·q_lora, RS T·d_rope])``: each column-parallel up projection
    re-gathers its input for the weight gradient and reduce-scatters its input gradient, ``kv`` first (autograd
    runs later-recorded nodes first; the order among them is inferred from that rule, not traced), and the
    rotary-key gather's backward reduce-scatter comes last."""
    if ctx.tp == 1:
        return [], []
    if not ctx.model.multi_latent_attention:
        t = block_backward(ctx, layer, mb)
        k = len(t) - 2 if ctx.sp else 0  # the grad-output AG (and its amax all-reduce) before core attention
        return t[:k], t[k:]
    rope, q, kv = _mla_gathers(ctx)
    post = []
    for nb in (kv, q):
        post += (_sp(ctx, "backward", "all_gather", "bwd_ag_input", layer, mb, elements=nb // ctx.act)
                 + _sp(ctx, "backward", "reduce_scatter", "bwd_rs", layer, mb, elements=nb // ctx.act))
    post.append(_c(ctx, "backward", "reduce_scatter", rope, layer, mb))
    return _sp(ctx, "backward", "all_gather", "bwd_ag_grad", layer, mb), post


def embedding_forward(ctx: Context, mb: int) -> list[Call]:
    """One call of ``A``: reduce-scatter with SP and rotary (or no) positions, else all-reduce.

    Megatron-LM ``LanguageModelEmbedding.__init__`` (core/models/common/embeddings/
    language_model_embedding.py) sets ``reduce_scatter_embeddings = not add_position_embedding and
    num_tokentypes <= 0 and sequence_parallel``; with ``position_embedding_type == "learned_absolute"`` it is
    False, so ``VocabParallelEmbedding.forward`` (core/tensor_parallel/layers.py) all-reduces
    (``reduce_from_tensor_model_parallel_region``) and ``LanguageModelEmbedding.forward`` then splits locally
    (``scatter_to_sequence_parallel_region``, no communication; its backward is the all-gather of
    :func:`embedding_backward`)."""
    if ctx.tp == 1:
        return []
    rs = ctx.sp and ctx.model.position_embedding_type != "learned_absolute"
    return [_c(ctx, "forward", "reduce_scatter" if rs else "all_reduce", ctx.act_bytes, -1, mb)]


def embedding_backward(ctx: Context, mb: int) -> list[Call]:
    if ctx.tp == 1 or not ctx.sp:
        return []
    return [_c(ctx, "backward", "all_gather", ctx.act_bytes, -1, mb)]


def output_forward(ctx: Context, mb: int) -> list[Call]:
    """Output layer input (SP all-gather) then the cross-entropy's three fp32 all-reduces of ``b·s/cp``."""
    if ctx.tp == 1:
        return []
    layer = ctx.model.num_layers
    calls = [_c(ctx, "forward", "all_gather", ctx.act_bytes, layer, mb)] if ctx.sp else []
    return calls + cross_entropy(ctx, mb)


def cross_entropy(ctx: Context, mb: int) -> list[Call]:
    """The vocabulary-parallel cross-entropy's fp32 all-reduces of ``b·s/cp`` values: three (max, predicted
    logits, sum of exp-logits; core/tensor_parallel/cross_entropy.py) or, with ``cross_entropy_loss_fusion``,
    two: the max, then ``torch.cat((predicted_logits, sum_exp_logits))`` of ``2·b·s/cp`` values
    (core/fusions/fused_cross_entropy.py ~87-122)."""
    if ctx.tp == 1:
        return []
    layer, ce = ctx.model.num_layers, ctx.tokens * 4
    sizes = [ce, 2 * ce] if ctx.parallel.cross_entropy_loss_fusion else [ce, ce, ce]
    return [_c(ctx, "forward", "all_reduce", n, layer, mb, "fp32") for n in sizes]


def output_backward(ctx: Context, mb: int) -> list[Call]:
    """Output layer backward: all-reduce ``A`` without SP; with SP two calls, all-gather ``A`` (the saved
    ``s/tp`` input re-gathered for the weight gradient) then reduce-scatter ``A`` (the input gradient) —
    Megatron-LM ``LinearWithGradAccumulationAndAsyncCommunication.backward`` (core/tensor_parallel/layers.py;
    ``dist_all_gather_func`` then ``dist_reduce_scatter_func``). Unlike a transformer block there is no
    preceding row-parallel reduce-scatter whose backward would add a third call."""
    if ctx.tp == 1:
        return []
    layer, a = ctx.model.num_layers, ctx.act_bytes
    if ctx.sp:
        return [_c(ctx, "backward", "all_gather", a, layer, mb), _c(ctx, "backward", "reduce_scatter", a, layer, mb)]
    return [_c(ctx, "backward", "all_reduce", a, layer, mb)]


def norm_grad_allreduce(ctx: Context, norm_params: int, grad_bytes: int, grad_dtype: str) -> list[Call]:
    """Megatron all-reduces the gradients of the replicated parameters over the TP group once per iteration,
    one coalesced call (``_allreduce_non_tensor_model_parallel_grads``, core/distributed/finalize_model_grads.py
    ~416-480): with SP the LayerNorm/RMSNorm parameters and everything marked ``sequence_parallel`` (biases,
    router, MLA's duplicated down projections), and the q/k layer norms with ``qk_layernorm`` also without SP
    (:func:`llmcomm.predict.dp.tp_replicated_grads`): ``norm_params · grad_bytes``."""
    if ctx.tp == 1 or norm_params == 0:
        return []
    return [Call("optimizer", "tp", "all_reduce", "tp", norm_params * grad_bytes, grad_dtype)]
