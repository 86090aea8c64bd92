"""Summaries of a bandwidth table (:func:`llmcomm.ingest.ingest_bandwidth`: one row per message size and
placement of a sweep)."""

from __future__ import annotations

import pandas as pd

SWEEP_KEYS = ["source", "placement"]
PEAK_COLUMNS = ["source", "device", "op", "ranks", "nodes", "placement", "bytes", "busbw", "algbw"]


def bandwidth_summary(bandwidth: pd.DataFrame) -> pd.DataFrame:
    """Peak bus bandwidth ``peak_busbw = max_size busbw`` (GB/s) and the message size where it occurs
    (``bytes_at_peak``), per sweep (source file, placement)."""
    peak_rows = bandwidth.groupby(SWEEP_KEYS)["busbw"].idxmax()
    return (bandwidth.loc[peak_rows, PEAK_COLUMNS]
            .rename(columns={"bytes": "bytes_at_peak", "busbw": "peak_busbw"})
            .reset_index(drop=True))
