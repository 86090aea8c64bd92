"""Pipeline schedule order: which (forward/backward, micro-batch, model chunk) steps a pipeline stage runs,
in the order it runs them.

``m`` micro-batches, ``p`` stages, stage ``r`` (0-based), ``v`` model chunks per stage (interleaved only).

* GPipe: every forward, then every backward (micro-batches in order both times).
* 1F1B (PipeDream-flush, Megatron's ``forward_backward_pipelining_without_interleaving``):
  ``w = min(p - r - 1, m)`` warm-up forwards, then ``m - w`` pairs (forward, backward), then ``w``
  cool-down backwards.
* Interleaved 1F1B (Megatron's ``forward_backward_pipelining_with_interleaving``): ``m·v`` virtual steps each
  way, looked up in Megatron's schedule table (``get_schedule_table``, core/pipeline_parallel/schedules.py):
  micro-batches in groups of ``n`` (``microbatch_group_size_per_vp_stage``, default ``p``; the last group
  takes the remainder), each group run chunk by chunk; forward step ``k`` runs ``table[k]``, backward step
  ``k`` the same micro-batch on chunk ``v - 1 - chunk``; warm-up ``w = min((p - r - 1)·2 + (v - 1)·n, m·v)``
  forwards (``get_pp_rank_microbatches``), then 1F1B pairs, then cool-down backwards. With ``n = p`` and
  ``m % p == 0`` step ``k`` is chunk ``(k // p) % v``, micro-batch ``(k // (p·v))·p + k % p``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ..errors import ConfigError


class Step(NamedTuple):
    """One scheduled step: ``kind`` is ``"F"`` or ``"B"``."""

    kind: str
    microbatch: int
    chunk: int


def gpipe(m: int) -> list[Step]:
    """All forwards then all backwards."""
    return [Step("F", i, 0) for i in range(m)] + [Step("B", i, 0) for i in range(m)]


def one_f_one_b(m: int, p: int, r: int) -> list[Step]:
    """Non-interleaved 1F1B order on stage ``r`` of ``p``: ``w`` warm-up forwards ``F0 … F(w-1)``, then the
    pairs ``F(w+i), B(i)`` for ``i < m - w``, then the cool-down backwards ``B(m-w) … B(m-1)``, assembled by
    slicing the stage-independent forwards and backwards of :func:`_steps_of` (a deep pipeline's stages share
    them: 32 stages of 512 micro-batches would otherwise build 32,768 steps)."""
    w = min(p - r - 1, m)
    fwd, bwd = _steps_of("F", m), _steps_of("B", m)
    pairs: list[Step | None] = [None] * (2 * (m - w))
    pairs[0::2] = fwd[w:]
    pairs[1::2] = bwd[:m - w]
    return [*fwd[:w], *pairs, *bwd[m - w:]]  # type: ignore[list-item]  # every None replaced


@lru_cache(maxsize=64)
def _steps_of(kind: str, m: int) -> tuple[Step, ...]:
    """``Step(kind, i, 0)`` for ``i < m`` (steps are immutable tuples: shared by every stage's list)."""
    return tuple(Step(kind, i, 0) for i in range(m))


def schedule_table(m: int, v: int, n: int) -> list[tuple[int, int]]:
    """``(micro-batch, chunk)`` of each virtual step: groups of ``n`` micro-batches, each run chunk by chunk
    (Megatron-LM ``get_schedule_table``; the last group holds what is left)."""
    out: list[tuple[int, int]] = []
    for lo in range(0, m, n):
        hi = m if lo + n >= m else lo + n
        out += [(mb, c) for c in range(v) for mb in range(lo, hi)]
    return out


def interleaved(m: int, p: int, r: int, v: int, n: int | None = None) -> list[Step]:
    """Interleaved 1F1B order on stage ``r``; ``n`` micro-batches per group (default ``p``) with Megatron's
    rule ``p <= n <= m`` and ``m % n`` either 0 or ``>= p``."""
    n = p if n is None else n
    if not p <= n <= m or 0 < m % n < p:
        raise ConfigError(f"interleaved schedule: micro-batch group {n} needs pp={p} <= {n} <= "
                          f"num_microbatches={m} and {m} % {n} in {{0}} or >= {p}")
    table = schedule_table(m, v, n)
    total = m * v

    def fwd(k: int) -> Step:
        return Step("F", table[k][0], table[k][1])

    def bwd(k: int) -> Step:
        return Step("B", table[k][0], v - 1 - table[k][1])

    w = min((p - r - 1) * 2 + (v - 1) * n, total)
    steps = [fwd(k) for k in range(w)]
    for i in range(total - w):
        steps.append(fwd(w + i))
        steps.append(bwd(i))
    steps += [bwd(total - w + i) for i in range(w)]
    return steps


def schedule(name: str, m: int, p: int, r: int, v: int = 1, n: int | None = None) -> list[Step]:
    """The step order of stage ``r`` for schedule ``name`` (``gpipe``, ``1f1b``, ``interleaved``; ``n`` is
    the interleaved schedule's micro-batch group, default ``p``)."""
    if name == "gpipe":
        return gpipe(m)
    if name == "1f1b":
        return one_f_one_b(m, p, r)
    if name == "interleaved":
        return interleaved(m, p, r, v, n)
    raise ConfigError(f"schedule={name!r} is not one of gpipe, 1f1b, interleaved")
