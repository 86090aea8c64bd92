"""The predicted timeline (llmcomm.overhead.timeline) against a recorded run, and link demand over time."""

from __future__ import annotations

import numpy as np
import pytest

from llmcomm import ParallelConfig, load_cluster, load_model, read_trace
from llmcomm.network import link_loads
from llmcomm.network.demand import fabric_bound_share, link_demand
from llmcomm.overhead.bandwidth import Bandwidth
from llmcomm.overhead.timeline import compare_timelines, layer_pass_times, on_off, predicted_timeline
from llmcomm.paths import data_dir
from llmcomm.predict import predict_traffic


@pytest.fixture(scope="module")
def recorded():
    return read_trace(data_dir() / "traces" / "gpt_tp2pp2_timeline.parquet")


def test_order_matches_the_recorded_run(recorded):
    par = ParallelConfig.from_dict(recorded.meta["parallel"])
    m = load_model("tiny-gpt")
    t = predict_traffic(m, par, framework="torch", aggregate=False)
    tl = predicted_timeline(t, m, par)
    c = compare_timelines(tl.trace(t.meta), recorded)
    assert c["same_order"].all() and len(c) == 4
    # the on-off rhythm: gaps between calls rank alike in the prediction and on the CPU run (measured, not fitted)
    assert (c["gap_rank_correlation"] > 0.2).all()


def test_pp1_iteration_is_compute_plus_calls():
    m = load_model("tiny-gpt")
    par = ParallelConfig(tp=2, dp=2, micro_batch=1, global_batch=4)
    cl = load_cluster("h100-80g-ndr400")
    t = predict_traffic(m, par, aggregate=False)
    tl = predicted_timeline(t, m, par, cluster=cl)
    per_layer, t_emb, t_out = layer_pass_times(m, par, cl)
    mb = par.num_microbatches
    compute = mb * 3 * (per_layer.sum() + t_emb + t_out)  # forward 1 + backward 2 passes per micro-batch
    bw = Bandwidth.default(cl)
    ev = t.events[t.events["rank"] == 0]
    calls = sum(float(bw.time(o, b, len(g), len(g))) for o, b, g in zip(ev["op"], ev["bytes"], ev["group"], strict=True)
                if len(g) > 1)
    assert tl.iteration_s == pytest.approx(compute + calls, rel=1e-6)
    assert tl.compute["t_end_ns"].sum() - tl.compute["t_start_ns"].sum() == pytest.approx(compute * 1e9, rel=1e-6)


def test_timeline_is_causal():
    m = load_model("tiny-gpt")
    par = ParallelConfig(tp=2, pp=4, dp=1, micro_batch=1, global_batch=8)
    t = predict_traffic(m, par, aggregate=False)
    ev = predicted_timeline(t, m, par).events
    s, e = ev["t_start_ns"].to_numpy(np.int64), ev["t_end_ns"].to_numpy(np.int64)
    assert (e >= s).all()
    for _, d in ev.groupby("rank"):  # calls of a rank do not overlap and keep their order
        assert (d["t_start_ns"].to_numpy()[1:] >= d["t_end_ns"].to_numpy()[:-1]).all()
    sends = ev[ev["op"] == "send"]
    recvs = ev[ev["op"] == "recv"]
    # the k-th recv of a pair ends no earlier than the k-th send of that pair ends
    for (a, b), g in sends.groupby(["rank", "peer"]):
        r = recvs[(recvs["rank"] == b) & (recvs["peer"] == a)]
        assert len(r) == len(g)
        assert (r["t_end_ns"].to_numpy() >= g["t_end_ns"].to_numpy()).all()
    oo = on_off(ev)
    assert (oo["gap_ns"].fillna(0) >= 0).all()


def test_demand_over_time_conserves_the_iteration_bytes():
    m = load_model("tiny-gpt")
    par = ParallelConfig(tp=2, pp=2, dp=8, micro_batch=1, global_batch=16)
    t = predict_traffic(m, par, aggregate=False)
    tt = predicted_timeline(t, m, par).trace(t.meta)
    d = link_demand(tt, "dgx-superpod-h100", bins=50)
    L = link_loads(tt, "dgx-superpod-h100")
    got = d.groupby("tier", observed=True)["bytes"].sum()
    want = L.links.groupby("tier", observed=True)["bytes"].sum()
    for tier in want.index:
        assert got[tier] == pytest.approx(want[tier], rel=1e-9)
    f = fabric_bound_share(d)
    assert set(f.columns) == {"tier", "over_capacity_share", "max_peak_demand"}
    with pytest.raises(Exception, match="timed trace"):
        link_demand(t, "dgx-superpod-h100")


@pytest.mark.parametrize(("schedule", "vpp"), [("interleaved", 2), ("gpipe", 1)])
def test_other_schedules(schedule, vpp):
    m = load_model("tiny-gpt")
    par = ParallelConfig(tp=2, pp=2, vpp=vpp, schedule=schedule, micro_batch=1, global_batch=4)
    t = predict_traffic(m, par, aggregate=False)
    tl = predicted_timeline(t, m, par)
    ev = tl.events
    assert ev["t_start_ns"].notna().all()
    per_layer, t_emb, t_out = layer_pass_times(m, par, load_cluster("h100-80g-ndr400"))
    per_stage = par.num_microbatches * 3 * per_layer.sum() / par.pp
    busy = (tl.compute["t_end_ns"] - tl.compute["t_start_ns"]).groupby(tl.compute["stage"]).sum() / 1e9
    assert busy.to_numpy() == pytest.approx(per_stage + np.array([3 * par.num_microbatches * t_emb,
                                                                  3 * par.num_microbatches * t_out]), rel=1e-6)
    assert tl.iteration_s >= busy.max()


def test_overlap_draws_the_reductions_and_sends_concurrent_with_compute():
    """overlap_grad_reduce: the DP reductions of the last backward run on the communication stream, over the
    compute still to run (buckets of ~1/4 of the parameters: the first are ready early), and the optimizer
    phase starts after the last of them; the iteration is shorter by what they hide. overlap_p2p_comm in the
    interleaved schedule: the sends no longer hold the sender."""
    m = load_model("tiny-gpt")
    cl = load_cluster("h100-80g-ndr400")
    par = ParallelConfig(dp=2, micro_batch=1, global_batch=4, overlap_grad_reduce=True, bucket_size=20_000)
    t = predict_traffic(m, par, aggregate=False)
    on = predicted_timeline(t, m, par, cluster=cl)
    # the same calls, each blocking the compute stream
    off = predicted_timeline(t, m, ParallelConfig(dp=2, micro_batch=1, global_batch=4, bucket_size=20_000), cluster=cl)
    ev = on.events[on.events["rank"] == 0]
    red = ev[(ev["phase"] == "backward") & (ev["parallelism"] == "dp")]
    assert len(red) > 1
    comp = on.compute[on.compute["stage"] == 0]
    end_bwd = comp["t_end_ns"].max()
    first = red["t_start_ns"].min()
    assert first < end_bwd  # drawn concurrent with the backward compute
    assert ((comp["t_start_ns"] < red["t_end_ns"].iloc[0]) & (comp["t_end_ns"] > first)).any()
    opt = ev[ev["phase"] == "optimizer"]["t_start_ns"].min()
    assert opt >= red["t_end_ns"].max()
    hidden = float((np.minimum(red["t_end_ns"], end_bwd) - red["t_start_ns"]).clip(lower=0).sum()) / 1e9
    assert on.iteration_s == pytest.approx(off.iteration_s - hidden, rel=1e-6)
    vp = ParallelConfig(pp=2, vpp=2, micro_batch=1, global_batch=4)
    a = predicted_timeline(predict_traffic(m, vp, aggregate=False), m, vp, cluster=cl)
    vpo = ParallelConfig(pp=2, vpp=2, micro_batch=1, global_batch=4, overlap_p2p_comm=True)
    b = predicted_timeline(predict_traffic(m, vpo, aggregate=False), m, vpo, cluster=cl)
    assert b.iteration_s < a.iteration_s
