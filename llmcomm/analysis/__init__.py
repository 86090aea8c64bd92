"""Analyses over traces: every function takes a :class:`~llmcomm.trace.Trace` (or its events) first and
returns a tidy DataFrame or a number (Holistic Trace Analysis style).

* :mod:`.volumes` — bytes per parallelism / phase, shares, the TP share (finding F2).
* :mod:`.pairs` — bytes per pair class (intra- / inter-node), bytes outside every group (finding F1).
* :mod:`.temporal` — time series, autocorrelation, periods (finding F3).
* :mod:`.repeatability` — calls numbered in issue order and followed across iterations: identical
  sequences, message sizes, duration spread (finding F3).
* :mod:`.alltoall` — all-to-all matrices, exact or estimated from recorded margins (finding F4).
* :mod:`.bandwidth` — peak bus bandwidth per sweep of a bandwidth table.
"""

from .alltoall import a2a_matrix_estimate
from .bandwidth import bandwidth_summary
from .events import events_of, timed_events, trace_of
from .pairs import pair_class_table, pair_classes, support_violations
from .repeatability import (
    SEQUENCE_COLUMNS,
    call_sequence,
    call_sequences,
    duration_spread,
    repeatability,
    size_repeatability,
)
from .temporal import (
    acf_peak_near,
    autocorrelation,
    comm_time_series,
    mean_autocorrelation,
    periods,
)
from .volumes import bytes_by, first_crossing, tp_share, volume_table

__all__ = [
    "SEQUENCE_COLUMNS",
    "a2a_matrix_estimate",
    "acf_peak_near",
    "autocorrelation",
    "bandwidth_summary",
    "bytes_by",
    "call_sequence",
    "call_sequences",
    "comm_time_series",
    "duration_spread",
    "events_of",
    "first_crossing",
    "mean_autocorrelation",
    "pair_class_table",
    "pair_classes",
    "periods",
    "repeatability",
    "size_repeatability",
    "support_violations",
    "timed_events",
    "tp_share",
    "trace_of",
    "volume_table",
]
