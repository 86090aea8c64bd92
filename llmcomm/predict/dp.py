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

from dataclasses import dataclass

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
    """``(params, replicated)`` of the non-layer parts a stage holds: embedding, final norm, output layer."""
    m, tp = ctx.model, ctx.tp
    vh = m.padded_vocab_size(tp) * m.hidden_size // tp
    p = repl = 0
    if ctx.holds_embedding(stage):
        p += vh
        if m.position_embedding_type == "learned_absolute":
            p += (m.max_position_embeddings or m.seq_length) * m.hidden_size
    if ctx.holds_output(stage):
        repl += m.norm_parameters()
        p += m.norm_parameters()
        if not m.tied_embeddings or ctx.pp > 1:
            p += vh
    return p, repl


def stage_parameters(ctx: Context, stage: int) -> StageParams:
    dense, repl = edge_parameters(ctx, stage)
    expert = 0
    for la in ctx.stage_layers(stage):
        split = layer_parameters(ctx, la)
        dense, expert, repl = dense + split.dense, expert + split.expert, repl + split.replicated
    return StageParams(dense, expert, repl)


def chunk_parameters(ctx: Context, stage: int, chunk: int) -> StageParams:
    """Parameters of model chunk ``chunk`` of ``stage``: its layers, plus the embedding on virtual stage 0
    and the final norm and output layer on the last virtual stage. With ``vpp = 1`` this is
    :func:`stage_parameters`."""
    if ctx.vpp == 1:
        return stage_parameters(ctx, stage)
    vs = ctx.virtual_stage(stage, chunk)
    dense = repl = expert = 0
    if vs in (0, ctx.last_virtual):  # vpp > 1 needs pp >= 2: stage 0 holds only the embedding, the last
        dense, repl = edge_parameters(ctx, stage)  # stage only the final norm and output layer
    for la in ctx.chunk_layers(stage, chunk):
        split = layer_parameters(ctx, la)
        dense, expert, repl = dense + split.dense, expert + split.expert, repl + split.replicated
    return StageParams(dense, expert, repl)


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
