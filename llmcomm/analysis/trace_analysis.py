"""One entry point over the analyses of one trace, as Holistic Trace Analysis' ``TraceAnalysis``: the trace is
given once, each method is the function of the module named in its doc (which stays its one home)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..trace import Trace
from ..vocab import AlgorithmName
from . import alltoall, moe, pairs, repeatability, temporal, volumes
from .events import TraceOrEvents, trace_of


class TraceAnalysis:
    """The analyses of one :class:`~llmcomm.trace.Trace` (or its events table), grouped by finding:
    volumes (F2), pairs and matrices (F1), temporal pattern and repeatability (F3), all-to-alls (F4)."""

    def __init__(self, data: TraceOrEvents) -> None:
        self.trace: Trace = trace_of(data)

    # -- F2: volumes --------------------------------------------------------------------------------------
    def bytes_by(self, by: Iterable[str] = ("parallelism",), algorithm: AlgorithmName | None = None) -> pd.DataFrame:
        """:func:`llmcomm.analysis.volumes.bytes_by`: bytes per group of ``by`` with each group's share."""
        return volumes.bytes_by(self.trace, by, algorithm)

    def tp_share(self, algorithm: AlgorithmName | None = None) -> float:
        """:func:`llmcomm.analysis.volumes.tp_share`: the TP (and SP) share of the bytes."""
        return volumes.tp_share(self.trace, algorithm)

    # -- F1: pairs and matrices ---------------------------------------------------------------------------
    def pair_classes(self, gpus_per_node: int = 8, algorithm: AlgorithmName = "ring") -> pd.DataFrame:
        """:func:`llmcomm.analysis.pairs.pair_classes`: bytes inside a node and across nodes."""
        return pairs.pair_classes(self.trace, gpus_per_node, algorithm)

    def support_violations(self, algorithm: AlgorithmName = "direct") -> pd.DataFrame:
        """:func:`llmcomm.analysis.pairs.support_violations`: matrix entries outside every group."""
        return pairs.support_violations(self.trace, algorithm)

    def diagonal_offsets(self, algorithm: AlgorithmName = "direct", **filters: Any) -> list[int]:
        """:func:`llmcomm.analysis.pairs.diagonal_offsets`: the rank offsets the matrix's lines lie on."""
        return pairs.diagonal_offsets(self.trace, algorithm, **filters)

    def matrix_asymmetry(self, algorithm: AlgorithmName = "direct", **filters: Any) -> float:
        """:func:`llmcomm.analysis.pairs.matrix_asymmetry`."""
        return pairs.matrix_asymmetry(self.trace, algorithm, **filters)

    # -- F3: temporal pattern and repeatability -----------------------------------------------------------
    def time_series(self, bin_s: float, **kwargs: Any) -> pd.DataFrame:
        """:func:`llmcomm.analysis.temporal.comm_time_series` (``rank=``, ``parallelism=``, ``value=``...)."""
        return temporal.comm_time_series(self.trace, bin_s, **kwargs)

    def silent_share(self, bin_s: float, **kwargs: Any) -> float:
        """:func:`llmcomm.analysis.temporal.silent_share`."""
        return temporal.silent_share(self.trace, bin_s, **kwargs)

    def periods(self, rank: int, iterations: Sequence[int] | None = None) -> dict[str, float]:
        """:func:`llmcomm.analysis.temporal.periods`: micro-batch and iteration periods of ``rank``."""
        return temporal.periods(self.trace, rank, iterations)

    def mean_autocorrelation(self, bin_s: float, nlags: int, **kwargs: Any) -> pd.DataFrame:
        """:func:`llmcomm.analysis.temporal.mean_autocorrelation`."""
        return temporal.mean_autocorrelation(self.trace, bin_s, nlags, **kwargs)

    def repeatability(self, reference_iteration: int = 1,
                      columns: Sequence[str] = repeatability.SEQUENCE_COLUMNS) -> pd.DataFrame:
        """:func:`llmcomm.analysis.repeatability.repeatability`: per (rank, iteration), the same calls?"""
        return repeatability.repeatability(self.trace, reference_iteration, columns)

    def call_sequence(self, iterations_from: int | None = 1) -> pd.DataFrame:
        """:func:`llmcomm.analysis.repeatability.call_sequence`."""
        return repeatability.call_sequence(self.trace, iterations_from)

    def duration_spread(self, iterations_from: int | None = 1) -> pd.DataFrame:
        """:func:`llmcomm.analysis.repeatability.duration_spread`."""
        return repeatability.duration_spread(self.trace, iterations_from)

    # -- F4: all-to-alls ----------------------------------------------------------------------------------
    def a2a_matrix_estimate(self, world_size: int | None = None) -> tuple[np.ndarray, pd.DataFrame]:
        """:func:`llmcomm.analysis.alltoall.a2a_matrix_estimate`."""
        return alltoall.a2a_matrix_estimate(self.trace, world_size)

    def routing_matrices(self, *, per_microbatch: bool = False) -> pd.DataFrame:
        """:func:`llmcomm.analysis.moe.routing_matrices`."""
        return moe.routing_matrices(self.trace, per_microbatch=per_microbatch)

    def iteration_matrices(self, algorithm: AlgorithmName = "direct", **filters: Any) -> pd.DataFrame:
        """:func:`llmcomm.analysis.moe.iteration_matrices`."""
        return moe.iteration_matrices(self.trace, algorithm, **filters)

    def __repr__(self) -> str:
        return f"TraceAnalysis({self.trace!r})"
