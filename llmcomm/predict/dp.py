"""Data-parallel calls and the parameter counts they move.

Parameters one rank of stage ``r`` holds (its TP shard; ``V'`` padded vocabulary, ``k`` 3 for a gated MLP
else 2, ``E`` experts, ``S`` shared experts, attention sizes as in :mod:`llmcomm.specs`):

    per layer   (h·a·d + 2h·g·d + a·d·h)/tp [+ (a·d + 2g·d)/tp + h biases] + 2 norms (replicated)
    dense MLP   k·h·f/tp [+ (k-1)·f/tp + h]
    MoE MLP     h·E router (replicated) + (E/ep)·k·h·f_e/tp experts + k·h·S·f_e/tp shared
    stage 0     V'·h/tp word embedding [+ P·h learned positions]
    last stage  final norm + V'·h/tp output layer (untied, or tied with pp > 1: the last stage's copy)

Megatron-LM's DDP (``megatron/core/distributed``), one gradient bucket per dtype (no overlap), per iteration:

* plain: all-reduce of ``dense·g`` over the DP group and of ``expert·g`` over the expert-data-parallel group
  (``g`` = bytes of ``grad_reduce_dtype``);
* distributed optimizer: reduce-scatter of the same buffers, then, after the step, all-gather of the
  parameters in ``param_dtype`` (``dense·p``, ``expert·p``);
* FSDP (ZeRO-3 style): per micro-batch, all-gather of each layer's parameters in the forward and again in the
  backward, reduce-scatter of its gradients in the backward (see :func:`fsdp_unit_forward`).

With context parallelism the non-expert gradients are reduced over the DP × CP group. Groups of size 1
issue nothing. Buffer padding (Megatron pads distributed-optimizer buffers to a multiple of
the DP size) is not modelled: at most ``dp - 1`` elements per buffer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from .. import step
from ..specs import LayerParams, dtype_bytes
from .calls import Call, Context


@dataclass(frozen=True)
class StageParams:
    """Parameter counts of one rank's TP shard of a stage."""

    dense: int  # everything reduced over the DP group
    expert: int  # routed-expert weights, reduced over the expert-data-parallel group
    replicated_norms: int  # norm (and SP-marked bias/router) parameters: SP's TP all-reduce


def layer_parameters(ctx: Context, layer: int) -> LayerParams:
    """One layer's parameters on one TP rank of one EP rank (:meth:`ModelSpec.layer_parameter_split`; routed
    experts split over the expert tensor-parallel size ``etp``)."""
    return ctx.model.layer_parameter_split(layer, ctx.tp, ctx.parallel.ep, etp=ctx.parallel.expert_tp)


def edge_parameters(ctx: Context, stage: int) -> tuple[int, int]:
    """``(params, replicated)`` of the non-layer parts a stage holds: embedding, final norm, output layer
    (:func:`llmcomm.step.edge_parameters`)."""
    p, repl = step.edge_parameters(ctx.model, ctx.tp, ctx.pp, ctx.holds_embedding(stage), ctx.holds_output(stage))
    return int(p), int(repl)


def _parameters(ctx: Context, stage: int, layers: Iterable[int], edges: bool) -> StageParams:
    """``layers``' parameters, plus the stage's :func:`edge_parameters` when ``edges``."""
    dense, repl = edge_parameters(ctx, stage) if edges else (0, 0)
    expert = 0
    for la in layers:
        split = layer_parameters(ctx, la)
        dense, expert, repl = dense + split.dense, expert + split.expert, repl + split.replicated
    return StageParams(dense, expert, repl)


def stage_parameters(ctx: Context, stage: int) -> StageParams:
    return _parameters(ctx, stage, ctx.stage_layers(stage), True)


def chunk_parameters(ctx: Context, stage: int, chunk: int) -> StageParams:
    """Parameters of model chunk ``chunk`` of ``stage``: its layers, plus the embedding on virtual stage 0
    and the final norm and output layer on the last virtual stage. With ``vpp = 1`` this is
    :func:`stage_parameters`."""
    # vpp > 1 needs pp >= 2: stage 0 holds only the embedding, the last stage only the final norm and output
    # layer, so the stage's edge parameters belong to its first or last virtual stage
    edges = ctx.vpp == 1 or ctx.virtual_stage(stage, chunk) in (0, ctx.last_virtual)
    return _parameters(ctx, stage, ctx.chunk_layers(stage, chunk), edges)


def _dp_kind(ctx: Context) -> str:
    """Non-expert gradients are reduced over DP × CP (Megatron's ``data_parallel_group_with_cp``)."""
    return "dpcp" if ctx.parallel.cp > 1 else "dp"


def _sizes(ctx: Context) -> tuple[int, int, str, str]:
    p = ctx.parallel
    return dtype_bytes(p.grad_reduce_dtype), dtype_bytes(p.param_dtype), p.grad_reduce_dtype, p.param_dtype


def grad_sync(ctx: Context, params: StageParams) -> list[Call]:
    """The once-per-iteration gradient reduction (all-reduce, or reduce-scatter with the distributed
    optimizer) of the dense buffer over ``dp`` and the expert buffer over ``edp``."""
    if ctx.parallel.fsdp:
        return []
    gb, _, gdt, _ = _sizes(ctx)
    op = "reduce_scatter" if ctx.parallel.distributed_optimizer else "all_reduce"
    out = []
    if ctx.parallel.dp * ctx.parallel.cp > 1 and params.dense:
        out.append(Call("optimizer", "dp", op, _dp_kind(ctx), params.dense * gb, gdt))
    if ctx.parallel.expert_dp > 1 and params.expert:
        out.append(Call("optimizer", "dp", op, "edp", params.expert * gb, gdt))
    return out


def param_gather(ctx: Context, params: StageParams) -> list[Call]:
    """Distributed optimizer: all-gather of the updated parameters in ``param_dtype`` after the step."""
    if not ctx.parallel.distributed_optimizer:
        return []
    _, pb, _, pdt = _sizes(ctx)
    out = []
    if ctx.parallel.dp * ctx.parallel.cp > 1 and params.dense:
        out.append(Call("optimizer", "dp", "all_gather", _dp_kind(ctx), params.dense * pb, pdt))
    if ctx.parallel.expert_dp > 1 and params.expert:
        out.append(Call("optimizer", "dp", "all_gather", "edp", params.expert * pb, pdt))
    return out


def fsdp_unit_forward(ctx: Context, dense: int, expert: int, layer: int, mb: int, phase: str = "forward"
                      ) -> list[Call]:
    """FSDP: all-gather of one unit's parameters (``dense·p`` over dp, ``expert·p`` over edp)."""
    if not ctx.parallel.fsdp:
        return []
    _, pb, _, pdt = _sizes(ctx)
    out = []
    if ctx.parallel.dp * ctx.parallel.cp > 1 and dense:
        out.append(Call(phase, "dp", "all_gather", _dp_kind(ctx), dense * pb, pdt, layer, mb))
    if ctx.parallel.expert_dp > 1 and expert:
        out.append(Call(phase, "dp", "all_gather", "edp", expert * pb, pdt, layer, mb))
    return out


def fsdp_unit_backward(ctx: Context, dense: int, expert: int, layer: int, mb: int) -> list[Call]:
    """FSDP backward of one unit: all-gather of the parameters again, then reduce-scatter of the gradients."""
    if not ctx.parallel.fsdp:
        return []
    gb, _, gdt, _ = _sizes(ctx)
    out = fsdp_unit_forward(ctx, dense, expert, layer, mb, phase="backward")
    if ctx.parallel.dp * ctx.parallel.cp > 1 and dense:
        out.append(Call("backward", "dp", "reduce_scatter", _dp_kind(ctx), dense * gb, gdt, layer, mb))
    if ctx.parallel.expert_dp > 1 and expert:
        out.append(Call("backward", "dp", "reduce_scatter", "edp", expert * gb, gdt, layer, mb))
    return out


# ------------------------------------------------------------------------------ buckets (overlap_grad_reduce)
@dataclass(frozen=True)
class Bucket:
    """One DDP bucket: ``numel`` gradient elements of the dense (``expert=False``) or expert buffer, complete
    once the backward has reached ``layer`` (``-1`` the embedding, ``num_layers`` the output layer)."""

    numel: int
    expert: bool
    layer: int


def layer_tensors(ctx: Context, layer: int) -> list[tuple[int, bool]]:
    """``(numel, expert)`` of one layer's parameter tensors on one rank, in Megatron-LM's module order with
    Transformer Engine layers (``TransformerLayer``: ``self_attention.linear_proj`` weight, bias;
    ``linear_qkv`` layer-norm weight, bias, weight, bias; then the MLP: ``linear_fc1`` layer-norm weight, bias,
    weight, bias, ``linear_fc2`` weight, bias; an MoE MLP: ``pre_mlp_layernorm``, ``router.weight``, the
    local experts' ``linear_fc1.weight0..`` and ``linear_fc2.weight0..``, the shared experts' fc1, fc2).
    The sizes sum to :meth:`ModelSpec.layer_parameter_split`."""
    m, tp, p = ctx.model, ctx.tp, ctx.parallel
    h, a, g, d = m.hidden_size, m.num_attention_heads, m.query_groups, m.head_dim
    k = 3 if m.gated_mlp else 2
    bias = m.add_bias_linear
    norm = [(h, False)] + ([(h, False)] if m.normalization == "LayerNorm" else [])
    out: list[tuple[int, bool]] = [(a * d * h // tp, False)] + ([(h, False)] if bias else [])
    out += norm + [((a * d + 2 * g * d) * h // tp, False)]
    if bias or m.add_qkv_bias:
        out.append(((a * d + 2 * g * d) // tp, False))
    if ctx.moe_pattern[layer]:
        fe, etp = m.expert_ffn_hidden_size, p.expert_tp
        local = m.num_experts // p.ep
        out += norm + [(h * m.num_experts, False)]
        out += [((k - 1) * fe * h // etp, True)] * local + [(h * fe // etp, True)] * local
        if m.num_shared_experts:
            sf = m.num_shared_experts * fe
            out += [((k - 1) * sf * h // tp, False), (h * sf // tp, False)]
    else:
        f = m.ffn_hidden_size
        out += norm + [((k - 1) * f * h // tp, False)] + ([((k - 1) * f // tp, False)] if bias else [])
        out += [(h * f // tp, False)] + ([(h, False)] if bias else [])
    return out


def chunk_tensors(ctx: Context, stage: int, chunk: int) -> list[tuple[int, bool, int]]:
    """``(numel, expert, layer)`` of every parameter tensor of a model chunk in module order (``GPTModel``:
    embedding word then position weights, the layers, final norm, output layer)."""
    m, tp = ctx.model, ctx.tp
    vs = ctx.virtual_stage(stage, chunk)
    vh = step.embedding_shard(m, tp)
    out: list[tuple[int, bool, int]] = []
    if vs == 0:
        out.append((vh, False, -1))
        if m.position_embedding_type == "learned_absolute":
            out.append(((m.max_position_embeddings or m.seq_length) * m.hidden_size, False, -1))
    for la in ctx.chunk_layers(stage, chunk):
        out += [(n, e, la) for n, e in layer_tensors(ctx, la)]
    if vs == ctx.last_virtual:
        norms = [m.hidden_size] * (2 if m.normalization == "LayerNorm" else 1)
        out += [(n, False, m.num_layers) for n in norms]
        if not m.tied_embeddings or ctx.pp > 1:
            out.append((vh, False, m.num_layers))
    return out


def bucket_size(ctx: Context) -> int:
    """``bucket_size`` or Megatron's default ``max(40,000,000, 1,000,000 · dp)`` elements
    (``DistributedDataParallel.__init__``, core/distributed/distributed_data_parallel.py; ``dp`` without CP)."""
    p = ctx.parallel
    return p.bucket_size if p.bucket_size is not None else max(40_000_000, 1_000_000 * p.dp)


def buckets(ctx: Context, stage: int, chunk: int) -> list[Bucket]:
    """The buckets of one model chunk in the order their reductions are issued.

    Per buffer (dense and expert apart: ``group_params_for_buffers`` keys on ``is_expert_parallel``), the
    tensors are taken in reverse module order (backward order) and a bucket closes at the first tensor that
    brings it to ``>= bucket_size`` elements; what is left forms the last bucket
    (``_compute_default_per_buffer_param_layout``, core/distributed/param_and_grad_buffer.py). Each bucket is
    its own bucket group without fp8 parameters (``partition_buckets``, case 2), so it is one call. Calls
    are ordered by where their closing tensor sits in the backward. The distributed optimizer's padding of
    bucket ends to a multiple of the DP size is not modelled."""
    size = bucket_size(ctx)
    tensors = chunk_tensors(ctx, stage, chunk)[::-1]
    out: list[tuple[int, Bucket]] = []
    for expert in (False, True):
        acc, last = 0, -1
        for i, (n, e, la) in enumerate(tensors):
            if e != expert:
                continue
            acc, last = acc + n, i
            if acc >= size:
                out.append((i, Bucket(acc, expert, la)))
                acc = 0
        if acc:
            out.append((last, Bucket(acc, expert, tensors[last][2])))
    return [b for _, b in sorted(out, key=lambda x: x[0])]


def _bucket_call(ctx: Context, b: Bucket, phase: str, op: str, mb: int) -> Call | None:
    gb, pb, gdt, pdt = _sizes(ctx)
    p = ctx.parallel
    if b.expert and p.expert_dp == 1 or not b.expert and p.dp * p.cp == 1:
        return None
    nbytes, dt = (b.numel * gb, gdt) if op != "all_gather" else (b.numel * pb, pdt)
    return Call(phase, "dp", op, "edp" if b.expert else _dp_kind(ctx), nbytes, dt, b.layer, mb)


def overlapped_grad_sync(ctx: Context, bucket_list: list[Bucket], layer: int, mb: int) -> list[Call]:
    """``overlap_grad_reduce``: the reductions of the buckets that complete at ``layer`` in the last
    micro-batch's backward (``_make_backward_post_hook`` -> ``register_grad_ready`` -> ``start_grad_sync``
    of the bucket group, core/distributed/distributed_data_parallel.py); ``finish_grad_sync`` then only waits."""
    if not ctx.parallel.overlap_grad_reduce or ctx.parallel.fsdp or mb != ctx.num_microbatches - 1:
        return []
    op = "reduce_scatter" if ctx.parallel.distributed_optimizer else "all_reduce"
    calls = [_bucket_call(ctx, b, "backward", op, mb) for b in bucket_list if b.layer == layer]
    return [c for c in calls if c is not None]


def bucketed_param_gather(ctx: Context, bucket_list: list[Bucket]) -> list[Call]:
    """Distributed optimizer with buckets: one parameter all-gather per bucket group after the step, dense
    buckets first, then expert ones (``start_param_sync``: ``bucket_groups + expert_parallel_bucket_groups``)."""
    if not ctx.parallel.distributed_optimizer:
        return []
    order = [b for b in bucket_list if not b.expert] + [b for b in bucket_list if b.expert]
    calls = [_bucket_call(ctx, b, "optimizer", "all_gather", -1) for b in order]
    return [dataclasses.replace(c, layer=-1) for c in calls if c is not None]
