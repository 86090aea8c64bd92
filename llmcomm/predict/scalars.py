"""Per-iteration scalars every rank issues after the gradient sync (tiny in bytes, but calls in the count and
the temporal pattern). In Megatron-LM's order, after ``finalize_model_grads``:

1. fp16 only (a grad scaler exists): ``found_inf`` all-reduce (MAX, one fp32) over the gradient-statistics
   group (``MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan``, core/optimizer/optimizer.py);
2. gradient norm: one fp32 all-reduce (SUM) over the gradient-statistics group
   (``get_grad_norm_fp32``, core/optimizer/clip_grads.py): the model-parallel group (``tp × pp``) without the
   distributed optimizer, every rank with it (``get_grad_stats_parallel_group``: "Distributed optimizer:
   Return the entire world"); the distributed optimizer's parameter all-gather follows the step;
3. ``train_step`` (megatron/training/training.py): ``logical_and_across_model_parallel_group`` (one int32,
   MIN) and ``reduce_max_stat_across_model_parallel_group(grad_norm)`` (one fp32, MAX), both over the
   model-parallel group (megatron/training/utils/common_utils.py);
4. last pipeline stage: the loss report, ``[loss sum, token count]`` (two fp32) all-reduced over the
   data-parallel group with CP (``torch.distributed.all_reduce(val, group=dp_cp_group)`` in ``train_step``).

5. MoE models: ``training_log`` reports the load-balancing loss through the metrics tracker once per step
   (``MoEMetricsTracker.report`` -> ``_sync_metrics``, core/transformer/moe/moe_logging.py): a tensor of
   ``num_layers`` fp32 values all-reduced over the pipeline group, over the router's ``tp_cp`` group when the
   router recorded into it (``moe_aux_loss_coeff > 0``), then averaged over the data-parallel group (without
   CP).

Groups of one rank issue nothing. Tagged ``other``, except the loss report (``dp``).
Not modelled: ``--log-num-zeros-in-grad`` (off by default), z-loss and other optional MoE metrics.
"""

from __future__ import annotations

from .calls import Call, Context


def _mp_size(ctx: Context) -> int:
    return ctx.tp * ctx.pp


def grad_norm(ctx: Context) -> list[Call]:
    """fp16 ``found_inf`` then the gradient-norm all-reduce, over the gradient-statistics group."""
    p = ctx.parallel
    kind, size = ("world", p.world_size) if p.distributed_optimizer else ("mp", _mp_size(ctx))
    if size == 1:
        return []
    out = []
    if p.act_dtype == "fp16":
        out.append(Call("optimizer", "other", "all_reduce", kind, 4, "fp32"))
    out.append(Call("optimizer", "other", "all_reduce", kind, 4, "fp32"))
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


def moe_metrics(ctx: Context) -> list[Call]:
    """The MoE load-balancing-loss tracker sync: ``num_layers`` fp32 over pp, [tp·cp], dp."""
    m, p = ctx.model, ctx.parallel
    if not m.is_moe:
        return []
    n = 4 * m.num_layers
    out = []
    if p.pp > 1:
        out.append(Call("optimizer", "other", "all_reduce", "pp", n, "fp32"))
    if p.moe_aux_loss_coeff > 0 and ctx.tp * p.cp > 1:
        out.append(Call("optimizer", "other", "all_reduce", "tpcp", n, "fp32"))
    if p.dp > 1:
        out.append(Call("optimizer", "other", "all_reduce", "dp", n, "fp32"))
    return out
