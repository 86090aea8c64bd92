"""Analyses over traces: every function takes a :class:`~llmcomm.trace.Trace` (or its events) first and
returns a tidy DataFrame or a number (Holistic Trace Analysis style).

* :mod:`.temporal` — time series, autocorrelation, periods, call-sequence repeatability (finding F3).
* :mod:`.moe` — MoE predictability: all-to-all matrices, uniformity, identities, predictors (finding F4).
"""

from .moe import (
    a2a_cells,
    a2a_identities,
    consecutive_distance,
    ep_matrices,
    exact_bounded_split,
    expert_load,
    identity_summary,
    iteration_matrices,
    load_autocorrelation,
    load_uniformity,
    matrix_stack,
    matrix_uniformity,
    moe_repeatability,
    predict_next,
    predictor_errors,
    routing_matrices,
    routing_vs_events,
    sequence_variation,
    uniformity_stats,
)
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
    "a2a_cells",
    "a2a_identities",
    "acf_peak_near",
    "autocorrelation",
    "call_sequences",
    "comm_time_series",
    "consecutive_distance",
    "ep_matrices",
    "exact_bounded_split",
    "expert_load",
    "identity_summary",
    "iteration_matrices",
    "load_autocorrelation",
    "load_uniformity",
    "matrix_stack",
    "matrix_uniformity",
    "mean_autocorrelation",
    "moe_repeatability",
    "periods",
    "predict_next",
    "predictor_errors",
    "routing_matrices",
    "repeatability",
    "routing_vs_events",
    "sequence_variation",
    "uniformity_stats",
]
