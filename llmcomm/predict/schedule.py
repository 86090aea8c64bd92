"""Pipeline schedule order: which (forward/backward, micro-batch, model chunk) steps a pipeline stage runs,
in the order it runs them.

``m`` micro-batches, ``p`` stages, stage ``r`` (0-based), ``v`` model chunks per stage (interleaved only).

* GPipe: every forward, then every backward (micro-batches in order both times).
* 1F1B (PipeDream-flush, Megatron's ``forward_backward_pipelining_without_interleaving``):
  ``w = min(p - r - 1, m)`` warm-up forwards, then ``m - w`` pairs (forward, backward), then ``w``
  cool-down backwards.
* Interleaved 1F1B (Megatron's ``forward_backward_pipelining_with_interleaving``): ``m·v`` virtual steps each
  way; virtual forward step ``k`` runs chunk ``(k // p) % v`` on micro-batch ``(k // (p·v))·p + k % p``,
  backward step ``k`` runs chunk ``v - 1 - (k // p) % v`` on the same micro-batch formula; warm-up
  ``w = min((p - r - 1)·2 + (v - 1)·p, m·v)`` forwards, then 1F1B pairs, then cool-down backwards.
"""

from __future__ import annotations

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
    """Non-interleaved 1F1B order on stage ``r`` of ``p``."""
    w = min(p - r - 1, m)
    steps = [Step("F", i, 0) for i in range(w)]
    for i in range(m - w):
        steps.append(Step("F", w + i, 0))
        steps.append(Step("B", i, 0))
    steps += [Step("B", m - w + i, 0) for i in range(w)]
    return steps


def _virtual(k: int, p: int, v: int, forward: bool) -> Step:
    chunk = (k // p) % v
    mb = (k // (p * v)) * p + k % p
    return Step("F", mb, chunk) if forward else Step("B", mb, v - 1 - chunk)


def interleaved(m: int, p: int, r: int, v: int) -> list[Step]:
    """Interleaved 1F1B order on stage ``r`` (needs ``m % p == 0``, as Megatron does)."""
    if m % p:
        raise ConfigError(f"pp={p} does not divide num_microbatches={m} (required by the interleaved schedule)")
    total = m * v
    w = min((p - r - 1) * 2 + (v - 1) * p, total)
    steps = [_virtual(k, p, v, True) for k in range(w)]
    for i in range(total - w):
        steps.append(_virtual(w + i, p, v, True))
        steps.append(_virtual(i, p, v, False))
    steps += [_virtual(total - w + i, p, v, False) for i in range(w)]
    return steps


def schedule(name: str, m: int, p: int, r: int, v: int = 1) -> list[Step]:
    """The step order of stage ``r`` for schedule ``name`` (``gpipe``, ``1f1b``, ``interleaved``)."""
    if name == "gpipe":
        return gpipe(m)
    if name == "1f1b":
        return one_f_one_b(m, p, r)
    if name == "interleaved":
        return interleaved(m, p, r, v)
    raise ConfigError(f"schedule={name!r} is not one of gpipe, 1f1b, interleaved")
