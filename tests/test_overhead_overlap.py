"""Overlap and FP8 in the iteration-time formulation (issue 20), each on a hand-worked case."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from stub_bandwidth import StubBandwidth, call

from llmcomm import step
from llmcomm.errors import ConfigError
from llmcomm.overhead import Utilization, iteration_time
from llmcomm.overhead.iteration import (
    layer_gemm_shapes,
    measured_gemm,
    param_gather_exposed,
    tp_overlap_exposed,
)
from llmcomm.predict import dp
from llmcomm.predict.calls import Context
from llmcomm.specs import Cluster, ModelSpec, ParallelConfig, load_cluster, load_model
from llmcomm.step import layer_gemms

MODEL = ModelSpec(name="small", num_layers=4, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                  vocab_size=128, add_bias_linear=True, position_embedding_type="learned_absolute",
                  max_position_embeddings=32, seq_length=32)
GEMM_ONLY = Utilization(coef=(1.0, 0.0, 0.0, 0.0, 0.0))


def cluster(peak: float, fp8: float | None = None) -> Cluster:
    return Cluster(name="test", gpus_per_node=8, gpu="test GPU", peak_bf16_flops=peak, peak_fp8_flops=fp8,
                   gpu_memory_bytes=80e9, intra_node_bandwidth=1e9, inter_node_bandwidth=1e9)


def test_tp_overlap_exposed_by_hand():
    """tp = 4: ring_exchange and the pipeline (4 splits) hide under 3/4 of a block's GEMM; each block kind
    (attention, dense MLP, shared experts) is timed against its own GEMMs, once per forward pass."""
    one = np.ones(1)
    g_ag, g_rs = np.array([[2.0, 4.0, 0.0]]), np.array([[1.0, 4.0, 0.0]])
    t_rs = np.array([[0.5, 1.0, 1.0]])
    # 2 attention and 2 MLP blocks, t_ag = 1.2: attention max(0, 1.2 - 1.5) + max(0, 0.5 - 0.75) = 0, MLP
    # max(0, 1.2 - 3) + max(0, 1 - 3) = 0; backward max(0, 5 - 2·11·3/4) = 0; 12 - 10 of other calls
    n = np.array([[2.0, 2.0, 0.0]])
    args = (12 * one, 10 * one, 5 * one, 11 * one, 1.2 * one, t_rs)
    assert tp_overlap_exposed(*args, n, g_ag, g_rs, 4 * one)[0] == pytest.approx(2.0)
    # short attention GEMMs (qkv 1, proj 0.4): each attention block leaves 1.2 - 0.75 and 0.5 - 0.3 exposed, and the
    # MLP's slack hides none of it
    short_ag, short_rs = np.array([[1.0, 4.0, 0.0]]), np.array([[0.4, 4.0, 0.0]])
    assert tp_overlap_exposed(*args, n, short_ag, short_rs, 4 * one)[0] == pytest.approx(2.0 + 2 * (0.45 + 0.2))
    # full recomputation replays every block's forward: twice the forward passes, twice the attention's exposure
    assert tp_overlap_exposed(*args, 2 * n, short_ag, short_rs, 4 * one)[0] == pytest.approx(2.0 + 4 * (0.45 + 0.2))
    # the backward's calls beyond its two GEMM passes: max(0, 20 - 2·11·3/4)
    assert tp_overlap_exposed(12 * one, 10 * one, 20 * one, 11 * one, 1.2 * one, t_rs, n, g_ag, g_rs,
                              4 * one)[0] == pytest.approx(2.0 + 3.5)


def test_tp_overlap_exposed_is_never_negative():
    """All TP calls are the blocks' and all hide under long GEMMs: exposed is 0, not the float residue of
    ``tp − ub`` (``0.1 + (0.2 + 0.3)`` and ``(0.1 + 0.2) + 0.3`` differ by an ulp, the difference is −1.1e-16
    unclamped)."""
    one = np.ones(1)
    tp = 0.1 + (0.2 + 0.3)
    assert tp - ((0.1 + 0.2) + 0.3) < 0.0  # the residue the clamp removes
    big = np.full((1, 3), 10.0)
    ex = tp_overlap_exposed(tp * one, (0.1 + 0.2) + 0.3 * one, 0.3 * one, 10 * one, 0.05 * one, np.full((1, 3), 0.05),
                            np.ones((1, 3)), big, big, 2 * one)
    assert ex[0] == 0.0


def test_sp_backward_exposed_by_hand():
    """SP without userbuffers: per block the backward issues 3 equal calls (grad-output gather, input re-gather,
    dgrad reduce-scatter); the re-gather hides under the dgrad GEMM and the reduce-scatter under the wgrad GEMM,
    each as long as the forward GEMM ``g_ag``."""
    from llmcomm.overhead.overlap import sp_backward_exposed

    one = np.ones(1)
    # tp 10 s of which the backward blocks' 6 s: c = 2 per kind; g_ag = 5 hides both: 10 - 2 - 2
    assert sp_backward_exposed(10 * one, 6 * one, 5 * one)[0] == pytest.approx(6.0)
    # a short GEMM (1 s) hides 1 s of each: 10 - 1 - 1
    assert sp_backward_exposed(10 * one, 6 * one, 1 * one)[0] == pytest.approx(8.0)
    # recomputation: the replayed forward's AG and RS (4 s of tp 14) are not backward calls (``ub`` "replay"
    # items): exposed as the forward's are, c = 6/3 still
    assert sp_backward_exposed(14 * one, 6 * one, 5 * one)[0] == pytest.approx(14 - 2 - 2)
    # nothing SP-gathered: nothing hidden
    assert sp_backward_exposed(3 * one, 0 * one, 5 * one)[0] == 3.0


def test_sp_backward_overlap_in_the_step():
    """The formulation applies it to SP rows without tp_comm_overlap only: with SP the TP seconds drop below
    the all-exposed sum by twice min(c, g_ag); tp_comm_overlap rows keep their own rule."""
    from llmcomm.overhead import iteration as it
    from llmcomm.overhead import overlap as O
    from llmcomm.parallel_table import ParallelTable

    m = load_model("gpt3-175b")
    h100 = load_cluster("h100-80g-ndr400").for_world(128)
    par = ParallelConfig(tp=4, pp=8, vpp=6, dp=4, sp=True, micro_batch=1, global_batch=256, distributed_optimizer=True,
                         fp8="hybrid")
    b = iteration_time(m, par, h100)
    bw, ut = it._resolve(h100, None, None)
    st = it.stages(m, ParallelTable.from_parallel(par, m), h100, bw)
    util = it.combine_utilization(st, ut)
    r = st.cls["mid"]
    th = util.coef[0] / util.scale
    c = r["ub_b"] / 3.0
    hidden = 2 * np.minimum(c, th * r["q"]["Gag"])
    assert hidden[0] > 0 and r["ub_b"][0] > 0
    assert O.sp_backward_exposed(r["tp"], r["ub_b"], th * r["q"]["Gag"])[0] == pytest.approx(
        r["tp"][0] - hidden[0])
    assert b.tp_comm_s < st.m[0] * r["tp"][0]  # less than every TP call exposed on the critical stage


def test_param_gather_exposed_by_hand():
    ag, nb = np.array([4.0, 4.0]), np.array([4, 4])
    # short forward: the gathers outrun it (4 - 2*3/4); long forward: only the first bucket waits (4/4)
    assert param_gather_exposed(ag, np.array([2.0, 10.0]), nb).tolist() == pytest.approx([2.5, 1.0])
    assert param_gather_exposed(ag[:1], np.array([100.0]), np.array([1]))[0] == 4.0  # one bucket: nothing hides


SP = ParallelConfig(tp=2, pp=1, dp=1, sp=True, micro_batch=1, global_batch=1, attention_backend="unfused")


def test_tp_comm_overlap_hides_the_blocks_sp_calls_under_slow_gemms():
    A = 32 * 64 * 2  # b*s*h*bf16
    # 4 layers x 2 blocks: forward 8 AG + 8 RS, backward 16 AG + 8 RS, each call(A)
    ub = 40 * call(A)
    # without userbuffers the backward's input re-gathers and dgrad reduce-scatters (8 + 8) still hide under the
    # dgrad/wgrad GEMMs (overlap.sp_backward_exposed); userbuffers hide the other 24 too
    sp_async = 16 * call(A)
    off = iteration_time(MODEL, SP, cluster(1e6), StubBandwidth(), GEMM_ONLY)
    on = iteration_time(MODEL, dataclasses.replace(SP, tp_comm_overlap=True), cluster(1e6), StubBandwidth(),
                        GEMM_ONLY)
    assert on.tp_comm_s == pytest.approx(off.tp_comm_s - (ub - sp_async), rel=1e-12)  # GEMMs of seconds hide all
    assert on.forward_s == off.forward_s and on.dp_comm_s == off.dp_comm_s
    fast = cluster(1e30)  # GEMMs take no time: nothing to hide under
    assert iteration_time(MODEL, dataclasses.replace(SP, tp_comm_overlap=True), fast, StubBandwidth(),
                          GEMM_ONLY).tp_comm_s == pytest.approx(
        iteration_time(MODEL, SP, fast, StubBandwidth(), GEMM_ONLY).tp_comm_s, rel=1e-12)


def test_tp_comm_overlap_rules():
    c, bw = cluster(1e12), StubBandwidth()
    with pytest.raises(ConfigError, match="tp_comm_overlap needs sp"):
        iteration_time(MODEL, ParallelConfig(tp=2, tp_comm_overlap=True), c, bw, GEMM_ONLY)
    iteration_time(MODEL, ParallelConfig(tp=1, tp_comm_overlap=True), c, bw, GEMM_ONLY)  # nothing to overlap
    with pytest.raises(ConfigError, match="overlap_param_gather needs distributed_optimizer"):
        iteration_time(MODEL, ParallelConfig(dp=2, overlap_param_gather=True, overlap_grad_reduce=True), c, bw,
                       GEMM_ONLY)


DO = ParallelConfig(tp=1, pp=1, dp=2, micro_batch=1, global_batch=2, distributed_optimizer=True,
                    overlap_grad_reduce=True, attention_backend="unfused")


def test_overlap_param_gather_by_hand():
    c = cluster(1e6)  # forward and backward of seconds
    b = iteration_time(MODEL, DO, c, StubBandwidth(), GEMM_ONLY)
    # one bucket (the model is far below 40M parameters): it is ready when the embedding's gradient is, at the
    # end of the backward, so the reduce-scatter hides behind nothing; the all-gather follows the optimizer step
    assert b.dp_comm_s > 0 and b.dp_comm_total_s == pytest.approx(b.dp_comm_s, rel=1e-12)
    one = np.ones(1, np.int64)
    dense, expert, _ = step.stage_parameters(MODEL, one, one, one, one, 4 * one, 0 * one, one > 0, one > 0)
    params = int(dense[0] + expert[0])
    on = iteration_time(MODEL, dataclasses.replace(DO, overlap_param_gather=True), c, StubBandwidth(), GEMM_ONLY)
    assert on.dp_comm_s == pytest.approx(b.dp_comm_s, rel=1e-12)  # one bucket: it cannot hide behind anything
    # buckets of a quarter of the parameters (the predictor's layout closes a bucket at the tensor that reaches the
    # size): under backward and forward of seconds the last bucket's reduce-scatter (its share of the one-call
    # time) and the first bucket's all-gather (1/nb of it) stay exposed, and the step's scalars (2 of 4 bytes,
    # the loss's 8)
    four = dataclasses.replace(DO, overlap_param_gather=True, bucket_size=-(-params // 4))
    bl = dp.buckets(Context(MODEL, four), 0, 0)
    rest = 2 * call(4) + call(8)
    assert b.dp_comm_s == pytest.approx(call(4 * params) + call(2 * params) + rest, rel=1e-12)
    q = iteration_time(MODEL, four, c, StubBandwidth(), GEMM_ONLY)
    assert len(bl) > 1
    assert q.dp_comm_s == pytest.approx(call(4 * params) * bl[-1].numel / params + call(2 * params) / len(bl) + rest,
                                        rel=1e-12)


def test_fp8_moves_the_linear_gemms_to_the_fp8_peak():
    par = ParallelConfig(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, attention_backend="unfused")
    T, h, f, a, d = 32, 64, 256, 4, 16
    lin = 2 * T * (4 * h * h + 2 * h * f)  # qkv + proj + fc1 + fc2 of one layer
    core = 4 * T * T * a * d
    out = 2 * T * h * 128  # output layer, BF16
    peak = 1e12
    bf = iteration_time(MODEL, par, cluster(peak, 2 * peak), StubBandwidth(), GEMM_ONLY)
    f8 = iteration_time(MODEL, dataclasses.replace(par, fp8="hybrid"), cluster(peak, 2 * peak), StubBandwidth(),
                        GEMM_ONLY)
    assert bf.forward_s == pytest.approx((4 * (lin + core) + out) / peak, rel=1e-12)
    assert f8.forward_s == pytest.approx((4 * (lin / 2 + core) + out) / peak, rel=1e-12)
    with pytest.raises(ConfigError, match="peak_fp8_flops"):
        iteration_time(MODEL, dataclasses.replace(par, fp8="e4m3"), cluster(peak), StubBandwidth(), GEMM_ONLY)
    with pytest.raises(ConfigError, match="fp8="):
        ParallelConfig(fp8="e5m2")


def test_fp8_casts_are_elementwise_bytes():
    par = ParallelConfig(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, attention_backend="flash")
    mem_only = Utilization(coef=(0.0, 1.0, 0.0, 0.0, 0.0))
    c = dataclasses.replace(cluster(1e12, 2e12), hbm_bandwidth=1e9)
    bf = iteration_time(MODEL, par, c, StubBandwidth(), mem_only)
    f8 = iteration_time(MODEL, dataclasses.replace(par, fp8="hybrid"), c, StubBandwidth(), mem_only)
    # delayed scaling, per GEMM operand as TransformerEngine 1.x runs it (llmcomm.overhead.fp8_casts), T = 32,
    # tp = 1 (no SP), m = 1, per layer: forward the weights cast + transposed, 4·(192·64 + 64·64 + 256·64 + 64·256)
    # = 196,608, and proj's and fc2's inputs, 4·32·(64 + 256) = 40,960; backward the qkv and fc1 LayerNorm
    # outputs transposed, 2·2·32·64 = 8,192, and every grad output cast + transposed, 4·32·(192 + 64 + 256 + 64)
    # = 73,728: 237,568 and 81,920 bytes, four layers
    assert f8.forward_s - bf.forward_s == pytest.approx(4 * 237_568 / 1e9, rel=1e-12)
    assert f8.backward_s - bf.backward_s == pytest.approx(4 * 81_920 / 1e9, rel=1e-12)


def test_layer_gemm_shapes_equal_the_step_description():
    for name, par in (("llama3-8b", ParallelConfig(tp=4, sp=True, micro_batch=2)),
                      ("qwen3-30b-a3b", ParallelConfig(tp=2, sp=True, dp=8, ep=8))):
        m = load_model(name)
        T = par.micro_batch * par.sequence_length(m)
        got = layer_gemm_shapes(m, np.array([T]), np.array([par.tp]), np.array([par.expert_tp]), np.array([par.ep]))
        for g in layer_gemms(m, par, m.is_moe):
            if g.name == "router":
                continue
            mm, nn, kk, bb = got[g.name]
            assert (int(mm[0]), int(nn[0]), int(kk[0]), int(bb[0])) == (g.m, g.n, g.k, g.count), g.name


def test_measured_gemms_on_h100_and_never_above_the_ceiling():
    h100 = load_cluster("h100-80g-ndr400")
    g = measured_gemm(h100)
    assert g is not None and measured_gemm(load_cluster("vtrain-a100")) is None
    m = load_model("llama3-70b")
    par = ParallelConfig(tp=8, pp=4, dp=2, sp=True, micro_batch=1, global_batch=64, distributed_optimizer=True)
    b = iteration_time(m, par, h100.for_world(64))
    T, h = 8192, m.hidden_size
    lin = 2 * T * h * (m.num_attention_heads * m.head_dim * 2 + 2 * m.query_groups * m.head_dim
                       + 3 * m.ffn_hidden_size) / 8
    layers = m.num_layers // 4
    # the forward of a middle stage is at least its linear GEMMs at the measured ceiling
    assert b.forward_s >= 32 * layers * lin / g.ceiling("bf16")


def test_fp8_tensorwise_adds_the_amax_pass_and_unfused_norm_casts():
    par = ParallelConfig(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, attention_backend="flash", fp8="hybrid")
    mem_only = Utilization(coef=(0.0, 1.0, 0.0, 0.0, 0.0))
    c = dataclasses.replace(cluster(1e12, 2e12), hbm_bandwidth=1e9)
    bf = iteration_time(MODEL, dataclasses.replace(par, fp8=None), c, StubBandwidth(), mem_only)
    cs = iteration_time(MODEL, dataclasses.replace(par, fp8_recipe="tensorwise"), c, StubBandwidth(), mem_only)
    T, h, f, ad = 32, 64, 256, 64
    # current scaling keeps the formulation's rule (delayed scaling has its own, llmcomm.overhead.fp8_casts): the
    # proj/fc2 inputs cast (3 bytes of T·(a·d + f)) after an amax pass (2), the two LayerNorm outputs quantized
    # apart (2·5·T·h); backward twice the forward
    assert cs.forward_s - bf.forward_s == pytest.approx(4 * (5 * T * (ad + f) + 2 * 5 * T * h) / 1e9, rel=1e-12)
    assert cs.backward_s - bf.backward_s == pytest.approx(2 * (cs.forward_s - bf.forward_s), rel=1e-12)
    with pytest.raises(ConfigError, match="fp8_recipe='mxfp8'"):
        iteration_time(MODEL, dataclasses.replace(par, fp8_recipe="mxfp8"), c, StubBandwidth(), mem_only)
    with pytest.raises(ConfigError, match="fp8_recipe="):
        ParallelConfig(fp8_recipe="e8m0")


def test_fp8_param_gather_moves_one_byte_per_parameter():
    c = cluster(1e6, 2e6)
    f8 = dataclasses.replace(DO, fp8="hybrid")
    off = iteration_time(MODEL, f8, c, StubBandwidth(), GEMM_ONLY)
    on = iteration_time(MODEL, dataclasses.replace(f8, fp8_param_gather=True), c, StubBandwidth(), GEMM_ONLY)
    one = np.ones(1, np.int64)
    dense, expert, _ = step.stage_parameters(MODEL, one, one, one, one, 4 * one, 0 * one, one > 0, one > 0)
    # the all-gather (exposed after the optimizer step) carries 1 byte per parameter instead of bf16's 2
    assert off.dp_comm_s - on.dp_comm_s == pytest.approx(int(dense[0] + expert[0]) * 1e-9, rel=1e-9)
    with pytest.raises(ConfigError, match="fp8_param_gather needs"):
        iteration_time(MODEL, dataclasses.replace(DO, fp8_param_gather=True), c, StubBandwidth(), GEMM_ONLY)


def test_first_chunk_exposed_per_row_profiles_equal_one_profile_each() -> None:
    """Profiles as rows × buckets (stage_grad_reduce batches layouts with as many buckets) give each row the value
    of its profile alone, bit for bit; hand-worked: window 2, d 1, ready (0.5, 1), before (0, 0.5):
    max(2·0.5 + 1·1, 2·1 + 1·0.5) − 2 = 0.5."""
    from llmcomm.overhead.overlap import first_chunk_exposed

    r1, b1 = np.array([0.5, 1.0]), np.array([0.0, 0.5])
    r2, b2 = np.array([0.2, 1.0]), np.array([0.0, 0.9])
    assert first_chunk_exposed(np.array([1.0]), np.array([2.0]), r1, b1).tolist() == [0.5]
    d, w = np.array([1.0, 0.3, 2.5]), np.array([2.0, 0.7, 0.1])
    both = first_chunk_exposed(d, w, np.stack([r1, r2, r1]), np.stack([b1, b2, b1]))
    alone = [first_chunk_exposed(d[i:i + 1], w[i:i + 1], r, b)[0] for i, (r, b) in enumerate(((r1, b1), (r2, b2),
                                                                                              (r1, b1)))]
    assert both.tolist() == alone


def test_tp_comm_overlap_times_a_replayed_forward_as_the_forward():
    """With userbuffers a recomputed block's forward SP calls, replayed in the backward, overlap that block's own
    GEMMs as the forward's do (tp_overlap_exposed), under full recomputation and ``--recompute-modules`` alike.
    Worked by hand on 4 dense layers at tp 2 (hide 1/2 for the all-gather, 3/4 for the reduce-scatter), T = 32
    tokens, every SP call of ``A = 32·64·2`` bytes; at 4e10 FLOP/s the qkv GEMM (2·32·64·192/2 FLOPs) hides
    all but ``call(A) − qkv/2`` of the attention all-gather and proj (2·32·64·64/2) all but ``call(A) − 0.75·proj``
    of its reduce-scatter, while fc1 and fc2 (2·32·64·256/2 each) hide the MLP's calls; the backward's own calls
    (24) hide under its dgrad and wgrad passes. So full recomputation exposes 4 attention blocks' share once more,
    selective ``mlp`` nothing more. Before: the replayed calls joined the backward's pool, credited one more
    GEMM pass under full only — full exposed nothing more and ``mlp`` (8 replayed calls beyond 2 passes) more
    than full, though it recomputes a part of what full does."""
    c = cluster(4e10)
    on = dataclasses.replace(SP, tp_comm_overlap=True)
    base = iteration_time(MODEL, on, c, StubBandwidth(), GEMM_ONLY)
    full = iteration_time(MODEL, dataclasses.replace(on, recompute="full"), c, StubBandwidth(), GEMM_ONLY)
    mlp = iteration_time(MODEL, dataclasses.replace(on, recompute="selective", recompute_modules=("mlp",)), c,
                         StubBandwidth(), GEMM_ONLY)
    T, h, f, peak = 32, 64, 256, 4e10
    qkv, proj, fc1 = 2 * T * h * 3 * h / 2 / peak, 2 * T * h * h / 2 / peak, 2 * T * h * f / 2 / peak
    A = T * h * 2
    attention = max(0.0, call(A) - qkv / 2) + max(0.0, call(A) - 0.75 * proj)
    assert attention > 0 and call(A) < fc1 / 2  # the attention block exposes some, the MLP's calls hide
    assert base.tp_comm_s > 0
    assert full.tp_comm_s - base.tp_comm_s == pytest.approx(4 * attention, rel=1e-9)
    assert mlp.tp_comm_s == pytest.approx(base.tp_comm_s, rel=1e-12)
    assert mlp.tp_comm_s <= full.tp_comm_s
