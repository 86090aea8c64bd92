"""An audit table of the predictor for one configuration: every call Megatron-LM issues per micro-batch and
per iteration, grouped by where in Megatron-LM's (or TransformerEngine's) code it comes from.

The table is built from the same generator functions the predictor strings together (:mod:`.program`), one
origin at a time, so that a reader can check each line against the cited source; its totals per stage equal
the calls :func:`llmcomm.predict.predict_traffic` issues on one rank of that stage (checked by the tests).

Columns: ``stage``, ``scope`` (``micro-batch``: issued for every micro-batch; ``iteration``: once per
iteration), ``origin`` (Megatron-LM / TransformerEngine function), ``generator`` (the llmcomm function),
``phase``, ``parallelism``, ``op``, ``group`` (group kind, see :data:`llmcomm.vocab.CALL_GROUP_KINDS`), ``bytes``,
``dtype``, ``calls_per_microbatch`` (0 for iteration scope), ``calls_per_iteration`` and
``bytes_per_iteration`` (``bytes · calls_per_iteration``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pandas as pd

from .. import step
from ..specs import ModelSpec, ParallelConfig, load_model, validate
from ..vocab import dtype_bytes
from . import cp, dp, ep, pp, program, scalars, tp
from .batch import batch_broadcast
from .calls import Call, Context
from .support import check_supported

COLUMNS = ("stage", "scope", "origin", "generator", "phase", "parallelism", "op", "group", "bytes", "dtype",
           "calls_per_microbatch", "calls_per_iteration", "bytes_per_iteration")

_MC = "megatron/core/"
ORIGINS = {
    "batch": "pretrain_gpt.py get_batch -> core/utils.py get_batch_on_this_tp_rank (broadcast per tensor)",
    "p2p": _MC + "pipeline_parallel/schedules.py + p2p_communication.py (send/recv of activations and grads)",
    "p2p_partitioned": "DeepSpeed deepspeed/runtime/pipe/engine.py (pipe_partitioned: PartitionedTensor.full all-gathers "
                       "over TP on receiving activations and grads and before the backward pass)",
    "embedding": _MC + "models/common/embeddings/language_model_embedding.py + tensor_parallel/layers.py "
                       "VocabParallelEmbedding.forward",
    "attention_tp": _MC + "tensor_parallel/layers.py ColumnParallelLinear (linear_qkv; MLA: "
                          "multi_latent_attention.py up projections, k_pos_emb gather) + RowParallelLinear "
                          "(linear_proj); mappings.py",
    "cp_ring": "TransformerEngine pytorch/attention/dot_product_attention/context_parallel.py "
               "AttnFuncWithCPAndKVP2P",
    "cp_all_gather": "TransformerEngine pytorch/attention/dot_product_attention/context_parallel.py "
                     "AttnFuncWithCPAndKVAllGather",
    "cp_a2a": "TransformerEngine pytorch/attention/dot_product_attention/context_parallel.py "
              "AttnFuncWithCPAndQKVOA2A",
    "mlp_tp": _MC + "tensor_parallel/layers.py ColumnParallelLinear (linear_fc1) + RowParallelLinear "
                    "(linear_fc2); mappings.py",
    "moe": _MC + "transformer/moe/moe_layer.py forward: shared_experts.py, router.py (aux losses), "
                 "token_dispatcher.py (dispatcher)",
    "output": _MC + "tensor_parallel/layers.py ColumnParallelLinear (output_layer) "
                    "LinearWithGradAccumulationAndAsyncCommunication",
    "cross_entropy": _MC + "tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy.forward",
    "fsdp": _MC + "distributed (FSDP: parameter all-gather, gradient reduce-scatter per unit)",
    "buckets": _MC + "distributed/param_and_grad_buffer.py bucket groups (overlap_grad_reduce, last "
                     "micro-batch's backward)",
    "grad_sync": _MC + "distributed/finalize_model_grads.py finish_grad_sync per model chunk -> "
                       "param_and_grad_buffer.py start_grad_sync (one call per bucket)",
    "norm_grads": _MC + "distributed/finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads",
    "tied_embedding": _MC + "distributed/finalize_model_grads.py _allreduce_word_embedding_grads",
    "expert_bias": _MC + "distributed/finalize_model_grads.py _update_router_expert_bias -> moe_utils.py "
                         "get_updated_expert_bias",
    "per_token_loss": _MC + "distributed/finalize_model_grads.py finalize_model_grads (num_tokens broadcast over "
                            "pp, all-reduce over dp_cp)",
    "rerun": _MC + "rerun_state_machine.py should_run_forward_backward -> _reduce_any (int32 over the world)",
    "grad_norm": _MC + "optimizer/clip_grads.py get_grad_norm_fp32 per gradient-statistics group "
                       "(ChainedOptimizer.get_grad_norm; + fp16 found_inf, optimizer.py)",
    "param_gather": _MC + "optimizer/distrib_optimizer.py step_with_ready_grads -> "
                          "start_param_sync_for_bucket_group_subset (per optimizer, chunk and bucket)",
    "moe_metrics": _MC + "transformer/moe/moe_logging.py MoEMetricsTracker._sync_metrics (training_log)",
    "train_step": "megatron/training/training.py train_step (logical_and / reduce_max over mp, loss over dp_cp)",
}


def _rows(stage: int, scope: str, origin: str, gen: Callable, calls: list[Call], m: int) -> list[dict]:
    out = []
    for c in calls:
        per_mb = 1 if scope == "micro-batch" else 0
        out.append({"stage": stage, "scope": scope, "origin": ORIGINS[origin],
                    "generator": f"{gen.__module__.removeprefix('llmcomm.')}.{gen.__name__}",
                    "phase": c.phase, "parallelism": c.parallelism, "op": c.op, "group": c.group,
                    "bytes": c.bytes, "dtype": c.dtype, "calls_per_microbatch": per_mb,
                    "calls_per_iteration": m if per_mb else 1})
    return out


def _stage_rows(ctx: Context, stage: int) -> list[dict]:
    m, p = ctx.num_microbatches, ctx.parallel
    rows: list[dict] = []
    mb = 0
    cp_fwd, cp_bwd, cp_origin = cp.generators(ctx)  # the CP calls of the configuration's cp_comm_type

    def add(origin: str, gen: Callable, calls: list[Call], scope: str = "micro-batch") -> None:
        rows.extend(_rows(stage, scope, origin, gen, calls, m))

    for chunk in range(ctx.vpp):
        vs = ctx.virtual_stage(stage, chunk)
        layers = list(ctx.chunk_layers(stage, chunk))
        if vs > 0:
            add("p2p", pp.recv_forward, [pp.recv_forward(ctx, mb, layers[0])])
            add("p2p_partitioned", pp.partitioned_gathers, pp.partitioned_gathers(ctx, "forward", mb, layers[0]))
        add("batch", batch_broadcast, batch_broadcast(ctx, vs, mb))
        if vs == 0:
            add("embedding", tp.embedding_forward, tp.embedding_forward(ctx, mb))
        recomputed = ({layers[j] for g in step.recompute_groups(len(layers), p.recompute_method,
                                                                p.recompute_num_layers) for j in g}
                      if p.recompute == "full" else set())  # the layers full recomputation recomputes
        for phase_fwd in (True, False) if p.recompute == "full" else (True,):
            for la in layers:
                if not phase_fwd and la not in recomputed:
                    continue
                att = [c for part in tp.attention_forward(ctx, la, mb) for c in part]
                ring = cp_fwd(ctx, la, mb)
                mlp = ep.moe_forward(ctx, la, mb) if ctx.moe_pattern[la] else tp.block_forward(ctx, la, mb)
                if not phase_fwd:  # full recomputation repeats the forward calls in the backward
                    att, ring, mlp = ([dataclasses.replace(c, phase="backward") for c in x] for x in (att, ring, mlp))
                add("attention_tp", tp.attention_forward, att)
                add(cp_origin, cp_fwd, ring)
                add("moe" if ctx.moe_pattern[la] else "mlp_tp",
                    ep.moe_forward if ctx.moe_pattern[la] else tp.block_forward, mlp)
                if p.fsdp and phase_fwd:
                    d, e = dp.layer_parameters(ctx, la).dense, dp.layer_parameters(ctx, la).expert
                    add("fsdp", dp.fsdp_unit_forward, dp.fsdp_unit_forward(ctx, d, e, la, mb))
                    add("fsdp", dp.fsdp_unit_backward, dp.fsdp_unit_backward(ctx, d, e, la, mb))
        if vs == ctx.last_virtual:
            ce = tp.cross_entropy(ctx, mb)
            add("output", tp.output_forward, tp.output_forward(ctx, mb)[:len(tp.output_forward(ctx, mb)) - len(ce)])
            add("cross_entropy", tp.cross_entropy, ce)
            add("output", tp.output_backward, tp.output_backward(ctx, mb))
        else:
            add("p2p", pp.send_forward, [pp.send_forward(ctx, mb, layers[-1])])
            add("p2p", pp.recv_backward, [pp.recv_backward(ctx, mb, layers[-1])])
            add("p2p_partitioned", pp.partitioned_gathers, pp.partitioned_gathers(ctx, "backward", mb, layers[-1]))
        for la in layers:
            replay = program.recompute_replay(ctx, la, mb)  # selective recomputation of communicating modules
            add("moe" if ctx.moe_pattern[la] else "mlp_tp", program.recompute_replay, replay)
            if ctx.moe_pattern[la]:
                add("moe", ep.moe_backward, ep.moe_backward(ctx, la, mb))
            else:
                add("mlp_tp", tp.block_backward, tp.block_backward(ctx, la, mb))
            add("attention_tp", tp.attention_backward, [c for part in tp.attention_backward(ctx, la, mb) for c in part])
            add(cp_origin, cp_bwd, cp_bwd(ctx, la, mb))
        if vs == 0:
            add("embedding", tp.embedding_backward, tp.embedding_backward(ctx, mb))
        if vs > 0:
            add("p2p", pp.send_backward, [pp.send_backward(ctx, mb, layers[0])])
        if p.fsdp and vs in (0, ctx.last_virtual) and (vs == 0 or stage != 0):
            edge = dp.edge_parameters(ctx, stage)[0]
            if dp.megatron_fsdp(ctx):  # non-unit modules: gathered once per iteration (dp.fsdp_edge_forward)
                add("fsdp", dp.fsdp_edge_forward, dp.fsdp_edge_forward(ctx, edge, 0), "iteration")
            else:
                add("fsdp", dp.fsdp_edge_forward, dp.fsdp_edge_forward(ctx, edge, mb))
            add("fsdp", dp.fsdp_edge_backward, dp.fsdp_edge_backward(ctx, edge, mb))
    # once per iteration
    it = "iteration"
    bl = [dp.buckets(ctx, stage, c) for c in range(ctx.vpp)]
    if p.overlap_grad_reduce and not p.fsdp:
        for b in bl:
            calls = [x for la in sorted({k.layer for k in b}, reverse=True)
                     for x in dp.overlapped_grad_sync(ctx, b, la, m - 1)]
            add("buckets", dp.overlapped_grad_sync, calls, it)
    for b in bl:
        add("grad_sync", dp.grad_sync, dp.grad_sync(ctx, b), it)
    gdt = p.grad_reduce_dtype
    add("norm_grads", tp.norm_grad_allreduce,
        tp.norm_grad_allreduce(ctx, dp.tp_replicated_grads(ctx, stage), dtype_bytes(gdt), gdt), it)
    add("tied_embedding", pp.tied_embedding_allreduce, pp.tied_embedding_allreduce(ctx, stage), it)
    add("expert_bias", ep.expert_bias_allreduce, ep.expert_bias_allreduce(ctx, stage), it)
    add("per_token_loss", scalars.per_token_loss, scalars.per_token_loss(ctx), it)
    add("rerun", scalars.rerun_state, scalars.rerun_state(ctx), it)
    add("grad_norm", scalars.grad_norm, scalars.grad_norm(ctx, stage), it)
    for _ in range(dp.param_gather_passes(ctx, stage)):
        for b in bl:
            add("param_gather", dp.param_gather, dp.param_gather(ctx, b), it)
    add("train_step", scalars.train_step_scalars, scalars.train_step_scalars(ctx, stage), it)
    add("moe_metrics", scalars.moe_metrics, scalars.moe_metrics(ctx), it)
    return rows


def audit_table(model: ModelSpec | str, parallel: ParallelConfig, stages: list[int] | None = None) -> pd.DataFrame:
    """The calls one rank of each pipeline stage issues under Megatron-LM, per micro-batch and per iteration,
    grouped by code origin (see the module docstring). Identical calls of one origin are merged and counted
    (for example the two attention all-reduces of every layer)."""
    if isinstance(model, str):
        model = load_model(model)
    validate(model, parallel)
    check_supported(model, parallel)
    ctx = Context(model, parallel, "megatron")
    rows = [r for s in (range(parallel.pp) if stages is None else stages) for r in _stage_rows(ctx, s)]
    if not rows:
        return pd.DataFrame(columns=list(COLUMNS))
    df = pd.DataFrame(rows)
    keys = ["stage", "scope", "origin", "generator", "phase", "parallelism", "op", "group", "bytes", "dtype"]
    df = df.groupby(keys, sort=False, observed=True)[["calls_per_microbatch", "calls_per_iteration"]].sum()
    df = df.reset_index()
    df["bytes_per_iteration"] = df["bytes"] * df["calls_per_iteration"]
    return df[list(COLUMNS)]
