"""Analyses over traces: every function takes a :class:`~llmcomm.trace.Trace` (or its events) first and
returns a tidy DataFrame or a number (Holistic Trace Analysis style).

* :mod:`.volumes` — bytes per parallelism / phase, shares, the TP share (finding F2).
* :mod:`.pairs` — bytes per pair class (intra- / inter-node), bytes outside every group (finding F1).
* :mod:`.temporal` — time series, autocorrelation, periods (finding F3).
* :mod:`.repeatability` — calls numbered in issue order and followed across iterations: identical
  sequences, message sizes, duration spread (finding F3).
* :mod:`.alltoall` — all-to-all matrices, exact or estimated from recorded margins (finding F4).
* :mod:`.moe` — MoE predictability: all-to-all matrices, uniformity, identities, predictors (finding F4).
* :mod:`.bandwidth` — peak bus bandwidth per sweep of a bandwidth table.
"""

from .alltoall import a2a_matrix_estimate
from .bandwidth import bandwidth_summary
from .events import events_of, timed_events, trace_of
from .moe import (
    a2a_cells,
    a2a_identities,
    call_variation,
    call_variation_table,
    consecutive_distance,
    dispatch_exact_bounded,
    envelope_summary,
    ep_matrices,
    exact_bounded_split,
    expert_load,
    identity_panel_cells,
    identity_summary,
    iteration_matrices,
    load_autocorrelation,
    load_uniformity,
    matrix_stack,
    matrix_uniformity,
    moe_repeatability,
    phase_means,
    phase_pivot,
    pooled_identity_summary,
    position_duration_spread,
    predict_next,
    predictor_errors,
    reference_iteration,
    routed_uniform_split,
    routing_matrices,
    routing_vs_events,
    sequence_variation,
    training_phase,
    uniformity_over_training,
    uniformity_stats,
)
from .pairs import pair_class_table, pair_classes, support_violations
from .repeatability import (
    SEQUENCE_COLUMNS,
    call_sequence,
    call_sequences,
    duration_spread,
    in_issue_order,
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
    "a2a_cells",
    "a2a_identities",
    "a2a_matrix_estimate",
    "acf_peak_near",
    "autocorrelation",
    "bandwidth_summary",
    "bytes_by",
    "call_sequence",
    "call_sequences",
    "call_variation",
    "call_variation_table",
    "comm_time_series",
    "consecutive_distance",
    "dispatch_exact_bounded",
    "duration_spread",
    "envelope_summary",
    "ep_matrices",
    "events_of",
    "exact_bounded_split",
    "expert_load",
    "first_crossing",
    "identity_panel_cells",
    "identity_summary",
    "in_issue_order",
    "iteration_matrices",
    "load_autocorrelation",
    "load_uniformity",
    "matrix_stack",
    "matrix_uniformity",
    "mean_autocorrelation",
    "moe_repeatability",
    "pair_class_table",
    "pair_classes",
    "periods",
    "phase_means",
    "phase_pivot",
    "pooled_identity_summary",
    "position_duration_spread",
    "predict_next",
    "predictor_errors",
    "reference_iteration",
    "repeatability",
    "routed_uniform_split",
    "routing_matrices",
    "routing_vs_events",
    "sequence_variation",
    "size_repeatability",
    "support_violations",
    "timed_events",
    "tp_share",
    "trace_of",
    "training_phase",
    "uniformity_over_training",
    "uniformity_stats",
    "volume_table",
]
