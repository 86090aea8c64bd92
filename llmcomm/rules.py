"""The validity rules of a training configuration, each written once, vectorized, with the source it comes from.

A rule is a predicate over a configuration ``p`` and (for most) a model: ``p`` is a
:class:`~llmcomm.specs.ParallelConfig` (Python scalars) or a :class:`~llmcomm.parallel_table.ParallelTable`
(numpy arrays, one entry per configuration) — both expose the same field names and derived sizes, so one
expression serves :meth:`ParallelConfig.validate`, :func:`llmcomm.specs.validate`, the predictor's checks, the
cost model's candidate tables and the tuner's space.

Scopes (which caller applies a rule):

``config``    needs no model (``ParallelConfig.validate``);
``job``       needs the model (``specs.validate``: every path);
``megatron``  what Megatron-LM's own runtime requires beyond ``job`` (the predictor with ``framework="megatron"``,
              the cost model, the tuner);
``cost``      what the iteration-time formulation models (:mod:`llmcomm.overhead.iteration`; the tuner's space
              holds only configurations it can rank).

Megatron-LM sources are cited at commit ``d98e8a6`` (NVIDIA/Megatron-LM, 2026-08-22); paths are relative to its
repository root.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from .errors import ConfigError
from .vocab import CP_COMM_TYPES, RECOMPUTE_MODULES

SCOPES = ("config", "job", "megatron", "cost")
Model = Any  # llmcomm.specs.ModelSpec (not imported: specs imports this module)


def _any(x: Any) -> bool:
    return bool(x) if isinstance(x, (bool, np.bool_)) else bool(np.any(x))


@dataclass(frozen=True)
class Rule:
    """``bad(model, p)`` is true where ``p`` breaks the rule; ``message(model, r)`` says how, for one
    configuration ``r`` (scalars)."""

    name: str
    scope: str
    source: str
    bad: Callable[[Model, Any], Any]
    message: Callable[[Model, Any], str]


def _seq(model: Model, p: Any) -> Any:
    return p.sequence_length(model)


def _method_bad(v: Any) -> Any:
    """Where ``recompute_method`` is not None, "uniform" or "block" (a scalar or an object array; no np.isin: this
    runs on every ParallelConfig)."""
    if v is None or isinstance(v, str):
        return v not in (None, "uniform", "block")
    if isinstance(v, np.ndarray) and v.size >= EACH_DISTINCT_MIN:  # a long column: once per distinct value
        return _each(v, lambda x: not (x == None or x == "uniform" or x == "block"))  # noqa: E711
    a = np.asarray(v, dtype=object)
    return ~((a == None) | (a == "uniform") | (a == "block"))  # noqa: E711  (elementwise on objects)


EACH_DISTINCT_MIN = 256  # _each: from this many elements on, the predicate runs once per distinct value


def _each(values: Any, fn: Callable[[Any], Any]) -> np.ndarray:
    """``[bool(fn(v)) for v in values]`` as a boolean array of ``values``' shape (a scalar or an object array):
    the per-element predicate of an object column. For a long column ``fn`` runs once per distinct value (equal
    values give equal verdicts): once where every row holds one value (one elementwise ``==``), else per value of
    pandas' hash table, the verdicts spread over the rows; ``None`` rows (which pandas counts as missing, with NaN)
    get ``fn(None)``, any other missing value its own call. The distinct values of a column are found once per
    :func:`check_table` call (:data:`_DISTINCT`: its rules ask several predicates of one column)."""
    a = np.asarray(values, dtype=object)
    flat = a.reshape(-1)
    if len(flat) < EACH_DISTINCT_MIN:
        return np.array([bool(fn(v)) for v in flat], dtype=bool).reshape(a.shape)
    memo = _DISTINCT[-1] if _DISTINCT else None
    hit = memo.get(id(values)) if memo is not None else None
    if hit is not None and hit[0] is values:
        kind = hit[1]
    else:
        kind = _distinct(flat)
        if memo is not None:
            memo[id(values)] = (values, kind)  # the column held: its id stays its own while the memo lives
    if kind is None:  # an unhashable element (a list): one call per element
        return np.array([bool(fn(v)) for v in flat], dtype=bool).reshape(a.shape)
    if len(kind) == 1:  # one value in every row (a column filled with it)
        return np.full(a.shape, bool(fn(kind[0])))
    codes, uniq, missing, none = kind
    lut = np.array([bool(fn(u)) for u in uniq] + [False], dtype=bool)  # code -1 (missing) reads the last entry
    out = lut[codes]
    if len(missing):
        out[missing[none]] = bool(fn(None))
        for i in missing[np.logical_not(none)].tolist():  # NaN, pd.NA, NaT: as they are
            out[i] = bool(fn(flat[i]))
    return out.reshape(a.shape)


def _distinct(flat: np.ndarray) -> tuple[Any, ...] | None:
    """What :func:`_each` needs of a long 1-D object array's values: ``(value,)`` where every element holds one
    value (one elementwise ``==``), ``None`` where an element is unhashable, else pandas' ``(codes, distinct values,
    missing rows, which of those are None)``."""
    first = np.empty(1, dtype=object)
    first[0] = flat[0]  # compared as one element (a tuple is not spread over an axis)
    if np.asarray(flat == first, dtype=bool).all():
        return (flat[0],)
    try:
        codes, uniq = pd.factorize(flat)
    except TypeError:
        return None
    missing = np.flatnonzero(codes < 0)
    none: np.ndarray = np.array([v is None for v in flat[missing].tolist()], dtype=bool)
    return codes, uniq, missing, none


_DISTINCT: list[dict[int, tuple[Any, Any]]] = []  # _each's distinct values per column, one dict per check_table call


def _equals(values: Any, value: Any) -> Any:
    """``np.asarray(values, dtype=object) == value`` (elementwise ``v == value``); a long object array through
    :func:`_each` (its column's distinct values found once per :func:`check_table` call)."""
    if isinstance(values, np.ndarray) and values.size >= EACH_DISTINCT_MIN:
        return _each(values, lambda v: v == value)
    return np.asarray(values, dtype=object) == value


def _differs(values: Any, value: Any) -> Any:
    """``np.asarray(values, dtype=object) != value`` (elementwise ``v != value``), as :func:`_equals`."""
    if isinstance(values, np.ndarray) and values.size >= EACH_DISTINCT_MIN:
        return _each(values, lambda v: v != value)
    return np.not_equal(np.asarray(values, dtype=object), value)


def _opt(v: Any) -> Any:
    """An optional layer count as an integer (array): ``None`` (a ParallelConfig) or ``-1`` (a table) -> ``-1``."""
    return -1 if v is None else v


def _first_last(p: Any) -> tuple[Any, Any]:
    return np.asarray(_opt(p.num_layers_in_first_pipeline_stage)), np.asarray(_opt(p.num_layers_in_last_pipeline_stage))


def _uneven(p: Any) -> Any:
    f, la = _first_last(p)
    return np.logical_or(f >= 0, la >= 0)


def _accounts(p: Any) -> Any:
    return np.logical_or(p.account_for_embedding_in_pipeline_split, p.account_for_loss_in_pipeline_split)


def _mixed_layers(m: Model) -> bool:
    """Whether the model has both dense and MoE layers (``moe_layer_freq``, first dense layers)."""
    pattern = getattr(m, "moe_layer_pattern", None)
    return bool(getattr(m, "is_moe", False)) and pattern is not None and not all(pattern())


def _even_total(m: Model, p: Any) -> Any:
    """``L + [embedding] + [loss]``: the layers the even split divides."""
    return (m.num_layers + np.asarray(p.account_for_embedding_in_pipeline_split, dtype=np.int64)
            + np.asarray(p.account_for_loss_in_pipeline_split, dtype=np.int64))


def _middle_stages(p: Any) -> Any:
    f, la = _first_last(p)
    return p.pp - (f >= 0).astype(np.int64) - (la >= 0).astype(np.int64)


def _rest(m: Model, p: Any) -> Any:
    f, la = _first_last(p)
    return m.num_layers - np.maximum(f, 0) - np.maximum(la, 0)


def _per_middle(m: Model, p: Any) -> Any:
    k = _middle_stages(p)
    return np.where(k > 0, _rest(m, p) // np.maximum(k, 1), 0)


def _leftover_bad(m: Model, p: Any) -> Any:
    k, rest = _middle_stages(p), _rest(m, p)
    return np.logical_or(rest < 0, np.where(k > 0, rest % np.maximum(k, 1) != 0, rest != 0))


def _uneven_vpp_bad(m: Model, p: Any) -> Any:
    f, la = _first_last(p)
    v = p.vpp
    return np.logical_or.reduce([np.logical_and(f >= 0, f % v != 0), np.logical_and(la >= 0, la % v != 0),
                                 np.logical_and(_middle_stages(p) > 0, _per_middle(m, p) % v != 0)])


def _smallest_chunk(m: Model, p: Any) -> Any:
    """The fewest layers any model chunk holds (:func:`llmcomm.stage_split.pipeline_split`), for splits the other rules
    accept."""
    f, la = _first_last(p)
    v = p.vpp
    per_chunk = _even_total(m, p) // (p.pp * v)
    emb = np.asarray(p.account_for_embedding_in_pipeline_split, dtype=np.int64)
    loss = np.asarray(p.account_for_loss_in_pipeline_split, dtype=np.int64)
    single = (p.pp * v == 1)
    even = np.where(single, per_chunk - emb - loss, per_chunk - np.maximum(emb, loss))
    big = np.iinfo(np.int64).max
    uneven = np.minimum.reduce([np.where(f >= 0, f // v, big), np.where(la >= 0, la // v, big),
                                np.where(_middle_stages(p) > 0, _per_middle(m, p) // v, big)])
    return np.where(_uneven(p), uneven, even)


# ParallelConfig fields the predictor models (issue 24) and the iteration-time formulation does not: refused at a
# non-default value (rule "cost-unmodelled"), and not counted as accepted by llmcomm.overhead.validation
COST_UNMODELLED_FIELDS = ("rerun_mode", "ddp_num_buckets", "num_distributed_optimizer_instances", "moe_router_dtype",
                          "moe_router_load_balancing_type", "moe_router_enable_expert_bias",
                          "cross_entropy_loss_fusion", "calculate_per_token_loss")


def _non_default(p: Any, field: str) -> Any:
    """Where ``field`` differs from ``ParallelConfig``'s default (a table holds ``-1`` for an unset integer)."""
    from .specs import ParallelConfig  # specs imports this module

    d = ParallelConfig.__dataclass_fields__[field].default
    v = getattr(p, field)
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            return _each(v, lambda x: x != d)
        return v != (-1 if d is None else d)
    return v != d


def _unmodelled(p: Any) -> Any:
    return np.logical_or.reduce([np.asarray(_non_default(p, f), dtype=bool) for f in COST_UNMODELLED_FIELDS])


def _module_sets(p: Any) -> np.ndarray:
    """``recompute_modules`` as a 1-D object array (a table's column, or one configuration's value alone)."""
    v = p.recompute_modules
    if isinstance(v, np.ndarray):
        return v
    one = np.empty(1, dtype=object)
    one[0] = v  # a tuple stays one element
    return one


def _modules_set(p: Any) -> Any:
    """Where ``recompute_modules`` is given (not ``None``)."""
    out = _each(_module_sets(p), lambda v: v is not None)
    return out if isinstance(p.recompute_modules, np.ndarray) else bool(out[0])


def _modules_bad(p: Any) -> Any:
    out = _each(_module_sets(p), lambda v: v is not None and (isinstance(v, str) or any(
        x not in RECOMPUTE_MODULES for x in v)))
    return out if isinstance(p.recompute_modules, np.ndarray) else bool(out[0])


def _has_module(p: Any, names: tuple[str, ...]) -> Any:
    """Where recomputation is selective and ``recompute_modules`` names one of ``names``."""
    has = _each(_module_sets(p), lambda v: v is not None and any(x in v for x in names))
    sel = _equals(p.recompute, "selective")
    return (has & sel) if isinstance(p.recompute_modules, np.ndarray) else bool(has[0] and sel)


def _expert_order_bad(p: Any) -> Any:
    """Where the order is not pp-last while ``pp > 1`` and the expert DP size differs from dp, for ``etp != tp``
    (rule ``expert-order``)."""
    not_pp_last = _each(np.atleast_1d(np.asarray(p.order, dtype=object)), lambda o: not str(o).endswith("pp"))
    out = (np.asarray(p.pp) > 1) & (np.asarray(p.expert_dp) != np.asarray(p.dp)) & \
        (np.asarray(p.expert_tp) != np.asarray(p.tp)) & not_pp_last.reshape(np.shape(p.tp))
    return out if isinstance(p.tp, np.ndarray) else bool(out)


FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise", "custom")  # transformer_config.py:594

RULES: tuple[Rule, ...] = (
    # ------------------------------------------------------------------------------------ config
    Rule("positive-sizes", "config", "kit: every size is a positive integer (ParallelConfig.validate's type checks)",
         lambda m, p: np.logical_or.reduce([np.asarray(getattr(p, f)) < 1 for f in (
             "tp", "pp", "dp", "ep", "cp", "vpp", "micro_batch", "global_batch")]),
         lambda m, r: "tp, pp, dp, ep, cp, vpp, micro_batch and global_batch must be positive integers"),
    Rule("pipe-partitioned-sp", "config",
         "kit: DeepSpeed's PipelineEngine (deepspeed/runtime/pipe/engine.py pipe_partitioned) splits the "
         "pipeline tensor over TP itself; with SP it is already split",
         lambda m, p: np.logical_and(p.pipe_partitioned, p.sp),
         lambda m, r: "pipe_partitioned (DeepSpeed's pipeline engine) with sp=True is not modelled: SP already "
                      "splits the pipeline tensor over TP"),
    Rule("batch-divisible", "config", "megatron/core/num_microbatches_calculator.py:381",
         lambda m, p: p.global_batch % (p.micro_batch * p.dp) != 0,
         lambda m, r: f"micro_batch*dp={r.micro_batch * r.dp} does not divide global_batch={r.global_batch}"),
    Rule("fp8-format", "config", "megatron/core/transformer/transformer_config.py:587 (fp8: None, 'e4m3' or 'hybrid')",
         lambda m, p: _each(np.atleast_1d(np.asarray(p.fp8, dtype=object)),
                            lambda v: v not in (None, "hybrid", "e4m3")).reshape(np.shape(p.tp)),
         lambda m, r: f"fp8={r.fp8!r} is not one of None, 'hybrid', 'e4m3' (Megatron-LM's --fp8-format)"),
    Rule("fp8-recipe", "config", "megatron/core/transformer/transformer_config.py:594",
         lambda m, p: _each(p.fp8_recipe, lambda v: v not in FP8_RECIPES),
         lambda m, r: f"fp8_recipe={r.fp8_recipe!r} is not one of {FP8_RECIPES} (Megatron-LM's --fp8-recipe)"),
    # context parallelism's communication type (issue 20; llmcomm.predict.cp holds the calls of each)
    Rule("cp-comm-type", "config",
         "megatron/training/arguments.py:3221 (--cp-comm-type) and megatron/core/transformer/transformer_config.py:1030 "
         "(p2p, all_gather, a2a, a2a+p2p; TransformerEngine context_parallel.py:5139 raises on any other)",
         lambda m, p: _each(p.cp_comm_type, lambda v: v not in CP_COMM_TYPES),
         lambda m, r: f"cp_comm_type={r.cp_comm_type!r} is not one of {CP_COMM_TYPES} (Megatron-LM's --cp-comm-type)"),
    Rule("cp-hierarchical", "config",
         "megatron/training/arguments.py:583 (a2a+p2p needs --hierarchical-context-parallel-sizes, "
         "model_parallel_config.py:103; groups from parallel_state.py:1127); kit: ParallelConfig does not carry "
         "the hierarchical sizes and Layout has no a2a/p2p sub-groups of the CP group",
         lambda m, p: np.asarray(p.cp_comm_type, dtype=object) == "a2a+p2p",
         lambda m, r: "cp_comm_type='a2a+p2p' needs hierarchical_context_parallel_sizes (Megatron-LM's "
                      "--hierarchical-context-parallel-sizes: the a2a group inside, the p2p ring across), which the "
                      "kit does not model; use 'p2p', 'all_gather' or 'a2a'"),
    Rule("sp-needs-tp", "config",
         "megatron/training/arguments.py:1433 (Megatron turns SP off at tp = 1; the kit refuses instead)",
         lambda m, p: np.logical_and(p.sp, p.tp == 1),
         lambda m, r: "sp=True needs tp > 1 (sequence parallelism splits over the TP group)"),
    Rule("expert-grid", "config", "megatron/core/parallel_state.py:883",
         lambda m, p: p.world_size % (p.expert_tp * p.ep * p.pp) != 0,
         lambda m, r: f"world size {r.world_size} is not divisible by etp*ep*pp={r.expert_tp * r.ep * r.pp} "
                      "(Megatron-LM parallel_state.initialize_model_parallel: world_size must be divisible by "
                      "expert_tensor_parallel_size * expert_model_parallel_size * pipeline_model_parallel_size)"),
    Rule("interleaved-needs-pp", "config", "megatron/training/arguments.py:1002",
         lambda m, p: np.logical_and(p.vpp > 1, p.pp < 2),
         lambda m, r: f"vpp={r.vpp} (interleaved schedule) needs pp >= 2, got pp={r.pp}"),
    Rule("vp-group-range", "config", "megatron/core/pipeline_parallel/schedules.py:1160",
         lambda m, p: np.logical_and(p.vpp > 1, np.logical_or(p.vp_group_size < p.pp,
                                                              p.vp_group_size > p.num_microbatches)),
         lambda m, r: f"microbatch_group_size_per_vp_stage={r.vp_group_size} must lie in [pp={r.pp}, "
                      f"num_microbatches={r.num_microbatches}] (Megatron-LM's interleaved schedule)"),
    Rule("vp-last-group", "config", "megatron/core/pipeline_parallel/schedules.py:1172",
         lambda m, p: np.logical_and(p.vpp > 1, np.logical_and(0 < p.num_microbatches % p.vp_group_size,
                                                               p.num_microbatches % p.vp_group_size < p.pp)),
         lambda m, r: f"num_microbatches={r.num_microbatches} % microbatch_group_size_per_vp_stage="
                      f"{r.vp_group_size} = {r.num_microbatches % r.vp_group_size} must be 0 or >= pp={r.pp} "
                      "(Megatron-LM's interleaved schedule: the last micro-batch group)"),
    Rule("vpp-needs-interleaved", "config", "kit: llmcomm.vocab.PipelineSchedule (virtual stages are interleaved 1F1B)",
         lambda m, p: np.logical_and(p.vpp > 1, p.schedule != "interleaved"),
         lambda m, r: f"vpp={r.vpp} needs schedule='interleaved' (virtual pipeline stages are interleaved 1F1B), "
                      f"got schedule={r.schedule!r}"),
    Rule("interleaved-needs-vpp", "config", "kit: llmcomm.vocab.PipelineSchedule",
         lambda m, p: np.logical_and(p.schedule == "interleaved", p.vpp == 1),
         lambda m, r: "schedule='interleaved' needs vpp > 1"),
    # FSDP and --recompute-modules (issue 20, deliverable 6); fsdp with distributed_optimizer is Megatron-FSDP,
    # which runs with the distributed optimizer (Megatron-FSDP v1 turns it on itself: megatron/training/arguments.py:1128-1135)
    Rule("fsdp-reshard-needs-fsdp", "config",
         "kit: reshard_after_forward is an FSDP option (torch fully_shard, torch/distributed/fsdp/_fully_shard/"
         "_fully_shard.py; Megatron-LM's --torch-fsdp2-no-reshard-after-forward, arguments.py:3218)",
         lambda m, p: np.logical_and(np.logical_not(p.fsdp_reshard_after_forward), np.logical_not(p.fsdp)),
         lambda m, r: "fsdp_reshard_after_forward=False needs fsdp=True"),
    Rule("recompute-modules-names", "config",
         "megatron/core/transformer/transformer_config.py:1945-1962 (the allowed --recompute-modules; the kit "
         "refuses gdn_norm_out, gdp_in_proj, gdp_qkv and mhc: GatedDeltaNet and mHC layers are not in its models)",
         lambda m, p: _modules_bad(p),
         lambda m, r: f"recompute_modules={r.recompute_modules!r}: each must be one of {RECOMPUTE_MODULES}"),
    Rule("recompute-modules-need-selective", "config",
         "megatron/core/transformer/transformer_layer.py:473 (the modules are read only under recompute "
         "granularity 'selective'; Megatron ignores them otherwise, the kit refuses instead)",
         lambda m, p: np.logical_and(_modules_set(p), np.asarray(p.recompute) != "selective"),
         lambda m, r: f"recompute_modules={r.recompute_modules!r} needs recompute='selective', got "
                      f"recompute={r.recompute!r}"),
    Rule("recompute-modules-fp8-delayed", "config", "megatron/core/transformer/transformer_config.py:2000-2005",
         lambda m, p: np.logical_and.reduce([_differs(p.fp8, None), _equals(p.fp8_recipe, "delayed"),
                                             _has_module(p, ("moe_act", "layernorm"))]),
         lambda m, r: "recompute_modules moe_act and layernorm with fp8 need an fp8_recipe other than 'delayed' "
                      "(Megatron-LM: 'Delayed scaling does not support moe_act and layernorm recompute for fp8')"),
    # --recompute-method / --recompute-num-layers (which layers full recomputation checkpoints; llmcomm.step
    # recomputed_layers): Megatron-LM's TransformerConfig checks, the kit's None meaning uniform of 1
    Rule("recompute-method-names", "config", "megatron/core/transformer/transformer_config.py:1908-1912",
         lambda m, p: _method_bad(p.recompute_method),
         lambda m, r: f"recompute_method={r.recompute_method!r} must be None, 'uniform' or 'block'"),
    Rule("recompute-method-needs-full", "config",
         "megatron/training/arguments.py:1425-1428 (no recompute method with selective recomputation) and "
         "megatron/core/transformer/transformer_block.py:662 (the method is read only under recompute granularity "
         "'full'; Megatron ignores it without recomputation, the kit refuses instead)",
         lambda m, p: np.logical_and(np.logical_or(_differs(p.recompute_method, None),
                                                   np.asarray(_opt(p.recompute_num_layers)) != -1),
                                     _differs(p.recompute, "full")),
         lambda m, r: f"recompute_method={r.recompute_method!r} / recompute_num_layers={r.recompute_num_layers!r} "
                      f"need recompute='full', got recompute={r.recompute!r}"),
    Rule("recompute-method-and-num-layers", "config",
         "megatron/core/transformer/transformer_config.py:1913-1924 (full recomputation needs both a method and "
         "recompute_num_layers; the kit's recompute='full' with neither is uniform of 1, every layer on its own)",
         lambda m, p: np.equal(np.equal(np.asarray(p.recompute_method, dtype=object), None),  # type: ignore[call-overload]
                               np.asarray(_opt(p.recompute_num_layers)) != -1),
         lambda m, r: f"recompute_method={r.recompute_method!r} and recompute_num_layers={r.recompute_num_layers!r}: "
                      "set both or neither"),
    # ---------------------------------------------------------------------------------------- job
    Rule("tp-heads", "job", "megatron/core/transformer/transformer_config.py:1446",
         lambda m, p: m.num_attention_heads % p.tp != 0,
         lambda m, r: f"tp={r.tp} does not divide num_attention_heads={m.num_attention_heads}"),
    Rule("tp-query-groups", "job",
         "megatron/core/transformer/transformer_config.py:1462 (Megatron also accepts tp a multiple of the groups, "
         "replicating K/V heads; the kit does not model that)",
         lambda m, p: m.query_groups % p.tp != 0,
         lambda m, r: f"tp={r.tp} does not divide num_query_groups={m.query_groups}"),
    Rule("tp-ffn", "job", "megatron/core/tensor_parallel/layers.py:1038 (ColumnParallelLinear: divide(output_size, "
         "world_size))",
         lambda m, p: m.ffn_hidden_size % p.tp != 0,
         lambda m, r: f"tp={r.tp} does not divide ffn_hidden_size={m.ffn_hidden_size}"),
    Rule("pp-layers", "job",
         "megatron/core/transformer/transformer_block.py:158 (L + embedding + loss over pp) and :178 (over vpp); "
         "megatron/training/arguments.py:998",
         lambda m, p: np.logical_and(np.logical_not(_uneven(p)), _even_total(m, p) % (p.pp * p.vpp) != 0),
         lambda m, r: (f"pp*vpp={r.pp * r.vpp} does not divide num_layers + embedding + loss = {_even_total(m, r)}"
                       if _accounts(r) else f"pp*vpp={r.pp * r.vpp} does not divide num_layers={m.num_layers}"
                       if r.vpp > 1 else f"pp={r.pp} does not divide num_layers={m.num_layers}")),
    Rule("uneven-without-account", "job", "megatron/core/transformer/transformer_block.py:112",
         lambda m, p: np.logical_and(_uneven(p), _accounts(p)),
         lambda m, r: "num_layers_in_first/last_pipeline_stage cannot be combined with "
                      "account_for_embedding/loss_in_pipeline_split (Megatron-LM: no standalone embedding or loss "
                      "stage with uneven pipeline stages)"),
    Rule("uneven-needs-pp", "job", "kit: uneven stages split a pipeline; with pp = 1 there is nothing to split",
         lambda m, p: np.logical_and(_uneven(p), p.pp < 2),
         lambda m, r: f"num_layers_in_first/last_pipeline_stage need pp >= 2, got pp={r.pp}"),
    Rule("uneven-leftover", "job", "megatron/core/transformer/transformer_block.py:133",
         lambda m, p: np.logical_and(_uneven(p), _leftover_bad(m, p)),
         lambda m, r: f"num_layers={m.num_layers} minus num_layers_in_first/last_pipeline_stage="
                      f"{_opt(r.num_layers_in_first_pipeline_stage)}/{_opt(r.num_layers_in_last_pipeline_stage)} "
                      f"must split evenly over the {_middle_stages(r)} middle stage(s) (and be 0 without any)"),
    Rule("uneven-vpp", "job", "megatron/core/transformer/transformer_block.py:178",
         lambda m, p: np.logical_and(_uneven(p), _uneven_vpp_bad(m, p)),
         lambda m, r: f"vpp={r.vpp} must divide the layers of every pipeline stage (first "
                      f"{_opt(r.num_layers_in_first_pipeline_stage)}, last {_opt(r.num_layers_in_last_pipeline_stage)}, "
                      f"middle {_per_middle(m, r)})"),
    Rule("chunk-nonempty", "job",
         "kit: every model chunk holds a layer (Megatron allows an empty one, transformer_block.py:196; the "
         "predictor's programs start a chunk's calls at its first layer)",
         lambda m, p: _smallest_chunk(m, p) < 1,
         lambda m, r: f"a model chunk would hold {int(_smallest_chunk(m, r))} layers; every chunk needs at least one"),
    Rule("ep-needs-moe", "job", "megatron/training/arguments.py:1656",
         lambda m, p: np.logical_and(p.ep > 1, not m.is_moe),
         lambda m, r: f"ep={r.ep} needs an MoE model; {m.name} has num_experts=0"),
    Rule("ep-experts", "job", "megatron/training/arguments.py:1657",
         lambda m, p: np.logical_and(m.is_moe, m.num_experts % p.ep != 0),
         lambda m, r: f"ep={r.ep} does not divide num_experts={m.num_experts}"),
    # MoE parallel folding (moe-fold; llmcomm.overhead.moe_fold): the expert grid's own rules
    Rule("etp-expert-ffn", "job",
         "megatron/core/transformer/moe/experts.py:210-239 (TEGroupedMLP: linear_fc1/linear_fc2 split "
         "moe_ffn_hidden_size over pg_collection.expt_tp; megatron/core/utils.py:595 divide asserts divisibility)",
         lambda m, p: np.logical_and(m.is_moe, m.expert_ffn_hidden_size % np.maximum(p.expert_tp, 1) != 0),
         lambda m, r: f"etp={r.expert_tp} does not divide the expert FFN size {m.expert_ffn_hidden_size} "
                      "(moe_ffn_hidden_size)"),
    Rule("recompute-mla-up-proj", "job", "megatron/core/transformer/transformer_config.py:1969",
         lambda m, p: np.logical_and(_has_module(p, ("mla_up_proj",)), not m.multi_latent_attention),
         lambda m, r: f"recompute_modules mla_up_proj needs multi-latent attention; {m.name} has none"),
    Rule("positive-sequence", "job", "kit: the sequence is a positive integer",
         lambda m, p: _seq(m, p) < 1,
         lambda m, r: f"seq_len={r.sequence_length(m)} must be a positive integer"),
    Rule("learned-positions", "job",
         "megatron/core/models/common/embeddings/language_model_embedding.py:71 (a learned position table of "
         "max_position_embeddings rows: positions beyond it have no embedding)",
         lambda m, p: np.logical_and(
             np.logical_and(m.position_embedding_type == "learned_absolute", m.max_position_embeddings is not None),
             _seq(m, p) > (m.max_position_embeddings or 0)),
         lambda m, r: f"seq_len={r.sequence_length(m)} exceeds {m.name}'s max_position_embeddings="
                      f"{m.max_position_embeddings}: learned absolute positions have no embedding beyond it"),
    Rule("cp-sequence", "job", "megatron/core/utils.py:2551 (get_batch_on_this_cp_rank: 2·cp chunks)",
         lambda m, p: np.logical_and(p.cp > 1, _seq(m, p) % (2 * p.cp) != 0),
         lambda m, r: f"2*cp={2 * r.cp} does not divide seq_len={r.sequence_length(m)}"),
    Rule("sp-sequence", "job", "megatron/core/tensor_parallel/mappings.py:177 (reduce-scatter along the sequence)",
         lambda m, p: np.logical_and(p.sp, (_seq(m, p) // p.cp) % p.tp != 0),
         lambda m, r: f"tp={r.tp} does not divide seq_len/cp={r.sequence_length(m) // r.cp} (needed by sp)"),
    Rule("cp-a2a-heads", "job",
         "TransformerEngine transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py:4246 "
         "(AttnFuncWithCPAndQKVOA2A.forward: num_heads % cp_size == 0 for Q and for K, V, on the rank's a/tp and "
         "g/tp heads; TransformerEngine d0067d0)",
         lambda m, p: np.logical_and.reduce([p.cp > 1, _equals(p.cp_comm_type, "a2a"),
                                             np.logical_or((m.num_attention_heads // p.tp) % p.cp != 0,
                                                           (m.kv_heads // p.tp) % p.cp != 0)]),
         lambda m, r: f"cp_comm_type='a2a' needs cp={r.cp} dividing the heads of each TP rank: "
                      f"num_attention_heads/tp={m.num_attention_heads // r.tp} and "
                      f"kv heads/tp={m.kv_heads // r.tp} (heads divisible by cp*tp={r.cp * r.tp})"),
    # ----------------------------------------------------------------------------------- megatron
    Rule("cp-te-attention", "megatron",
         "megatron/core/transformer/dot_product_attention.py:57 (the local backend asserts context_parallel_size "
         "== 1) and TransformerEngine attention/dot_product_attention/utils.py:1169 (UnfusedDotProductAttention "
         "is disabled under context parallelism): CP runs in TE's flash/fused kernels only",
         lambda m, p: np.logical_and(p.cp > 1, _each(p.attention_backend, lambda v: v in ("unfused", "local"))),
         lambda m, r: f"cp={r.cp} > 1 needs a fused attention backend (flash, fused or auto); "
                      f"attention_backend={r.attention_backend!r} does not support context parallelism"),
    Rule("moe-tp-needs-sp", "megatron",
         "megatron/core/transformer/moe/moe_layer.py:638 (MoELayer.forward raises in training; "
         "model_parallel_config.py:560 only warns, for ep > 1)",
         lambda m, p: np.logical_and(m.is_moe, np.logical_and(p.tp > 1, np.logical_not(p.sp))),
         lambda m, r: "an MoE model with tp>1 needs sp=True: Megatron-LM's MoELayer.forward raises in training when "
                      "attention TP is > 1 without sequence parallelism ('During training, performance may degrade "
                      "if MoE and tensor parallelism are enabled without also enabling sequence parallelism'; with "
                      "ep>1: 'When using expert parallelism and tensor parallelism, sequence parallelism must be "
                      "used'; megatron/core/transformer/moe/moe_layer.py ~636-640, model_parallel_config.py ~560)"),
    Rule("param-gather-needs-distopt", "megatron",
         "megatron/training/arguments.py:1027 (only with the distributed optimizer) and :1029 (needs "
         "--overlap-grad-reduce), Megatron-LM d98e8a6",
         lambda m, p: np.logical_and(p.overlap_param_gather, np.logical_not(np.logical_and(
             p.distributed_optimizer, p.overlap_grad_reduce))),
         lambda m, r: "overlap_param_gather needs distributed_optimizer=True and overlap_grad_reduce=True"),
    Rule("fp8-param-gather-needs-distopt", "megatron",
         "megatron/training/arguments.py:1095 (--fp8-param-gather only with the distributed optimizer or FSDP) and "
         "megatron/core/transformer/transformer_config.py:602 (fp8_param: only together with fp8)",
         lambda m, p: np.logical_and(p.fp8_param_gather, np.logical_or(
             np.logical_not(np.logical_or(p.distributed_optimizer, p.fsdp)),
             np.equal(np.asarray(p.fp8, dtype=object), None))),  # type: ignore[call-overload]  # object vs None
         lambda m, r: "fp8_param_gather needs distributed_optimizer=True (or fsdp=True) and fp8 set"),
    Rule("tp-comm-overlap-needs-sp", "megatron",
         "megatron/training/arguments.py:1442 (Megatron-LM d98e8a6: TP comm/GEMM overlap only with sequence "
         "parallelism; at tp = 1 nothing is overlapped and the kit accepts the flag as a no-op, as Megatron-Bridge "
         "turns it off there)",
         lambda m, p: np.logical_and.reduce([np.asarray(p.tp_comm_overlap, dtype=bool), p.tp > 1,
                                             np.logical_not(p.sp)]),
         lambda m, r: "tp_comm_overlap needs sp=True when tp > 1"),
    Rule("megatron-fsdp-overlap-grad-reduce", "megatron",
         "megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:1359-1365 (synchronize_gradient_reduce: "
         "'Cannot sync-reduce gradients for optim_grads / optim_grads_params! Ensure that overlap_grad_reduce=True "
         "for ZeRO-2 and ZeRO-3'), reached from finish_grad_sync every step",
         lambda m, p: np.logical_and.reduce([p.fsdp, p.distributed_optimizer, np.logical_not(p.overlap_grad_reduce)]),
         lambda m, r: "fsdp with distributed_optimizer (Megatron-FSDP, optim_grads_params) needs "
                      "overlap_grad_reduce=True"),
    Rule("megatron-fsdp-reshards", "megatron",
         "megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:977-998 (Megatron-FSDP's post-forward "
         "hook always releases a unit's gathered parameters under optim_grads_params); keeping them is torch "
         "FSDP2's reshard_after_forward=False (megatron/core/distributed/torch_fully_sharded_data_parallel.py:82-85), "
         "which runs without the distributed optimizer (arguments.py:1038)",
         lambda m, p: np.logical_and.reduce([p.fsdp, p.distributed_optimizer,
                                             np.logical_not(p.fsdp_reshard_after_forward)]),
         lambda m, r: "fsdp_reshard_after_forward=False is torch FSDP2's option (distributed_optimizer=False); "
                      "Megatron-FSDP (fsdp with distributed_optimizer) reshards after every forward"),
    # overlap of the pipeline and MoE communication (issue 20, llmcomm.overhead.overlap)
    Rule("a2a-overlap-needs-ep", "megatron",
         "megatron/core/transformer/transformer_config.py:3013-3015 (overlap_moe_expert_parallel_comm 'is only "
         "supported with expert model parallelism'), Megatron-LM d98e8a6",
         lambda m, p: np.logical_and(np.asarray(p.moe_a2a_overlap, dtype=bool),
                                     np.logical_or(not m.is_moe, p.ep == 1)),
         lambda m, r: "moe_a2a_overlap (overlap_moe_expert_parallel_comm) needs an MoE model with ep > 1"),
    Rule("a2a-overlap-needs-vpp", "megatron",
         "megatron/core/transformer/transformer_config.py:3007-3011 (with pp > 1 the EP A2A overlap needs "
         "virtual_pipeline_model_parallel_size: it runs in the interleaved schedule's 1F1B phase)",
         lambda m, p: np.logical_and.reduce([np.asarray(p.moe_a2a_overlap, dtype=bool), p.pp > 1, p.vpp == 1]),
         lambda m, r: f"moe_a2a_overlap with pp={r.pp} > 1 needs vpp > 1 (the interleaved schedule)"),
    Rule("a2a-overlap-no-full-recompute", "megatron",
         "megatron/core/transformer/transformer_config.py:3020-3023 ('disable full recomputation when enabling "
         "overlap_moe_expert_parallel_comm')",
         lambda m, p: np.logical_and(np.asarray(p.moe_a2a_overlap, dtype=bool),
                                     _equals(p.recompute, "full")),
         lambda m, r: "moe_a2a_overlap needs recompute != 'full'"),
    Rule("a2a-overlap-no-moe-recompute", "megatron",
         "megatron/core/transformer/transformer_config.py:3030-3032 ('disable moe in recompute_modules when "
         "enabling overlap_moe_expert_parallel_comm')",
         lambda m, p: np.logical_and(np.asarray(p.moe_a2a_overlap, dtype=bool), _has_module(p, ("moe",))),
         lambda m, r: "moe_a2a_overlap needs 'moe' out of recompute_modules"),
    # --------------------------------------------------------------------------------------- cost
    Rule("expert-order", "megatron",
         "megatron/core/parallel_state.py:898-902 (Megatron asserts it for every MoE grid; the kit checks it where "
         "etp != tp, the configurations MoE parallel folding brought in, and leaves the etp = tp ones as before)",
         lambda m, p: np.logical_and(m.is_moe, _expert_order_bad(p)),
         lambda m, r: f"order={r.order!r} does not end with pp, so the expert data-parallel size "
                      f"{r.expert_dp} must equal dp={r.dp} (Megatron-LM: 'When not using pp-last rank ordering, "
                      "the data parallel size of the attention and moe layers must be the same')"),
    Rule("cost-fp8-recipe", "cost",
         "kit: the formulation times the delayed and tensorwise (per-tensor current) scaling recipes; mxfp8 is "
         "Blackwell-only (transformer_config.py:594), blockwise and custom scale per block or by user code",
         lambda m, p: np.logical_and(_differs(p.fp8, None),
                                     _each(p.fp8_recipe, lambda v: v not in ("delayed", "tensorwise"))),
         lambda m, r: f"fp8_recipe={r.fp8_recipe!r} is not modelled by the iteration-time formulation"),
    Rule("cost-recompute-mla-up-proj", "cost",
         "kit: the formulation's layer has no MLA up-projection GEMMs of their own to recompute",
         lambda m, p: _has_module(p, ("mla_up_proj",)),
         lambda m, r: "recompute_modules mla_up_proj is not modelled by the iteration-time formulation"),
    Rule("cost-dispatcher", "cost",
         "kit: the formulation writes the alltoall dispatcher's NCCL calls only (allgather's are not written). The "
         "flex dispatcher (moe_token_dispatcher_type='flex' or moe_flex_dispatcher_backend set; "
         "megatron/core/transformer/moe/token_dispatcher.py:1809 MoEFlexTokenDispatcher, over the tp_ep group "
         ":1836) runs DeepEP (fused_a2a.py:72-165: get_dispatch_layout -> num_tokens_per_rank, "
         "num_tokens_per_rdma_rank, is_token_in_rank, then Buffer.dispatch / combine) or HybridEP "
         "(fused_a2a.py:358-520 dispatch_with_permute, BF16 only: fp8_dispatch off, :327, :402): a token crosses "
         "RDMA once per destination node and NVLink once per destination GPU, not once per routed expert. Missing: "
         "(1) in the predictor and the events table, a call for a two-hop forwarded transfer (its per-token "
         "distinct ranks ep·(1 - C(E - E/ep, k)/C(E, k)) and nodes are computable under uniform routing, but no "
         "op of vocab.Op carries them, so llmcomm.predict.ep refuses flex); (2) in time, the kernels' bandwidth: "
         "SM-driven copies (DeepEP num_sms, HybridEP num_sms_dispatch_api) that are not NCCL collectives, with no "
         "H100 measurement in the shared data (DeepEP's published figures are H800: 153 GB/s NVLink at EP 8, "
         "43-58 GB/s RDMA at EP 16-64, DeepEP docs/legacy.md:19-26)",
         lambda m, p: np.logical_and(m.is_moe, np.logical_or(
             _differs(p.moe_token_dispatcher_type, "alltoall"),
             _differs(getattr(p, "moe_flex_dispatcher_backend", None), None))),
         lambda m, r: (f"moe_token_dispatcher_type={r.moe_token_dispatcher_type!r}, moe_flex_dispatcher_backend="
                       f"{getattr(r, 'moe_flex_dispatcher_backend', None)!r}: only the alltoall MoE token "
                       "dispatcher is modelled by the iteration-time formulation; the flex dispatcher's DeepEP/"
                       "HybridEP kernels (a token once per destination node over RDMA, once per GPU over NVLink) "
                       "are the missing mechanism: their bytes have no call in the events table and their kernel "
                       "bandwidth no H100 measurement")),
    Rule("cost-account-interleaved", "cost",
         "kit: with vpp > 1 the embedding/loss slot makes the edge chunk hold one layer fewer; the closed-form DP "
         "buffers take its layers as all of one kind, so models mixing dense and MoE layers are refused there",
         lambda m, p: np.logical_and(np.logical_and(_accounts(p), p.vpp > 1), _mixed_layers(m)),
         lambda m, r: "account_for_embedding/loss_in_pipeline_split with vpp > 1 on a model mixing dense and MoE "
                      "layers is not modelled by the iteration-time formulation"),
    Rule("cost-unmodelled", "cost", "kit: the predictor's calls for these options are not in comm_items",
         lambda m, p: _unmodelled(p),
         lambda m, r: f"{', '.join(f for f in COST_UNMODELLED_FIELDS if _non_default(r, f))}: not modelled by the "
                      "iteration-time formulation (the predictor's calls for them are not in comm_items)"),
    Rule("cost-interleaved-microbatches", "cost",
         "kit: the formulation's interleaved bubble assumes whole micro-batch groups of pp (Megatron allows more, "
         "schedules.py:1172)",
         lambda m, p: np.logical_and(p.vpp > 1, p.num_microbatches % p.pp != 0),
         lambda m, r: f"vpp > 1 (interleaved) needs pp={r.pp} dividing the number of micro-batches "
                      f"{r.num_microbatches} in the iteration-time formulation"),
)

BY_NAME = {r.name: r for r in RULES}


def rules(scopes: Sequence[str]) -> tuple[Rule, ...]:
    bad = [s for s in scopes if s not in SCOPES]
    if bad:
        raise ConfigError(f"unknown rule scope(s) {bad}; known: {SCOPES}")
    return tuple(r for r in RULES if r.scope in scopes)


def _first_broken(model: Model, p: Any, scopes: tuple[str, ...]) -> str | None:
    for r in rules(scopes):
        if _any(r.bad(model, p)):
            return r.message(model, p)
    return None


@lru_cache(maxsize=4096)
def _first_broken_cached(model: Model, p: Any, scopes: tuple[str, ...]) -> str | None:
    return _first_broken(model, p, scopes)


def check(model: Model, p: Any, scopes: Sequence[str] = ("config", "job")) -> None:
    """Raise :class:`ConfigError` with the first rule of ``scopes`` that the one configuration ``p`` (a
    ``ParallelConfig``) breaks. The verdict of frozen (hashable) specs is cached: the rules are pure functions
    of them."""
    try:
        msg = _first_broken_cached(model, p, tuple(scopes))
    except TypeError:  # an unhashable stand-in
        msg = _first_broken(model, p, tuple(scopes))
    if msg is not None:
        raise ConfigError(msg)


class _Row:
    """Row ``i`` of a table, with Python scalars, for a rule's message."""

    def __init__(self, table: Any, i: int) -> None:
        self._t, self._i = table, i

    def __getattr__(self, name: str) -> Any:
        v = getattr(self._t, name)
        return v[self._i].item() if hasattr(v[self._i], "item") else v[self._i]

    def sequence_length(self, model: Model) -> int:
        return int(self._t.sequence_length(model)[self._i])


SPLIT_RULES = ("pp-layers", "uneven-without-account", "uneven-needs-pp", "uneven-leftover", "uneven-vpp",
               "chunk-nonempty")


class _Layers:
    """A model that is only its layer count (the pipeline-split rules read nothing else)."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.name = f"{num_layers} layers"


def check_split(num_layers: int, p: Any) -> None:
    """The pipeline-split rules (:data:`SPLIT_RULES`) for ``num_layers`` layers and one configuration."""
    m = _Layers(num_layers)
    for name in SPLIT_RULES:
        r = BY_NAME[name]
        if _any(r.bad(m, p)):
            raise ConfigError(r.message(m, p))


def violations(model: Model, table: Any, scopes: Sequence[str]) -> dict[str, np.ndarray]:
    """``{rule name: rows breaking it}`` (boolean arrays) of a :class:`ParallelTable` for ``scopes``."""
    n = len(table)
    return {r.name: np.broadcast_to(np.asarray(r.bad(model, table), dtype=bool), (n,)) for r in rules(scopes)}


def valid(model: Model, table: Any, scopes: Sequence[str]) -> np.ndarray:
    """Rows of ``table`` that break no rule of ``scopes``."""
    ok = np.ones(len(table), bool)
    for bad in violations(model, table, scopes).values():
        ok &= ~bad
    return ok


def check_table(model: Model, table: Any, scopes: Sequence[str], what: str = "candidate row") -> None:
    """Raise :class:`ConfigError` naming the first rule (in :data:`RULES` order) that some row breaks, with the
    first such row and its sizes."""
    _DISTINCT.append({})  # the columns' distinct values, found once for every rule of this call (_each)
    try:
        _check_table(model, table, scopes, what)
    finally:
        _DISTINCT.pop()


def _check_table(model: Model, table: Any, scopes: Sequence[str], what: str) -> None:
    """:func:`check_table`'s loop over the rules."""
    for r in rules(scopes):
        bad = np.asarray(r.bad(model, table), dtype=bool)
        if bad.any():
            i = int(np.argmax(np.broadcast_to(bad, (len(table),))))
            row = _Row(table, i)
            sizes = {k: getattr(row, k) for k in ("tp", "pp", "dp", "ep", "cp", "vpp", "micro_batch", "global_batch",
                                                  "seq_len")}
            name = getattr(model, "name", "")
            raise ConfigError(f"{name}: {what} {i} {sizes} breaks the rule {r.name!r}: {r.message(model, row)} "
                              f"[{r.source}]")
