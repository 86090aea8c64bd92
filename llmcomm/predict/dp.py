"""Data-parallel calls and the parameter counts they move.

Parameters one rank of stage ``r`` holds (its TP shard; ``V'`` padded vocabulary, ``k`` 3 for a gated MLP
else 2, ``E`` experts, ``S`` shared experts, attention sizes as in :mod:`llmcomm.specs`):

    per layer   (h·a·d + 2h·g·d + a·d·h)/tp [+ (a·d + 2g·d)/tp + h biases] + 2 norms (replicated)
    dense MLP   k·h·f/tp [+ (k-1)·f/tp + h]
    MoE MLP     h·E router (replicated) + (E/ep)·k·h·f_e/tp experts + k·h·S·f_e/tp shared
    stage 0     V'·h/tp word embedding [+ P·h learned positions]
    last stage  final norm + V'·h/tp output layer (untied, or tied with pp > 1: the last stage's copy)

Megatron-LM's DDP (``megatron/core/distributed``), per iteration, one call per bucket (:func:`buckets`): one
bucket per buffer (dense, and expert when :func:`experts_in_own_buffer`) unless ``overlap_grad_reduce`` splits
the first stage's first chunk, or the distributed optimizer gives a tied ``shared_embedding`` its own:

* plain: all-reduce of ``dense·g`` over the DP group and of ``expert·g`` over the expert-data-parallel group
  (``g`` = bytes of ``grad_reduce_dtype``);
* distributed optimizer: reduce-scatter of the same buffers, then, after the step, all-gather of the
  parameters in ``param_dtype`` (``dense·p``, ``expert·p``) — by each chained optimizer in turn, so twice with
  an expert optimizer (:func:`param_gather_passes`);
* FSDP (ZeRO-3 style): per micro-batch, all-gather of each layer's parameters in the forward and again in the
  backward (not with ``fsdp_reshard_after_forward=False``), reduce-scatter of its gradients in the backward (see
  :func:`fsdp_unit_forward`); the non-layer parameters of a stage (embedding, final norm, output layer) are one
  more unit, gathered first. ``fsdp`` alone is torch FSDP2 (Megatron's ``--use-torch-fsdp2``, which refuses the
  distributed optimizer, arguments.py:1038) or Megatron-FSDP v2; with ``distributed_optimizer`` it is Megatron-FSDP
  v1 (``--use-megatron-fsdp --use-distributed-optimizer``, strategy ``optim_grads_params``), whose optimizer step
  issues none of the distributed optimizer's bucket all-gathers (:func:`param_gather_passes`). Not written:
  Megatron-FSDP's ``start_param_sync`` after the step (megatron_fsdp.py:1284-1323: every bucket without
  ``overlap_param_gather``, which the first micro-batch's forward then finds gathered — the same bytes in the
  optimizer phase; the first bucket with it) and Megatron's torch FSDP2 wrapping the embedding, the output layer and
  the root apart (torch_fully_sharded_data_parallel.py:59-64, 130-148: three calls where the kit writes one of the
  same bytes). Megatron-FSDP's non-unit modules (embedding, final norm, output layer) are gathered once per
  iteration and kept (:func:`fsdp_edge_forward`).

With context parallelism the non-expert gradients are reduced over the DP × CP group. Groups of size 1
issue nothing. Buffer padding (Megatron pads distributed-optimizer buffers to a multiple of
the DP size) is not modelled: at most ``dp - 1`` elements per buffer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import step
from ..specs import LayerParams
from ..vocab import OpName, PhaseName, dtype_bytes
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
    split = ctx.model.layer_parameter_split(layer, ctx.tp, ctx.parallel.ep, etp=ctx.parallel.expert_tp)
    if split.expert and not experts_in_own_buffer(ctx):  # experts share the dense buffer
        return LayerParams(split.sharded + split.expert, 0, split.replicated)
    return split


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


def tp_replicated_grads(ctx: Context, stage: int) -> int:
    """Gradient elements one rank of ``stage`` all-reduces over TP once per iteration
    (``_allreduce_non_tensor_model_parallel_grads``, core/distributed/finalize_model_grads.py ~416-480, one
    coalesced call): with SP every parameter marked ``sequence_parallel`` (the replicated ones:
    :attr:`StageParams.replicated_norms`); without SP only ``q_layernorm``/``k_layernorm`` under
    ``qk_layernorm`` (matched by name, ~459-461: ``2·d`` per layer)."""
    if ctx.sp:
        return stage_parameters(ctx, stage).replicated_norms
    m = ctx.model
    if not m.qk_layernorm or m.multi_latent_attention:
        return 0
    return 2 * m.head_dim * len(ctx.stage_layers(stage))


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


def fsdp_unit_forward(ctx: Context, dense: int, expert: int, layer: int, mb: int, phase: PhaseName = "forward"
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
    """FSDP backward of one unit: all-gather of the parameters again (none with ``fsdp_reshard_after_forward=False``:
    torch FSDP2 keeps the unsharded parameters from the forward, ``reshard_after_forward``), then reduce-scatter of
    the gradients (every micro-batch: Megatron-FSDP reduces on every backward under ``optim_grads_params``,
    megatron_fsdp.py:707-770, ``_process_post_backward_gradients``)."""
    if not ctx.parallel.fsdp:
        return []
    gb, _, gdt, _ = _sizes(ctx)
    out = (fsdp_unit_forward(ctx, dense, expert, layer, mb, phase="backward")
           if ctx.parallel.fsdp_reshard_after_forward else [])
    if ctx.parallel.dp * ctx.parallel.cp > 1 and dense:
        out.append(Call("backward", "dp", "reduce_scatter", _dp_kind(ctx), dense * gb, gdt, layer, mb))
    if ctx.parallel.expert_dp > 1 and expert:
        out.append(Call("backward", "dp", "reduce_scatter", "edp", expert * gb, gdt, layer, mb))
    return out


def megatron_fsdp(ctx: Context) -> bool:
    """``fsdp`` with ``distributed_optimizer``: Megatron-FSDP (v1 runs with the distributed optimizer,
    arguments.py:1128-1135); ``fsdp`` alone is torch FSDP2 (or Megatron-FSDP v2)."""
    return ctx.parallel.fsdp and ctx.parallel.distributed_optimizer


def fsdp_edge_forward(ctx: Context, params: int, mb: int) -> list[Call]:
    """The stage's non-layer parameters (embedding, final norm, output layer) in the forward. torch FSDP2 wraps them
    as units of their own (torch_fully_sharded_data_parallel.py:59-64, 130-148): gathered every micro-batch.
    Megatron-FSDP's units are the transformer layers only (mcore_fsdp_adapter.py:170-171): a non-unit module's
    parameters are gathered by its pre-forward hook (megatron_fsdp.py:1086-1087), never released in the forward or
    backward (only FSDP units get the release hooks, :1089-1100, 1116-1125), so a later micro-batch finds the
    bucket ready (param_and_grad_buffer.py ``all_gather_params`` gathers EMPTY/PRESERVED buckets only) — one
    all-gather per iteration, on the first micro-batch, until the step's ``reset(preserve_non_fsdp_units=True)``."""
    if megatron_fsdp(ctx) and mb != 0:
        return []
    return fsdp_unit_forward(ctx, params, 0, -1, mb)


def fsdp_edge_backward(ctx: Context, params: int, mb: int) -> list[Call]:
    """The non-layer parameters in the backward: torch FSDP2 gathers them again and reduce-scatters; Megatron-FSDP
    keeps them gathered and reduce-scatters their gradients every micro-batch (the post-accumulate-grad hooks,
    megatron_fsdp.py:1127-1140, under ``optim_grads_params``)."""
    if not megatron_fsdp(ctx):
        return fsdp_unit_backward(ctx, params, 0, -1, mb)
    return [c for c in fsdp_unit_backward(ctx, params, 0, -1, mb) if c.op == "reduce_scatter"]


# ------------------------------------------------------------------------------------- buckets and their calls
@dataclass(frozen=True)
class Tensor:
    """One parameter tensor of a model chunk on one rank: ``numel`` elements, in the expert buffer or the dense
    one, belonging to ``layer`` (``-1`` the embedding, ``num_layers`` the final norm and output layer);
    ``shared``: Megatron-LM's ``shared_embedding`` attribute (the tied word embedding on the first stage and its
    copy on the last, ``pp > 1``)."""

    numel: int
    expert: bool
    layer: int
    shared: bool = False


@dataclass(frozen=True)
class Bucket:
    """One DDP bucket: ``numel`` gradient elements of the dense (``expert=False``) or expert buffer. ``layer``:
    where the backward has reached when its bucket group is ready to reduce (``-1`` the embedding,
    ``num_layers`` the output layer)."""

    numel: int
    expert: bool
    layer: int


def experts_in_own_buffer(ctx: Context) -> bool:
    """Whether routed-expert weights live in DDP's expert buffers (reduced over the expert-data-parallel
    group, stepped by the expert optimizer): ``ep > 1`` or ``etp != tp``. Megatron-LM marks a TE expert
    linear ``allreduce = not use_expert_pgs`` with ``use_expert_pgs = is_expert and (expert_parallel or
    expert_tensor_parallel_size != tensor_model_parallel_size ...)`` (``core/extensions/transformer_engine.py``
    ~1235-1239, ~110) and ``group_params_for_buffers`` keys the buffer on ``not param.allreduce``
    (``core/distributed/param_and_grad_buffer.py`` ~925); otherwise the experts share the dense buffer."""
    p = ctx.parallel
    return ctx.model.is_moe and (p.ep > 1 or p.expert_tp != ctx.tp)


def layer_tensors(ctx: Context, layer: int) -> list[tuple[int, bool]]:
    """``(numel, expert)`` of one layer's parameter tensors on one rank, in Megatron-LM's module order with
    Transformer Engine layers (``TransformerLayer``: ``self_attention.linear_proj`` weight, bias;
    ``linear_qkv`` layer-norm weight, bias, weight, bias; then the MLP: ``linear_fc1`` layer-norm weight, bias,
    weight, bias, ``linear_fc2`` weight, bias; an MoE MLP: ``pre_mlp_layernorm``, ``router.weight``, the
    local experts' ``linear_fc1.weight0..`` and ``linear_fc2.weight0..``, the shared experts' fc1, fc2 [and
    gate]). The sizes sum to :func:`layer_parameters`; ``expert`` only when :func:`experts_in_own_buffer`."""
    m, tp, p = ctx.model, ctx.tp, ctx.parallel
    h = m.hidden_size
    k = 3 if m.gated_mlp else 2
    bias = m.add_bias_linear
    own = experts_in_own_buffer(ctx)
    norm = [(h, False)] + ([(h, False)] if m.normalization == "LayerNorm" else [])
    out: list[tuple[int, bool]] = [(n, False) for n in m.attention_tensors(tp)]
    if ctx.moe_pattern[layer]:
        fe, etp = m.expert_ffn_hidden_size, p.expert_tp
        local = m.num_experts // p.ep
        out += norm + [(h * m.num_experts, False)]
        out += [((k - 1) * fe * h // etp, own)] * local
        out += [((k - 1) * fe // etp, own)] * local if bias else []
        out += [(h * fe // etp, own)] * local + ([(h, own)] * local if bias else [])
        if m.num_shared_experts:
            sf = m.shared_expert_ffn_hidden_size
            out += [((k - 1) * sf * h // tp, False), (h * sf // tp, False)]
            if m.moe_shared_expert_gate:
                out.append((h, False))
    else:
        f = m.ffn_hidden_size
        out += norm + [((k - 1) * f * h // tp, False)] + ([((k - 1) * f // tp, False)] if bias else [])
        out += [(h * f // tp, False)] + ([(h, False)] if bias else [])
    return out


def chunk_tensors(ctx: Context, stage: int, chunk: int) -> list[Tensor]:
    """Every parameter tensor of a model chunk in module order (``GPTModel``: embedding word then position
    weights, the layers, final norm, output layer). With tied embeddings and ``pp > 1`` the word embedding of
    virtual stage 0 and the output-layer copy on the last virtual stage carry ``shared_embedding``
    (``LanguageModule.setup_embeddings_and_output_layer``, core/models/common/language_module/
    language_module.py ~270-290)."""
    m, tp = ctx.model, ctx.tp
    vs = ctx.virtual_stage(stage, chunk)
    vh = step.embedding_shard(m, tp)
    shared = m.tied_embeddings and ctx.pp > 1
    out: list[Tensor] = []
    if vs == 0:
        out.append(Tensor(vh, False, -1, shared))
        if m.position_embedding_type == "learned_absolute":
            out.append(Tensor((m.max_position_embeddings or m.seq_length) * m.hidden_size, False, -1))
    for la in ctx.chunk_layers(stage, chunk):
        out += [Tensor(n, e, la) for n, e in layer_tensors(ctx, la)]
    if vs == ctx.last_virtual:
        norms = [m.hidden_size] * (2 if m.normalization == "LayerNorm" else 1)
        out += [Tensor(n, False, m.num_layers) for n in norms]
        if not m.tied_embeddings or ctx.pp > 1:
            out.append(Tensor(vh, False, m.num_layers, shared))
    return out


def num_parameters(ctx: Context, stage: int) -> int:
    """Parameters one rank of ``stage`` holds over all its model chunks (``get_model``'s ``num_parameters``,
    megatron/training/training.py ~2442-2444)."""
    p = stage_parameters(ctx, stage)
    return p.dense + p.expert


DEFAULT_BUCKET_ELEMENTS = 40_000_000  # megatron/training/training.py ~2189: max(40M, 1M·dp·cp)
DEFAULT_BUCKET_PER_RANK = 1_000_000


def bucket_elements(dp: Any, cp: Any, bucket_size: Any, ddp_num_buckets: Any, first_stage_params: Any) -> Any:
    """The DDP bucket size in elements (scalars or numpy arrays; ``bucket_size`` and ``ddp_num_buckets`` are
    ``-1`` or ``None`` when unset), as ``resolve_ddp_bucket_size`` (megatron/training/training.py ~2179-2194)
    sets it on the training path: ``first_stage_params // ddp_num_buckets`` when ``ddp_num_buckets`` is set,
    else ``bucket_size``, else ``max(40,000,000, 1,000,000 · dp·cp)`` (the size of the ``dp_cp`` group;
    ``DistributedDataParallel.__init__``'s own fallback on the plain DP group, distributed_data_parallel.py
    ~133, is not reached from training). The one home of this rule: the predictor (:func:`bucket_size`) and the
    iteration-time formulation (:mod:`llmcomm.overhead.overlap`) both call it."""
    bs = np.asarray(-1 if bucket_size is None else bucket_size)
    nb = np.asarray(-1 if ddp_num_buckets is None else ddp_num_buckets)
    size = np.where(bs > 0, bs, np.maximum(DEFAULT_BUCKET_ELEMENTS, DEFAULT_BUCKET_PER_RANK
                                           * np.asarray(dp) * np.asarray(cp)))
    out = np.where(nb > 0, np.asarray(first_stage_params) // np.maximum(nb, 1), size)
    return int(out) if out.ndim == 0 else out


def chunk_is_bucketed(overlap_grad_reduce: Any, stage: Any, chunk: Any) -> Any:
    """Whether a model chunk's gradient buffers are split into buckets (scalars or numpy arrays): only with
    ``overlap_grad_reduce`` (distributed_data_parallel.py ~135-137 sets ``bucket_size = None`` without it), on the
    first pipeline stage (~160-171: ``if disable_bucketing or pp_rank > 0: self.bucket_size = None``) and its
    first model chunk (``get_model``: ``disable_bucketing = chunk_idx > 0``, megatron/training/training.py
    ~2504-2514; with ``disable_bucketing`` a buffer's buckets also form one bucket group,
    ``partition_buckets(force_single_bucket_group=...)``, distributed_data_parallel.py ~342-353). Elsewhere each
    buffer is one bucket. The one home of this rule (see :func:`bucket_elements`)."""
    out = np.logical_and(np.asarray(overlap_grad_reduce, dtype=bool),
                         np.logical_and(np.equal(stage, 0), np.equal(chunk, 0)))
    return bool(out) if out.ndim == 0 else out


def bucket_size(ctx: Context) -> int:
    """The DDP bucket size in elements (:func:`bucket_elements`); ``num_parameters`` is the first stage's
    (:func:`num_parameters`): only that stage buckets (:func:`chunk_bucket_size`)."""
    p = ctx.parallel
    first = num_parameters(ctx, 0) if p.ddp_num_buckets is not None else 0
    return bucket_elements(p.dp, p.cp, p.bucket_size, p.ddp_num_buckets, first)


def chunk_bucket_size(ctx: Context, stage: int, chunk: int) -> int | None:
    """The bucket size a model chunk's buffers use; ``None``: one bucket per buffer (:func:`chunk_is_bucketed`:
    ``None`` without ``overlap_grad_reduce``, on every pipeline stage but the first and on every model chunk but
    the first)."""
    if not chunk_is_bucketed(ctx.parallel.overlap_grad_reduce, stage, chunk):
        return None
    return bucket_size(ctx)


def buckets(ctx: Context, stage: int, chunk: int) -> list[Bucket]:
    """The buckets of one model chunk in the order their reductions are issued under ``overlap_grad_reduce``.

    Per buffer (dense and expert apart, :func:`experts_in_own_buffer`), the tensors are taken in reverse module
    order (backward order) and a bucket closes at the first tensor that brings it to ``>= size`` elements
    (:func:`chunk_bucket_size`; ``None``: never); what is left forms the last bucket
    (``_compute_default_per_buffer_param_layout``, core/distributed/param_and_grad_buffer.py ~954-1000). With
    the distributed optimizer the layout is ``DistributedOptimizer._compute_per_buffer_param_layout``
    (core/optimizer/distrib_optimizer.py ~505-575), which also gives a ``shared_embedding`` tensor a bucket of
    its own (closing the open bucket before it, and its own after it): one more bucket on the first and the
    last stage with tied embeddings and ``pp > 1``.

    Bucket groups (``partition_buckets``, param_and_grad_buffer.py ~1658-1730): on the first chunk each bucket is
    its own group (case 2, no fp8 parameters), reduced as soon as its gradients are ready; on a later chunk
    (``disable_bucketing``: ``force_single_bucket_group``) a buffer's buckets form one group, issued together
    (coalesced, one NCCL call per bucket) once the whole buffer is ready, so their ``layer`` is the last one's.
    Calls are ordered by where their group becomes ready in the backward. The distributed optimizer's padding of
    bucket ends to a multiple of the DP size (``pad_bucket_end``) and of parameter starts to 64 bytes is not
    modelled (at most ``dp - 1`` elements per bucket)."""
    size = chunk_bucket_size(ctx, stage, chunk)
    split_shared = ctx.parallel.distributed_optimizer
    tensors = chunk_tensors(ctx, stage, chunk)[::-1]
    out: list[tuple[int, Bucket]] = []
    for expert in (False, True):
        mine: list[tuple[int, Bucket]] = []
        acc, last = 0, -1
        for i, t in enumerate(tensors):
            if t.expert != expert:
                continue
            new_bucket = split_shared and t.shared
            if new_bucket and last >= 0 and acc:
                mine.append((last, Bucket(acc, expert, tensors[last].layer)))
                acc = 0
            acc, last = acc + t.numel, i
            if (size is not None and acc >= size) or new_bucket:
                mine.append((i, Bucket(acc, expert, t.layer)))
                acc = 0
        if acc:
            mine.append((last, Bucket(acc, expert, tensors[last].layer)))
        if chunk > 0 and mine:  # one bucket group per buffer, ready when its last bucket is
            pos, end = mine[-1][0], mine[-1][1].layer
            mine = [(pos, dataclasses.replace(b, layer=end)) for _, b in mine]
        out += mine
    return [b for _, b in sorted(out, key=lambda x: x[0])]


def buffer_order(bucket_list: list[Bucket]) -> list[Bucket]:
    """Buckets in ``bucket_groups + expert_parallel_bucket_groups`` order: the dense buffer's, then the expert
    buffer's, each from the end of the model (``DistributedDataParallel.finish_grad_sync`` and
    ``start_param_sync``, distributed_data_parallel.py ~638, ~677)."""
    return [b for b in bucket_list if not b.expert] + [b for b in bucket_list if b.expert]


def _bucket_call(ctx: Context, b: Bucket, phase: PhaseName, op: OpName, mb: int) -> Call | None:
    gb, pb, gdt, pdt = _sizes(ctx)
    p = ctx.parallel
    if b.expert and p.expert_dp == 1 or not b.expert and p.dp * p.cp == 1 or not b.numel:
        return None
    nbytes, dt = (b.numel * gb, gdt) if op != "all_gather" else (b.numel * pb, pdt)
    return Call(phase, "dp", op, "edp" if b.expert else _dp_kind(ctx), nbytes, dt, b.layer, mb)


def grad_sync(ctx: Context, bucket_list: list[Bucket]) -> list[Call]:
    """Without ``overlap_grad_reduce``: the once-per-iteration reduction of one model chunk, one call per
    bucket (all-reduce, or reduce-scatter with the distributed optimizer) in buffer order
    (``finish_grad_sync`` -> ``start_grad_sync``, param_and_grad_buffer.py ~600-830): the dense buckets over
    ``dp·cp``, the expert ones over ``edp``. Without the shared-embedding split there is one bucket per
    buffer."""
    if ctx.parallel.fsdp or ctx.parallel.overlap_grad_reduce:
        return []
    op: OpName = "reduce_scatter" if ctx.parallel.distributed_optimizer else "all_reduce"
    calls = [_bucket_call(ctx, b, "optimizer", op, -1) for b in buffer_order(bucket_list)]
    return [dataclasses.replace(c, layer=-1) for c in calls if c is not None]


def overlapped_grad_sync(ctx: Context, bucket_list: list[Bucket], layer: int, mb: int) -> list[Call]:
    """``overlap_grad_reduce``: the reductions of the bucket groups that become ready at ``layer`` in the last
    micro-batch's backward (``_make_backward_post_hook`` -> ``register_grad_ready`` -> ``start_grad_sync``
    of the bucket group, core/distributed/distributed_data_parallel.py); ``finish_grad_sync`` then only waits."""
    if not ctx.parallel.overlap_grad_reduce or ctx.parallel.fsdp or mb != ctx.num_microbatches - 1:
        return []
    op: OpName = "reduce_scatter" if ctx.parallel.distributed_optimizer else "all_reduce"
    calls = [_bucket_call(ctx, b, "backward", op, mb) for b in bucket_list if b.layer == layer]
    return [c for c in calls if c is not None]


def param_gather_passes(ctx: Context, stage: int) -> int:
    """How many times the distributed optimizer all-gathers every bucket group of a stage after the step: 2
    when the stage also has an expert optimizer (its expert buffers are not empty), else 1.

    ``get_megatron_optimizer`` builds a dense ``DistributedOptimizer`` over the model chunks and, when there are
    expert-parallel parameters, an expert one over the *same* chunks (core/optimizer/__init__.py ~1162-1240),
    chained. ``ChainedOptimizer.step_with_ready_grads`` -> ``_step`` calls each one's
    ``step_with_ready_grads`` (core/optimizer/optimizer.py ~1667-1675, ~1770-1774), and each, without
    ``overlap_param_gather`` (not modelled: the default), runs ``start_param_sync_for_bucket_group_subset``,
    which walks ``model_chunk.bucket_groups + model_chunk.expert_parallel_bucket_groups`` of every chunk it
    holds (core/optimizer/distrib_optimizer.py ~3139-3195). ``_ParamAndGradBucketGroup.start_param_sync``
    (param_and_grad_buffer.py ~383-536) sets ``param_gather_dispatched`` but never checks it, so nothing
    de-duplicates: every dense and expert bucket is gathered by the dense optimizer and again by the expert
    one. Only the MXFP8 buffer-reuse path defers and de-duplicates (``_enable_deferred_mxfp8_param_sync``,
    optimizer.py ~1700-1735, whose comment says the two optimizers share chunks). Read at HEAD d98e8a6; the
    per-rank condition (a stage without expert parameters has no expert optimizer) follows
    ``if len(moe_param_groups) > 0`` (__init__.py ~1226)."""
    if not ctx.parallel.distributed_optimizer or ctx.parallel.fsdp:
        # FSDP: the distributed optimizer holds no DDP buffers (Megatron-FSDP manages weights and gradients,
        # distrib_optimizer.py:704-706) and its step calls MegatronFSDP.start_param_sync instead
        # (distrib_optimizer.py:3181-3185): the parameters are gathered per unit in the forward
        return 0
    return 2 if experts_in_own_buffer(ctx) and stage_parameters(ctx, stage).expert else 1


def param_gather(ctx: Context, bucket_list: list[Bucket]) -> list[Call]:
    """Distributed optimizer: one parameter all-gather per bucket in ``param_dtype`` after the step, dense
    buckets first, then expert ones (``start_param_sync``: ``bucket_groups + expert_parallel_bucket_groups``)."""
    if not ctx.parallel.distributed_optimizer:
        return []
    calls = [_bucket_call(ctx, b, "optimizer", "all_gather", -1) for b in buffer_order(bucket_list)]
    return [dataclasses.replace(c, layer=-1) for c in calls if c is not None]
