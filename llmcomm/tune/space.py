"""The configurations a tuner may choose from: every combination of tp, cp, pp (with the uneven first/last-stage
splits), dp, ep, etp, micro-batch, virtual pipeline stages, sequence parallelism, recomputation, the distributed
optimizer or FSDP and the attention backend that :func:`llmcomm.specs.validate` accepts for a model, a GPU count
and a global batch, and that the iteration-time formulation can rank.

Built by construction, not by filtering a Cartesian product, so that a 16,384-GPU space stays small in memory:
``tp``, ``cp`` and ``pp`` run over the divisors of the GPUs (``dp = gpus / (tp·cp·pp)``), the pipeline split over
:func:`stage_splits`, ``ep`` (MoE only) over the divisors of ``dp``, ``micro_batch`` over the divisors of
``global_batch / dp`` (up to ``max_micro_batch``), ``vpp`` over the divisors of every stage's layer count; every
row is then checked against the rules of :mod:`llmcomm.rules` (scopes :data:`SCOPES`: what ``ParallelConfig``,
``specs.validate``, Megatron-LM and the iteration-time formulation require, each rule written once there with its
source), so the space holds exactly the configurations the cost model can rank.

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

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from .. import rules
from ..errors import ConfigError
from ..parallel_table import ParallelTable
from ..specs import ModelSpec
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
    ``SearchSpace(tp=(8,), recompute=("selective",))``. ``etp=None``: expert TP equals tp (Megatron's default);
    ``uneven``: which pipeline splits, even (``False``) and/or uneven first/last stages (``True``);
    ``max_stage_offset``: how many layers lighter than a middle stage an uneven end stage may be; ``max_cp``: the
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
    distributed_optimizer: tuple[bool, ...] = (False, True)
    fsdp: tuple[bool, ...] | None = None
    attention_backend: tuple[str, ...] = ("auto", "unfused")  # Megatron-LM's default (fused) and the 2021 kernels
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
        for f in ("sp", "distributed_optimizer", "fsdp", "uneven"):
            v = getattr(self, f)
            if v is not None and (not v or any(not isinstance(x, (bool, np.bool_)) for x in v)):
                raise ConfigError(f"space: {f}={v!r} must be a non-empty tuple of booleans")
        for f in ("max_micro_batch", "max_vpp", "max_cp"):
            if not isinstance(getattr(self, f), (int, np.integer)) or getattr(self, f) < 1:
                raise ConfigError(f"space: {f}={getattr(self, f)!r} must be a positive integer")
        if not isinstance(self.max_stage_offset, (int, np.integer)) or self.max_stage_offset < 0:
            raise ConfigError(f"space: max_stage_offset={self.max_stage_offset!r} must be a non-negative integer")

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
DIMENSIONS = ("tp", "cp", "pp", "dp", "ep", "etp", "micro_batch", "vpp", "num_layers_in_first_pipeline_stage",
              "num_layers_in_last_pipeline_stage", "sp", "recompute", "distributed_optimizer", "fsdp",
              "attention_backend", "cp_comm_type")
SHORT = {"num_layers_in_first_pipeline_stage": "first", "num_layers_in_last_pipeline_stage": "last"}


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


def _raw_candidates(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None,
                    space: SearchSpace) -> tuple[pd.DataFrame, ParallelTable]:
    s = seq_len or model.seq_length
    L = model.num_layers
    fsdps = tuple(accepted_values(model, "fsdp", [False, True])) if space.fsdp is None else space.fsdp
    shape_rows: list[tuple[int, ...]] = []
    for tp, cp, pp, dp in splits(model, gpus, global_batch, space.tp, space.pp, _cp_values(model, space, gpus)):
        eps = [e for e in divisors(dp) if model.num_experts % e == 0] if model.is_moe else [1]
        etps = (UNSET,) if space.etp is None or not model.is_moe else space.etp
        shape_rows += [(tp, cp, pp, dp, ep, et) for ep in _allowed(eps, space.ep) for et in etps]
    rows = []
    split_cache: dict[int, list[tuple[int, int, list[int]]]] = {}
    for tp, cp, pp, dp, ep, et in shape_rows:
        if pp not in split_cache:
            split_cache[pp] = []
            for f, la in stage_splits(L, pp, space.max_stage_offset, space.uneven):
                g = math.gcd(*_stage_layers(L, pp, f, la))
                vs = _allowed([v for v in divisors(g) if v <= space.max_vpp and (v == 1 or pp >= 2)], space.vpp)
                split_cache[pp].append((f, la, vs))
        per_replica = global_batch // dp
        mbs = _allowed([b for b in divisors(per_replica) if b <= space.max_micro_batch], space.micro_batch)
        for f, la, vpps in split_cache[pp]:
            for mb, v in itertools.product(mbs, vpps):
                m = per_replica // mb
                # cp_comm_type only where there is context parallelism (cp = 1: Megatron's default, no CP calls)
                for sp, rec, do, fs, ab, ct in itertools.product(space.sp, space.recompute, space.distributed_optimizer,
                                                                 fsdps, space.attention_backend,
                                                                 space.cp_comm_type if cp > 1 else ("p2p",)):
                    rows.append((tp, cp, pp, dp, ep, et, mb, v, f, la, sp, rec, do, fs, ab, ct, m))
    cols = [*DIMENSIONS, "num_microbatches"]
    df = pd.DataFrame(rows, columns=cols)
    df["global_batch"] = global_batch
    df["seq_len"] = s
    df["schedule"] = np.where(df["vpp"] > 1, "interleaved", "1f1b")
    table = ParallelTable.from_columns(len(df), model, **{c: df[c].to_numpy() for c in df.columns
                                                          if c != "num_microbatches"})
    return df, table


def enumerate_candidates(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None = None,
                         space: SearchSpace | None = None) -> pd.DataFrame:
    """Every valid configuration as one row (columns named as :class:`~llmcomm.specs.ParallelConfig`
    fields, :data:`UNSET` for an optional integer left to its default, plus ``num_microbatches``); see the
    module docstring for the rules."""
    df, table = _raw_candidates(model, gpus, global_batch, seq_len, space or SearchSpace())
    return df[rules.valid(model, table, SCOPES)].reset_index(drop=True)


EXPLICIT = ("tp", "cp", "pp", "ep", "etp", "micro_batch", "vpp", "fsdp", "attention_backend", "sp", "recompute",
            "distributed_optimizer", "cp_comm_type")


def refusals(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None,
             space: SearchSpace) -> dict[str, str]:
    """``{"cp=2": "rule 'cost-cp': ..."}`` for each value a dimension of ``space`` asks for explicitly that no
    valid configuration keeps, with the first rule (in :data:`llmcomm.rules.RULES` order) that removed every row
    holding it, and its message."""
    df, table = _raw_candidates(model, gpus, global_batch, seq_len, space)
    if not len(df):
        return {}
    bad = rules.violations(model, table, SCOPES)
    ok = np.ones(len(df), bool)
    for b in bad.values():
        ok &= ~b
    out: dict[str, str] = {}
    for dim in EXPLICIT:
        chosen = getattr(space, dim)
        if chosen is None or dim not in df.columns:
            continue
        for v in chosen:
            holds = (df[dim] == v).to_numpy()
            if not holds.any() or (ok & holds).any():
                continue
            for r in rules.rules(SCOPES):
                if bad[r.name][holds].all():
                    i = int(np.flatnonzero(holds)[0])
                    out[f"{dim}={v}"] = f"rule {r.name!r}: {r.message(model, rules._Row(table, i))}"
                    break
    return out
