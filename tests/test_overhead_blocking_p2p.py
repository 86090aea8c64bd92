"""DeepSpeed's blocking pipeline receives (llmcomm.overhead.blocking_p2p) on hand-worked cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from llmcomm.overhead import Utilization, blocking_p2p, iteration_times
from llmcomm.overhead.iteration import CommItem, _resolve, stages
from llmcomm.parallel_table import ParallelTable
from llmcomm.specs import load_cluster, load_model


def _item(op: str, term: str = "pp") -> CommItem:
    one = np.ones(2, np.int64)
    return CommItem(term, term, op, "forward", 1e6 * one, 3 * one, 2 * one, one, "microbatch")


def test_timed_calls_keeps_pipeline_receives_only_where_blocking():
    items = [_item("send"), _item("recv"), _item("all_reduce", "tp"), _item("recv", "tp")]
    out = blocking_p2p.timed_calls(items, np.array([True, False]))
    assert [(i.op, i.term) for i in out] == [("send", "pp"), ("recv", "pp"), ("all_reduce", "tp")]
    np.testing.assert_array_equal(out[1].count, [3, 0])  # the receive counted on the DeepSpeed row only
    assert [i.op for i in blocking_p2p.timed_calls(items, np.array([False, False]))] == ["send", "all_reduce"]


@pytest.fixture(scope="module")
def case():
    # tp 1: pipe_partitioned changes nothing but the engine (no split over TP), so the bytes are equal
    model = load_model("gpt3-13b")
    base = dict(tp=1, pp=4, dp=4, micro_batch=2, global_batch=64, seq_len=2048)
    tab = pd.DataFrame([base | {"pipe_partitioned": False}, base | {"pipe_partitioned": True}])
    return model, tab, load_cluster("vtrain-a100")


def test_each_stage_waits_for_its_receives_too(case):
    """Per micro-batch τ per transfer: Megatron-LM first τ, mid 2τ, last τ; DeepSpeed 2τ, 4τ, 2τ: twice."""
    model, tab, cluster = case
    bw, _ = _resolve(cluster, None, Utilization.default())
    st = stages(model, ParallelTable.from_frame(tab), cluster, bw)
    for cls in ("first", "mid", "last"):
        pp = st.cls[cls]["pp"]
        assert pp[0] > 0
        assert pp[1] == pytest.approx(2 * pp[0], rel=1e-12), cls
        assert st.cls[cls]["pp_bus"][1] == st.cls[cls]["pp_bus"][0]  # a receive's bytes are its peer's send's


def test_blocking_receives_lengthen_the_iteration_by_the_pipeline_term(case):
    model, tab, cluster = case
    r = iteration_times(model, tab, cluster, interval=False)
    assert r["pp_comm_s"].iloc[1] == pytest.approx(2 * r["pp_comm_s"].iloc[0], rel=1e-12)
    assert r["total_s"].iloc[1] > r["total_s"].iloc[0]
    assert (r["forward_s"].iloc[1], r["dp_comm_s"].iloc[1]) == (r["forward_s"].iloc[0], r["dp_comm_s"].iloc[0])


@pytest.mark.parametrize("p,m", [(1, 4), (2, 8), (4, 24), (8, 16), (16, 48)])
def test_deepspeed_train_schedule_is_1f1b_with_free_transfers(p, m):
    # (m + p − 1)·(F + B): with F = 1, B = 3 (backward with its recomputation)
    assert blocking_p2p.train_schedule_time(p, m, 1.0, 3.0) == pytest.approx((m + p - 1) * 4.0)


def test_blocking_transfers_cost_about_four_per_step_on_deep_pipelines():
    tau = 0.05
    extra = {p: (blocking_p2p.train_schedule_time(p, 24, 1.0, 3.0, tau) - (24 + p - 1) * 4.0) / ((24 + p - 1) * tau)
             for p in (2, 4, 8, 16)}
    assert 1.7 < extra[2] < 2.0  # first and last stage only: one send and one receive each per micro-batch
    for p in (4, 8, 16):
        assert 3.0 < extra[p] < 4.0, (p, extra[p])  # a middle stage: two sends and two receives


def test_train_schedule_time_refuses_bad_sizes():
    from llmcomm.errors import UsageError

    with pytest.raises(UsageError, match="at least 1"):
        blocking_p2p.train_schedule_time(0, 4, 1.0, 3.0)
    with pytest.raises(UsageError, match="exceed"):
        blocking_p2p.train_schedule_time(512, 1000, 1.0, 3.0)


@pytest.mark.parametrize("recv_first", [False, True])
def test_train_schedule_two_stages_two_micro_batches_by_hand(recv_first):
    # p = 2, m = 2, F = 1, B = 3: stage 0 F, [act 0], F, [grad 0 + act 1], B, [grad 1], B; stage 1 [act 0], F, B,
    # [grad 0 + act 1], F, B, [grad 1]. Rendezvous: act 0 at 1 + τ; stage 1 then runs F and B (5 + τ), the pair
    # of step 3 ends at 5 + 3τ; stage 1 runs F, B (9 + 3τ), grad 1 at 9 + 4τ, stage 0's last B ends at 12 + 4τ,
    # in either order of step 3's pair (DeepSpeed before and after b528f50e3)
    tau = 0.5
    assert blocking_p2p.train_schedule_time(2, 2, 1.0, 3.0, tau, recv_first=recv_first) == pytest.approx(12 + 4 * tau)


@pytest.mark.parametrize("p,m", [(2, 8), (4, 24), (8, 16), (16, 48), (8, 3)])
def test_deepspeed_2022_instruction_order_times_alike(p, m):
    # vTrain's 2022 runs: receive before send (DeepSpeed b609a2941); the kit's default: send first (b528f50e3)
    for tau in (0.0, 0.02, 0.3):
        assert blocking_p2p.train_schedule_time(p, m, 1.0, 3.0, tau, recv_first=True) == pytest.approx(
            blocking_p2p.train_schedule_time(p, m, 1.0, 3.0, tau), rel=1e-12)
