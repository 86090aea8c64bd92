"""The temporal pattern of communication: time series, autocorrelation and periods.

Every function takes a :class:`~llmcomm.trace.Trace` or its events DataFrame and returns numbers or tidy
DataFrames (Holistic Trace Analysis style); whether iterations repeat call for call is
:mod:`llmcomm.analysis.repeatability`.

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
* :func:`silent_share`: the on-off measure, the share of a rank's bins with no call in flight.
* :func:`with_pipeline_stage`: each call's pipeline stage (the rows of a timeline, grouped by stage).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..errors import AnalysisError
from .events import TraceOrEvents, timed_events


def comm_time_series(data: TraceOrEvents, bin_s: float, *, rank: int | None = None,
                     parallelism: str | Sequence[str] | None = None, value: str = "bytes",
                     t0_ns: int | None = None, t1_ns: int | None = None) -> pd.DataFrame:
    """Binned communication of ``rank`` (or all ranks): columns ``t_s`` (bin start, s from ``t0``) and
    ``value`` (bytes started in the bin, or the busy fraction ``∈ [0, 1]`` for ``value="busy"``)."""
    if value not in ("bytes", "busy"):
        raise AnalysisError(f"value={value!r} is not 'bytes' or 'busy'")
    events = timed_events(data)
    if rank is not None:
        events = events[events["rank"] == rank]
    if parallelism is not None:
        wanted = [parallelism] if isinstance(parallelism, str) else list(parallelism)
        events = events[events["parallelism"].isin(wanted)]
    start = events["t_start_ns"].to_numpy(np.int64)
    end = events["t_end_ns"].fillna(events["t_start_ns"]).to_numpy(np.int64)
    t0 = int(start.min()) if t0_ns is None else int(t0_ns)
    t1 = int(end.max()) if t1_ns is None else int(t1_ns)
    bin_ns = int(bin_s * 1e9)
    n_bins = max(1, int(np.ceil((t1 - t0) / bin_ns)))
    in_window = (start >= t0) & (start < t1)
    series = np.zeros(n_bins)
    if value == "bytes":
        bin_of_call = ((start[in_window] - t0) // bin_ns).astype(np.int64)
        np.add.at(series, np.minimum(bin_of_call, n_bins - 1), events["bytes"].to_numpy(np.float64)[in_window])
    else:
        edges = t0 + bin_ns * np.arange(n_bins + 1, dtype=np.int64)
        call_ends = np.maximum(end[in_window], start[in_window] + 1)
        for call_start, call_end in zip(start[in_window], call_ends, strict=True):
            first_bin, last_bin = (call_start - t0) // bin_ns, min(n_bins - 1, (call_end - t0) // bin_ns)
            for i in range(int(first_bin), int(last_bin) + 1):
                series[i] += (min(call_end, edges[i + 1]) - max(call_start, edges[i])) / bin_ns
        series = np.minimum(series, 1.0)
    return pd.DataFrame({"t_s": np.arange(n_bins) * bin_s, "value": series})


def silent_share(data: TraceOrEvents, bin_s: float, *, rank: int | None = None,
                 parallelism: str | Sequence[str] | None = None) -> float:
    """Share of the bins of :func:`comm_time_series` (``value="busy"``, bins of ``bin_s`` seconds) in which
    no call of ``rank`` (and ``parallelism``) is in flight: ``#{i : busy_i = 0} / n``. Between 0 and 1 when
    communication is on-off."""
    series = comm_time_series(data, bin_s, rank=rank, parallelism=parallelism, value="busy")
    return float((series["value"] == 0).mean())


def with_pipeline_stage(events: pd.DataFrame, parallel: Any) -> pd.DataFrame:
    """``events`` with a ``stage`` column: the pipeline stage (``pp`` coordinate in the
    :class:`~llmcomm.layout.Layout` of ``parallel``, a :class:`~llmcomm.specs.ParallelConfig` or its dict as in
    ``trace.meta["parallel"]``) of each call's ``rank``."""
    from ..layout import Layout
    from ..specs import ParallelConfig

    config = ParallelConfig.from_dict(dict(parallel)) if isinstance(parallel, Mapping) else parallel
    stage = Layout(config).coords.set_index("rank")["pp"]
    return events.assign(stage=events["rank"].map(stage))


def autocorrelation(x: np.ndarray | pd.Series, nlags: int) -> pd.DataFrame:
    """Sample autocorrelation ``r(k)`` for ``k = 0..nlags`` (statsmodels ``acf``, FFT)."""
    from statsmodels.tsa.stattools import acf

    values = np.asarray(x, dtype=np.float64)
    nlags = min(nlags, len(values) - 1)
    return pd.DataFrame({"lag": np.arange(nlags + 1), "acf": acf(values, nlags=nlags, fft=True)})


def acf_peak_near(acf: pd.DataFrame, lag: float, rel_window: float = 0.25) -> tuple[int, float]:
    """The highest local maximum of ``acf`` with ``|k - lag| <= rel_window·lag``: ``(k, r(k))``
    (``(-1, nan)`` when the window holds none)."""
    r = acf["acf"].to_numpy()
    lags = acf["lag"].to_numpy()
    is_max = np.zeros(len(r), dtype=bool)
    is_max[1:-1] = (r[1:-1] >= r[:-2]) & (r[1:-1] >= r[2:])
    candidates = is_max & (np.abs(lags - lag) <= rel_window * lag)
    if not candidates.any():
        return -1, float("nan")
    best = np.nonzero(candidates)[0][np.argmax(r[candidates])]
    return int(lags[best]), float(r[best])


def periods(data: TraceOrEvents, rank: int, iterations: Sequence[int] | None = None) -> dict[str, float]:
    """Measured periods of ``rank`` in seconds: ``microbatch`` (median gap between the first forward calls
    of consecutive micro-batches inside an iteration) and ``iteration`` (median gap between the first calls
    of consecutive iterations); ``iterations`` restricts both (e.g. skip the set-up iteration)."""
    events = timed_events(data)
    events = events[(events["rank"] == rank) & (events["phase"] != "setup")]
    if iterations is not None:
        events = events[events["iteration"].isin(list(iterations))]
    iteration_starts = events.groupby("iteration")["t_start_ns"].min().sort_index().to_numpy(np.int64)
    forward = events[(events["phase"] == "forward") & (events["microbatch"] >= 0)]
    microbatch_starts = forward.groupby(["iteration", "microbatch"])["t_start_ns"].min().sort_index()
    gaps = [np.diff(starts.to_numpy(np.int64)) for _, starts in microbatch_starts.groupby(level="iteration")]
    microbatch_gaps = np.concatenate(gaps) if gaps else np.zeros(0)
    return {"microbatch": float(np.median(microbatch_gaps)) / 1e9 if len(microbatch_gaps) else float("nan"),
            "iteration": (float(np.median(np.diff(iteration_starts))) / 1e9 if len(iteration_starts) > 1
                          else float("nan"))}


def mean_autocorrelation(data: TraceOrEvents, bin_s: float, nlags: int, ranks: Sequence[int] | None = None,
                         parallelism: str | Sequence[str] | None = None, value: str = "busy") -> pd.DataFrame:
    """Autocorrelation averaged over ranks: ``r̄(k) = (1/R) Σ_r r_r(k)`` of each rank's
    :func:`comm_time_series` on one common clock. Columns ``lag``, ``acf``, and ``n`` (bins per rank);
    the white-noise band of the mean is ``±1.96/√(n·R)``."""
    events = timed_events(data)
    ranks = sorted(events["rank"].unique()) if ranks is None else list(ranks)
    t0 = int(events["t_start_ns"].min())
    t1 = int(events["t_end_ns"].fillna(events["t_start_ns"]).max())
    per_rank = []
    n_bins = 0
    for rank in ranks:
        series = comm_time_series(events, bin_s, rank=rank, parallelism=parallelism, value=value,
                                  t0_ns=t0, t1_ns=t1)
        n_bins = len(series)
        per_rank.append(autocorrelation(series["value"], nlags)["acf"].to_numpy())
    n_lags = min(len(acf) for acf in per_rank)
    return pd.DataFrame({"lag": np.arange(n_lags), "acf": np.mean([acf[:n_lags] for acf in per_rank], axis=0),
                         "n": n_bins * len(ranks)})
