"""Per-iteration scalars every rank issues after the gradient sync (tiny in bytes, but calls in the count and
the temporal pattern). In Megatron-LM's order, after ``finalize_model_grads``:

0. the rerun state machine, under the default ``--rerun-mode validate_results`` (and ``report_stats``): after
   the forward-backward pass (so after ``finalize_model_grads``), ``train_step``'s ``while
   rerun_state_machine.should_run_forward_backward(...)`` asks a second time, and in state ``INITIAL_RUN``
   ``_reduce_any(self.rerun_requested)`` all-reduces one int32 over the world (default group)
   (core/rerun_state_machine.py ~325-329 -> ~263-270; megatron/training/training.py ~3045);
1. fp16 only (a grad scaler exists): ``found_inf`` all-reduce (MAX, one fp32) over each optimizer's
   gradient-statistics group (``MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan``,
   core/optimizer/optimizer.py; ``ChainedOptimizer.prepare_grads`` runs it per optimizer);
2. gradient norm: one fp32 all-reduce (SUM) over the gradient-statistics group
   (``get_grad_norm_fp32``, core/optimizer/clip_grads.py): the model-parallel group (``tp × pp``) without the
   distributed optimizer, every rank with it (``get_grad_stats_parallel_group``: "Distributed optimizer:
   Return the entire world"; ``intra_dist_opt_group``, core/optimizer/__init__.py ~674). With an expert
   optimizer (MoE with expert buffers, :func:`.dp.experts_in_own_buffer`) the optimizers are chained; the
   expert one's group is the expert ``tp-ep-pp`` group (``model_parallel_group=expt_tp_pp...``,
   __init__.py ~1242). ``ChainedOptimizer.get_grad_norm`` (optimizer.py ~1792-1808) makes one all-reduce when
   the groups are the same (distributed optimizer: both the world) and one per optimizer otherwise (dense over
   ``mp``, then expert over ``tpeppp``); the distributed optimizer's parameter all-gather follows the step;
3. ``train_step`` (megatron/training/training.py): ``logical_and_across_model_parallel_group`` (one int32,
   MIN) and ``reduce_max_stat_across_model_parallel_group(grad_norm)`` (one fp32, MAX), both over the
   model-parallel group (megatron/training/utils/common_utils.py);
4. last pipeline stage: the loss report, ``[loss sum, token count]`` (two fp32) all-reduced over the
   data-parallel group with CP (``torch.distributed.all_reduce(val, group=dp_cp_group)`` in ``train_step``).

5. MoE models: ``training_log`` reports the load-balancing losses through the metrics tracker once per step
   (``MoEMetricsTracker.report`` -> ``_sync_metrics``, core/transformer/moe/moe_logging.py): per tracked loss
   (:func:`moe_metric_names`) a tensor of ``num_layers`` fp32 values all-reduced over the pipeline group, over
   the router's ``tp_cp`` group when the router recorded into it (``moe_aux_loss_coeff > 0``), then averaged
   over the data-parallel group (without CP).

Groups of one rank issue nothing. Tagged ``other``, except the loss report (``dp``).
Not modelled: ``--log-num-zeros-in-grad`` (off by default), z-loss and other optional MoE metrics.
"""

from __future__ import annotations

from .calls import Call, Context


def _mp_size(ctx: Context) -> int:
    return ctx.tp * ctx.pp


def rerun_state(ctx: Context) -> list[Call]:
    """The rerun state machine's ``_reduce_any`` after the forward-backward pass: one int32 over the world
    (none with ``rerun_mode="disabled"``)."""
    if ctx.parallel.rerun_mode == "disabled" or ctx.parallel.world_size == 1:
        return []
    return [Call("optimizer", "other", "all_reduce", "world", 4, "int32")]


def per_token_loss(ctx: Context) -> list[Call]:
    """``calculate_per_token_loss``: at the end of ``finalize_model_grads`` the token count (``torch.int``,
    4 bytes, schedules.py ~776) is broadcast from the last pipeline stage over the pipeline group, then
    all-reduced over ``dp × cp`` (core/distributed/finalize_model_grads.py ~694-706)."""
    p = ctx.parallel
    if not p.calculate_per_token_loss:
        return []
    out = []
    if p.pp > 1:
        out.append(Call("optimizer", "other", "broadcast", "pp", 4, "int32", peer=-1))
    if p.dp * p.cp > 1:
        out.append(Call("optimizer", "dp", "all_reduce", "dpcp" if p.cp > 1 else "dp", 4, "int32"))
    return out


def grad_stats_groups(ctx: Context, stage: int) -> list[tuple[str, int]]:
    """``(kind, size)`` of each optimizer's gradient-statistics group on a rank of ``stage``, in chain order
    (dense, then expert when the stage has an expert optimizer; see item 2 above)."""
    from .dp import experts_in_own_buffer, stage_parameters

    p = ctx.parallel
    dense = ("world", p.world_size) if p.distributed_optimizer else ("mp", _mp_size(ctx))
    if not (experts_in_own_buffer(ctx) and stage_parameters(ctx, stage).expert):
        return [dense]
    if p.distributed_optimizer:
        return [dense, dense]
    return [dense, ("tpeppp", p.expert_tp * p.ep * p.pp)]


def grad_norm(ctx: Context, stage: int = 0) -> list[Call]:
    """fp16 ``found_inf`` per optimizer, then the gradient-norm all-reduce(s): one over the shared group, or one
    per optimizer when their groups differ."""
    groups = grad_stats_groups(ctx, stage)
    out = []
    if ctx.parallel.act_dtype == "fp16":
        out += [Call("optimizer", "other", "all_reduce", k, 4, "fp32") for k, n in groups if n > 1]
    norms = groups[:1] if len(set(groups)) == 1 else groups
    out += [Call("optimizer", "other", "all_reduce", k, 4, "fp32") for k, n in norms if n > 1]
    return out


def train_step_scalars(ctx: Context, stage: int) -> list[Call]:
    """``update_successful`` and ``grad_norm`` over the model-parallel group; the loss report on the last
    stage over DP × CP."""
    out = []
    if _mp_size(ctx) > 1:
        out += [Call("optimizer", "other", "all_reduce", "mp", 4, "int32"),
                Call("optimizer", "other", "all_reduce", "mp", 4, "fp32")]
    p = ctx.parallel
    if ctx.holds_output(stage) and p.dp * p.cp > 1:
        out.append(Call("optimizer", "dp", "all_reduce", "dpcp" if p.cp > 1 else "dp", 8, "fp32"))
    return out


def moe_metric_names(ctx: Context) -> list[tuple[str, str | None, bool]]:
    """``(name, reduce_group, needs_dp_avg)`` of the MoE metrics ``training_log`` syncs, in order.

    ``training_log`` tracks ``load_balancing_loss`` when ``"aux_loss" in args.moe_router_load_balancing_type``,
    ``seq_load_balancing_loss`` when ``"seq_aux_loss" in ...``, ``global_load_balancing_loss`` when
    ``"global_aux_loss" in ...`` (megatron/training/training.py ~3456-3462): on a string that is a substring
    test, so ``seq_aux_loss`` and ``global_aux_loss`` also track ``load_balancing_loss``; on a list,
    membership. ``report(force_initialize=True)`` creates the untouched ones as zeros with no reduce group and
    ``needs_dp_avg=True``; a router that recorded one (its coefficient > 0) set ``reduce_group`` to ``tp_cp``
    (``tp_dp_cp`` and ``needs_dp_avg=False`` for the global loss; router.py ~553-615,
    ``attach_and_log_load_balancing_loss``). z-loss (``moe_z_loss_coeff``) is not modelled."""
    p = ctx.parallel
    lb = p.moe_router_load_balancing_type
    contains = (lambda t: t in lb) if isinstance(lb, str) else (lambda t: t in p.load_balancing_types)
    on = p.moe_aux_loss_coeff > 0
    out = []
    for kind, name, group in (("aux_loss", "load_balancing_loss", "tpcp"),
                              ("seq_aux_loss", "seq_load_balancing_loss", "tpcp"),
                              ("global_aux_loss", "global_load_balancing_loss", "tpdpcp")):
        if not contains(kind):
            continue
        recorded = on and kind in p.load_balancing_types
        out.append((name, group if recorded else None, not (recorded and kind == "global_aux_loss")))
    return out


def moe_metrics(ctx: Context) -> list[Call]:
    """The MoE load-balancing-loss tracker sync, per tracked metric (:func:`moe_metric_names`): ``L`` fp32
    (``L = num_layers + mtp_num_layers``) all-reduced over pp, then over its reduce group, then averaged over
    DP (``MoEMetricsTracker._sync_metrics``, core/transformer/moe/moe_logging.py ~255-294)."""
    m, p = ctx.model, ctx.parallel
    if not m.is_moe:
        return []
    n = 4 * (m.num_layers + m.mtp_num_layers)
    sizes = {"tpcp": ctx.tp * p.cp, "tpdpcp": ctx.tp * p.dp * p.cp}
    out = []
    for _, group, dp_avg in moe_metric_names(ctx):
        if p.pp > 1:
            out.append(Call("optimizer", "other", "all_reduce", "pp", n, "fp32"))
        if group is not None and sizes[group] > 1:
            out.append(Call("optimizer", "other", "all_reduce", group, n, "fp32"))
        if dp_avg and p.dp > 1:
            out.append(Call("optimizer", "other", "all_reduce", "dp", n, "fp32"))
    return out
