"""Predictability metrics over events tables: time series, periodicity, repeatability.

Every function takes an events DataFrame (:attr:`llmcomm.trace.Trace.events`) and returns numbers or tidy
DataFrames (Holistic Trace Analysis style).

Temporal pattern (finding F3)
-----------------------------
* :func:`comm_time_series` bins a rank's calls on the wall clock: ``x[i]`` = bytes of the calls whose start
  falls in ``[t0 + i·Δ, t0 + (i+1)·Δ)``, or with ``value="busy"`` the fraction of the bin covered by calls in
  flight (``[t_start, t_end]``).
* :func:`autocorrelation`: ``r(k) = Σ (x_i - x̄)(x_{i+k} - x̄) / Σ (x_i - x̄)²`` (statsmodels ``acf``);
  :func:`mean_autocorrelation` averages it over ranks.
* :func:`periods`: the measured micro-batch and iteration periods of a rank (median time between the first
  calls of consecutive micro-batches / iterations), the lags where the autocorrelation should peak.
* :func:`acf_peak_near`: the highest local maximum of ``r`` within a relative window around a lag.
* :func:`call_sequences` / :func:`repeatability`: the ordered calls of each (rank, iteration) as tuples of
  their non-timing columns, and the share of iterations whose sequence equals the reference iteration's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

SEQUENCE_COLUMNS = ("microbatch", "layer", "phase", "parallelism", "op", "peer", "bytes")


def _timed(events: pd.DataFrame) -> pd.DataFrame:
    e = events[events["t_start_ns"].notna()]
    if e.empty:
        raise ValueError("no timed events (predicted traces carry no t_start_ns)")
    return e


def comm_time_series(events: pd.DataFrame, bin_s: float, *, rank: int | None = None,
                     parallelism: str | Sequence[str] | None = None, value: str = "bytes",
                     t0_ns: int | None = None, t1_ns: int | None = None) -> pd.DataFrame:
    """Binned communication of ``rank`` (or all ranks): columns ``t_s`` (bin start, s from ``t0``) and
    ``value`` (bytes started in the bin, or the busy fraction ``∈ [0, 1]`` for ``value="busy"``)."""
    e = _timed(events)
    if rank is not None:
        e = e[e["rank"] == rank]
    if parallelism is not None:
        e = e[e["parallelism"].isin([parallelism] if isinstance(parallelism, str) else list(parallelism))]
    start = e["t_start_ns"].to_numpy(np.int64)
    end = e["t_end_ns"].fillna(e["t_start_ns"]).to_numpy(np.int64)
    t0 = int(start.min()) if t0_ns is None else int(t0_ns)
    t1 = int(end.max()) if t1_ns is None else int(t1_ns)
    dt = int(bin_s * 1e9)
    n = max(1, int(np.ceil((t1 - t0) / dt)))
    keep = (start >= t0) & (start < t1)
    x = np.zeros(n)
    if value == "bytes":
        idx = ((start[keep] - t0) // dt).astype(np.int64)
        np.add.at(x, np.minimum(idx, n - 1), e["bytes"].to_numpy(np.float64)[keep])
    elif value == "busy":
        edges = t0 + dt * np.arange(n + 1, dtype=np.int64)
        for s, f in zip(start[keep], np.maximum(end[keep], start[keep] + 1), strict=True):
            i0, i1 = (s - t0) // dt, min(n - 1, (f - t0) // dt)
            for i in range(int(i0), int(i1) + 1):
                x[i] += (min(f, edges[i + 1]) - max(s, edges[i])) / dt
        x = np.minimum(x, 1.0)
    else:
        raise ValueError(f"value={value!r} is not 'bytes' or 'busy'")
    return pd.DataFrame({"t_s": np.arange(n) * bin_s, "value": x})


def autocorrelation(x: np.ndarray | pd.Series, nlags: int) -> pd.DataFrame:
    """Sample autocorrelation ``r(k)`` for ``k = 0..nlags`` (statsmodels ``acf``, FFT)."""
    from statsmodels.tsa.stattools import acf

    v = np.asarray(x, dtype=np.float64)
    nlags = min(nlags, len(v) - 1)
    return pd.DataFrame({"lag": np.arange(nlags + 1), "acf": acf(v, nlags=nlags, fft=True)})


def acf_peak_near(acf: pd.DataFrame, lag: float, rel_window: float = 0.25) -> tuple[int, float]:
    """The highest local maximum of ``acf`` with ``|k - lag| <= rel_window·lag``: ``(k, r(k))``
    (``(-1, nan)`` when the window holds none)."""
    r = acf["acf"].to_numpy()
    k = acf["lag"].to_numpy()
    is_max = np.zeros(len(r), dtype=bool)
    is_max[1:-1] = (r[1:-1] >= r[:-2]) & (r[1:-1] >= r[2:])
    win = is_max & (np.abs(k - lag) <= rel_window * lag)
    if not win.any():
        return -1, float("nan")
    i = np.nonzero(win)[0][np.argmax(r[win])]
    return int(k[i]), float(r[i])


def periods(events: pd.DataFrame, rank: int, iterations: Sequence[int] | None = None) -> dict[str, float]:
    """Measured periods of ``rank`` in seconds: ``microbatch`` (median gap between the first forward calls
    of consecutive micro-batches inside an iteration) and ``iteration`` (median gap between the first calls
    of consecutive iterations); ``iterations`` restricts both (e.g. skip the set-up iteration)."""
    e = _timed(events)
    e = e[(e["rank"] == rank) & (e["phase"] != "setup")]
    if iterations is not None:
        e = e[e["iteration"].isin(list(iterations))]
    first_it = e.groupby("iteration")["t_start_ns"].min().sort_index().to_numpy(np.int64)
    fwd = e[(e["phase"] == "forward") & (e["microbatch"] >= 0)]
    first_mb = fwd.groupby(["iteration", "microbatch"])["t_start_ns"].min().sort_index()
    gaps = [np.diff(g.to_numpy(np.int64)) for _, g in first_mb.groupby(level="iteration")]
    mb = np.concatenate(gaps) if gaps else np.zeros(0)
    return {"microbatch": float(np.median(mb)) / 1e9 if len(mb) else float("nan"),
            "iteration": float(np.median(np.diff(first_it))) / 1e9 if len(first_it) > 1 else float("nan")}


def call_sequences(events: pd.DataFrame, columns: Sequence[str] = SEQUENCE_COLUMNS) -> pd.Series:
    """For each ``(rank, iteration)``, the tuple of its calls in issue order (by ``t_start_ns`` when timed,
    else table order), each call a tuple of ``columns``."""
    e = events.copy()
    e["_order"] = e["t_start_ns"].astype("float64").fillna(pd.Series(np.arange(len(e)), index=e.index))
    e = e.sort_values(["rank", "iteration", "_order"], kind="stable")
    cols = list(columns)
    return e.groupby(["rank", "iteration"], sort=True)[cols].apply(
        lambda g: tuple(map(tuple, g.astype(str).to_numpy())))


def repeatability(events: pd.DataFrame, reference_iteration: int = 1,
                  columns: Sequence[str] = SEQUENCE_COLUMNS) -> pd.DataFrame:
    """Per ``(rank, iteration)``: number of calls and whether the call sequence equals that rank's
    ``reference_iteration`` sequence (``identical``), plus ``position_match``: the share of positions whose
    call is the same (1.0 when identical)."""
    seqs = call_sequences(events, columns)
    rows = []
    for (rank, it), seq in seqs.items():
        ref = seqs.get((rank, reference_iteration))
        if ref is None:
            continue
        n = max(len(seq), len(ref))
        same = sum(a == b for a, b in zip(seq, ref, strict=False))
        rows.append({"rank": rank, "iteration": it, "calls": len(seq), "identical": seq == ref,
                     "position_match": same / n if n else 1.0})
    return pd.DataFrame(rows)


def mean_autocorrelation(events: pd.DataFrame, bin_s: float, nlags: int, ranks: Sequence[int] | None = None,
                         parallelism: str | Sequence[str] | None = None, value: str = "busy") -> pd.DataFrame:
    """Autocorrelation averaged over ranks: ``r̄(k) = (1/R) Σ_r r_r(k)`` of each rank's
    :func:`comm_time_series` on one common clock. Columns ``lag``, ``acf``, and ``n`` (bins per rank);
    the white-noise band of the mean is ``±1.96/√(n·R)``."""
    e = _timed(events)
    ranks = sorted(e["rank"].unique()) if ranks is None else list(ranks)
    t0 = int(e["t_start_ns"].min())
    t1 = int(e["t_end_ns"].fillna(e["t_start_ns"]).max())
    acfs = []
    n = 0
    for r in ranks:
        s = comm_time_series(e, bin_s, rank=r, parallelism=parallelism, value=value, t0_ns=t0, t1_ns=t1)
        n = len(s)
        acfs.append(autocorrelation(s["value"], nlags)["acf"].to_numpy())
    k = min(len(a) for a in acfs)
    return pd.DataFrame({"lag": np.arange(k), "acf": np.mean([a[:k] for a in acfs], axis=0), "n": n * len(ranks)})
