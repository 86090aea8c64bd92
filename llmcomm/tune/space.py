"""The configurations a tuner may choose from: every combination of tp, pp, dp, ep, micro-batch, virtual
pipeline stages, sequence parallelism, recomputation and the distributed optimizer that
:func:`llmcomm.specs.validate` accepts for a model, a GPU count and a global batch.

Built by construction, not by filtering a Cartesian product, so that a 16,384-GPU space stays small in memory:

* ``tp`` divides the GPUs, the attention heads, the key/value groups and the FFN size;
* ``pp`` divides the GPUs left and the layers; ``dp = gpus / (tp · pp)`` divides the global batch;
* ``ep`` (MoE only) divides ``dp`` and the number of experts; with ``tp > 1`` it needs SP (Megatron-LM);
* ``micro_batch`` divides ``global_batch / dp`` (up to ``max_micro_batch``);
* ``vpp > 1`` (interleaved 1F1B) needs ``pp ≥ 2``, ``pp · vpp`` dividing the layers and ``pp`` dividing the
  number of micro-batches;
* ``sp`` needs ``tp > 1`` and ``tp`` dividing the sequence;
* ``recompute`` ∈ none/selective/full; ``distributed_optimizer`` ∈ False/True.

Context parallelism and FSDP are not in the space: the iteration-time formulation does not model them (it
refuses them), so a tuner could not rank them honestly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..specs import ModelSpec
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
    max_micro_batch: int = 16
    max_vpp: int = 8

    def __post_init__(self) -> None:
        bad = [r for r in self.recompute if r not in RECOMPUTE]
        if bad:
            raise ConfigError(f"space: recompute values {bad} are not in {RECOMPUTE}")
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
        return cls(**{k: (tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in d.items()})


def _allowed(values: Sequence[int], chosen: tuple[int, ...] | None) -> list[int]:
    return [v for v in values if chosen is None or v in chosen]


def splits(model: ModelSpec, gpus: int, global_batch: int, tp: tuple[int, ...] | None = None,
           pp: tuple[int, ...] | None = None) -> Iterator[tuple[int, int, int]]:
    """``(tp, pp, dp)`` with ``tp · pp · dp = gpus`` that the module docstring's divisibility rules allow
    (``tp``, ``pp``: only these values; ``None``: all), in increasing tp, then pp."""
    for t in _allowed(divisors(gpus), tp):
        if model.num_attention_heads % t or model.query_groups % t or model.ffn_hidden_size % t:
            continue
        for p in _allowed(divisors(gpus // t), pp):
            if model.num_layers % p:
                continue
            dp = gpus // (t * p)
            if global_batch % dp == 0:
                yield t, p, dp


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
        sps = [x for x in space.sp if not x or (tp > 1 and s % tp == 0)]
        if ep > 1 and tp > 1:
            sps = [x for x in sps if x]
        for mb, v in itertools.product(mbs, vpps):
            m = per_replica // mb
            if v > 1 and m % pp:
                continue
            for sp, rec, do in itertools.product(sps, space.recompute, space.distributed_optimizer):
                rows.append((tp, pp, dp, ep, mb, v, sp, rec, do, m))
    cols = ["tp", "pp", "dp", "ep", "micro_batch", "vpp", "sp", "recompute", "distributed_optimizer",
            "num_microbatches"]
    df = pd.DataFrame(rows, columns=cols)
    df["global_batch"] = global_batch
    df["seq_len"] = s
    df["schedule"] = np.where(df["vpp"] > 1, "interleaved", "1f1b")
    return df
