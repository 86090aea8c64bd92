"""What the vTrain multi-node rows' memory says about their hardware and optimizer
(llmcomm.overhead.vtrain_memory): hand-worked memory of one row, the 80 GB part's bandwidth, the last-stage
recompute reading, the interval coverage helper, and the what-if refits."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from llmcomm.errors import ConfigError, UsageError
from llmcomm.overhead import Utilization, validation
from llmcomm.overhead import calibrate as C
from llmcomm.overhead import iteration as it
from llmcomm.overhead import utilization as U
from llmcomm.overhead import vtrain_memory as V
from llmcomm.specs import load_cluster


def test_cluster_80gb_is_the_80gb_part():
    c = V.cluster_80gb(load_cluster(C.CLUSTER))
    assert U.hbm_bandwidth(c) == 2.039e12  # NVIDIA A100 datasheet, 80 GB SXM (40 GB: 1,555 GB/s)
    assert c.gpu_memory_bytes == 80e9
    assert U.hbm_bandwidth(load_cluster(C.CLUSTER)) == 1.555e12
    with pytest.raises(ConfigError, match="gpu="):
        V.cluster_80gb(load_cluster("h100-80g-ndr400"))


@pytest.fixture(scope="module")
def mem():
    return V.memory_readings("multi")


def test_memory_of_the_3_6b_tp1_row_hand_worked(mem):
    """3.6B (h 3,072, 30 layers, sequence 2,048), tp 1, pp 1, dp 64: P = 30·(12h² + 13h) + 50,304·h (50,257 padded
    to a multiple of 128) + 2,048·h (learned positions) + 2h (final LayerNorm) = 3,559,415,808. Unsharded:
    2 + 2 + 12 = 16 bytes per parameter, 56.95 GB before any activation (over 40 GB); ZeRO-1 over 64 ranks:
    2 + 2 + 12/64 bytes, 14.91 GB."""
    h = 3072
    p = 30 * (12 * h * h + 13 * h) + 50304 * h + 2048 * h + 2 * h
    assert p == 3_559_415_808
    rows = mem[(mem["group"] == "3.6B") & (mem["tp"] == 1) & (mem["pp"] == 1)]
    assert len(rows) == 3
    np.testing.assert_allclose(rows["states_gb"], 16 * p / 1e9, rtol=1e-12)
    np.testing.assert_allclose(rows["zero1_gb"] - rows["activations_gb"], (4 + 12 / 64) * p / 1e9, rtol=1e-12)
    assert (rows["total_gb"] > 40).all() and (rows["zero1_gb"] < 40).all()


def test_fits_counts_as_stated(mem):
    f = V.fits(mem)
    assert f == {**f, "rows": 109, "over_40gb": 43, "over_80gb": 0, "zero1_over_40gb": 5}
    assert 67.0 < f["max_gb"] < 68.0  # 175B, tp 4, pp 16, dp 8, micro-batch 4
    small = pd.DataFrame({"total_gb": [39.0, 41.0, 81.0], "zero1_gb": [20.0, 39.0, 41.0]})
    assert V.fits(small) == {"rows": 3, "over_40gb": 2, "over_80gb": 1, "max_gb": 81.0, "zero1_over_40gb": 1,
                             "zero1_max_gb": 41.0}


def test_zero1_candidates_shard_only_the_optimizer():
    rows = V.measured.read("multi").head(3)
    plain, z = V.candidates(rows), V.candidates(rows, zero1=True)
    assert not plain["distributed_optimizer"].any() and z["distributed_optimizer"].all()
    pd.testing.assert_frame_equal(plain.drop(columns="distributed_optimizer"), z.drop(columns="distributed_optimizer"))


@pytest.fixture(scope="module")
def shipped():
    return V.reading("shipped")


def test_last_stage_recompute_removed_only_there(shipped):
    """pp = 1: the one stage recomputes nothing; pp ≥ 2: the last stage class recomputes nothing, the first
    keeps its pass; forward and backward untouched."""
    _, multi = shipped
    util = Utilization.default()
    before = [it.combine(st, util) for _, st in multi.stages]
    after = [it.combine(st, util) for _, st in V.without_last_stage_recompute(multi).stages]
    for (_, st), b, a in zip(multi.stages, before, after, strict=True):
        one = st.pp == 1
        assert (b["recompute_s"][one] > 0).all() and (a["recompute_s"][one] == 0).all()
        np.testing.assert_array_equal(a["forward_s"][one], b["forward_s"][one])
        np.testing.assert_array_equal(a["backward_s"][one], b["backward_s"][one])
        assert (sum(a[t] for t in it.TERMS) <= sum(b[t] for t in it.TERMS) + 1e-12).all()
    st = next(st for _, st in V.without_last_stage_recompute(multi).stages if (st.pp >= 2).any())
    assert (st.cls["last"]["q"]["full"] == 0).all()
    orig = next(s for _, s in multi.stages if (s.pp >= 2).any())
    two = orig.pp >= 2
    assert (orig.cls["first"]["q"]["full"][two] > 0).all()
    np.testing.assert_array_equal(st.cls["first"]["q"]["full"][two], orig.cls["first"]["q"]["full"][two])


def test_coverage_reproduces_the_shipped_interval(shipped):
    """Under the shipped θ the recomputed quantiles are the shipped interval's: the same coverage as
    validate("vtrain-multi") reports."""
    single, multi = shipped
    _, s = validation.validate("vtrain-multi")
    assert V.coverage(single, multi, Utilization.default()) == pytest.approx(s["interval_coverage_90"], abs=1e-12)


def test_unknown_reading_is_refused():
    with pytest.raises(UsageError, match="reading="):
        V.reading("80GB")


@pytest.mark.slow
def test_whatif_every_reading_moves_the_multi_node_error_up():
    """The finding: the shipped row reproduces the shipped fit and validation; every memory-motivated reading,
    refitted on the single-node runs only, leaves the multi-node MAPE higher and θ_tp on its bound."""
    t = V.whatif(cv=False, nemo=False).set_index("reading")
    _, s = validation.validate("vtrain-multi")
    assert t.loc["shipped", "theta_gemm"] == pytest.approx(Utilization.default().coef[0], rel=1e-6)
    assert t.loc["shipped", "multi_mape"] == pytest.approx(s["mape"], rel=1e-9)
    assert t.loc["80gb-multi", "theta_gemm"] == t.loc["shipped", "theta_gemm"]  # same single-node fit
    for r in ("80gb", "80gb-multi", "zero1", "last-stage-no-recompute"):
        assert t.loc[r, "multi_mape"] > s["mape"]
        assert "tp" in t.loc[r, "at_bound"]
    # the 80 GB part's bandwidth is absorbed by θ_mem on the shared cluster (1.555 → 2.039 TB/s)
    assert t.loc["80gb", "theta_mem"] > t.loc["shipped", "theta_mem"] * 1.3
