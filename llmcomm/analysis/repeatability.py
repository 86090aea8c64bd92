"""Do iterations repeat? The calls of each rank's iteration, numbered in issue order, followed across iterations.

One ordering serves every measure here (and :mod:`.moe`'s): :func:`in_issue_order` sorts each
``(rank, iteration)``'s calls into issue order (by ``t_start_ns`` when timed, else table order), and
:func:`call_sequence` numbers them ``seq = 0, 1, ...``, so that call ``seq`` of iteration ``i`` and call ``seq``
of iteration ``j`` are *the same call* of the program.

* :func:`repeatability`: per ``(rank, iteration)``, whether its sequence of calls (tuples of the non-timing
  columns :data:`SEQUENCE_COLUMNS`) equals the reference iteration's (``identical``), and the share of
  positions that match, ``position_match = #{k : c_k = c_k^ref} / max(n, n_ref)``.
* :func:`size_repeatability`: per ``(rank, seq)``, how many distinct message sizes and ops the call takes over
  the iterations (1 and 1 when the volume repeats exactly).
* :func:`duration_spread`: per collective (``op/parallelism/size``), the spread of its measured durations,
  ``cv = std / mean``; :func:`smallest_duration_ratio`: the steadiest frequent collective's ``max / min``.
* :func:`repeatability_summary`: :func:`repeatability` rows summed up per trace.
* :func:`comm_time_per_iteration`: the measured time in communication calls per iteration.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..units import format_bytes
from .events import TraceOrEvents, events_of

SEQUENCE_COLUMNS = ("microbatch", "layer", "phase", "parallelism", "op", "peer", "bytes")


def in_issue_order(data: TraceOrEvents) -> pd.DataFrame:
    """The events sorted into issue order within each ``(rank, iteration)``: by ``t_start_ns`` where timed,
    else by table position (a stable sort, so untimed calls keep the order they were issued in)."""
    events = events_of(data)
    position = pd.Series(np.arange(len(events), dtype=np.float64), index=events.index)
    issue_time = events["t_start_ns"].astype("float64").fillna(position)
    return (events.assign(_issue_time=issue_time)
            .sort_values(["rank", "iteration", "_issue_time"], kind="stable")
            .drop(columns="_issue_time"))


def call_sequence(data: TraceOrEvents, iterations_from: int | None = 1) -> pd.DataFrame:
    """The events of iterations ``>= iterations_from`` (all when None; the default skips the set-up
    iteration 0) in issue order per ``(rank, iteration)``, with ``seq`` (position of the call in its rank's
    iteration), ``duration_us`` (``(t_end - t_start)/1000``, NaN when untimed) and a readable
    ``collective`` label (``op/parallelism/size``, e.g. ``all_to_all/ep/32MiB``)."""
    events = events_of(data)
    if iterations_from is not None:
        events = events[events["iteration"] >= iterations_from]
    seq = in_issue_order(events)
    seq["seq"] = seq.groupby(["rank", "iteration"]).cumcount()
    duration_ns = (seq["t_end_ns"] - seq["t_start_ns"]).astype("Float64")
    seq["duration_us"] = (duration_ns / 1e3).astype(float)
    size_label = {b: format_bytes(b, compact=True) for b in seq["bytes"].unique()}
    seq["collective"] = seq["op"] + "/" + seq["parallelism"] + "/" + seq["bytes"].map(size_label)
    return seq.reset_index(drop=True)


def call_sequences(data: TraceOrEvents, columns: Sequence[str] = SEQUENCE_COLUMNS) -> pd.Series:
    """For each ``(rank, iteration)`` (every iteration), the tuple of its calls in issue order, each call a
    tuple of ``columns`` (as text)."""
    return in_issue_order(data).groupby(["rank", "iteration"], sort=True)[list(columns)].apply(
        lambda calls: tuple(map(tuple, calls.astype(str).to_numpy())))


def repeatability(data: TraceOrEvents, reference_iteration: int = 1,
                  columns: Sequence[str] = SEQUENCE_COLUMNS) -> pd.DataFrame:
    """Per ``(rank, iteration)``: ``calls``, ``identical`` (the call sequence equals that rank's
    ``reference_iteration`` sequence) and ``position_match`` (share of positions holding the same call;
    1.0 when identical)."""
    sequences = call_sequences(data, columns)
    rows = []
    for (rank, iteration), calls in sequences.items():
        reference = sequences.get((rank, reference_iteration))
        if reference is None:
            continue
        longest = max(len(calls), len(reference))
        same = sum(a == b for a, b in zip(calls, reference, strict=False))
        rows.append({"rank": rank, "iteration": iteration, "calls": len(calls), "identical": calls == reference,
                     "position_match": same / longest if longest else 1.0})
    return pd.DataFrame(rows)


def size_repeatability(data: TraceOrEvents, iterations_from: int | None = 1) -> pd.DataFrame:
    """Per ``(rank, seq)`` of :func:`call_sequence`: ``iterations`` it occurs in, distinct message ``sizes``
    and ``ops``, and its ``collective`` label. A trace whose volume repeats has ``sizes == ops == 1``."""
    seq = call_sequence(data, iterations_from)
    return (seq.groupby(["rank", "seq"])
            .agg(iterations=("iteration", "nunique"), sizes=("bytes", "nunique"), ops=("op", "nunique"),
                 collective=("collective", "first"))
            .reset_index())


def duration_spread(data: TraceOrEvents, iterations_from: int | None = 1) -> pd.DataFrame:
    """Per collective label of :func:`call_sequence`: ``calls``, median/min/max/mean/std duration (µs) and
    the coefficient of variation ``cv = std / mean``, slowest median first."""
    durations = call_sequence(data, iterations_from).groupby("collective")["duration_us"]
    out = durations.agg(calls="size", median_us="median", min_us="min", max_us="max", mean_us="mean",
                        std_us="std")
    out["cv"] = out["std_us"] / out["mean_us"]
    return out.reset_index().sort_values("median_us", ascending=False, ignore_index=True)


def smallest_duration_ratio(spread: pd.DataFrame, min_calls: int = 20) -> float:
    """``min over collectives of max_us / min_us`` in a :func:`duration_spread` table, over the collectives
    with at least ``min_calls`` calls: above 1 when every frequent collective's time varies (NaN when none
    has that many calls)."""
    frequent = spread[spread["calls"] >= min_calls]
    return float((frequent["max_us"] / frequent["min_us"]).min())


def repeatability_summary(rows: pd.DataFrame, by: str = "trace") -> pd.DataFrame:
    """Per ``by`` of stacked :func:`repeatability` rows: ``iterations`` and ``ranks`` (distinct),
    ``calls_per_iteration`` (median over rank-iterations) and ``identical`` (share of rank-iterations whose
    sequence equals the reference's)."""
    return rows.groupby(by).agg(iterations=("iteration", "nunique"), ranks=("rank", "nunique"),
                                calls_per_iteration=("calls", "median"), identical=("identical", "mean"))


def comm_time_per_iteration(sequence: pd.DataFrame) -> pd.Series:
    """Milliseconds spent in communication calls per iteration: ``Σ duration_us / 1000`` over the calls of a
    :func:`call_sequence` (all its ranks), indexed by ``iteration``."""
    return sequence.groupby("iteration")["duration_us"].sum() / 1e3
