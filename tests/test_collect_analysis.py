"""Temporal-pattern metrics (llmcomm.analysis) on synthetic events with known periods."""

from __future__ import annotations

import numpy as np
import pandas as pd

import llmcomm.analysis.api as A


def _events(iters: int = 6, mbs: int = 4, calls: int = 5, mb_ns: int = 10_000_000, jitter: float = 0.0,
            seed: int = 0) -> pd.DataFrame:
    """One rank: per micro-batch ``calls`` all-reduces in its first half, silence in the second half."""
    rng = np.random.default_rng(seed)
    rows = []
    t = 0
    for it in range(iters):
        for mb in range(mbs):
            for c in range(calls):
                s = t + c * mb_ns // (2 * calls) + int(rng.normal(0, jitter * mb_ns))
                rows.append(dict(rank=0, iteration=it, microbatch=mb, layer=c, phase="forward",
                                 parallelism="tp", op="all_reduce", peer=-1, bytes=1000,
                                 t_start_ns=s, t_end_ns=s + mb_ns // (4 * calls)))
            t += mb_ns
        t += 3 * mb_ns  # optimizer gap between iterations
    return pd.DataFrame(rows)


def test_periods_and_acf_peaks_at_the_microbatch_and_iteration_periods() -> None:
    e = _events()
    p = A.periods(e, rank=0)
    assert abs(p["microbatch"] - 0.010) < 1e-4 and abs(p["iteration"] - 0.070) < 1e-4
    bin_s = 0.001
    ts = A.comm_time_series(e, bin_s, rank=0)
    assert ts["value"].sum() == len(e) * 1000
    ac = A.autocorrelation(ts["value"], 100)
    k, r = A.acf_peak_near(ac, p["microbatch"] / bin_s)
    assert k == 10 and r > 0.3
    k, r = A.acf_peak_near(ac, p["iteration"] / bin_s, rel_window=0.1)
    assert k == 70 and r > 0.5
    busy = A.comm_time_series(e, bin_s, rank=0, value="busy")
    assert busy["value"].between(0, 1).all() and busy["value"].max() > 0


def test_acf_of_noise_has_no_peak_above_the_band() -> None:
    rng = np.random.default_rng(1)
    ac = A.autocorrelation(rng.normal(size=4000), 50)
    assert (ac["acf"].iloc[1:].abs() < 4 / np.sqrt(4000)).all()


def test_repeatability_detects_a_changed_call() -> None:
    e = _events(iters=3)
    r = A.repeatability(e, reference_iteration=1)
    assert r["identical"].all() and (r["position_match"] == 1).all()
    e.loc[(e["iteration"] == 2) & (e["layer"] == 3), "bytes"] = 999
    r = A.repeatability(e, reference_iteration=1).set_index("iteration")
    assert not r.loc[2, "identical"] and r.loc[2, "position_match"] == 1 - 4 / 20
