"""How many bytes each kind of communication carries (finding F2).

Two byte measures:

* message bytes (``algorithm=None``): the events' nccl-tests sizes × count (what :meth:`Trace.volumes` sums),
  a point-to-point transfer counted once, at its sender (``recv`` rows are left out);
* wire bytes (``algorithm="ring"`` or ``"direct"``): the flows each rank puts on links, from
  :meth:`Trace.flows` (all-reduce ``2(n-1)/n·S`` per rank under ring, send ``S``...).

``share`` is always a group's bytes over the total, ``bytes_g / Σ_g bytes_g``; the TP share is the share of
``tp`` and ``sp`` together.

* :func:`bytes_by`, :func:`volume_table`: bytes and shares per group, of one trace or several labelled ones;
  :func:`largest_parallelism`: the parallelism with the largest share per configuration.
* :func:`tp_share`; :func:`tp_microbatch_bytes`: the TP and SP bytes that recur every micro-batch.
* :func:`first_crossing`, :func:`first_crossings`, :func:`describe_crossing`: from how many micro-batches on a
  TP-share sweep reaches a threshold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pandas as pd

from ..vocab import AlgorithmName
from .events import TraceOrEvents, events_of, trace_of

TP_PARALLELISMS = ("tp", "sp")


def with_share(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with a ``share`` column: each row's ``bytes`` over their sum (0 when the sum is 0)."""
    total = float(table["bytes"].sum())
    return table.assign(share=table["bytes"] / total if total else 0.0)


def bytes_by(data: TraceOrEvents, by: Iterable[str] = ("parallelism",), algorithm: AlgorithmName | None = None
             ) -> pd.DataFrame:
    """Bytes grouped by ``by`` with each group's ``share`` of the total (message or wire bytes), largest
    first."""
    trace = trace_of(data)
    by = list(by)
    if algorithm is None:
        grouped = trace.volumes(by, sent_only=True)[[*by, "bytes"]]
    else:
        grouped = trace.flows(algorithm).groupby(by, observed=True)["bytes"].sum().reset_index()
    return with_share(grouped).sort_values("bytes", ascending=False, ignore_index=True)


def tp_share(data: TraceOrEvents, algorithm: AlgorithmName | None = None) -> float:
    """Fraction of all bytes that TP (and SP) calls carry."""
    shares = bytes_by(data, ("parallelism",), algorithm)
    return float(shares.loc[shares["parallelism"].isin(TP_PARALLELISMS), "share"].sum())


def tp_microbatch_bytes(data: TraceOrEvents) -> int:
    """Message bytes of the TP and SP calls issued every micro-batch: ``Σ bytes·count`` over the ``tp`` and
    ``sp`` calls outside the ``optimizer`` phase (which holds the once-per-iteration ones, e.g. SP's
    all-reduce of the replicated norm gradients)."""
    events = events_of(data)
    per_microbatch = events["parallelism"].isin(TP_PARALLELISMS) & (events["phase"] != "optimizer")
    return int((events["bytes"] * events["count"])[per_microbatch].sum())


def first_crossing(sweep: pd.DataFrame, threshold: float = 0.99) -> int | None:
    """Smallest number of micro-batches whose ``tp_share`` reaches ``threshold`` in a sweep table (columns
    ``microbatches``, ``tp_share``); None if none does."""
    hit = sweep.loc[sweep["tp_share"] >= threshold, "microbatches"]
    return int(hit.min()) if len(hit) else None


def first_crossings(sweeps: pd.DataFrame, threshold: float = 0.99, by: str = "configuration"
                    ) -> dict[str, int | None]:
    """:func:`first_crossing` of each ``by`` group of stacked sweeps (e.g.
    :func:`llmcomm.analysis.sweeps.tp_share_sweeps`), in order of first appearance."""
    return {label: first_crossing(sweeps[sweeps[by] == label], threshold) for label in pd.unique(sweeps[by])}


def describe_crossing(microbatches: int | None, up_to: int) -> str:
    """A crossing in words, for a result sentence: ``"from 64 micro-batches on"``, or ``"at none of up to
    2,048 micro-batches"`` when the sweep (up to ``up_to`` micro-batches) never reached the threshold."""
    if microbatches is None:
        return f"at none of up to {up_to:,} micro-batches"
    return f"from {microbatches:,} micro-batches on"


def volume_table(traces: Mapping[str, TraceOrEvents], algorithm: AlgorithmName | None = None) -> pd.DataFrame:
    """Tidy ``config, parallelism, bytes, share`` over several traces (``{config label: trace}``)."""
    return pd.concat([bytes_by(trace, ["parallelism"], algorithm).assign(config=label)
                      for label, trace in traces.items()], ignore_index=True)


def largest_parallelism(volumes: pd.DataFrame) -> pd.DataFrame:
    """Per ``config`` of a :func:`volume_table`, the row of the parallelism with the largest ``share`` (the
    first such row on a tie), indexed by ``config``."""
    return volumes.loc[volumes.groupby("config")["share"].idxmax()].set_index("config")
