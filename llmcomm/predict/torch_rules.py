"""The program of a stage under torch's own parallel APIs, as the project's collector uses them
(``llmcomm/collect/parallelize.py``; what each API issues is documented in
``llmcomm/collect/WHAT_TORCH_ISSUES.md`` and checked against ``data/traces/*.parquet`` by
``tests/test_predict_vs_recorded.py``).

Differences from Megatron-LM (:mod:`.program`), with ``A = b·s·h·act`` and ``V`` the vocabulary:

* vocabulary not padded (``V``, not ``V'``);
* output layer (``ColwiseParallel`` gathered to full logits): forward all-gather of the logits
  ``b·s·V·act`` instead of Megatron's three fp32 cross-entropy all-reduces of ``b·s`` (the loss is then
  computed on replicated logits); backward: all-reduce ``A`` without SP, reduce-scatter ``A`` with SP (no
  re-gather of the input);
* SP backward of a block: all-gather + reduce-scatter (2 calls, not Megatron's 3: torch's DTensor keeps the
  gathered input, so there is no second all-gather for the weight gradient); the SP calls are tagged ``sp``;
* SP norm gradients: one all-reduce of ``h·act`` per LayerNorm weight and per bias (4 per layer, 2 for the
  final norm) instead of Megatron's one coalesced all-reduce, issued during the last micro-batch's backward;
* MoE layers: the MLP is not tensor-parallel (no TP call for it); an extra all-to-all of the per-expert token
  counts (``8·E`` bytes, int64) precedes each forward dispatch;
* DP (``replicate``, FSDP2-based DDP): one gradient all-reduce per transformer block plus one for the root
  (embedding; output layer and final norm), in ``grad_reduce_dtype``, during the last micro-batch's
  backward (``phase="backward"``), instead of one bucket per iteration (recorded order: with pp > 1 the root
  first, then the blocks in descending order, after the stage's backward; with pp = 1 each block's as its
  backward finishes, the root last); experts (``ep > 1``) over the
  expert-data-parallel group; no distributed optimizer, no FSDP, no tied-embedding all-reduce;
* pipeline: ``torch.distributed.pipelining`` GPipe / 1F1B only (no interleaving), same p2p sizes and peers;
  its setup traffic (shape votes, metadata objects, one real forward/backward) is ``phase="setup"`` in the
  recordings and is not predicted;
* no activation recomputation.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..vocab import OpName, ParallelismName, PhaseName, dtype_bytes
from . import ep as epmod
from . import pp
from .calls import Call, Context
from .schedule import schedule


def _check(ctx: Context) -> None:
    p = ctx.parallel
    for flag, bad in (("vpp", p.vpp > 1), ("distributed_optimizer", p.distributed_optimizer), ("fsdp", p.fsdp),
                      ("recompute", p.recompute != "none"), ("cp", p.cp > 1),
                      ("overlap_grad_reduce", p.overlap_grad_reduce), ("etp", p.expert_tp != p.tp),
                      ("moe_token_dispatcher_type", p.moe_token_dispatcher_type != "alltoall"),
                      ("moe_aux_loss_coeff", p.moe_aux_loss_coeff > 0), ("pipe_partitioned", p.pipe_partitioned),
                      ("moe_router_dtype", p.moe_router_dtype is not None),
                      ("moe_router_enable_expert_bias", p.moe_router_enable_expert_bias),
                      ("calculate_per_token_loss", p.calculate_per_token_loss)):
        if bad:
            raise ConfigError(f"framework='torch': {flag} is not used by the collector's torch workloads")
    m = ctx.model
    for flag, bad in (("multi_latent_attention", m.multi_latent_attention), ("qk_layernorm", m.qk_layernorm),
                      ("moe_shared_expert_gate", m.moe_shared_expert_gate), ("mtp_num_layers", m.mtp_num_layers != 0),
                      ("softmax_type", m.softmax_type != "vanilla"), ("hybrid_override_pattern",
                                                                     bool(m.hybrid_override_pattern))):
        if bad:
            raise ConfigError(f"framework='torch': model field {flag} is not used by the collector's torch workloads")


def _tp(ctx: Context, phase: PhaseName, op: OpName, nbytes: int, layer: int, mb: int) -> Call:
    """A TP-group call; tagged ``sp`` when sequence parallelism is on and it is a gather or scatter (the
    recorder's convention: without SP the logits all-gather is ``tp``)."""
    par: ParallelismName = "sp" if ctx.sp and op in ("all_gather", "reduce_scatter") else "tp"
    return Call(phase, par, op, "tp", nbytes, ctx.act_dtype, layer, mb)


def _block(ctx: Context, phase: PhaseName, layer: int, mb: int) -> list[Call]:
    if ctx.tp == 1:
        return []
    a = ctx.act_bytes
    if ctx.sp:
        return [_tp(ctx, phase, "all_gather", a, layer, mb), _tp(ctx, phase, "reduce_scatter", a, layer, mb)]
    return [_tp(ctx, phase, "all_reduce", a, layer, mb)]


def _moe(ctx: Context, phase: PhaseName, layer: int, mb: int) -> list[Call]:
    if ctx.parallel.ep == 1:
        return []
    e = ctx.model.num_experts
    out = []
    if phase == "forward":
        out.append(Call("forward", "ep", "all_to_all", "ep", 8 * e, "int64", layer, mb, route="counts"))
    disp = epmod.uniform_split_bytes(ctx) * ctx.parallel.ep
    out.append(Call(phase, "ep", "all_to_all", "ep", disp, ctx.act_dtype, layer, mb, route="dispatch"))
    out.append(Call(phase, "ep", "all_to_all", "ep", disp, ctx.act_dtype, layer, mb, route="combine"))
    return out


def _block_params(ctx: Context, layer: int) -> tuple[int, int]:
    """``(dp, expert)`` local parameters of one transformer block."""
    m, t = ctx.model, ctx.tp
    h, a, g, d = m.hidden_size, m.num_attention_heads, m.query_groups, m.head_dim
    k = 3 if m.gated_mlp else 2
    dense = m.attention_projection_parameters() // t + 2 * m.norm_parameters()
    if m.add_bias_linear or m.add_qkv_bias:
        dense += (a * d + 2 * g * d) // t + (h if m.add_bias_linear else 0)
    if not ctx.moe_pattern[layer]:
        return dense + k * h * m.ffn_hidden_size // t + ((k - 1) * m.ffn_hidden_size // t + h
                                                           if m.add_bias_linear else 0), 0
    experts = (m.num_experts // ctx.parallel.ep) * k * h * m.expert_ffn_hidden_size
    dense += h * m.num_experts
    return (dense, experts) if ctx.parallel.ep > 1 else (dense + experts, 0)


def _dp_calls(ctx: Context, dense: int, expert: int, layer: int, mb: int) -> list[Call]:
    gdt = ctx.parallel.grad_reduce_dtype
    gb = dtype_bytes(gdt)
    out = []
    if ctx.parallel.dp > 1 and dense:
        out.append(Call("backward", "dp", "all_reduce", "dp", dense * gb, gdt, -1, mb))
    if ctx.parallel.expert_dp > 1 and expert:
        out.append(Call("backward", "dp", "all_reduce", "edp", expert * gb, gdt, -1, mb))
    return out


def _norm_ars(ctx: Context, n_norms: int, mb: int) -> list[Call]:
    if ctx.tp == 1 or not ctx.sp:
        return []
    per = ctx.model.norm_parameters() // ctx.model.hidden_size  # tensors per norm: 2 LayerNorm, 1 RMSNorm
    nbytes = ctx.model.hidden_size * dtype_bytes(ctx.parallel.grad_reduce_dtype)
    return [Call("backward", "tp", "all_reduce", "tp", nbytes, ctx.parallel.grad_reduce_dtype, -1, mb)
            for _ in range(n_norms * per)]


def _forward(ctx: Context, stage: int, mb: int) -> list[Call]:
    layers = ctx.chunk_layers(stage, 0)
    last = stage == ctx.pp - 1
    out: list[Call] = []
    if stage > 0:
        out.append(pp.recv_forward(ctx, mb, -1))
    if stage == 0 and ctx.tp > 1:
        out.append(_tp(ctx, "forward", "reduce_scatter" if ctx.sp else "all_reduce", ctx.act_bytes, -1, mb))
    for la in layers:
        out += _block(ctx, "forward", la, mb)
        out += _moe(ctx, "forward", la, mb) if ctx.moe_pattern[la] else _block(ctx, "forward", la, mb)
    if last and ctx.tp > 1:
        if ctx.sp:
            out.append(_tp(ctx, "forward", "all_gather", ctx.act_bytes, -1, mb))
        logits = ctx.tokens * ctx.model.vocab_size * ctx.act
        out.append(_tp(ctx, "forward", "all_gather", logits, -1, mb))
    if not last:
        out.append(pp.send_forward(ctx, mb, -1))
    return out


def _backward(ctx: Context, stage: int, mb: int) -> list[Call]:
    layers = ctx.chunk_layers(stage, 0)
    last = stage == ctx.pp - 1
    sync = mb == ctx.num_microbatches - 1  # gradient sync runs in the last micro-batch's backward
    out: list[Call] = []
    if not last:
        out.append(pp.recv_backward(ctx, mb, -1))
    elif ctx.tp > 1:
        out.append(_tp(ctx, "backward", "reduce_scatter" if ctx.sp else "all_reduce", ctx.act_bytes, -1, mb))
    # Recorded order of the gradient sync: with pp > 1 (the pipeline stage syncs after its backward) the
    # (final-norm SP all-reduces and) root all-reduce first, then the blocks' in descending order; with
    # pp = 1 (plain autograd) each block's all-reduce as soon as its backward is done, the root's last.
    inline = ctx.pp == 1
    m = ctx.model
    root: list[Call] = []
    if sync:
        root += _norm_ars(ctx, 1, mb) if last else []
        n_root = (m.vocab_size * m.hidden_size // ctx.tp) * (int(stage == 0) + int(last))
        root += _dp_calls(ctx, n_root + (m.norm_parameters() if last else 0), 0, -1, mb)
    tail: list[Call] = [] if inline else list(root)
    for la in reversed(layers):
        out += _moe(ctx, "backward", la, mb) if ctx.moe_pattern[la] else _block(ctx, "backward", la, mb)
        out += _block(ctx, "backward", la, mb)
        if sync:
            block = _norm_ars(ctx, 2, mb) + _dp_calls(ctx, *_block_params(ctx, la), la, mb)
            (out if inline else tail).extend(block)
    if stage == 0 and ctx.tp > 1 and ctx.sp:
        out.append(_tp(ctx, "backward", "all_gather", ctx.act_bytes, -1, mb))
    if stage > 0:
        out.append(pp.send_backward(ctx, mb, -1))
    if inline:
        tail = root
    return out + tail


def stage_program(ctx: Context, stage: int) -> list[Call]:
    """Every call of one rank of ``stage`` under the collector's torch parallelization, in issue order."""
    _check(ctx)
    sched = ctx.parallel.schedule if ctx.pp > 1 else "1f1b"  # pp = 1: forward then backward per micro-batch
    out: list[Call] = []
    for step in schedule(sched, ctx.num_microbatches, ctx.pp, stage, 1):
        out += (_forward if step.kind == "F" else _backward)(ctx, stage, step.microbatch)
    return out
