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
  sum of exp-logits; nothing in backward.

Every call is skipped when ``tp == 1``. The SP all-gathers and reduce-scatters are tagged ``sp`` (the TP group
carries them), the all-reduces ``tp``. Sources: NVIDIA/Megatron-LM ``megatron/core/tensor_parallel/
{layers.py, mappings.py, cross_entropy.py}``.
"""

from __future__ import annotations

from ..vocab import OpName, ParallelismName, PhaseName
from .calls import Call, Context


def _c(ctx: Context, phase: PhaseName, op: OpName, nbytes: int, layer: int, mb: int, dtype: str | None = None) -> Call:
    """A call on the TP group; sequence-parallel all-gathers/reduce-scatters are tagged ``sp``."""
    par: ParallelismName = "sp" if op in ("all_gather", "reduce_scatter") else "tp"
    return Call(phase, par, op, "tp", nbytes, dtype or ctx.act_dtype, layer, mb)


def block_forward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """One attention or MLP block, forward: SP ``[AG, RS]``, else ``[AR]``."""
    if ctx.tp == 1:
        return []
    a = ctx.act_bytes
    if ctx.sp:
        return [_c(ctx, "forward", "all_gather", a, layer, mb), _c(ctx, "forward", "reduce_scatter", a, layer, mb)]
    return [_c(ctx, "forward", "all_reduce", a, layer, mb)]


def block_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """One attention or MLP block, backward: SP ``[AG, AG, RS]``, else ``[AR]``."""
    if ctx.tp == 1:
        return []
    a = ctx.act_bytes
    if ctx.sp:
        return [_c(ctx, "backward", "all_gather", a, layer, mb), _c(ctx, "backward", "all_gather", a, layer, mb),
                _c(ctx, "backward", "reduce_scatter", a, layer, mb)]
    return [_c(ctx, "backward", "all_reduce", a, layer, mb)]


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
    ce = ctx.tokens * 4
    calls += [_c(ctx, "forward", "all_reduce", ce, layer, mb, "fp32") for _ in range(3)]
    return calls


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
    """With SP, Megatron all-reduces the gradients of the replicated LayerNorm/RMSNorm parameters (and of
    biases marked ``sequence_parallel``) over the TP group (``_allreduce_layernorm_grads``), once per
    iteration: ``norm_params · grad_bytes``."""
    if ctx.tp == 1 or not ctx.sp or norm_params == 0:
        return []
    return [Call("optimizer", "tp", "all_reduce", "tp", norm_params * grad_bytes, grad_dtype)]
