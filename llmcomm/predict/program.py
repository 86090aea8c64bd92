"""A stage's program: every call one rank of a pipeline stage issues in one iteration, in schedule order.

For each scheduled step (:mod:`.schedule`) of model chunk ``c`` (virtual stage ``vs = c·pp + r``):

forward:  [recv_forward if vs > 0] [embedding if vs == 0] per layer (FSDP gather, attention TP,
          MLP TP or MoE EP/TP) [output + cross-entropy if vs is last] [send_forward if vs is last-not]
backward: [recv_backward if not last] [output backward if last] per layer in reverse (full recompute: the
          layer's forward calls again first; FSDP gather; MLP/MoE then attention backward; FSDP
          reduce-scatter) [embedding backward if vs == 0] [send_backward if vs > 0]

then, once per iteration: DP gradient reduction, SP norm-gradient all-reduce, tied-embedding all-reduce,
and the distributed optimizer's parameter all-gather (Megatron's ``finalize_model_grads`` then the step).
"""

from __future__ import annotations

import dataclasses

from ..specs import dtype_bytes
from . import cp, dp, ep, pp, tp
from .calls import Call, Context
from .schedule import schedule


def attention_forward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """QKV side (SP all-gather), the CP ring inside core attention, then the projection (RS or AR)."""
    t = tp.block_forward(ctx, layer, mb)
    return t[:-1] + cp.ring_forward(ctx, layer, mb) + t[-1:]


def attention_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """Projection backward (SP all-gather), the CP ring, then the QKV input gradient (AG+RS or AR)."""
    t = tp.block_backward(ctx, layer, mb)
    k = 1 if ctx.sp else 0
    return t[:k] + cp.ring_backward(ctx, layer, mb) + t[k:]


def layer_forward(ctx: Context, layer: int, mb: int) -> list[Call]:
    out = attention_forward(ctx, layer, mb)
    if ctx.moe_pattern[layer]:
        out += ep.moe_forward(ctx, layer, mb)
    else:
        out += tp.block_forward(ctx, layer, mb)
    return out


def layer_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    out = ep.moe_backward(ctx, layer, mb) if ctx.moe_pattern[layer] else tp.block_backward(ctx, layer, mb)
    return out + attention_backward(ctx, layer, mb)


def _fsdp_unit(ctx: Context, layer: int) -> tuple[int, int]:
    """``(dense, expert)`` parameters FSDP gathers for one layer; ``(0, 0)`` without FSDP."""
    if not ctx.parallel.fsdp:
        return 0, 0
    split = dp.layer_parameters(ctx, layer)
    return split.dense, split.expert


def _forward(ctx: Context, stage: int, chunk: int, mb: int) -> list[Call]:
    vs = ctx.virtual_stage(stage, chunk)
    layers = ctx.chunk_layers(stage, chunk)
    out: list[Call] = []
    if vs > 0:
        out.append(pp.recv_forward(ctx, mb, layers[0]))
    edge_fsdp = dp.edge_parameters(ctx, stage)[0] if ctx.parallel.fsdp else 0
    if edge_fsdp and (vs == 0 or (vs == ctx.last_virtual and stage != 0)):
        out += dp.fsdp_unit_forward(ctx, edge_fsdp, 0, -1, mb)
    if vs == 0:
        out += tp.embedding_forward(ctx, mb)
    for la in layers:
        d, e = _fsdp_unit(ctx, la)
        out += dp.fsdp_unit_forward(ctx, d, e, la, mb)
        out += layer_forward(ctx, la, mb)
    if vs == ctx.last_virtual:
        out += tp.output_forward(ctx, mb)
    else:
        out.append(pp.send_forward(ctx, mb, layers[-1]))
    return out


def _backward(ctx: Context, stage: int, chunk: int, mb: int) -> list[Call]:
    vs = ctx.virtual_stage(stage, chunk)
    layers = ctx.chunk_layers(stage, chunk)
    out: list[Call] = []
    if vs < ctx.last_virtual:
        out.append(pp.recv_backward(ctx, mb, layers[-1]))
    else:
        out += tp.output_backward(ctx, mb)
    full = ctx.parallel.recompute == "full"
    for la in reversed(layers):
        d, e = _fsdp_unit(ctx, la)
        if full:
            out += [dataclasses.replace(c, phase="backward") for c in layer_forward(ctx, la, mb)]
        out += dp.fsdp_unit_backward(ctx, d, e, la, mb)
        out += layer_backward(ctx, la, mb)
    if vs == 0:
        out += tp.embedding_backward(ctx, mb)
    edge_fsdp = dp.edge_parameters(ctx, stage)[0] if ctx.parallel.fsdp else 0
    if edge_fsdp and (vs == 0 or (vs == ctx.last_virtual and stage != 0)):
        out += dp.fsdp_unit_backward(ctx, edge_fsdp, 0, -1, mb)
    if vs > 0:
        out.append(pp.send_backward(ctx, mb, layers[0]))
    return out


def iteration_end(ctx: Context, stage: int) -> list[Call]:
    """Once-per-iteration calls of a stage: gradient sync, SP norm all-reduce, tied embedding, param gather."""
    params = dp.stage_parameters(ctx, stage)
    gdt = ctx.parallel.grad_reduce_dtype

    out = dp.grad_sync(ctx, params)
    out += tp.norm_grad_allreduce(ctx, params.replicated_norms, dtype_bytes(gdt), gdt)
    out += pp.tied_embedding_allreduce(ctx, stage)
    out += dp.param_gather(ctx, params)
    return out


def stage_program(ctx: Context, stage: int) -> list[Call]:
    """Every call of one rank of pipeline stage ``stage``, in issue order."""
    # pp = 1: Megatron's forward_backward_no_pipelining, forward then backward per micro-batch (= 1F1B, p = 1)
    sched = ctx.parallel.schedule if ctx.pp > 1 else "1f1b"
    if ctx.pp > 1 and ctx.vpp == 1 and sched == "interleaved":
        sched = "1f1b"
    out: list[Call] = []
    for step in schedule(sched, ctx.num_microbatches, ctx.pp, stage, ctx.vpp):
        if step.kind == "F":
            out += _forward(ctx, stage, step.chunk, step.microbatch)
        else:
            out += _backward(ctx, stage, step.chunk, step.microbatch)
    return out + iteration_end(ctx, stage)
