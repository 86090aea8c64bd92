"""The 90 % prediction interval from the calibration residuals (llmcomm.overhead.interval)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from llmcomm.overhead import interval, iteration_times
from llmcomm.specs import data_dir, load_cluster, load_model


def test_interval_by_hand():
    d = json.loads((data_dir() / interval.FILE).read_text())
    assert d["r_lo"] < 0 < d["r_hi"] and d["rows"] == 1440 and "single" in d["fitted_on"]
    lo, hi = interval.apply(np.array([2.0]))
    assert lo[0] == pytest.approx(2.0 / (1 + d["r_hi"])) and hi[0] == pytest.approx(2.0 / (1 + d["r_lo"]))


def test_iteration_times_carries_the_interval():
    m = load_model("gpt3-175b")
    r = iteration_times(m, pd.DataFrame({"tp": [8], "pp": [16], "dp": [8], "global_batch": [1536]}),
                        load_cluster("vtrain-a100"))
    assert (r["total_s_lo"] < r["total_s"]).all() and (r["total_s"] < r["total_s_hi"]).all()
    r2 = iteration_times(m, pd.DataFrame({"tp": [8], "pp": [16], "dp": [8], "global_batch": [1536]}),
                         load_cluster("vtrain-a100"), interval=False)
    assert "total_s_lo" not in r2.columns and r2["total_s"].equals(r["total_s"])
