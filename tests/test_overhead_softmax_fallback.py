"""Megatron-DeepSpeed's fused-softmax fallback (llmcomm.overhead.softmax_fallback): the kernel-availability rule
by hand, the features it adds, which vTrain rows it touches, and the what-if refit's finding."""

from __future__ import annotations

import numpy as np
import pytest

from llmcomm.overhead import deepspeed_terms as D
from llmcomm.overhead import softmax_fallback as S
from llmcomm.overhead import utilization as U


def test_batch_per_block_hand_worked():
    # sk 1024/2048: next power of two > 32 -> warp 32, 1 batch per warp, 128/32 = 4 warps -> 4
    # sk 128: warp 32, 2 per warp -> 8; sk 16: warp 16, 8 warps × 2 -> 16
    np.testing.assert_array_equal(S.batch_per_block([1024, 2048, 1000, 128, 64, 16]), [4, 4, 4, 8, 8, 16])


def test_fused_softmax_available_hand_worked():
    # vTrain single node, 16 heads: tp 8 -> 2 heads per rank; b·np = 2 (mb 1) falls back, 4 (mb 2) does not
    got = S.fused_softmax_available([1, 2, 1, 1, 2, 4, 2], [2, 2, 4, 8, 3, 3, 8], [1024, 1024, 1024, 1024, 2048,
                                                                                 2048, 8192],
                                    [1024, 1024, 1024, 1024, 2048, 2048, 8192])
    np.testing.assert_array_equal(got, [False, True, True, True, False, True, False])  # 18.4B tp 16: np 3


def test_fallback_features_hand_worked():
    lm, mem = S.fallback_features([1, 2], [2, 2], [1024, 1024], 1.555e12)
    np.testing.assert_allclose(lm, [4 / 8, 0.0])
    np.testing.assert_allclose(mem, [32 * 1 * 2 * 1024**2 / 1.555e12, 0.0])


def test_with_fallback_touches_exactly_the_tp8_microbatch1_single_node_rows():
    single, _ = D.prepared()
    after = S.with_fallback(single)
    changed = np.zeros(len(single.rows), bool)
    for (idx, st0), (_, st1) in zip(single.stages, after.stages, strict=True):
        for c in st0.cls:
            d = st1.cls[c]["q"]["Ld"][:, U.I["launch_mem"]] - st0.cls[c]["q"]["Ld"][:, U.I["launch_mem"]]
            assert set(np.round(d, 12)) <= {0.0, 0.5}
            changed[idx] |= d > 0
    r = single.rows
    np.testing.assert_array_equal(changed, (r["tp"] == 8).to_numpy() & (r["micro_batch"] == 1).to_numpy())


@pytest.mark.slow
def test_whatif_explains_the_tp8_rows_and_moves_theta_gemm_to_its_bound():
    t = S.whatif(cv=False).set_index("case")
    base, fb = t.loc["shipped"], t.loc["fallback"]
    assert base["single_tp8_mb1_bias"] < -0.2 and abs(fb["single_tp8_mb1_bias"]) < 0.05
    assert fb["single_mape"] < base["single_mape"]
    # the finding: the refit puts matmuls at about peak and the multi-node rows move away from the target
    assert fb["theta_gemm"] < 1.02 < base["theta_gemm"] and fb["multi_mape"] > base["multi_mape"]
    assert "tp" in fb["at_bound"].split(",")
