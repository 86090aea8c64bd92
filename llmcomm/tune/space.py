"""The configurations a tuner may choose from: every combination of tp, cp, pp (with the uneven first/last-stage
splits), dp, ep, etp, micro-batch, virtual pipeline stages, sequence parallelism, recomputation, the distributed
optimizer or FSDP and the attention backend that :func:`llmcomm.specs.validate` accepts for a model, a GPU count
and a global batch, and that the iteration-time formulation can rank.

Built by construction, not by filtering a Cartesian product, so that a 16,384-GPU space stays small in memory:
``tp``, ``cp`` and ``pp`` run over the divisors of the GPUs (``dp = gpus / (tp·cp·pp)``), the pipeline split over
:func:`stage_splits`, ``ep`` and ``etp`` (MoE only) over :func:`expert_shapes` (``ep`` over the divisors of
``dp`` by default; with ``etp`` given, MoE parallel folding: over the divisors of ``tp·cp·dp``), ``micro_batch`` over the divisors of
``global_batch / dp`` (up to ``max_micro_batch``), ``vpp`` over the divisors of every stage's layer count; every
row is then checked against the rules of :mod:`llmcomm.rules` (scopes :data:`SCOPES`: what ``ParallelConfig``,
``specs.validate``, Megatron-LM and the iteration-time formulation require, each rule written once there with its
source), so the space holds exactly the configurations the cost model can rank. The rows are a product of shape
rows and categorical combinations, and each rule is evaluated on the distinct values of the columns it reads in
those two factors (:func:`llmcomm.tune.factored.product_valid`), not on every row of the product: the same rows
(``tests/test_tune.py`` checks them against ``rules.valid`` on every row and ``rules.check`` of each row).

Dimensions the formulation does not model yet are not left out by a list kept here: a dimension given as
``None`` (``cp``, ``fsdp``) takes the values that no rule of the ``cost`` scope refuses (:func:`accepted_values`,
a probe of one configuration per value), so when the cost model accepts a dimension it enters the space without
a change here (FSDP and context parallelism entered so with issue 20: rows with ``cp > 1`` come once per
``cp_comm_type`` of the space, Megatron's default ``p2p`` unless ``all_gather`` and ``a2a`` are asked for
(``--constraints cp_comm_type=p2p/all_gather/a2a``), each kept where its rules hold, e.g. ``cp-a2a-heads``;
``cp`` up to ``max_cp``). A value asked for explicitly
(``SearchSpace(cp=(2,))``, ``etp=(1,)``) is enumerated and then removed by the rule that refuses it, which
:func:`refusals` names.

Pipeline splits (:func:`stage_splits`): the even split where ``pp`` divides the layers, and Megatron-LM's
uneven split (``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``,
``megatron/core/transformer/transformer_block.py:112-178``) in which the first and/or last stage holds between
``m - max_stage_offset`` and ``m - 1`` layers and every middle stage ``m``: lighter end stages are what the
embedding and the loss ask for (how LLaMA-3 405B's 126 layers run on 16 stages: 7 + 14·8 + 7). A heavier end
stage is not in the space. ``account_for_embedding/loss_in_pipeline_split`` is not a dimension: with ``vpp = 1``
it gives the same layers per stage as an uneven split that is (126 + 2 over 16 stages = the 7 + 14·8 + 7 above),
and with ``vpp > 1`` the formulation refuses it (rule ``cost-account-interleaved``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from .. import rules, step
from ..errors import ConfigError
from ..parallel_table import ParallelTable
from ..specs import ModelSpec, ParallelConfig
from ..vocab import ATTENTION_BACKENDS, CP_COMM_TYPES
from ..vocab import RECOMPUTE_MODES as RECOMPUTE


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n`` in increasing order."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


UNSET = -1  # an optional integer field left to Megatron's default (ParallelTable's sentinel for None)


@dataclass(frozen=True)
class SearchSpace:
    """Which values each dimension may take; ``None`` means every valid value (for ``cp`` and ``fsdp``: every
    value the cost model accepts, :func:`accepted_values`). Narrow any dimension by giving a tuple, e.g.
    ``SearchSpace(tp=(8,), recompute=("selective",))``. ``etp=None``: expert TP equals tp (Megatron's default) and
    EP divides dp; ``etp=(1, 2, ...)``: those expert TP sizes, with EP folded over tp·cp·dp (:func:`expert_shapes`);
    ``uneven``: which pipeline splits, even (``False``) and/or uneven first/last stages (``True``);
    ``max_stage_offset``: how many layers lighter than a middle stage an uneven end stage may be; ``fp8``: the
    ``--fp8-format`` values (``None`` is BF16; the space's ``None`` resolves per cluster, :meth:`for_cluster`);
    the overlap flags and ``fp8_param_gather`` take both values where Megatron-LM allows them; ``max_cp``: the
    largest context-parallel size of ``cp=None``."""

    tp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    vpp: tuple[int, ...] | None = None
    sp: tuple[bool, ...] = (False, True)
    recompute: tuple[str, ...] = RECOMPUTE
    # --recompute-modules of the selective rows (each a tuple of RECOMPUTE_MODULES names, None: Megatron's default
    # core_attn); None: DEFAULT_MODULE_SETS as they apply to the model (module_sets)
    recompute_modules: tuple[tuple[str, ...] | None, ...] | None = None
    distributed_optimizer: tuple[bool, ...] = (False, True)
    fsdp: tuple[bool, ...] | None = None
    attention_backend: tuple[str, ...] = ("auto", "unfused")  # Megatron-LM's default (fused) and the 2021 kernels
    fp8: tuple[str | None, ...] | None = None  # None: (None, "hybrid") on a GPU with an FP8 peak, else (None,)
    fp8_param_gather: tuple[bool, ...] = (False, True)  # only with fp8 and the distributed optimizer
    tp_comm_overlap: tuple[bool, ...] = (False, True)  # only with SP where tp > 1
    overlap_grad_reduce: tuple[bool, ...] = (False, True)
    overlap_param_gather: tuple[bool, ...] = (False, True)  # only with the distributed optimizer and grad overlap
    # off by default (Megatron-LM's default; opening both costs 1.0-1.6 s of CPU per MoE search on 1,024 GPUs,
    # over the 1 s target): SearchSpace(overlap_p2p_comm=(False, True)) or --constraints opens them
    overlap_p2p_comm: tuple[bool, ...] = (False,)  # the interleaved schedule's async send/recv (else a no-op)
    moe_a2a_overlap: tuple[bool, ...] = (False,)  # MoE with ep > 1, interleaved where pp > 1, no full recompute
    # --cp-comm-type of the rows with cp > 1: Megatron's default; ("p2p", "all_gather", "a2a") searches all three
    # (each only moves cp_comm_s; with all three the space of LLaMA-3 405B on 16,384 GPUs is 40,500 rows, not 22,000)
    cp_comm_type: tuple[str, ...] = ("p2p",)
    uneven: tuple[bool, ...] = (False, True)
    max_micro_batch: int = 16
    max_vpp: int = 8
    max_cp: int = 16  # the bound of cp=None: LLaMA-3 405B's 128K stage used cp 16 (Dubey et al. 2024, Table 4)
    max_stage_offset: int = 2

    def __post_init__(self) -> None:
        bad = [r for r in self.recompute if r not in RECOMPUTE]
        if bad or not self.recompute:
            raise ConfigError(f"space: recompute values {bad} are not in {RECOMPUTE}")
        if self.recompute_modules is not None:
            if isinstance(self.recompute_modules, str) or not self.recompute_modules:
                raise ConfigError(f"space: recompute_modules={self.recompute_modules!r} must be a non-empty tuple of "
                                  "module sets (each None or a tuple of module names)")
            sets = tuple(dict.fromkeys(module_set(v) for v in self.recompute_modules))
            object.__setattr__(self, "recompute_modules", sets)
        bad = [b for b in self.attention_backend if b not in ATTENTION_BACKENDS]
        if bad or not self.attention_backend:
            raise ConfigError(f"space: attention_backend values {bad} are not in {ATTENTION_BACKENDS}")
        bad = [t for t in self.cp_comm_type if t not in CP_COMM_TYPES]
        if bad or not self.cp_comm_type:
            raise ConfigError(f"space: cp_comm_type values {bad} are not in {CP_COMM_TYPES}")
        for f in ("tp", "cp", "pp", "ep", "etp", "micro_batch", "vpp"):
            v = getattr(self, f)
            if v is not None and (not v or any(not isinstance(x, (int, np.integer)) or x < 1 for x in v)):
                raise ConfigError(f"space: {f}={v!r} must be a non-empty tuple of positive integers")
        if self.fp8 is not None and (not self.fp8 or any(v not in FP8_FORMATS for v in self.fp8)):
            raise ConfigError(f"space: fp8={self.fp8!r} must be a non-empty tuple of {FP8_FORMATS}")
        if self.cp_comm_type is not None and (not self.cp_comm_type
                                              or any(not isinstance(v, str) for v in self.cp_comm_type)):
            raise ConfigError(f"space: cp_comm_type={self.cp_comm_type!r} must be a non-empty tuple of strings")
        for f in ("sp", "distributed_optimizer", "fsdp", "uneven", *BOOL_TIME_FLAGS, "fp8_param_gather"):
            v = getattr(self, f)
            if v is not None and (not v or any(not isinstance(x, (bool, np.bool_)) for x in v)):
                raise ConfigError(f"space: {f}={v!r} must be a non-empty tuple of booleans")
        for f in ("max_micro_batch", "max_vpp", "max_cp"):
            if not isinstance(getattr(self, f), (int, np.integer)) or getattr(self, f) < 1:
                raise ConfigError(f"space: {f}={getattr(self, f)!r} must be a positive integer")
        if not isinstance(self.max_stage_offset, (int, np.integer)) or self.max_stage_offset < 0:
            raise ConfigError(f"space: max_stage_offset={self.max_stage_offset!r} must be a non-negative integer")

    def for_cluster(self, cluster: Any) -> SearchSpace:
        """This space with ``fp8=None`` resolved: BF16 and ``hybrid`` FP8 on a GPU that states an FP8 peak
        (``Cluster.peak_fp8_flops``: H100, H200), BF16 only otherwise (A100: no FP8 tensor cores)."""
        if self.fp8 is not None:
            return self
        fp8: tuple[str | None, ...] = (None, "hybrid") if getattr(cluster, "peak_fp8_flops", None) else (None,)
        return dataclasses.replace(self, fp8=fp8)

    @classmethod
    def from_dict(cls, d: dict | None) -> SearchSpace:
        if d is None:
            return cls()
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"space: unknown dimension(s) {unknown}; known: {sorted(known)}")
        values: dict[str, Any] = {k: (tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in d.items()}
        return cls(**values)


def _allowed(values: Sequence[Any], chosen: tuple[Any, ...] | None) -> list[Any]:
    return [v for v in values if chosen is None or v in chosen]


SCOPES = ("config", "job", "megatron", "cost")  # the rules (llmcomm.rules) every configuration of the space keeps
FP8_FORMATS = (None, "hybrid", "e4m3")  # Megatron-LM's --fp8-format (None: BF16), rule 'fp8-format'
# time only: not in memory (the flags ParallelConfig has; overlap_p2p_comm and moe_a2a_overlap came with issue 20)
BOOL_TIME_FLAGS = tuple(f for f in ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather",
                                    "overlap_p2p_comm", "moe_a2a_overlap")
                        if f in {x.name for x in dataclasses.fields(ParallelConfig)})
# the rules that say which combinations of the time-only flags (and fp8_param_gather) a row may take
FLAG_RULES = tuple(r for r in ("param-gather-needs-distopt", "fp8-param-gather-needs-distopt",
                               "tp-comm-overlap-needs-sp", "a2a-overlap-needs-ep", "a2a-overlap-needs-vpp",
                               "a2a-overlap-no-full-recompute", "a2a-overlap-no-moe-recompute") if r in rules.BY_NAME)
HAS_CP_COMM_TYPE = "cp_comm_type" in {f.name for f in dataclasses.fields(ParallelConfig)}
MEMORY_DIMENSIONS = ("tp", "cp", "pp", "dp", "ep", "etp", "micro_batch", "vpp", "num_layers_in_first_pipeline_stage",
                     "num_layers_in_last_pipeline_stage", "sp", "recompute", "recompute_modules",
                     "distributed_optimizer", "fsdp", "attention_backend", "fp8", "fp8_param_gather", *(("cp_comm_type",) if HAS_CP_COMM_TYPE else ()))
DIMENSIONS = (*MEMORY_DIMENSIONS, *BOOL_TIME_FLAGS)
SHORT = {"num_layers_in_first_pipeline_stage": "first", "num_layers_in_last_pipeline_stage": "last"}


class _Columns:
    """The fields :data:`FLAG_RULES` read, as arrays (ParallelConfig's default where not given): the rules'
    predicates on a few columns, without building a whole :class:`ParallelTable`."""

    def __init__(self, n: int, columns: dict[str, Any]) -> None:
        self._n, self._cols = n, columns

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._cols:
            return np.asarray(self._cols[name])
        default = ParallelConfig.__dataclass_fields__[name].default
        return np.full(self._n, default, dtype=object if default is None or isinstance(default, str) else None)


def _flag_ok(model: ModelSpec, n: int, **columns: Any) -> np.ndarray:
    """Rows (of ``n``; columns named as ParallelConfig fields) that break none of :data:`FLAG_RULES` (the only
    rules the flags enter)."""
    table = _Columns(n, columns)
    ok = np.ones(n, bool)
    for name in FLAG_RULES:
        ok &= ~np.broadcast_to(np.asarray(rules.BY_NAME[name].bad(model, table), dtype=bool), (n,))
    return ok


def accepted_values(model: ModelSpec, field: str, values: Sequence[Any]) -> list[Any]:
    """The ``values`` of ParallelConfig ``field`` that no rule of the ``cost`` scope refuses, each probed on one
    configuration that is ParallelConfig's defaults but for that field (so the cost model's own rules, not a list
    kept here, say which dimensions the tuner may open)."""
    table = ParallelTable.from_columns(len(values), model, **{field: np.asarray(values)})
    ok = rules.valid(model, table, ("cost",))
    return [v for v, k in zip(values, ok, strict=True) if k]


def stage_splits(num_layers: int, pp: int, max_offset: int, uneven: Sequence[bool] = (False, True)
                 ) -> list[tuple[int, int]]:
    """``(first, last)`` layer counts of the first and last pipeline stage (:data:`UNSET`: as a middle stage) for
    ``num_layers`` over ``pp`` stages: ``(UNSET, UNSET)`` (even) where ``pp`` divides the layers, and each uneven
    split in which every middle stage holds ``m`` layers and the first and/or last ``m - max_offset`` to ``m - 1``
    (see the module docstring). Even first."""
    out: list[tuple[int, int]] = []
    if False in uneven and num_layers % pp == 0:
        out.append((UNSET, UNSET))
    if True not in uneven or pp < 2:
        return out
    lighter = range(1, max_offset + 1)
    for m in range(1, num_layers + 1):
        for df, dl in itertools.product((0, *lighter), repeat=2):
            f, la = m - df, m - dl
            if (df == 0 and dl == 0) or f < 1 or la < 1 or (pp == 2 and df > 0 and dl > 0):
                continue  # even; an empty stage; pp = 2 with both ends set has no middle stage holding m
            if f + la + (pp - 2) * m == num_layers:
                out.append((f if df else UNSET, la if dl else UNSET))
    return out


def _stage_layers(num_layers: int, pp: int, first: int, last: int) -> list[int]:
    """The distinct layer counts of the stages of a split (for the vpp that divide every one)."""
    k = pp - (first != UNSET) - (last != UNSET)
    rest = num_layers - max(first, 0) - max(last, 0)
    return sorted({x for x in (first, last) if x != UNSET} | ({rest // k} if k else set()))


def splits(model: ModelSpec, gpus: int, global_batch: int, tp: tuple[int, ...] | None = None,
           pp: tuple[int, ...] | None = None, cp: tuple[int, ...] | None = (1,)) -> Iterator[tuple[int, int, int, int]]:
    """``(tp, cp, pp, dp)`` with ``tp · cp · pp · dp = gpus`` that the rules of scopes config and job allow at
    micro-batch 1 and an even split where ``pp`` divides the layers (uneven pipeline splits decide the layer rules
    later), in increasing tp, cp, then pp (``tp``, ``cp``, ``pp``: only these values; ``None``: all)."""
    quads = [(t, c, p) for t in _allowed(divisors(gpus), tp) for c in _allowed(divisors(gpus // t), cp)
             for p in divisors(gpus // (t * c)) if pp is None or p in pp]
    if not quads:
        return
    t_, c_, p_ = (np.array(x, np.int64) for x in zip(*quads, strict=True))
    dp = gpus // (t_ * c_ * p_)
    table = ParallelTable.from_columns(len(quads), model, tp=t_, cp=c_, pp=p_, dp=dp, global_batch=global_batch)
    bad = rules.violations(model, table, ("config", "job"))
    ok = np.ones(len(quads), bool)
    for name, b in bad.items():
        if name not in rules.SPLIT_RULES:  # the layer split is chosen per pp afterwards (stage_splits)
            ok &= ~b
    for i in np.flatnonzero(ok):
        yield int(t_[i]), int(c_[i]), int(p_[i]), int(dp[i])


def _cp_values(model: ModelSpec, space: SearchSpace, gpus: int) -> tuple[int, ...]:
    """``space.cp``, or every CP size up to ``max_cp`` the cost rules accept (Megatron itself allows any cp with
    ``2·cp | s``: at s = 8,192 on 16,384 GPUs up to cp 4,096, two tokens per chunk, which multiplies the space
    25-fold for configurations no recipe runs; a bound, like ``max_vpp``, not a pruning rule)."""
    if space.cp is not None:
        return space.cp
    return tuple(accepted_values(model, "cp", [c for c in divisors(gpus) if c <= space.max_cp]))


def _cp_comm_types(model: ModelSpec, space: SearchSpace) -> tuple[str, ...]:
    """The ``cp_comm_type`` values of rows with ``cp > 1``: ``space.cp_comm_type``, or every value of the
    specs' vocabulary that no ``cost`` rule refuses (probed at ``cp = 2``); ``()`` where ParallelConfig has no
    such field."""
    if not HAS_CP_COMM_TYPE:
        return ()
    if space.cp_comm_type is not None:
        return space.cp_comm_type
    from .. import vocab

    values = tuple(getattr(vocab, "CP_COMM_TYPES", ("p2p",)))
    table = ParallelTable.from_columns(len(values), model, cp=2, cp_comm_type=np.asarray(values, dtype=object))
    ok = rules.valid(model, table, ("cost",))
    return tuple(v for v, k in zip(values, ok, strict=True) if k)


# ------------------------------------------------------------------------ the expert grid (moe-fold)
def expert_shapes(model: ModelSpec, tp: int, cp: int, dp: int, space: SearchSpace) -> list[tuple[int, int]]:
    """``(ep, etp)`` pairs of the space for one attention shape ``tp · cp · dp`` (per pipeline stage), before the
    rules (the expert grid's own: ``expert-grid``, ``etp-expert-ffn``, ``ep-experts``, ``expert-order`` in
    :mod:`llmcomm.rules`, which :func:`refusals` names when they remove a value asked for).

    ``space.etp is None`` (the default): expert TP = tp (:data:`UNSET`, Megatron's default) and ``ep`` over the
    divisors of ``dp`` that divide the experts — the space as it was before MoE parallel folding. An explicit
    ``space.etp``: each of its values with ``ep`` over the divisors of ``tp · cp · dp`` that divide the experts,
    Megatron-Core's folding (``megatron/core/parallel_state.py:871-895``: the expert grid is
    ``etp · ep · edp · pp`` over the same world, so EP may span the attention TP, CP and DP ranks, as NVIDIA's
    Qwen3-235B-A22B recipe does with tp 2, ep 32, etp 1 and dp 16); the ``expert-grid`` rule then keeps exactly the
    pairs with ``etp · ep | tp · cp · dp``. A dense model: ``(1, UNSET)``."""
    if not model.is_moe:
        return [(1, UNSET)]
    E = model.num_experts
    if space.etp is None:
        return [(ep, UNSET) for ep in _allowed([e for e in divisors(dp) if E % e == 0], space.ep)]
    eps = _allowed([e for e in divisors(tp * cp * dp) if E % e == 0], space.ep)
    return [(ep, et) for ep in eps for et in space.etp]


# ------------------------------------------------------------------ selective recomputation by module
# The module sets of a default space (--recompute-modules, megatron/core/transformer/transformer_config.py:560-580 at
# d98e8a6): Megatron-LM's default, then those of NVIDIA's Megatron-Bridge DGX-H100 perf recipes
# (data/published/nemo_h100_recipes.yaml, read by data/published/read_nemo_recipes.py): GPT-OSS 120B's (25.11-26.04),
# DeepSeek-V3's (25.09) and Nemotron-3 Nano's (26.02.01). Each enters a model's space reduced to the modules that
# keep less there (module_sets). Not all 2^7 subsets: each set adds a copy of every selective row to the space
# (on deepseek-moe-16b, 1,024 GPUs, about 1/9 more rows per set), most of them memory-bound configurations a
# published recipe never ran; any other set is asked for with SearchSpace(recompute_modules=...) or
# --constraints recompute_modules=core_attn+mlp/moe.
DEFAULT_MODULE_SETS: tuple[tuple[str, ...] | None, ...] = (
    None, ("layernorm", "moe_act"), ("mla_up_proj", "mlp"), ("core_attn", "layernorm", "moe", "moe_act"))


def module_set(v: Any) -> tuple[str, ...] | None:
    """One ``--recompute-modules`` set in the space's canonical form: a tuple of
    :data:`~llmcomm.vocab.RECOMPUTE_MODULES` names in that order without repeats, ``None`` for Megatron-LM's
    default ``core_attn`` alone (:func:`llmcomm.step.recompute_flags`: the same configuration); ``"a+b"`` reads as
    ``("a", "b")``. A name outside the vocabulary is a :class:`ConfigError` naming the rule."""
    from ..vocab import RECOMPUTE_MODULES

    if v is None:
        return None
    names = v.split("+") if isinstance(v, str) else list(v)
    bad = [x for x in names if x not in RECOMPUTE_MODULES]
    if bad:
        raise ConfigError(f"space: recompute_modules {v!r}: {bad} not among {RECOMPUTE_MODULES} "
                          "(rule recompute-modules-names)")
    out = tuple(x for x in RECOMPUTE_MODULES if x in names)
    return None if out == ("core_attn",) else out


def _saves(model: ModelSpec, mods: tuple[str, ...], name: str) -> bool:
    """Whether recomputing ``name`` on top of the other modules of ``mods`` keeps fewer activation bytes on some
    layer of ``model`` (:func:`llmcomm.step.layer_activation_bytes`, the memory model's one home; at an unfused
    attention backend, where ``core_attn`` drops the scores, in BF16)."""
    rest = tuple(x for x in mods if x != name)
    return any(_kept_bytes(model, moe, mods) < _kept_bytes(model, moe, rest) for moe in set(model.moe_layer_pattern()))


def _kept_bytes(model: ModelSpec, moe: bool, mods: tuple[str, ...]) -> float:
    """Activation bytes a layer (MoE or dense) keeps with selective recomputation of ``mods``, at a probe shape
    (1,024 tokens, tp 1, BF16): only which sets keep fewer bytes is read from it."""
    return float(step.layer_activation_bytes(model, moe, seq=np.array([1024.0]), micro_batch=1, tp=1, sp=False,
                                             recompute="selective", act_bytes=2, recompute_modules=mods)[0])


def partial_modules(model: ModelSpec) -> frozenset[str]:
    """The modules that recompute on some layers of ``model`` only: those that keep fewer bytes on one kind of its
    layers (dense, MoE) and not on the other (``mlp`` on a model with dense and MoE layers, DeepSeek-MoE 16B's first
    layer; ``moe_act``, ``layernorm``, ``moe``, ``shared_experts`` there too). Their recomputation lengthens the
    backward of those layers only; the formulation's time has not been shown non-decreasing in them in general
    (the two cases found were bugs and are fixed: the grad-reduce pacing,
    :func:`llmcomm.overhead.overlap.stage_grad_reduce`, and the userbuffers backward's credit under ``full``
    against selective ``moe``, :func:`llmcomm.overhead.iteration.tp_overlap_exposed`), so the recompute-dominated
    rule does not take it as such (:func:`llmcomm.tune.search.recomputes_less`)."""
    from ..vocab import RECOMPUTE_MODULES

    kinds = set(model.moe_layer_pattern())
    return frozenset(name for name in RECOMPUTE_MODULES
                     if len({_kept_bytes(model, moe, (name,)) < _kept_bytes(model, moe, ()) for moe in kinds}) > 1)


def module_sets(model: ModelSpec, space: SearchSpace) -> tuple[tuple[str, ...] | None, ...]:
    """The ``recompute_modules`` values of the space's selective rows on ``model``: ``space.recompute_modules`` as
    given, or :data:`DEFAULT_MODULE_SETS` each reduced to its modules that keep fewer activation bytes on this model
    (:func:`_saves`: ``layernorm`` saves nothing on a dense layer, whose norms TransformerEngine fuses into the
    next GEMM, ``moe_act`` nothing beside ``moe``, ``mlp`` nothing without dense layers; ``mla_up_proj`` nothing in
    the kit's memory model, which times it not at all, rule ``cost-recompute-mla-up-proj``), without repeats and
    empty sets (selective recomputation of nothing: the time of ``none`` or more for its memory). A module that
    keeps no byte less costs time for nothing, so the reduced set is never slower for the same memory; the sets
    left are the published ones as the kit's cost model can tell them apart. Left out of the default too: a set
    holding a module that recomputes some layers of the model only (:func:`partial_modules`, a model of dense and
    MoE layers such as DeepSeek-MoE 16B), which the recompute-dominated rule cannot prune against ``none``
    (:func:`llmcomm.tune.search.recomputes_less`): each such set is evaluated wherever it fits, which on
    DeepSeek-MoE 16B on 1,024 GPUs took the search from 1.5 to 2.7 s of CPU; ask for them explicitly there."""
    if space.recompute_modules is not None:
        return space.recompute_modules
    out: list[tuple[str, ...] | None] = []
    partial = partial_modules(model)
    for s in DEFAULT_MODULE_SETS:
        mods = ("core_attn",) if s is None else s
        kept = module_set(tuple(x for x in mods if _saves(model, mods, x)))
        if kept != () and kept not in out and not set(kept or ()) & partial:
            out.append(kept)
    return tuple(out)


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array of ``values``, one element each: a tuple stays one value (``np.array`` of equal-length
    tuples would make a 2-D array)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _product(columns: dict[str, Sequence[Any]]) -> dict[str, np.ndarray]:
    """The Cartesian product of ``columns`` as one array per name (first name slowest)."""
    names = list(columns)
    grids = np.meshgrid(*(np.arange(len(columns[k])) for k in names), indexing="ij")
    return {k: np.asarray(list(columns[k]), dtype=object)[g.ravel()] for k, g in zip(names, grids, strict=True)}


def _shape_rows(model: ModelSpec, gpus: int, global_batch: int, space: SearchSpace) -> np.ndarray:
    """The shape rows of the space, ``(n, len(SHAPE_COLUMNS))`` integers: every (tp, cp, pp, dp) of :func:`splits`,
    expert shape (:func:`expert_shapes`), pipeline split (:func:`stage_splits`), micro-batch and vpp."""
    L = model.num_layers
    shape_rows: list[tuple[int, ...]] = []
    for tp, cp, pp, dp in splits(model, gpus, global_batch, space.tp, space.pp, _cp_values(model, space, gpus)):
        shape_rows += [(tp, cp, pp, dp, ep, et) for ep, et in expert_shapes(model, tp, cp, dp, space)]
    split_cache: dict[int, list[tuple[int, int, list[int]]]] = {}
    # per (pp, dp): the rows (mb, v, first, last, num_microbatches) every shape row of that pp and dp takes, in
    # order; the shape rows repeated by them (the product without a Python loop over its rows)
    blocks: dict[tuple[int, int], int] = {}
    tails: list[list[tuple[int, int, int, int, int]]] = []
    which = np.zeros(len(shape_rows), np.int64)
    for i, (_tp, _cp, pp, dp, _ep, _et) in enumerate(shape_rows):
        if (pp, dp) in blocks:
            which[i] = blocks[(pp, dp)]
            continue
        if pp not in split_cache:
            split_cache[pp] = []
            for f, la in stage_splits(L, pp, space.max_stage_offset, space.uneven):
                g = math.gcd(*_stage_layers(L, pp, f, la))
                vs = _allowed([v for v in divisors(g) if v <= space.max_vpp and (v == 1 or pp >= 2)], space.vpp)
                split_cache[pp].append((f, la, vs))
        per_replica = global_batch // dp
        mbs = _allowed([b for b in divisors(per_replica) if b <= space.max_micro_batch], space.micro_batch)
        which[i] = blocks[(pp, dp)] = len(tails)
        tails.append([(mb, v, f, la, per_replica // mb) for f, la, vpps in split_cache[pp]
                      for mb, v in itertools.product(mbs, vpps)])
    if not shape_rows:
        return np.zeros((0, len(SHAPE_COLUMNS)), np.int64)
    sizes = np.array([len(t) for t in tails], np.int64)
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    tail = np.array([r for t in tails for r in t], np.int64).reshape(-1, 5)
    reps = sizes[which]
    head = np.repeat(np.arange(len(shape_rows)), reps)
    within = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
    return np.hstack([np.array(shape_rows, np.int64)[head], tail[start[which][head] + within]])


SHAPE_COLUMNS = ("tp", "cp", "pp", "dp", "ep", "etp", "micro_batch", "vpp", "num_layers_in_first_pipeline_stage",
                 "num_layers_in_last_pipeline_stage", "num_microbatches")
# the categorical dimensions, whose product with the shape rows is the space (before the time-only flags)
COMBO_COLUMNS = ("sp", "recompute", "recompute_modules", "distributed_optimizer", "fsdp", "attention_backend", "fp8",
                 "fp8_param_gather")


def _combinations(model: ModelSpec, space: SearchSpace) -> dict[str, np.ndarray]:
    """The categorical combinations of the space (:data:`COMBO_COLUMNS`, typed as in the candidates' frame): their
    product, without the fp8_param_gather combinations Megatron-LM refuses (its rule, :data:`FLAG_RULES`)."""
    fsdps = tuple(accepted_values(model, "fsdp", [False, True])) if space.fsdp is None else space.fsdp
    fp8s = space.fp8 if space.fp8 is not None else (None,)
    sets = module_sets(model, space)
    combos = _product({"sp": space.sp, "recompute": space.recompute, "recompute_modules": range(len(sets)),
                       "distributed_optimizer": space.distributed_optimizer, "fsdp": fsdps,
                       "attention_backend": space.attention_backend, "fp8": fp8s,
                       "fp8_param_gather": space.fp8_param_gather})
    # one module set per selective row, None (no --recompute-modules) on the others: rule
    # recompute-modules-need-selective, applied here since the sets are the product's own
    selective = combos["recompute"] == "selective"
    which = combos["recompute_modules"].astype(np.int64)
    combos = {c: v[selective | (which == 0)] for c, v in combos.items()}
    mods = object_array(sets)[combos["recompute_modules"].astype(np.int64)]
    mods[combos["recompute"] != "selective"] = None
    combos["recompute_modules"] = mods
    nc = len(combos["sp"])
    keep = _flag_ok(model, nc, sp=np.ones(nc, bool), distributed_optimizer=combos["distributed_optimizer"].astype(bool),
                    fp8=combos["fp8"], fp8_param_gather=combos["fp8_param_gather"].astype(bool))
    combos = {k: v[keep] for k, v in combos.items()}
    out: dict[str, np.ndarray] = {}
    for k in ("sp", "distributed_optimizer", "fsdp", "fp8_param_gather"):
        out[k] = combos[k].astype(bool)
    out["recompute"] = combos["recompute"].astype(str)
    out["recompute_modules"] = combos["recompute_modules"]
    out["attention_backend"] = combos["attention_backend"].astype(str)
    out["fp8"] = combos["fp8"]
    return {k: out[k] for k in COMBO_COLUMNS}


def _shape_columns(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None, space: SearchSpace
                   ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """``(columns, shape, copy)``: the shape rows (:func:`_shape_rows`), each with ``cp > 1`` once per
    ``cp_comm_type`` of the space (:func:`_cp_comm_types`), with every column of a candidate but the categorical
    ones (the time-only flags off); ``shape``: the shape row of each, ``copy``: which of its copies."""
    s = seq_len or model.seq_length
    shapes = _shape_rows(model, gpus, global_batch, space)
    cols: dict[str, Any] = {c: shapes[:, i] for i, c in enumerate(SHAPE_COLUMNS)}
    n = len(shapes)
    shape, copy = np.arange(n), np.zeros(n, np.int64)
    if HAS_CP_COMM_TYPE:
        default = str(ParallelConfig.__dataclass_fields__["cp_comm_type"].default)
        types = _cp_comm_types(model, space) or (default,)
        cp_gt1 = cols["cp"] > 1
        reps = np.where(cp_gt1, len(types), 1)
        shape = np.repeat(shape, reps)
        cols = {k: v[shape] for k, v in cols.items()}
        copy = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)  # 0.. within each row's copies
        cct = np.asarray(types, dtype=object)[np.minimum(copy, len(types) - 1)]
        cols["cp_comm_type"] = np.where(cp_gt1[shape], cct, default)
    n = len(shape)
    for k in BOOL_TIME_FLAGS:
        cols[k] = np.zeros(n, bool)
    cols["global_batch"] = np.full(n, global_batch, np.int64)
    cols["seq_len"] = np.full(n, s, np.int64)
    cols["schedule"] = np.where(cols["vpp"] > 1, "interleaved", "1f1b").astype(object)
    return cols, shape, copy


def _twins(space: SearchSpace, combos: dict[str, np.ndarray], dominated: bool
           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(combos, twins)``: the combinations to build (without those :func:`dominated_combinations` leaves out
    where ``dominated``) and, per kept one, the :data:`TWIN_COLUMNS` counts (zero without ``dominated``)."""
    nc = len(combos["sp"])
    if not dominated:
        return combos, {k: np.zeros(nc, np.int64) for k in TWIN_COLUMNS}
    twins = dominated_combinations(space, combos)
    keep = twins["keep"]
    return {k: v[keep] for k, v in combos.items()}, {k: twins[k][keep] for k in TWIN_COLUMNS}


def _assemble(shape_cols: dict[str, np.ndarray], combos: dict[str, np.ndarray], twins: dict[str, np.ndarray],
              e: np.ndarray, c: np.ndarray) -> dict[str, np.ndarray]:
    """The candidates' columns of the product rows ``(e[k], c[k])`` (a shape-column row, a combination), with
    the string columns also as their factor and index (:class:`_Assembled`)."""
    cols = _Assembled({k: v[e] for k, v in shape_cols.items()})
    cols.update({k: v[c] for k, v in combos.items()})
    cols.update({k: v[c] for k, v in twins.items()})
    cols.strings = {k: (v, e) for k, v in shape_cols.items() if k in STRING_COLUMNS}
    cols.strings.update({k: (v, c) for k, v in combos.items() if k in STRING_COLUMNS})
    return cols


STRING_COLUMNS = ("recompute", "attention_backend", "cp_comm_type", "schedule")  # the frame's str columns


class _Assembled(dict):
    """The columns of :func:`_assemble`; ``strings``: each of :data:`STRING_COLUMNS` as ``(values, index)``, its
    column being ``values[index]``, so that :func:`_frame` builds the (Arrow-backed) string column by one take of
    the few ``values`` instead of converting every row's string."""

    strings: dict[str, tuple[np.ndarray, np.ndarray]]


def _product_order(shape: np.ndarray, copy: np.ndarray, e: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The order of the product rows ``(e, c)`` in the space: by shape row, then combination, then
    ``cp_comm_type`` copy."""
    return np.lexsort((copy[e], c, shape[e]))


def _table(model: ModelSpec, cols: dict[str, np.ndarray], n: int) -> ParallelTable:
    return ParallelTable.from_columns(n, model, **{c: cols[c] for c in _FRAME_COLUMNS
                                                  if c in cols and c not in ("num_microbatches", *TWIN_COLUMNS)})


def _raw_columns(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None,
                 space: SearchSpace, dominated: bool = False) -> tuple[dict[str, np.ndarray], ParallelTable]:
    """Every row of the space but the time-only flags (:data:`BOOL_TIME_FLAGS`, False here), before the rules:
    the whole product of the shape rows and the combinations (:func:`refusals` names the rule that removes a
    value; the tuner itself checks the rules on the factors, :func:`_valid_columns`). ``dominated``: leave out the
    rows two pruning rules would remove whatever the memory budget (:func:`dominated_combinations`), counted in
    the columns :data:`TWIN_COLUMNS` of the row that dominates them."""
    shape_cols, shape, copy = _shape_columns(model, gpus, global_batch, seq_len, space)
    combos, twins = _twins(space, _combinations(model, space), dominated)
    e, c = (x.ravel() for x in np.meshgrid(np.arange(len(shape)), np.arange(len(combos["sp"])), indexing="ij"))
    order = _product_order(shape, copy, e, c)
    cols = _assemble(shape_cols, combos, twins, e[order], c[order])
    # the table straight from the arrays (the DataFrame is built by _frame, on the rows that are kept)
    return cols, _table(model, cols, len(order))


def _valid_columns(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None, space: SearchSpace,
                   dominated: bool = False) -> dict[str, np.ndarray]:
    """The rows of :func:`_raw_columns` that break no rule of :data:`SCOPES`, in the same order, the rules
    checked on the factors of the product (:func:`llmcomm.tune.factored.product_valid`) rather than on each of
    its rows. With ``dominated``, a left-out unfused twin counts only where the rules accept it (cp > 1 needs TE
    attention): checked on the same factors, the kept combinations with the ``unfused`` backend."""
    from .factored import product_valid

    shape_cols, shape, copy = _shape_columns(model, gpus, global_batch, seq_len, space)
    combos, twins = _twins(space, _combinations(model, space), dominated)
    nc = len(combos["sp"])
    right = {k: v for k, v in combos.items()}
    has = twins["unfused_twins"] > 0
    if has.any():  # the twins' combinations after the kept ones
        right = {k: np.concatenate([v, v[has]]) for k, v in combos.items()}
        right["attention_backend"] = np.concatenate([combos["attention_backend"],
                                                     np.full(int(has.sum()), "unfused")])
    left = _table(model, shape_cols, len(shape))
    ok = product_valid(model, left, _table(model, right, len(right["sp"])), COMBO_COLUMNS, SCOPES)
    e, c = np.nonzero(ok[:, :nc])
    order = _product_order(shape, copy, e, c)
    e, c = e[order], c[order]
    cols = _assemble(shape_cols, combos, twins, e, c)
    if has.any():
        twin_of = np.full(nc, -1)
        twin_of[has] = nc + np.arange(int(has.sum()))
        u = cols["unfused_twins"].copy()
        u[(twin_of[c] >= 0) & ~ok[e, np.maximum(twin_of[c], 0)]] = 0
        cols["unfused_twins"] = u
    return cols


_FRAME_COLUMNS = (*DIMENSIONS, "num_microbatches", "unfused_twins", "fp8_param_gather_twins", "core_attn_twins",
                  "global_batch",
                  "seq_len", "schedule")  # TWIN_COLUMNS in the middle


def _frame(cols: dict[str, np.ndarray], rows: np.ndarray | None = None) -> pd.DataFrame:
    """The candidates' DataFrame of :func:`_raw_columns`' arrays (``rows``: a boolean mask, or all)."""
    pick = (lambda v: v) if rows is None else (lambda v: v[rows])
    strings = getattr(cols, "strings", {})

    def column(c: str) -> Any:
        if c not in strings:
            return pick(cols[c])
        values, index = strings[c]  # the same str column as pandas builds from the strings (tested)
        return pd.array(values, dtype="str").take(pick(index))

    df = pd.DataFrame({c: column(c) for c in _FRAME_COLUMNS if c != "fp8"})
    # fp8 holds None (BF16) or a format name: an object column (pandas would read None as a missing string)
    df.insert(DIMENSIONS.index("fp8"), "fp8", pd.Series(pick(cols["fp8"]), dtype=object))
    return df


def _raw_candidates(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None,
                    space: SearchSpace, dominated: bool = False) -> tuple[pd.DataFrame, ParallelTable]:
    """:func:`_raw_columns` as a DataFrame and its table."""
    cols, table = _raw_columns(model, gpus, global_batch, seq_len, space, dominated)
    return _frame(cols), table


# per row of a space built with ``dominated=True``: how many rows of the full space it stands for (its twins), by
# the rule that removes them
TWIN_COLUMNS = ("unfused_twins", "fp8_param_gather_twins", "core_attn_twins")


def dominated_combinations(space: SearchSpace, combos: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Of the categorical combinations ``combos`` (arrays over combinations), which to build (``keep``) and how
    many left-out twins each kept one stands for, by rule — the two pruning rules whose dominating twin never
    needs more memory, so that they hold whatever the memory budget and can act before anything is built:

    ``unfused-dominated``: a combination with an unfused (or ``local``) attention backend where the space holds
        a fused one: the fused twin is never slower (:func:`llmcomm.tune.search.unfused_dominated`) and keeps no
        ``s²`` scores (memory never above), so it fits whenever the unfused one does;
    ``fp8-param-gather-dominated``: FP8 with the distributed optimizer and ``fp8_param_gather`` off where the
        space holds it on: never slower (:func:`llmcomm.tune.search.fp8_param_gather_dominated`) and its FP8
        primary weights need less memory (:mod:`llmcomm.overhead.memory`);
    ``recompute-dominated`` (its case that needs no budget): selective recomputation of Megatron's default
        ``core_attn`` with a fused backend where the space holds ``none``: with a fused kernel there are no
        ``s²`` scores to drop (:func:`llmcomm.step.layer_activation_bytes`: the same memory as ``none``;
        Megatron-LM warns the same, transformer_config.py:1983-1989, "For fused attention, you have no need to
        set 'core_attn' to recompute"), and recomputing it is never faster (the rule's monotonicity,
        :func:`llmcomm.tune.search.recomputes_less`), so the ``none`` twin fits and wins; the kept ``none`` row
        stands for it (``core_attn_twins``) and for its unfused twins (in ``unfused_twins``: their memory is the
        fused one's, their time above it).

    The count assumes that no rule outside :data:`FLAG_RULES` reads ``attention_backend`` or
    ``fp8_param_gather``, and none tells ``none`` from selective ``core_attn`` (so a twin is valid where its kept
    row is); ``tests/test_tune.py`` checks the counts against the exhaustive enumeration."""
    from ..vocab import FUSED_ATTENTION_BACKENDS

    ab = combos["attention_backend"].astype(str)
    fused = np.isin(ab, FUSED_ATTENTION_BACKENDS)
    n_unfused = sum(b not in FUSED_ATTENTION_BACKENDS for b in space.attention_backend)
    has_fused = any(b in FUSED_ATTENTION_BACKENDS for b in space.attention_backend)
    fp8 = np.not_equal(combos["fp8"], None).astype(bool)  # type: ignore[call-overload]
    dopt = combos["distributed_optimizer"].astype(bool)
    fpg = combos["fp8_param_gather"].astype(bool)
    fpg_both = True in space.fp8_param_gather and False in space.fp8_param_gather
    fpg_dominated = fpg_both & fp8 & dopt & ~fpg
    rec = combos["recompute"].astype(str)
    default_sel = (rec == "selective") & np.equal(combos["recompute_modules"], None)  # type: ignore[call-overload]
    core = bool((rec == "none").any() and default_sel.any())  # both in the space: every none row has its twin
    core_dominated = core & default_sel & fused
    keep = ~(has_fused & ~fused) & ~fpg_dominated & ~core_dominated
    factor = np.where(fpg_both & fp8 & dopt & fpg, 2, 1)  # a kept fp8_param_gather row stands for its off twin too
    core_twin = np.where(core & (rec == "none") & fused, 1, 0)
    return {"keep": keep, "unfused_twins": np.where(has_fused & fused, n_unfused, 0) * factor * (1 + core_twin),
            "fp8_param_gather_twins": np.where(factor == 2, 1, 0), "core_attn_twins": core_twin * factor}


def column_codes(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``pandas.factorize`` of one column with ``None`` and NaN each a value of their own; a string column without
    missing values factorized as it is (no conversion of every value to a Python object)."""
    return pd.factorize(col if isinstance(col.dtype, pd.StringDtype) and not col.hasnans else col.to_numpy(),
                        use_na_sentinel=False)


def row_codes(frame: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """One integer per row of ``frame``, equal exactly for rows equal in every one of ``columns`` (``None`` and NaN
    each a value of their own): each column factorized, the codes combined and recoded as they grow."""
    code = np.zeros(len(frame), np.int64)
    span = 1  # the codes are below span
    for c in columns:
        codes, uniq = column_codes(frame[c])
        radix = max(len(uniq), 1)
        if span * radix >= 2**62:  # recode before the product overflows
            code, uniq_codes = pd.factorize(code)
            code, span = code.astype(np.int64), max(len(uniq_codes), 1)
        code = code * radix + codes
        span *= radix
    # recoded in the order of first appearance: the same codes as recoding after every column
    return pd.factorize(code)[0].astype(np.int64) if span > 1 else code


def time_flag_combinations(space: SearchSpace) -> list[dict[str, bool]]:
    """Every combination of :data:`BOOL_TIME_FLAGS` values the space allows (before the rules)."""
    return [dict(zip(BOOL_TIME_FLAGS, c, strict=True))
            for c in itertools.product(*(getattr(space, k) for k in BOOL_TIME_FLAGS))]


def _flag_masks(model: ModelSpec, cands: pd.DataFrame, space: SearchSpace) -> list[tuple[dict[str, bool], np.ndarray]]:
    fixed = {"tp": cands["tp"].to_numpy(), "sp": cands["sp"].to_numpy(bool),
             "distributed_optimizer": cands["distributed_optimizer"].to_numpy(bool), "ep": cands["ep"].to_numpy(),
             "pp": cands["pp"].to_numpy(), "vpp": cands["vpp"].to_numpy()}
    rec, rec_values = column_codes(cands["recompute"])  # the str column coded as it is, not converted row by row
    mods, mod_values = column_codes(cands["recompute_modules"])  # tuples or None, coded by value
    # the rules on the distinct values of the columns they read (elementwise predicates: the same verdict per row)
    inv, first = step.group_rows([*(v.astype(np.int64) for v in fixed.values()), rec.astype(np.int64),
                                  mods.astype(np.int64)])
    k = len(first)
    distinct = {c: v[first] for c, v in fixed.items()}
    distinct["recompute"] = np.asarray(rec_values, dtype=object)[rec[first]]
    # factorize gives None back as NaN
    distinct["recompute_modules"] = object_array([v if isinstance(v, tuple) else None for v in mod_values])[mods[first]]
    return [(combo, _flag_ok(model, k, **distinct, **{c: np.full(k, v) for c, v in combo.items()})[inv.reshape(-1)])
            for combo in time_flag_combinations(space)]


def time_flag_grid(model: ModelSpec, cands: pd.DataFrame, space: SearchSpace
                   ) -> tuple[list[dict[str, bool]], np.ndarray]:
    """``(combos, ok)``: the combinations of :data:`BOOL_TIME_FLAGS` the space allows
    (:func:`time_flag_combinations`) and ``ok[i, j]``, whether row ``i`` of ``cands`` (time-only flags off) may
    take combination ``j`` (:data:`FLAG_RULES`)."""
    masks = _flag_masks(model, cands, space)
    ok = np.stack([m for _, m in masks], axis=1) if masks else np.zeros((len(cands), 0), bool)
    return [c for c, _ in masks], ok


def time_flag_multiplicity(model: ModelSpec, cands: pd.DataFrame, space: SearchSpace) -> np.ndarray:
    """How many rows of the full space each row of ``cands`` (time-only flags off) stands for: its valid
    combinations of :data:`BOOL_TIME_FLAGS` (:func:`expand_time_flags`)."""
    return time_flag_grid(model, cands, space)[1].sum(axis=1, dtype=np.int64)


def expand_by_grid(cands: pd.DataFrame, combos: list[dict[str, bool]], ok: np.ndarray) -> pd.DataFrame:
    """The rows ``(i, j)`` of ``cands`` times ``combos`` where ``ok[i, j]`` (:func:`time_flag_grid`), row by row
    and within a row in combination order (the order of ``ok``'s true cells, row-major)."""
    return expand_cells(cands, combos, *np.nonzero(ok))


def expand_cells(cands: pd.DataFrame, combos: list[dict[str, bool]], rows: np.ndarray, which: np.ndarray
                 ) -> pd.DataFrame:
    """The cells ``(rows[k], which[k])`` of the grid of :func:`expand_by_grid` as rows: row ``rows[k]`` of
    ``cands`` with the time-only flags of combination ``which[k]`` (one take of ``cands``; index from 0)."""
    out = cands.iloc[rows].reset_index(drop=True)
    for k in BOOL_TIME_FLAGS:
        out[k] = np.array([c[k] for c in combos], bool)[which]
    return out


def expand_time_flags(model: ModelSpec, cands: pd.DataFrame, space: SearchSpace) -> pd.DataFrame:
    """``cands`` (rows with the time-only flags off) times every combination of :data:`BOOL_TIME_FLAGS` that
    Megatron-LM accepts for each row (:data:`FLAG_RULES`: ``tp_comm_overlap`` needs SP where tp > 1,
    ``overlap_param_gather`` the distributed optimizer and ``overlap_grad_reduce``), in row order. The memory
    model reads none of these flags (their buffers are not modelled: TransformerEngine's userbuffers, a few
    ``s·b·h`` per GPU), so the tuner filters memory before expanding."""
    if cands.empty:
        return cands.reset_index(drop=True)
    return expand_by_grid(cands, *time_flag_grid(model, cands, space))


def enumerate_candidates(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None = None,
                         space: SearchSpace | None = None) -> pd.DataFrame:
    """Every valid configuration as one row (columns named as :class:`~llmcomm.specs.ParallelConfig`
    fields, :data:`UNSET` for an optional integer left to its default, plus ``num_microbatches``); see the
    module docstring for the rules."""
    base = enumerate_base(model, gpus, global_batch, seq_len, space)
    return expand_time_flags(model, base, space or SearchSpace())


def enumerate_base(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None = None,
                   space: SearchSpace | None = None, *, dominated: bool = False) -> pd.DataFrame:
    """The valid rows of the space with the time-only flags (:data:`BOOL_TIME_FLAGS`) off: what the memory model
    needs (:func:`expand_time_flags` gives the rest); ``dominated``: without the rows
    :func:`dominated_combinations` leaves out, counted in :data:`TWIN_COLUMNS`."""
    return base_and_table(model, gpus, global_batch, seq_len, space, dominated=dominated)[0]


def base_and_table(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None = None,
                   space: SearchSpace | None = None, *, dominated: bool = False
                   ) -> tuple[pd.DataFrame, ParallelTable]:
    """:func:`enumerate_base` and its rows as a :class:`ParallelTable` (built from the same arrays, not from the
    DataFrame: what the memory model reads)."""
    cols = _valid_columns(model, gpus, global_batch, seq_len, space or SearchSpace(), dominated)
    out = _frame(cols)
    return (out if dominated else out.drop(columns=list(TWIN_COLUMNS))), _table(model, cols, len(out))


EXPLICIT = ("tp", "cp", "pp", "ep", "etp", "micro_batch", "vpp", "fsdp", "attention_backend", "sp", "recompute",
            "distributed_optimizer", "fp8", "cp_comm_type")
# the dimensions whose values asked for refusals() names the rule of: EXPLICIT and the module sets of selective
# recomputation (their values tuples, written as --constraints writes them: module_set_text)
REFUSABLE = (*EXPLICIT, "recompute_modules")


def module_set_text(v: tuple[str, ...] | None) -> str:
    """A module set as ``--constraints recompute_modules=`` writes it: its names joined by ``+``, ``default`` for
    Megatron-LM's (``None``, :func:`module_set`)."""
    return "default" if v is None else "+".join(v)


def refusals(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None,
             space: SearchSpace) -> dict[str, str]:
    """``{"cp=2": "rule 'cost-cp': ..."}`` for each value a dimension of ``space`` asks for explicitly
    (:data:`REFUSABLE`; a module set of ``recompute_modules`` as ``recompute_modules=core_attn+mla_up_proj``, on
    the selective rows, which are the ones that hold it) that no valid configuration keeps, with the first rule
    (in :data:`llmcomm.rules.RULES` order) that removed every row holding it, and its message."""
    df, table = _raw_candidates(model, gpus, global_batch, seq_len, space)
    if not len(df):
        return {}
    bad = rules.violations(model, table, SCOPES)
    ok = np.ones(len(df), bool)
    for b in bad.values():
        ok &= ~b
    out: dict[str, str] = {}
    for dim in REFUSABLE:
        chosen = getattr(space, dim)
        if chosen is None or dim not in df.columns:
            continue
        for v in chosen:
            if dim == "recompute_modules":  # tuples (or None) compared as values; only selective rows hold a set
                holds = np.fromiter((x == v for x in df[dim]), bool, len(df)) & (df["recompute"] == "selective"
                                                                                 ).to_numpy()
                shown = module_set_text(v)
            else:
                holds, shown = (df[dim] == v).to_numpy(), v
            if not holds.any() or (ok & holds).any():
                continue
            for r in rules.rules(SCOPES):
                if bad[r.name][holds].all():
                    i = int(np.flatnonzero(holds)[0])
                    out[f"{dim}={shown}"] = f"rule {r.name!r}: {r.message(model, rules._Row(table, i))}"
                    break
    return out
