"""Summaries of a bandwidth table (:func:`llmcomm.ingest.ingest_bandwidth`: one row per message size and
placement of a sweep; ``busbw`` in GB/s).

* :func:`bandwidth_summary`: peak bus bandwidth per sweep; :func:`node_peaks`: those peaks split into sweeps
  inside one node and across nodes.
* :func:`small_message_fraction`: how close small messages come to the peak, at the best group size.
* :func:`saturation_bytes`: the smallest message that reaches a fraction of the peak, per group size.
"""

from __future__ import annotations

import pandas as pd

SMALL_BYTES = 64 * 1024

SWEEP_KEYS = ["source", "placement"]
PEAK_COLUMNS = ["source", "device", "op", "ranks", "nodes", "placement", "bytes", "busbw", "algbw"]


def bandwidth_summary(bandwidth: pd.DataFrame) -> pd.DataFrame:
    """Peak bus bandwidth ``peak_busbw = max_size busbw`` (GB/s) and the message size where it occurs
    (``bytes_at_peak``), per sweep (source file, placement)."""
    peak_rows = bandwidth.groupby(SWEEP_KEYS)["busbw"].idxmax()
    return (bandwidth.loc[peak_rows, PEAK_COLUMNS]
            .rename(columns={"bytes": "bytes_at_peak", "busbw": "peak_busbw"})
            .reset_index(drop=True))


def node_peaks(peaks: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """``peak_busbw`` of the multi-GPU sweeps of a :func:`bandwidth_summary` indexed by ``source``: those inside
    one node (``nodes == 1``, ``ranks > 1``) and those across nodes (``nodes > 1``)."""
    by_source = peaks.set_index("source")
    intra = by_source[(by_source["nodes"] == 1) & (by_source["ranks"] > 1)]["peak_busbw"]
    inter = by_source[by_source["nodes"] > 1]["peak_busbw"]
    return intra, inter


def small_message_fraction(bandwidth: pd.DataFrame, max_bytes: int = SMALL_BYTES,
                           placement: str = "out-of-place", by: str = "ranks") -> float:
    """How much of the peak small messages reach, at the group size where they do best:
    ``max_g (max busbw of the rows of g with bytes <= max_bytes and this placement) / (max busbw of g)``, the
    peak of ``g`` over all its rows (either placement)."""
    small = bandwidth[(bandwidth["bytes"] <= max_bytes) & (bandwidth["placement"] == placement)]
    return float((small.groupby(by)["busbw"].max() / bandwidth.groupby(by)["busbw"].max()).max())


def saturation_bytes(bandwidth: pd.DataFrame, fraction: float = 0.9, by: str = "ranks") -> pd.Series:
    """Per ``by`` (group size), the smallest message size whose ``busbw`` reaches ``fraction`` of that group's
    largest: ``min {bytes : busbw >= fraction · max busbw}``."""
    relative = bandwidth["busbw"] / bandwidth.groupby(by)["busbw"].transform("max")
    return bandwidth[relative >= fraction].groupby(by)["bytes"].min()
