"""The configurations a tuner may choose from: every combination of tp, pp, dp, ep, micro-batch, virtual
pipeline stages, sequence parallelism, recomputation and the distributed optimizer that
:func:`llmcomm.specs.validate` accepts for a model, a GPU count and a global batch.

Built by construction, not by filtering a Cartesian product, so that a 16,384-GPU space stays small in memory:
``tp`` and ``pp`` run over the divisors of the GPUs, ``ep`` (MoE only) over the divisors of ``dp``, ``micro_batch``
over the divisors of ``global_batch / dp`` (up to ``max_micro_batch``), ``vpp`` over the divisors of the layers per
stage; every row is then checked against the rules of :mod:`llmcomm.rules` (scopes :data:`SCOPES`: what
``ParallelConfig``, ``specs.validate``, Megatron-LM and the iteration-time formulation require, each rule written
once there with its source), so the space holds exactly the configurations the cost model can rank.

Context parallelism and FSDP are not in the space: the iteration-time formulation does not model them (it
refuses them), so a tuner could not rank them honestly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from .. import rules
from ..errors import ConfigError
from ..parallel_table import ParallelTable
from ..specs import ModelSpec
from ..vocab import ATTENTION_BACKENDS
from ..vocab import RECOMPUTE_MODES as RECOMPUTE


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n`` in increasing order."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class SearchSpace:
    """Which values each dimension may take; ``None`` means every valid value. Narrow any dimension by giving
    a tuple, e.g. ``SearchSpace(tp=(8,), recompute=("selective",))``."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    vpp: tuple[int, ...] | None = None
    sp: tuple[bool, ...] = (False, True)
    recompute: tuple[str, ...] = RECOMPUTE
    distributed_optimizer: tuple[bool, ...] = (False, True)
    attention_backend: tuple[str, ...] = ("auto",)  # Megatron-LM's default; ("unfused",) for pre-2022 recipes
    max_micro_batch: int = 16
    max_vpp: int = 8

    def __post_init__(self) -> None:
        bad = [r for r in self.recompute if r not in RECOMPUTE]
        if bad:
            raise ConfigError(f"space: recompute values {bad} are not in {RECOMPUTE}")
        bad = [b for b in self.attention_backend if b not in ATTENTION_BACKENDS]
        if bad or not self.attention_backend:
            raise ConfigError(f"space: attention_backend values {bad} are not in {ATTENTION_BACKENDS}")
        for f in ("tp", "pp", "ep", "micro_batch", "vpp"):
            v = getattr(self, f)
            if v is not None and (not v or any(not isinstance(x, (int, np.integer)) or x < 1 for x in v)):
                raise ConfigError(f"space: {f}={v!r} must be a non-empty tuple of positive integers")

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


def _allowed(values: Sequence[int], chosen: tuple[int, ...] | None) -> list[int]:
    return [v for v in values if chosen is None or v in chosen]


SCOPES = ("config", "job", "megatron", "cost")  # the rules (llmcomm.rules) every configuration of the space keeps
DIMENSIONS = ("tp", "pp", "dp", "ep", "micro_batch", "vpp", "sp", "recompute", "distributed_optimizer",
              "attention_backend")


def splits(model: ModelSpec, gpus: int, global_batch: int, tp: tuple[int, ...] | None = None,
           pp: tuple[int, ...] | None = None) -> Iterator[tuple[int, int, int]]:
    """``(tp, pp, dp)`` with ``tp · pp · dp = gpus`` that the rules of :mod:`llmcomm.rules` allow at micro-batch 1
    (``tp``, ``pp``: only these values; ``None``: all), in increasing tp, then pp."""
    pairs = [(t, p) for t in _allowed(divisors(gpus), tp) for p in _allowed(divisors(gpus // t), pp)]
    if not pairs:
        return
    t_, p_ = (np.array(x, np.int64) for x in zip(*pairs, strict=True))
    dp = gpus // (t_ * p_)
    table = ParallelTable.from_columns(len(pairs), model, tp=t_, pp=p_, dp=dp, global_batch=global_batch)
    ok = rules.valid(model, table, ("config", "job"))
    for i in np.flatnonzero(ok):
        yield int(t_[i]), int(p_[i]), int(dp[i])


def enumerate_candidates(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None = None,
                         space: SearchSpace | None = None) -> pd.DataFrame:
    """Every valid configuration as one row (columns named as :class:`~llmcomm.specs.ParallelConfig`
    fields, plus ``num_microbatches``); see the module docstring for the rules."""
    space = space or SearchSpace()
    s = seq_len or model.seq_length
    L = model.num_layers
    shape_rows: list[tuple[int, int, int, int]] = []
    for tp, pp, dp in splits(model, gpus, global_batch, space.tp, space.pp):
        eps = [e for e in divisors(dp) if model.num_experts % e == 0] if model.is_moe else [1]
        shape_rows += [(tp, pp, dp, ep) for ep in _allowed(eps, space.ep)]
    rows = []
    for tp, pp, dp, ep in shape_rows:
        per_replica = global_batch // dp
        mbs = _allowed([b for b in divisors(per_replica) if b <= space.max_micro_batch], space.micro_batch)
        vpps = _allowed([v for v in divisors(L // pp) if v <= space.max_vpp and (v == 1 or pp >= 2)], space.vpp)
        for mb, v in itertools.product(mbs, vpps):
            m = per_replica // mb
            for sp, rec, do, ab in itertools.product(space.sp, space.recompute, space.distributed_optimizer,
                                                     space.attention_backend):
                rows.append((tp, pp, dp, ep, mb, v, sp, rec, do, ab, m))
    cols = [*DIMENSIONS, "num_microbatches"]
    df = pd.DataFrame(rows, columns=cols)
    df["global_batch"] = global_batch
    df["seq_len"] = s
    df["schedule"] = np.where(df["vpp"] > 1, "interleaved", "1f1b")
    table = ParallelTable.from_columns(len(df), model, **{c: df[c].to_numpy() for c in df.columns
                                                          if c != "num_microbatches"})
    return df[rules.valid(model, table, SCOPES)].reset_index(drop=True)
