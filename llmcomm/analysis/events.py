"""What every analysis starts from: a :class:`~llmcomm.trace.Trace` or its events table, either one."""

from __future__ import annotations

from typing import TypeAlias

import pandas as pd

from ..errors import AnalysisError
from ..trace import Trace

TraceOrEvents: TypeAlias = Trace | pd.DataFrame


def events_of(data: TraceOrEvents) -> pd.DataFrame:
    """The events DataFrame of ``data`` (a Trace's ``events``, or ``data`` itself)."""
    if isinstance(data, Trace):
        return data.events
    if isinstance(data, pd.DataFrame):
        return data
    raise AnalysisError(f"expected a Trace or its events DataFrame, got {type(data).__name__}")


def timed_events(data: TraceOrEvents) -> pd.DataFrame:
    """The events with a start time; an :class:`AnalysisError` when there are none."""
    events = events_of(data)
    timed = events[events["t_start_ns"].notna()]
    if timed.empty:
        raise AnalysisError("no timed events: field 't_start_ns' is null everywhere (predicted traces and "
                            "execution traces carry no times)")
    return timed


def trace_of(data: TraceOrEvents) -> Trace:
    """``data`` as a Trace (an events table is wrapped as is, with empty metadata), for the analyses that use
    the Trace's views (flows, volumes)."""
    if isinstance(data, Trace):
        return data
    return Trace(events_of(data))
