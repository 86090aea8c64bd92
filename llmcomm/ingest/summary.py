"""Analyses of imported traces and bandwidth tables used by notebook 04 (real traces).

* :func:`call_sequence` numbers each rank's calls within an iteration (``seq``) so the same call can be
  followed across iterations; :func:`size_repeatability` says whether every call keeps its message size
  and :func:`duration_spread` how much its time varies.
* :func:`a2a_matrix_estimate` builds an all-to-all matrix when split sizes were not recorded but the bytes
  each rank sent (row sums) and received (column sums) were: the maximum-entropy matrix with those margins,
  ``M[i, j] = s_i · r_j / Σr`` (exact margins; the cells are an estimate).
* :func:`bandwidth_summary` reduces a bandwidth table to the peak bus bandwidth per sweep.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..trace import Trace


def call_sequence(trace: Trace, iterations_from: int = 1) -> pd.DataFrame:
    """Events of iterations ``>= iterations_from`` with ``seq`` (position of the call within its rank's
    iteration), ``duration_us`` and a readable ``collective`` label (``op/parallelism/size``)."""
    ev = trace.events
    ev = ev[ev["iteration"] >= iterations_from].copy()
    ev = ev.sort_values(["rank", "iteration", "t_start_ns"], kind="stable")
    ev["seq"] = ev.groupby(["rank", "iteration"]).cumcount()
    dur = (ev["t_end_ns"] - ev["t_start_ns"]).astype("Float64")
    ev["duration_us"] = (dur / 1e3).astype(float)
    ev["collective"] = ev["op"] + "/" + ev["parallelism"] + "/" + ev["bytes"].map(_fmt_bytes)
    return ev.reset_index(drop=True)


def size_repeatability(seq: pd.DataFrame) -> pd.DataFrame:
    """Per ``(rank, seq)``: number of iterations, distinct message sizes and ops seen. A fully repeatable
    trace has ``sizes == 1`` and ``ops == 1`` everywhere."""
    return (seq.groupby(["rank", "seq"])
            .agg(iterations=("iteration", "nunique"), sizes=("bytes", "nunique"), ops=("op", "nunique"),
                 collective=("collective", "first"))
            .reset_index())


def duration_spread(seq: pd.DataFrame) -> pd.DataFrame:
    """Per collective label: calls, median/min/max duration (µs) and coefficient of variation."""
    g = seq.groupby("collective")["duration_us"]
    out = g.agg(calls="size", median_us="median", min_us="min", max_us="max", mean_us="mean", std_us="std")
    out["cv"] = out["std_us"] / out["mean_us"]
    return out.reset_index().sort_values("median_us", ascending=False, ignore_index=True)


def a2a_matrix_estimate(trace: Trace, world_size: int | None = None) -> tuple[np.ndarray, pd.DataFrame]:
    """All-to-all matrix (bytes, sender row, receiver column) summed over calls, and per-rank margins
    (``rank, sent, received``). Uses recorded ``split_bytes`` where present, else the maximum-entropy
    estimate from the sent bytes and the ``a2a_recv_bytes`` the Kineto reader kept in ``meta``."""
    n = world_size or trace.world_size
    ev = trace.events[trace.events["op"] == "all_to_all"].sort_values(["rank", "t_start_ns"], kind="stable")
    recv_by_rank = {m["rank"]: m.get("a2a_recv_bytes") for m in trace.meta.get("per_file", [])}
    ev = ev.assign(k=ev.groupby("rank").cumcount())
    mat = np.zeros((n, n))
    sent = np.zeros(n)
    recv = np.zeros(n)
    for _k, calls in ev.groupby("k"):
        s = np.zeros(n)
        r = np.zeros(n)
        direct = np.zeros((n, n))
        have_split = True
        for row in calls.itertuples():
            s[row.rank] += row.bytes
            sb = row.split_bytes
            if isinstance(sb, (list, tuple, np.ndarray)) and len(sb):
                for dst, b in zip(row.group, sb, strict=True):
                    direct[row.rank, dst] += b
            else:
                have_split = False
            rb = recv_by_rank.get(row.rank)
            if rb is not None and row.k < len(rb) and rb[row.k] is not None:
                r[row.rank] += rb[row.k]
        if have_split:
            mat += direct
            r = direct.sum(axis=0)
        elif r.sum() > 0:
            mat += np.outer(s, r) / r.sum()
        else:
            mat += np.outer(s, np.ones(n)) / n  # nothing known of the receivers: an even split
            r = mat.sum(axis=0) - recv
        sent += s
        recv += r
    margins = pd.DataFrame({"rank": np.arange(n), "sent": sent, "received": recv})
    return mat, margins


def bandwidth_summary(bw: pd.DataFrame) -> pd.DataFrame:
    """Peak bus bandwidth (GB/s) and the message size where it occurs, per sweep (source, placement)."""
    idx = bw.groupby(["source", "placement"])["busbw"].idxmax()
    cols = ["source", "device", "op", "ranks", "nodes", "placement", "bytes", "busbw", "algbw"]
    return bw.loc[idx, cols].rename(columns={"bytes": "bytes_at_peak", "busbw": "peak_busbw"}).reset_index(drop=True)


def _fmt_bytes(b: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= div:
            v = b / div
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{b}B"
