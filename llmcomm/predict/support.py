"""What the Megatron-LM predictor relies on or does not model, beyond :func:`llmcomm.specs.validate`: one small
check per rule, each raising :class:`~llmcomm.errors.ConfigError` that names the rule and its source. Used by
:func:`llmcomm.predict.predict_traffic` and :func:`llmcomm.predict.audit_table`."""

from __future__ import annotations

from .. import rules
from ..errors import ConfigError
from ..specs import ModelSpec, ParallelConfig


def check_supported(model: ModelSpec, parallel: ParallelConfig, framework: str = "megatron") -> None:
    """Rules of Megatron-LM the predictor relies on, beyond :func:`llmcomm.specs.validate`, and what it does not
    model; each a small check of its own."""
    if framework != "megatron":
        return
    for check in (_moe_needs_sp, _mla_needs_sp, _no_hybrid, _no_mtp, _cp_attention_kind, _no_partial_distopt):
        check(model, parallel)
    _fp8_wire_known(model, parallel)  # acc-fp8wire


def _fp8_wire_known(model: ModelSpec, parallel: ParallelConfig) -> None:
    """The SP collectives' bytes under FP8 are known for TransformerEngine's built-in recipes only
    (:mod:`llmcomm.predict.fp8_wire`); a ``custom`` recipe's quantizers are the user's."""
    from .fp8_wire import RULE

    if parallel.fp8 is not None and parallel.sp and parallel.tp > 1 and parallel.fp8_recipe not in RULE:
        raise ConfigError(f"fp8_recipe={parallel.fp8_recipe!r} with sp and tp={parallel.tp} is not predicted "
                          f"(rule fp8-wire-recipe): the bytes TransformerEngine sends are known for {tuple(RULE)}; a "
                          "'custom' recipe's quantizers are the user's (llmcomm.predict.fp8_wire)")


def _moe_needs_sp(model: ModelSpec, parallel: ParallelConfig) -> None:
    """The ``megatron`` rules of :mod:`llmcomm.rules` (an MoE model with tp > 1 needs SP, written once there)."""
    rules.check(model, parallel, ("megatron",))


def _mla_needs_sp(model: ModelSpec, parallel: ParallelConfig) -> None:
    if model.multi_latent_attention and parallel.tp > 1 and not parallel.sp:
        raise ConfigError("multi_latent_attention with tp>1 and sp=False is not predicted: reading Megatron-LM's "
                          "MLASelfAttention (multi_latent_attention.py ~640-763) leaves unclear which TP call reduces "
                          "the rotary key's gradient without SP; use sp=True (every MLA recipe does)")


def _no_hybrid(model: ModelSpec, parallel: ParallelConfig) -> None:
    if model.hybrid_override_pattern:
        raise ConfigError(f"model {model.name}: hybrid Mamba models (hybrid_override_pattern) are not predicted: "
                          "the Mamba mixer's TP/CP calls are not modelled")


def _no_mtp(model: ModelSpec, parallel: ParallelConfig) -> None:
    if model.mtp_num_layers:
        raise ConfigError(f"model {model.name}: mtp_num_layers={model.mtp_num_layers} (multi-token prediction) is "
                          "counted in the parameters but its calls are not predicted; predict "
                          "dataclasses.replace(model, mtp_num_layers=0), the main model")


def _cp_attention_kind(model: ModelSpec, parallel: ParallelConfig) -> None:
    """TransformerEngine's ``attn_forward_func_with_cp`` (context_parallel.py, TE d0067d0): sliding-window
    attention only with ``cp_comm_type`` ``a2a`` or ``all_gather`` (:5057-5060), attention sinks
    (``softmax_type`` other than vanilla) only with ``a2a`` (:5065-5067). Their calls are those of the type
    (:mod:`.cp`: the gathers carry the whole K, V; the all-to-alls the whole tensors)."""
    if parallel.cp == 1:
        return
    kind = parallel.cp_comm_type
    if model.window_size is not None and kind not in ("a2a", "all_gather"):
        raise ConfigError(
            f"model {model.name}: cp>1 with sliding-window attention needs cp_comm_type 'a2a' or 'all_gather' "
            f"(got {kind!r}): TransformerEngine refuses it otherwise "
            "(attention/dot_product_attention/context_parallel.py:5057-5060)")
    if model.softmax_type != "vanilla" and kind != "a2a":
        raise ConfigError(
            f"model {model.name}: cp>1 with attention sinks (softmax_type={model.softmax_type!r}) needs "
            f"cp_comm_type='a2a' (got {kind!r}): TransformerEngine refuses it otherwise "
            "(attention/dot_product_attention/context_parallel.py:5065-5067)")


def _no_partial_distopt(model: ModelSpec, parallel: ParallelConfig) -> None:
    if parallel.num_distributed_optimizer_instances > 1:
        raise ConfigError(
            "num_distributed_optimizer_instances > 1 is not predicted: its reduce-scatter runs over the intra-"
            "instance partial data-parallel group and an all-reduce over the inter-instance group "
            "(param_and_grad_buffer.py start_grad_sync ~700-745; intra groups: slices of the dp-cp ranks, "
            "parallel_state.py ~984-1014; the dense buckets' inter-instance all-reduce uses the expert grid's "
            "inter-partial group, get_inter_distributed_optimizer_instance_group ~2457-2467, built by "
            "create_hierarchical_groups ~1474-1496; the norm's intra_dist_opt_group ~1564-1577), groups the layout "
            "does not build")
