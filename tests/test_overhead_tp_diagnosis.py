"""The θ_tp / TP-2 diagnostic (llmcomm.overhead.tp_diagnosis): hand-worked placement and byte counts, the TP
all-reduce timing against vTrain's measured tables, the single-node residual by TP and the multi-node ceiling."""

from __future__ import annotations

import numpy as np
import pytest

from llmcomm.overhead import Utilization, validation
from llmcomm.overhead import deepspeed_terms as D
from llmcomm.overhead import tp_diagnosis as T


def test_dp_ranks_per_node_follows_deepspeed_topology():
    # ranks pipe·dp·tp + data·tp + model on 8-GPU nodes: a node holds 8/tp consecutive data ranks of each DP group
    np.testing.assert_array_equal(T.dp_ranks_per_node([2, 8, 1, 4, 2, 16], [32, 32, 64, 2, 2, 4]),
                                  [4, 1, 8, 2, 2, 1])


def test_node_dp_bytes_hand_worked():
    # 1e9 fp16 gradients per GPU, dp 32: ring share 2·31/32·2e9 = 3.875e9 per group crossing the node
    # tp 2: 2 groups of 4 GPUs per node; tp 8: 8 groups of 1 -> four times the bytes out of the node
    b2, b8 = T.node_dp_bytes([1e9, 1e9], [2, 8], [32, 32])
    assert b2 == pytest.approx(2 * 3.875e9) and b8 == pytest.approx(8 * 3.875e9)
    assert T.node_dp_bytes(1e9, 2, 4) == 0.0  # the whole DP group sits in one node


def test_inter_node_and_tp_bytes_hand_worked():
    # dp 4: 2·3/4·(1e9·2) = 3e9; 2 micro-batches × (activation + gradient) × 1·1024·1024·2 bytes
    assert T.inter_node_bytes(1e9, 4, 2, 1, 1024, 1024) == pytest.approx(3e9 + 2 * 2 * 1024 * 1024 * 2)
    assert T.inter_node_bytes(1e9, 1, 2, 1, 1024, 1024) == pytest.approx(2 * 2 * 1024 * 1024 * 2)
    # 39.1B tp 2, 6 layers per stage, 24 micro-batches of 2×2048×8192: 6·6·24 calls × busbw factor 1 × 64 MiB
    msg = 2 * 2048 * 8192 * 2
    assert T.tp_bytes(2, 6, 24, 2, 2048, 8192) == pytest.approx(6 * 6 * 24 * msg)
    assert T.tp_bytes(8, 6, 24, 2, 2048, 8192) == pytest.approx(6 * 6 * 24 * 1.75 * msg)


def test_implied_bandwidth_hand_worked():
    np.testing.assert_allclose(T.implied_bandwidth([10e9, 10e9], [0.5, 0.5], [4.5, -1.0]), [2e9, 20e9])


def test_tp_allreduce_is_timed_as_vtrain_measured_it():
    """The kit's intra-node all-reduce against vTrain's own nccl-tests tables at the rows' message sizes."""
    ar = T.allreduce_vs_measured(T._bandwidth(), [2 * 2**20, 25165824, 67108864, 201326592, 805306368])
    assert set(ar["group_size"]) == {2, 4, 8}
    assert ar["error"].abs().max() < 0.1
    assert ar.loc[ar["bytes"] >= 6e7, "error"].abs().max() < 0.06  # the 39.1B/175B TP sizes


@pytest.fixture(scope="module")
def prepared():
    return D.prepared()


def test_single_node_residual_is_not_monotonic_in_tp(prepared):
    """Why θ_tp sits on 0: tp 4 is predicted too slow and tp 8 too fast; unbounded, θ_tp goes negative."""
    single, _ = prepared
    r = T.residual_by_tp(single, Utilization.default())
    assert r[4] > 0.03 and r[8] < -0.08 and abs(r[1]) < 0.05 and abs(r[2]) < 0.05
    free = T.unbounded_theta_tp(single)
    assert free.coef[-1] < 0.0  # the rows want TP cheaper, not dearer
    rf = T.residual_by_tp(single, free)
    assert rf[4] > 0.03 and rf[8] < -0.08  # still both signs: no per-pass TP cost fits


def test_tp2_excess_exceeds_every_inter_node_byte(prepared):
    _, multi = prepared
    pred, _ = validation.validate("vtrain-multi")
    net = T.network_table(pred, multi)
    tp2 = net[(net["group"] == "39.1B") & (net["tp"] == 2)]
    assert len(tp2) == 6 and (tp2["unexplained_s"] > 1.0).all()
    assert (tp2["implied_gb_s"] < 3.0).all()
    same = net[(net["group"] == "39.1B") & (net["dp"] == 32) & (net["tp"] * net["pp"] == 16)
               & net["tp"].isin([4, 8])]
    assert (same["unexplained_s"] < 0).all() and (same["implied_gb_s"] > 3.0).all()
    # the placement sends fewer DP bytes out of a tp-2 node than out of a tp-4/tp-8 one
    assert tp2.loc[tp2["dp"] == 32, "node_dp_gb"].max() < same["node_dp_gb"].min()


def test_microbatch_inversions_hand_worked_and_on_vtrain(prepared):
    import pandas as pd

    rows = pd.DataFrame({"hidden": 1024, "layers": 12, "tp": 4, "dp": 1, "pp": 1, "micro_batch": [1, 2, 4],
                         "global_batch": [2, 4, 8], "time_s": [1.0, 0.9, 1.8]})
    t = T.microbatch_inversions(rows)
    assert t["micro_batch"].tolist() == [1, 2] and t["ratio"].round(6).tolist() == [0.9, 2.0]
    single, _ = prepared
    inv = T.microbatch_inversions(single.rows).assign(inv=lambda x: x["ratio"] < 1).groupby("tp")["inv"].sum()
    assert inv[1] == 0 and inv[4] > 0 and inv[8] > 0  # faster with twice the work: only where tp > 1


def test_residual_stays_non_monotonic_with_the_softmax_fallback(prepared):
    from llmcomm.overhead import calibrate as C
    from llmcomm.overhead import softmax_fallback as S

    single, _ = prepared
    f = S.with_fallback(single)
    u, _ = C.fit(f)
    r = T.residual_by_tp(f, u)
    assert u.coef[-1] == 0.0 and r[4] > 0.03 and r[8] < -0.02
