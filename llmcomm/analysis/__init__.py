"""Analyses over traces: every function takes a :class:`~llmcomm.trace.Trace` (or its events) first and
returns a tidy DataFrame or a number (Holistic Trace Analysis style).

* :mod:`.temporal` — time series, autocorrelation, periods, call-sequence repeatability (finding F3).
"""

from .temporal import (
    SEQUENCE_COLUMNS,
    acf_peak_near,
    autocorrelation,
    call_sequences,
    comm_time_series,
    mean_autocorrelation,
    periods,
    repeatability,
)

__all__ = [
    "SEQUENCE_COLUMNS",
    "acf_peak_near",
    "autocorrelation",
    "call_sequences",
    "comm_time_series",
    "mean_autocorrelation",
    "periods",
    "repeatability",
]
