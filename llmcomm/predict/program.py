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
from collections import Counter
from functools import cached_property, lru_cache
from operator import itemgetter

from ..vocab import dtype_bytes
from . import cp, dp, ep, pp, scalars, tp
from .batch import batch_broadcast
from .calls import Call, Context
from .schedule import Step, schedule

PLAN_CACHE = 256  # stage plans kept (:func:`stage_plan`): one job of up to 256 stages


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


def _steps(ctx: Context, stage: int) -> list[Step]:
    # pp = 1: Megatron's forward_backward_no_pipelining, forward then backward per micro-batch (= 1F1B, p = 1)
    sched = ctx.parallel.schedule if ctx.pp > 1 else "1f1b"
    return schedule(sched, ctx.num_microbatches, ctx.pp, stage, ctx.vpp, ctx.parallel.vp_group_size)


def _step_calls(ctx: Context, stage: int, step: Step) -> list[Call]:
    build = _forward if step.kind == "F" else _backward
    return build(ctx, stage, step.chunk, step.microbatch)


def direct_stage_program(ctx: Context, stage: int) -> list[Call]:
    """Every call of one rank of pipeline stage ``stage``, in issue order, built step by step (the definition
    :class:`StagePlan` is checked against; :func:`stage_program` gives the same list faster)."""
    out: list[Call] = []
    for step in _steps(ctx, stage):
        out += _step_calls(ctx, stage, step)
    return out + iteration_end(ctx, stage)


def _restamp(c: Call, mb: int) -> Call:
    """``c`` with ``microbatch = mb`` (what ``dataclasses.replace`` gives, without its per-field checks)."""
    n = object.__new__(Call)
    d = n.__dict__
    d.update(c.__dict__)
    d["microbatch"] = mb
    return n


@dataclasses.dataclass(frozen=True)
class _Template:
    """The calls of one class of scheduled steps, built for micro-batch ``mb``; ``stamped[i]``: call ``i`` carries
    the step's micro-batch (else a fixed one, kept as it is)."""

    calls: tuple[Call, ...]
    mb: int
    stamped: tuple[bool, ...]

    def at(self, mb: int) -> list[Call]:
        if mb == self.mb:
            return list(self.calls)
        return [_restamp(c, mb) if s else c for c, s in zip(self.calls, self.stamped, strict=True)]


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """One stage's program held compactly: the scheduled steps as ``(template, micro-batch)`` pieces in issue
    order, then the once-per-iteration calls (:func:`iteration_end`).

    A step's calls depend on its micro-batch ``mb`` only through the ``microbatch`` they carry and two tests in
    the generators: ``mb == 0`` (Megatron-FSDP's edge gather, :func:`.dp.fsdp_edge_forward`) and
    ``mb == m - 1`` (the overlapped gradient reduction of the last micro-batch, :func:`.dp.overlapped_grad_sync`).
    So the steps fall into classes ``(kind, chunk, mb == 0, mb == m - 1)``; a class's calls are built once and
    re-stamped with each step's micro-batch. :func:`stage_plan` checks that claim on two micro-batches of every
    class holding more than one and builds the stage step by step where it does not hold, so the plan always
    lists exactly :func:`direct_stage_program`'s calls. The plan costs one build per class (a handful per stage)
    instead of one per micro-batch: the explorer's deep pipelines (hundreds of micro-batches, dozens of stages)
    and the predictor's aggregated form (:meth:`aggregated`) need no per-micro-batch Python work beyond
    re-stamping."""

    templates: tuple[_Template, ...]
    pieces: tuple[tuple[int, int], ...]  # (template index, micro-batch) per scheduled step
    tail: tuple[Call, ...]

    @cached_property
    def uses(self) -> Counter[int]:
        """How many scheduled steps each template stands for, templates in order of first use (one counting pass
        in C over the pieces: a deep pipeline has about a thousand per stage)."""
        return Counter(map(itemgetter(0), self.pieces))

    def __len__(self) -> int:
        return sum(len(self.templates[t].calls) * n for t, n in self.uses.items()) + len(self.tail)

    def calls(self) -> list[Call]:
        """The program, call by call (equal to :func:`direct_stage_program`)."""
        out: list[Call] = []
        for t, mb in self.pieces:
            out += self.templates[t].at(mb)
        return out + list(self.tail)

    def microbatch_calls(self, microbatch: int) -> list[Call]:
        """``[c for c in self.calls() if c.microbatch == microbatch]`` without building the other micro-batches'
        calls."""
        out: list[Call] = []
        for t, mb in self.pieces:
            tm = self.templates[t]
            if mb == microbatch:
                out += tm.at(mb)
            else:
                out += [c for c, s in zip(tm.calls, tm.stamped, strict=True) if not s and c.microbatch == microbatch]
        return out + [c for c in self.tail if c.microbatch == microbatch]

    def aggregated(self) -> tuple[list[Call], list[int]]:
        """``expand.aggregate_calls(self.calls())`` (calls equal up to ``layer``/``microbatch`` merged, first-seen
        order, counts) from one aggregation per template: a class's merged calls times how many steps it has."""
        from .expand import aggregate_calls

        index: dict[Call, int] = {}
        out: list[Call] = []
        counts: list[int] = []
        parts = [(*aggregate_calls(self.templates[t].calls), n) for t, n in self.uses.items()]
        parts.append((*aggregate_calls(self.tail), 1))
        for calls, n, times in parts:
            for c, k in zip(calls, n, strict=True):
                i = index.get(c)
                if i is None:
                    index[c] = len(out)
                    out.append(c)
                    counts.append(k * times)
                else:
                    counts[i] += k * times
        return out, counts


def _template(calls: list[Call], mb: int) -> _Template:
    return _Template(tuple(calls), mb, tuple(c.microbatch == mb for c in calls))


@lru_cache(maxsize=PLAN_CACHE)
def stage_plan(ctx: Context, stage: int) -> StagePlan:
    """The :class:`StagePlan` of stage ``stage`` (cached for the last :data:`PLAN_CACHE` stages, so that the
    predictor and the explorer's call-sequence panel build a stage once)."""
    steps = _steps(ctx, stage)
    m = ctx.num_microbatches
    last = m - 1
    # a step's class; classes numbered in the order of their first step (a deep pipeline: a thousand steps per
    # stage in a handful of classes, so the classes' first and second steps are found by C-level scans)
    keys = [(kind, chunk, mb == 0, mb == last) for kind, mb, chunk in steps]
    slots: dict[tuple, int] = {key: t for t, key in enumerate(dict.fromkeys(keys))}
    templates: list[_Template] = []
    samples: dict[int, int] = {}  # template -> a second micro-batch of its class, checked below
    for key in slots:
        first = keys.index(key)
        step = steps[first]
        templates.append(_template(_step_calls(ctx, stage, step), step.microbatch))
        try:
            samples[slots[key]] = steps[keys.index(key, first + 1)].microbatch
        except ValueError:  # a class of one step
            pass
    pieces = [(slots[key], step[1]) for key, step in zip(keys, steps, strict=True)]
    for t, mb in samples.items():  # the claim of the class docstring, on a second micro-batch of each class
        kind, chunk = next(k for k, i in slots.items() if i == t)[:2]
        if _step_calls(ctx, stage, Step(kind, mb, chunk)) != templates[t].at(mb):
            templates = [_template(_step_calls(ctx, stage, s), s.microbatch) for s in steps]
            pieces = [(i, s.microbatch) for i, s in enumerate(steps)]
            break
    return StagePlan(tuple(templates), tuple(pieces), tuple(iteration_end(ctx, stage)))


def stage_program(ctx: Context, stage: int) -> list[Call]:
    """Every call of one rank of pipeline stage ``stage``, in issue order (:class:`StagePlan`; equal to
    :func:`direct_stage_program`)."""
    return stage_plan(ctx, stage).calls()
