"""A coefficient the fit fixed at its physical bound is reported as a bound, not as an estimate with standard
error 0 and interval [0, 0] (issue 23 item 18: notebook 06 printed θ_gemm = 1.000 ± 0)."""

from __future__ import annotations

import numpy as np

from llmcomm.overhead import Utilization


def test_bound_coefficients_have_no_interval() -> None:
    t = Utilization.default().table().set_index("feature")
    # θ_tp sits on its bound 0 (θ_gemm left its bound 1.0 once the element-wise bytes were counted by kernel)
    assert t.loc["tp", "coef"] == 0.0 and t.loc["tp", "status"] == "at bound"
    assert t.loc[["tp"], ["stderr", "ci_low", "ci_high"]].isna().all(axis=None)
    assert t.loc["gemm", "status"] == "fitted" and t.loc["gemm", "coef"] > 1.0
    fitted = t[t["status"] == "fitted"]
    assert len(fitted) >= 3 and (fitted["stderr"] > 0).all()
    assert np.all(fitted["ci_low"] < fitted["coef"]) and np.all(fitted["coef"] < fitted["ci_high"])
