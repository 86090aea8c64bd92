"""All-to-all matrices from what a trace recorded.

Where ranks recorded their per-peer ``split_bytes``, the matrix of a call is exact: ``M[i, j]`` = what rank
``i`` sent to rank ``j``. Older traces record only what each rank sent (row sums ``s_i``) and, in the Kineto
reader's ``meta['a2a_recv_bytes']``, what it received (column sums ``r_j``); then the call's matrix is the
maximum-entropy matrix with those margins, ``M[i, j] = s_i · r_j / Σr`` (exact margins, estimated cells).
With neither, each rank's bytes are spread evenly, ``M[i, j] = s_i / n``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..trace import Trace
from .events import TraceOrEvents, trace_of


def _received_bytes_by_rank(trace: Trace) -> dict[int, list[int | None] | None]:
    return {m["rank"]: m.get("a2a_recv_bytes") for m in trace.meta.get("per_file", [])}


def a2a_matrix_estimate(data: TraceOrEvents, world_size: int | None = None) -> tuple[np.ndarray, pd.DataFrame]:
    """All-to-all matrix (bytes, sender row, receiver column) summed over calls, and per-rank margins
    (``rank, sent, received``). The ``k``-th all-to-all of every rank is one collective call; each call's
    matrix is exact or estimated as the module docstring says (received bytes come from a Trace's
    metadata; an events table alone has none)."""
    trace = trace_of(data)
    n = world_size or trace.world_size
    calls = trace.events[trace.events["op"] == "all_to_all"].sort_values(["rank", "t_start_ns"], kind="stable")
    received_by_rank = _received_bytes_by_rank(trace)
    calls = calls.assign(call_index=calls.groupby("rank").cumcount())
    matrix = np.zeros((n, n))
    sent_total = np.zeros(n)
    received_total = np.zeros(n)
    for _, call in calls.groupby("call_index"):
        sent = np.zeros(n)
        received = np.zeros(n)
        recorded = np.zeros((n, n))
        every_split_recorded = True
        for row in call.itertuples():
            sent[row.rank] += row.bytes
            split = row.split_bytes
            if isinstance(split, (list, tuple, np.ndarray)) and len(split):
                for dst, nbytes in zip(row.group, split, strict=True):
                    recorded[row.rank, dst] += nbytes
            else:
                every_split_recorded = False
            received_per_call = received_by_rank.get(row.rank)
            if (received_per_call is not None and row.call_index < len(received_per_call)
                    and received_per_call[row.call_index] is not None):
                received[row.rank] += received_per_call[row.call_index]
        if every_split_recorded:
            matrix += recorded
            received = recorded.sum(axis=0)
        elif received.sum() > 0:
            matrix += np.outer(sent, received) / received.sum()
        else:
            matrix += np.outer(sent, np.ones(n)) / n
            received = matrix.sum(axis=0) - received_total
        sent_total += sent
        received_total += received
    margins = pd.DataFrame({"rank": np.arange(n), "sent": sent_total, "received": received_total})
    return matrix, margins
