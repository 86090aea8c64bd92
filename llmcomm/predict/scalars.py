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

Groups of one rank issue nothing. Tagged ``other`` (model-parallel and world groups) or ``dp`` (the loss).
Not modelled: ``--log-num-zeros-in-grad`` (off by default), the MoE metrics tracker's logging sync.
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
