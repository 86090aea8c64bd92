"""A stage's program: every call one rank of a pipeline stage issues in one iteration, in schedule order.

For each scheduled step (:mod:`.schedule`) of model chunk ``c`` (virtual stage ``vs = c·pp + r``):

forward:  [recv_forward if vs > 0] [batch broadcast over TP if vs is first or last] [embedding if vs == 0]
          per layer (FSDP gather, attention TP,
          MLP TP or MoE EP/TP) [output + cross-entropy if vs is last] [send_forward if vs is last-not]
backward: [recv_backward if not last] [output backward if last] per layer in reverse (full recompute: the
          layer's forward calls again first; FSDP gather; MLP/MoE then attention backward; FSDP
          reduce-scatter) [embedding backward if vs == 0] [send_backward if vs > 0]

then, once per iteration (Megatron's ``finalize_model_grads``, the rerun check, the optimizer step, then
``train_step``): the DP gradient reduction of each model chunk in turn, one call per bucket (``for model_chunk in
model: model_chunk.finish_grad_sync()``, core/distributed/finalize_model_grads.py ~638-640: every chunk has its
own DDP buffers; none left with ``overlap_grad_reduce``, whose buckets went out in the backward), the TP
all-reduce of replicated gradients (SP norms, q/k norms), the tied-embedding all-reduce, the rerun state
machine's world all-reduce, the gradient-norm all-reduce(s), the distributed optimizer's parameter all-gather
of every chunk and bucket (twice with an expert optimizer, :func:`.dp.param_gather_passes`), and the
``train_step`` scalars (:mod:`.scalars`).
"""

from __future__ import annotations

import dataclasses

from ..vocab import dtype_bytes
from . import cp, dp, ep, pp, scalars, tp
from .batch import batch_broadcast
from .calls import Call, Context
from .schedule import schedule


def attention_forward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """QKV side (SP all-gather(s)), the CP calls inside core attention (:func:`.cp.attention_forward`), then the
    projection (RS or AR)."""
    pre, post = tp.attention_forward(ctx, layer, mb)
    return pre + cp.attention_forward(ctx, layer, mb) + post


def attention_backward(ctx: Context, layer: int, mb: int) -> list[Call]:
    """Projection backward (SP all-gather), the CP ring, then the QKV input gradient (AG+RS or AR)."""
    pre, post = tp.attention_backward(ctx, layer, mb)
    return pre + cp.attention_backward(ctx, layer, mb) + post


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


def recompute_replay(ctx: Context, layer: int, mb: int) -> list[Call]:
    """Selective recomputation (``recompute_modules``, :func:`llmcomm.step.recompute_flags`): the forward calls of
    the checkpointed modules that communicate, again in the backward phase before the layer's backward —
    ``mlp`` the dense MLP block's TP calls (transformer_layer.py:537-539, 992: ``tensor_parallel.checkpoint`` of
    ``self.mlp``, whose SP all-gather / reduce-scatter or all-reduce run inside its linears), ``moe`` the whole MoE
    layer's forward calls (moe_layer.py:247-249, 701: router, dispatcher, experts, shared experts),
    ``shared_experts`` the shared experts' TP calls (moe_layer.py:252-254, 517). ``core_attn``, ``layernorm``,
    ``moe_act`` recompute no communication (the CP ring inside a recomputed core attention is not replayed here)."""
    from .. import step

    p = ctx.parallel
    rf = step.recompute_flags(p.recompute, p.recompute_modules)
    out: list[Call] = []
    if ctx.moe_pattern[layer]:
        if rf["moe"]:
            out = ep.moe_forward(ctx, layer, mb)
        elif rf["shared_experts"] and ctx.model.num_shared_experts:
            out = tp.block_forward(ctx, layer, mb)
    elif rf["mlp"]:
        out = tp.block_forward(ctx, layer, mb)
    return [dataclasses.replace(c, phase="backward") for c in out]


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
        out += pp.partitioned_gathers(ctx, "forward", mb, layers[0])
    out += batch_broadcast(ctx, vs, mb)
    edge_fsdp = dp.edge_parameters(ctx, stage)[0] if ctx.parallel.fsdp else 0
    if edge_fsdp and (vs == 0 or (vs == ctx.last_virtual and stage != 0)):
        out += dp.fsdp_edge_forward(ctx, edge_fsdp, mb)
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
    overlap = ctx.parallel.overlap_grad_reduce and mb == ctx.num_microbatches - 1 and not ctx.parallel.fsdp
    bl = dp.buckets(ctx, stage, chunk) if overlap else []
    out: list[Call] = []
    if vs < ctx.last_virtual:
        out.append(pp.recv_backward(ctx, mb, layers[-1]))
        out += pp.partitioned_gathers(ctx, "backward", mb, layers[-1])
    else:
        out += tp.output_backward(ctx, mb)
        out += dp.overlapped_grad_sync(ctx, bl, ctx.model.num_layers, mb)
    # full recomputation: a checkpointed group's forward calls again when the backward reaches its last layer
    # (llmcomm.step.recompute_groups: every layer alone, uniform groups, or block's first layers)
    from .. import step

    p = ctx.parallel
    groups = step.recompute_groups(len(layers), p.recompute_method, p.recompute_num_layers) \
        if p.recompute == "full" else ()
    at_end = {g[-1]: g for g in groups}
    for i in reversed(range(len(layers))):
        la = layers[i]
        d, e = _fsdp_unit(ctx, la)
        for j in at_end.get(i, ()):
            out += [dataclasses.replace(c, phase="backward") for c in layer_forward(ctx, layers[j], mb)]
        out += dp.fsdp_unit_backward(ctx, d, e, la, mb)
        out += recompute_replay(ctx, la, mb)
        out += layer_backward(ctx, la, mb)
        out += dp.overlapped_grad_sync(ctx, bl, la, mb)
    if vs == 0:
        out += tp.embedding_backward(ctx, mb)
        out += dp.overlapped_grad_sync(ctx, bl, -1, mb)
    edge_fsdp = dp.edge_parameters(ctx, stage)[0] if ctx.parallel.fsdp else 0
    if edge_fsdp and (vs == 0 or (vs == ctx.last_virtual and stage != 0)):
        out += dp.fsdp_edge_backward(ctx, edge_fsdp, mb)
    if vs > 0:
        out.append(pp.send_backward(ctx, mb, layers[0]))
    return out


def iteration_end(ctx: Context, stage: int) -> list[Call]:
    """Once-per-iteration calls of a stage: gradient sync per chunk and bucket, TP all-reduce of replicated
    gradients, tied embedding, the rerun-state check, gradient norm(s), parameter gather per optimizer, chunk
    and bucket, ``train_step`` scalars."""
    gdt = ctx.parallel.grad_reduce_dtype
    bl = [dp.buckets(ctx, stage, c) for c in range(ctx.vpp)]
    # with overlap_grad_reduce the buckets were reduced in the last micro-batch's backward
    out = [c for b in bl for c in dp.grad_sync(ctx, b)]
    out += tp.norm_grad_allreduce(ctx, dp.tp_replicated_grads(ctx, stage), dtype_bytes(gdt), gdt)
    out += pp.tied_embedding_allreduce(ctx, stage)
    out += ep.expert_bias_allreduce(ctx, stage)
    out += scalars.per_token_loss(ctx)
    out += scalars.rerun_state(ctx)
    out += scalars.grad_norm(ctx, stage)
    out += [c for _ in range(dp.param_gather_passes(ctx, stage)) for b in bl for c in dp.param_gather(ctx, b)]
    out += scalars.train_step_scalars(ctx, stage)
    out += scalars.moe_metrics(ctx)
    return out


def stage_program(ctx: Context, stage: int) -> list[Call]:
    """Every call of one rank of pipeline stage ``stage``, in issue order."""
    # pp = 1: Megatron's forward_backward_no_pipelining, forward then backward per micro-batch (= 1F1B, p = 1)
    sched = ctx.parallel.schedule if ctx.pp > 1 else "1f1b"
    out: list[Call] = []
    for step in schedule(sched, ctx.num_microbatches, ctx.pp, stage, ctx.vpp, ctx.parallel.vp_group_size):
        if step.kind == "F":
            out += _forward(ctx, stage, step.chunk, step.microbatch)
        else:
            out += _backward(ctx, stage, step.chunk, step.microbatch)
    return out + iteration_end(ctx, stage)
