"""The iteration-time formulation, term by term, against values computed by hand on a small configuration."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from conftest import TINY
from stub_bandwidth import StubBandwidth, call

from llmcomm import step
from llmcomm.errors import ConfigError
from llmcomm.overhead import Breakdown, Utilization, iteration_time, iteration_times
from llmcomm.overhead.iteration import TERMS
from llmcomm.specs import Cluster, ModelSpec, ParallelConfig

CLUSTER = Cluster(name="test", gpus_per_node=8, gpu="NVIDIA H100 test", peak_bf16_flops=1e12,
                  gpu_memory_bytes=80e9, intra_node_bandwidth=1e9, inter_node_bandwidth=1e9)
MODEL = dataclasses.replace(TINY, name="small", vocab_size=128, add_bias_linear=True,
                            position_embedding_type="learned_absolute", max_position_embeddings=32)
# hand-worked with the full score matrix: attention_backend unfused (test_attention_backend_by_hand: fused)
PAR = ParallelConfig(tp=2, pp=2, dp=2, micro_batch=1, global_batch=4, recompute="full", attention_backend="unfused")
GEMM_ONLY = Utilization(coef=(1.0, 0.0, 0.0, 0.0, 0.0))


def test_every_term_by_hand():
    b = iteration_time(MODEL, PAR, CLUSTER, StubBandwidth(), GEMM_ONLY)
    T, h = 32, 64
    # one layer's forward FLOPs on one TP rank: weight matmuls + attention core
    f_layer = 2 * T * (4 * h * h + 2 * h * 256) / 2 + 4 * T * T * 4 * 16 / 2
    f_out = 2 * T * h * 256 / 2  # output layer, vocabulary padded to 128*tp = 256
    fwd_first, fwd_last = 2 * f_layer / 1e12, (2 * f_layer + f_out) / 1e12
    rec = 2 * f_layer / 1e12
    A = T * h * 2  # activation bytes (bf16)
    mask = T * T  # the bool attention mask of the batch broadcast
    # 2 layers x (2 fwd + 2 recompute + 2 bwd) + embedding fwd; batch broadcast of tokens, positions, mask
    tp_first = 13 * call(A) + 2 * call(8 * T) + call(mask)
    # ... + output bwd AR + 3 fp32 cross-entropy ARs; broadcast of labels, loss mask, mask
    tp_last = 13 * call(A) + 3 * call(T * 4) + call(8 * T) + call(4 * T) + call(mask)
    pp_first = pp_last = call(A)  # one send per micro-batch (forward / backward)
    c_first = fwd_first * 3 + rec + tp_first + pp_first
    c_last = fwd_last * 3 + rec + tp_last + pp_last
    assert c_last > c_first
    m = 2
    assert b.critical_stage == "last"
    assert b.forward_s == pytest.approx(m * fwd_last, rel=1e-12)
    assert b.backward_s == pytest.approx(m * 2 * fwd_last, rel=1e-12)
    assert b.recompute_s == pytest.approx(m * rec, rel=1e-12)
    assert b.tp_comm_s == pytest.approx(m * tp_last, rel=1e-12)
    assert b.pp_comm_s == pytest.approx(m * pp_last, rel=1e-12)
    assert b.ep_comm_s == 0.0
    assert b.bubble_s == pytest.approx(c_first, rel=1e-12)
    # DP (fp32 gradients): layer = 8192 + 96 (QKV bias) + 16384 + 128 (FC1 bias) sharded + 384 replicated
    layer = 8192 + 96 + 16384 + 128 + 384
    first = 2 * layer + 256 * 64 // 2 + 32 * 64  # + word embedding shard + learned positions
    last = 2 * layer + 128 + 256 * 64 // 2  # + final norm + the last stage's copy of the tied embedding
    emb = call(256 * 64 // 2 * 4)
    scalars = 4 * call(4)  # gradient norm over tp·pp, train_step's two over tp·pp, the rerun int32 over the world
    dp_first = call(first * 4) + emb + scalars
    dp_last = call(last * 4) + emb + scalars + call(8)  # + the loss report over DP
    assert b.dp_comm_total_s == pytest.approx(max(dp_first, dp_last), rel=1e-12)
    assert b.dp_comm_s == pytest.approx(dp_first, rel=1e-12)
    assert b.optimizer_s == pytest.approx(40 * first / 3.35e12, rel=1e-12)
    assert b.total_s == pytest.approx(sum(getattr(b, t) for t in TERMS))
    assert b.exposed_comm_s == pytest.approx(b.tp_comm_s + b.pp_comm_s + b.dp_comm_s)
    assert b.comm_overhead == pytest.approx(b.exposed_comm_s / b.total_s)


def test_launch_floor_and_memory_terms_by_hand():
    """A layer pass is max(launch_gemm, gemm) + max(launch_mem, mem) + θ_tp·log2(tp)."""
    u = Utilization(coef=(1.0, 1.0, 1e-3, 2e-3, 5e-4))
    par = ParallelConfig(tp=2, pp=1, dp=1, micro_batch=1, global_batch=1, recompute="none")
    b = iteration_time(MODEL, par, CLUSTER, StubBandwidth(), u)
    # every layer pass is launch-bound at this size: 1e-3 + 2e-3 + 5e-4·log2(2)
    per_pass = 1e-3 + 2e-3 + 5e-4
    T, h, hbm = 32, 64, 3.35e12
    f_out = 2 * T * h * 256 / 2 / 1e12
    mem_edges = (2 * T * h + 20 * T * 256 / 2) / hbm  # embedding write + fp32 cross-entropy
    assert b.forward_s == pytest.approx(4 * per_pass + f_out + mem_edges, rel=1e-12)
    assert b.recompute_s == 0.0 and b.bubble_s == 0.0 and b.pp_comm_s == 0.0
    assert u.launch_floor() == pytest.approx(1e-3 + 2e-3, rel=1e-15)  # θ_Lg + θ_Lm, the floor above
    assert u.scaled(2.0).launch_floor() == pytest.approx(1.5e-3, rel=1e-15)


def test_utilization_curves_saturate_below_the_limit():
    from llmcomm.overhead.extrapolate import saturates_below

    curves = pd.DataFrame({"tp": [1, 1, 1, 8, 8], "hidden": [2048, 1024, 4096, 1024, 2048],
                           "utilization": [0.5, 0.2, 0.6, 0.1, 0.1]})
    assert saturates_below(curves, limit=0.6)          # rising per tp once sorted by hidden, flat counts
    assert not saturates_below(curves, limit=0.59)     # 0.6 passes the limit
    assert not saturates_below(curves.assign(utilization=[0.5, 0.2, 0.4, 0.1, 0.1]), limit=0.6)  # 0.5 -> 0.4


def test_recompute_modes_order_and_selective_is_attention_core():
    rows = pd.DataFrame([{"tp": 2, "pp": 2, "dp": 2, "global_batch": 8, "recompute": r,
                          "attention_backend": "unfused"} for r in ("none", "selective", "full")])
    out = iteration_times(MODEL, rows, CLUSTER, StubBandwidth(), GEMM_ONLY)
    none, sel, full = out["recompute_s"]
    assert none == 0 < sel < full
    T = 32
    core = 4 * T * T * 4 * 16 / 2 / 1e12  # attention core FLOPs of one layer
    m = 4
    assert sel == pytest.approx(m * 2 * core, rel=1e-12)  # 2 layers on the critical stage
    assert (out["tp_comm_s"].iloc[2] > out["tp_comm_s"].iloc[0])  # full recompute repeats the forward ARs


def test_schedules_bubble():
    base = dict(tp=1, pp=4, dp=1, global_batch=8)
    rows = pd.DataFrame([{**base, "schedule": "1f1b"}, {**base, "schedule": "gpipe"},
                         {**base, "vpp": 2, "schedule": "interleaved", "global_batch": 8}])
    m = ModelSpec(name="m8", num_layers=8, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                  vocab_size=128, seq_length=32)
    out = iteration_times(m, rows, CLUSTER, StubBandwidth(), GEMM_ONLY)
    assert out["bubble_s"].iloc[0] == pytest.approx(out["bubble_s"].iloc[1])
    assert out["bubble_s"].iloc[2] < out["bubble_s"].iloc[0]


def test_single_equals_vectorized_and_frame():
    b = iteration_time(MODEL, PAR, CLUSTER, StubBandwidth(), GEMM_ONLY)
    row = pd.DataFrame([{"tp": 2, "pp": 2, "dp": 2, "micro_batch": 1, "global_batch": 4, "recompute": "full",
                         "attention_backend": "unfused"}])
    v = iteration_times(MODEL, row, CLUSTER, StubBandwidth(), GEMM_ONLY).iloc[0]
    for t in TERMS:
        assert v[t] == pytest.approx(getattr(b, t), rel=1e-12)
    f = b.to_frame()
    assert list(f["term"]) == [t.removesuffix("_s") for t in TERMS if t != "cp_comm_s"]  # cp = 1: no cp row
    assert f["seconds"].sum() == pytest.approx(b.total_s)
    assert f["share"].sum() == pytest.approx(1.0)
    assert isinstance(b, Breakdown) and b.to_dict()["comm_overhead"] == pytest.approx(b.comm_overhead)


def test_overlap_with_one_bucket_hides_nothing():
    """A model far below the 40M-parameter bucket: each stage's buffer is one bucket, ready only when the
    backward reaches the first layer, so ``overlap_grad_reduce`` hides nothing (Megatron's buckets and schedule:
    hand-worked cases in tests/test_overhead_overlap.py)."""
    a = iteration_time(MODEL, PAR, CLUSTER, StubBandwidth(), GEMM_ONLY)
    b = iteration_time(MODEL, PAR, CLUSTER, StubBandwidth(), GEMM_ONLY, overlap_grad_reduce=True)
    assert b.dp_comm_s == pytest.approx(a.dp_comm_s, rel=1e-12)


def test_ranks_per_node_from_the_layout():
    """gpt3-1.3b tp2·pp4·dp4 on 8-GPU nodes, by hand. Default order tp-cp-ep-dp-pp (rank = tp + 2·dp + 8·pp):
    TP [0, 1] on one node; DP [0, 2, 4, 6] on one node; PP [0, 8, 16, 24] on four nodes, so a send is
    inter-node; the model-parallel group tp×pp [0, 1, 8, 9, 16, 17, 24, 25] spans 4 nodes, 2 each.
    Order pp-dp-tp (rank = pp + 4·dp + 16·tp): TP [0, 16] on two nodes (1 per node); DP [0, 4, 8, 12] on two
    (2 each); PP [0, 1, 2, 3] on one node, so every send stays inside it; mp [0, 1, 2, 3, 16, ..., 19]: 2 nodes."""
    base = dict(tp=2, pp=4, dp=4, global_batch=64)
    d = step.ranks_per_node(ParallelConfig(**base), 8)
    assert (d["tp"], d["dp"], d["pp"], d["p2p"], d["mp"], d["world"]) == ((2, 2), (4, 4), (4, 1), (2, 1), (8, 2),
                                                                          (32, 8))
    d = step.ranks_per_node(ParallelConfig(**base, order="pp-dp-tp"), 8)
    assert (d["tp"], d["dp"], d["pp"], d["p2p"], d["mp"]) == ((2, 1), (4, 2), (4, 4), (2, 2), (8, 4))


def test_order_changes_the_cost():
    """The same job under another rank order: TP across nodes (pp-dp-tp) makes the TP calls inter-node, and the
    pipeline sends intra-node, so tp_comm_s grows and pp_comm_s shrinks; the bytes do not change."""
    from llmcomm.overhead import Bandwidth

    model = __import__("llmcomm").load_model("gpt3-1.3b")
    cluster = __import__("llmcomm").load_cluster("a100-80g-hdr200")
    bw = Bandwidth.default(cluster)
    base = dict(tp=2, pp=4, dp=4, global_batch=64)
    a = iteration_time(model, ParallelConfig(**base), cluster, bw)
    b = iteration_time(model, ParallelConfig(**base, order="pp-dp-tp"), cluster, bw)
    assert b.tp_comm_s > 2 * a.tp_comm_s and b.pp_comm_s < a.pp_comm_s
    assert b.comm_bus_bytes == pytest.approx(a.comm_bus_bytes, rel=1e-12)
    # the TP term by hand: the same calls, each timed for 2 ranks on 2 nodes instead of 2 ranks on one
    t = __import__("llmcomm.overhead.iteration", fromlist=["x"])
    tab = t.candidate_table(model, __import__("llmcomm.parallel_table", fromlist=["x"]).ParallelTable.from_parallel(
        ParallelConfig(**base, order="pp-dp-tp"), model))
    c = t.arrays(model, tab, 8)
    layers = step.stage_classes(model, c["pp"], c["vpp"])
    crit = {"first": "first", "mid": "mid", "last": "last"}[b.critical_stage]
    m = 64 // 4
    want = sum(int(i.count[0]) * float(bw.time(i.op, i.nbytes[0], 2, 1)) for i in
               t.comm_items(model, t.for_class(c, crit), crit, layers[crit]) if i.term == "tp" and i.count[0] > 0)
    assert b.tp_comm_s == pytest.approx(m * want, rel=1e-9)


def test_bad_input():
    small = CLUSTER.with_nodes(1)
    with pytest.raises(ConfigError, match="holds 8"):
        iteration_time(MODEL, ParallelConfig(tp=2, pp=2, dp=4, global_batch=8), small, StubBandwidth(), GEMM_ONLY)
    tiny = Cluster(name="tiny", gpus_per_node=8, gpu="x", peak_bf16_flops=1e12, gpu_memory_bytes=1e5,
                   intra_node_bandwidth=1e9, inter_node_bandwidth=1e9)
    with pytest.raises(ConfigError, match="optimizer state"):
        iteration_time(MODEL, PAR, tiny, StubBandwidth(), GEMM_ONLY)
    with pytest.raises(ConfigError, match=r"a2a\+p2p"):
        iteration_time(MODEL, ParallelConfig(cp=2, global_batch=1, cp_comm_type="a2a+p2p"), CLUSTER,
                       StubBandwidth(), GEMM_ONLY)
    with pytest.raises(ConfigError, match="row 1"):
        iteration_times(MODEL, pd.DataFrame({"tp": [2, 3], "pp": [1, 1], "dp": [1, 1]}), CLUSTER,
                        StubBandwidth(), GEMM_ONLY)
    with pytest.raises(ConfigError, match="missing column"):
        iteration_times(MODEL, pd.DataFrame({"tp": [2]}), CLUSTER, StubBandwidth(), GEMM_ONLY)
    with pytest.raises(ConfigError, match="recompute"):
        iteration_times(MODEL, pd.DataFrame({"tp": [2], "pp": [1], "dp": [1], "recompute": ["some"]}), CLUSTER,
                        StubBandwidth(), GEMM_ONLY)


def test_defaults_use_shipped_calibration():
    """Without a bandwidth or utilization model, iteration_time reads the shipped fits (data/calibration/): the
    breakdown equals the one with them passed explicitly, and its total is today's value (pinned: a refit of
    the calibration, or a change of the formulation, must change this number on purpose)."""
    from llmcomm.overhead import Bandwidth
    from llmcomm.specs import load_cluster

    a100 = load_cluster("vtrain-a100")  # the cluster the shipped fits were measured on
    b = iteration_time(MODEL, PAR, a100)
    assert b == iteration_time(MODEL, PAR, a100, Bandwidth.default(a100), Utilization.default())
    assert b.total_s == pytest.approx(0.02139892254355538, rel=1e-9)
    assert b.comm_overhead == pytest.approx(0.08654567288926414, rel=1e-9)
    # a cluster without fits of its own: the calibration carried over by link ratio
    assert iteration_time(MODEL, PAR, CLUSTER).total_s == pytest.approx(0.021755657022514023, rel=1e-9)


def test_cached_timer_equals_bandwidth_time():
    from llmcomm.overhead import Bandwidth
    from llmcomm.overhead.iteration import _Timer
    from llmcomm.specs import load_cluster

    bw = Bandwidth.default(load_cluster("vtrain-a100"))
    t = _Timer(bw)
    rng = np.random.default_rng(0)
    n = rng.choice([1, 2, 4, 8, 16, 64, 256], 500)
    k = np.minimum(n, rng.choice([1, 2, 4, 8], 500))
    nbytes = rng.integers(1, 2**31, 500).astype(float)
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send"):
        np.testing.assert_allclose(t.time(op, nbytes, n, k), bw.time(op, nbytes, n, k), rtol=1e-12)


def test_timer_rows_equal_bandwidth_time_bit_for_bit():
    """The many-row path (``_Timer.time_rows``: every row with its own group's regime, groups of one rank and rows
    without a call among them) gives ``Bandwidth.time``'s seconds exactly, 0 where a row issues no call."""
    from llmcomm.overhead import Bandwidth
    from llmcomm.overhead.bandwidth import bus_factor
    from llmcomm.overhead.iteration import _Timer
    from llmcomm.specs import load_cluster

    rng = np.random.default_rng(1)
    for cluster in ("vtrain-a100", "h100-80g-ndr400"):
        bw = Bandwidth.default(load_cluster(cluster))
        t = _Timer(bw)
        n = rng.choice([1, 2, 4, 8, 16, 32, 64, 512], 4000)
        k = np.minimum(n, rng.choice([1, 2, 4, 8], 4000))
        nbytes = rng.integers(0, 2**31, 4000).astype(float) * rng.choice([0, 1, 1], 4000)
        live = rng.random(4000) < 0.8
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "broadcast"):
            t.reset()
            got = t.time_rows(op, bus_factor(op, n) * nbytes, n, k, live)
            want = np.where(live, bw.time(op, nbytes, n, k), 0.0)
            assert np.array_equal(got.view(np.int64), want.view(np.int64)), (cluster, op)


def test_expert_all_to_all_by_hand():
    """EP (alltoall dispatcher): per MoE layer and micro-batch, the token-count all-gather, dispatch, routing-
    probability and combine all-to-alls forward and the three all-to-alls backward (uniform routing), the
    forward ones repeated in the backward phase under full recomputation."""
    moe = ModelSpec(name="small-moe", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                    vocab_size=128, num_experts=4, moe_router_topk=2, seq_length=32, tied_embeddings=False)
    tok = round(32 * 2 * 64 * 2 / 2) * 2  # per-peer split (T·topk·h·act/ep) times ep peers
    prb = round(32 * 2 * 2 / 2) * 2  # routing probabilities (T·topk·act/ep per peer)
    cnt = 1 * 2 * 4 * 8  # token counts: E int64 gathered over tp·ep
    for rec, (n_tok, n_prb, n_cnt) in (("none", (4, 2, 1)), ("full", (6, 3, 2))):
        par = ParallelConfig(tp=1, pp=1, dp=2, ep=2, micro_batch=1, global_batch=4, recompute=rec)
        b = iteration_time(moe, par, CLUSTER, StubBandwidth(), GEMM_ONLY)
        m = 2
        per_layer = n_tok * call(tok) + n_prb * call(prb) + n_cnt * call(cnt)
        assert b.ep_comm_s == pytest.approx(m * 2 * per_layer, rel=1e-12)
        assert b.tp_comm_s == 0.0


def test_pipe_partitioned_splits_p2p_over_tp_and_adds_the_gathers():
    """DeepSpeed's PipelineEngine (``pipe_partitioned``): each TP rank sends 1/tp of the activation and of its
    gradient, and the full tensor is rebuilt by a TP all-gather (forward: on arrival; backward: own output
    and the received gradient). Off (Megatron-LM), nothing changes."""
    from llmcomm.overhead import measured
    from llmcomm.overhead.iteration import arrays, candidate_table, comm_items, for_class

    model = measured.model(2048, 16, 24, 1024)
    base = {"tp": 4, "pp": 4, "dp": 1, "micro_batch": 2, "global_batch": 8}
    items = {}
    for flag in (False, True):
        c = arrays(model, candidate_table(model, pd.DataFrame([base | {"pipe_partitioned": flag}])), 8)
        items[flag] = comm_items(model, for_class(c, "mid"), "mid", (np.array([6]), np.array([0])))
    A = 2 * 1024 * 2048 * 2
    sends = {f: [int(i.nbytes[0]) for i in its if i.op == "send" and i.count[0] > 0] for f, its in items.items()}
    assert sends[False] == [A, A] and sends[True] == [A // 4, A // 4]
    gathers = [(i.phase, int(i.count[0])) for i in items[True] if i.op == "all_gather" and i.parallelism == "pp"]
    assert sorted(gathers) == [("backward", 2), ("forward", 1)]
    assert not any(i.parallelism == "pp" and i.op == "all_gather" and i.count[0] for i in items[False])


def test_attention_backend_by_hand():
    """Fused attention (Megatron-LM's attention_backend flash/fused/auto) counts the causal half of the core's
    FLOPs and moves no score bytes; unfused counts the full score matrix and 13·b·(a/tp)·s² bytes. On MODEL (4
    layers, h 64, 4 heads of 16, s 32, tp 2, pp 2: 2 layers per stage), with θ_gemm = θ_mem = 1 and no launch
    floor, the forward pass of a stage differs by 2 layers · (F_attn/2 / peak + score bytes / HBM)."""
    both = Utilization(coef=(1.0, 1.0, 0.0, 0.0, 0.0))
    hbm = 3.35e12  # CLUSTER's "H100" entry in utilization.HBM_BANDWIDTH
    kw = dict(tp=2, pp=2, dp=2, micro_batch=1, global_batch=4)
    un = iteration_time(MODEL, ParallelConfig(**kw, attention_backend="unfused"), CLUSTER, StubBandwidth(), both)
    fu = iteration_time(MODEL, ParallelConfig(**kw, attention_backend="flash"), CLUSTER, StubBandwidth(), both)
    b, s, a, d, tp = 1, 32, 4, 16, 2
    f_attn = 4.0 * b * s * s * a * d / tp
    score = 13.0 * b * (a / tp) * s * s  # step.SCORE_BYTES: Q·Kᵀ out 2, softmax 4, dropout 4 + mask 1, scores·V in 2
    m = 2  # micro-batches
    assert un.forward_s - fu.forward_s == pytest.approx(m * 2 * (f_attn / 2 / 1e12 + score / hbm), rel=1e-9)
    assert un.backward_s - fu.backward_s == pytest.approx(2 * (un.forward_s - fu.forward_s), rel=1e-9)
    auto = iteration_time(MODEL, ParallelConfig(**kw), CLUSTER, StubBandwidth(), both)  # Megatron's default: auto
    assert auto.total_s == fu.total_s and un.tp_comm_s == fu.tp_comm_s
    from llmcomm.overhead.memory import memory

    mu, mf = memory(MODEL, ParallelConfig(**kw, attention_backend="unfused")), memory(MODEL, ParallelConfig(**kw))
    # 5·a·s bytes per token of each layer's score tensors (/tp), 16-bit: 2 layers · in-flight micro-batches
    assert mu.activations > mf.activations and mu.weights == mf.weights


def test_sums_at_once_is_the_item_by_item_loop():
    """stages' sums of one configuration's call items at once (_sums_at_once) add in item order from zero, as
    the item-by-item loop does: (0.1 + 0.2) + 0.3 is 0.6000000000000001, 0.1 + (0.2 + 0.3) is 0.6; a send feeds
    its term, its one-call seconds, its count and its bus bytes; a receive no bus bytes; a gradient bucket its kind."""
    from llmcomm.overhead.iteration import CommItem, _item_sums, _sums_at_once

    def item(term: str, op: str, phase: str = "forward", grad: str = "") -> CommItem:
        z = np.zeros(2, np.int64)
        return CommItem(term, term, op, phase, z, z, z, z, "microbatch", grad=grad)

    items = [item("tp", "all_reduce"), item("pp", "send"), item("tp", "all_reduce"), item("pp", "recv"),
             item("tp", "all_reduce"), item("dp", "reduce_scatter", "optimizer", grad="plain")]
    secs = np.array([[0.1, 1.0], [2.0, 2.0], [0.2, 1.0], [5.0, 5.0], [0.3, 1.0], [7.0, 7.0]])
    one = secs / 2
    count = np.array([[1, 1], [2, 2], [1, 1], [2, 2], [1, 1], [1, 1]])
    bus = secs * 10
    got = _sums_at_once(items, secs, one, count, bus)
    want: dict[str, np.ndarray] = {}
    for j, it in enumerate(items):
        for key, kind in _item_sums(it):
            want[key] = want.get(key, np.zeros(2)) + (secs, one, count, bus)[kind][j]
    assert got.keys() == want.keys() == {"tp", "tp_bus", "pp", "pp_sf", "pp_nf", "pp_bus", "dp", "g_plain", "g_all",
                                         "dp_bus"}
    for k in want:
        assert got[k].tobytes() == want[k].tobytes(), k
    assert got["tp"][0] == (0.1 + 0.2) + 0.3 != 0.1 + (0.2 + 0.3)
    assert got["pp"].tolist() == [7.0, 7.0] and got["pp_bus"].tolist() == [20.0, 20.0]  # the receive: no bus bytes
    assert got["pp_sf"].tolist() == [1.0, 1.0] and got["pp_nf"].tolist() == [2.0, 2.0]
    assert got["g_plain"].tolist() == [3.5, 3.5] and got["g_all"].tolist() == [7.0, 7.0]


def test_timer_rows_few_live_rows_and_shared_tables_bit_for_bit():
    """``_Timer.time_rows`` with few live rows (timed apart, ``LIVE_SHARE_APART``) and with many, one after another
    on the same arrays (the per-row regime tables built by either path and read by the other), gives
    ``Bandwidth.time``'s seconds exactly, 0 where a row issues no call."""
    from llmcomm.overhead import Bandwidth
    from llmcomm.overhead.bandwidth import bus_factor
    from llmcomm.overhead.iteration import LIVE_SHARE_APART, _Timer
    from llmcomm.specs import load_cluster

    rng = np.random.default_rng(2)
    bw = Bandwidth.default(load_cluster("h100-80g-ndr400"))
    t = _Timer(bw)
    n = rng.choice([1, 2, 4, 8, 16, 64], 3000)
    k = np.minimum(n, rng.choice([1, 2, 4, 8], 3000))
    nbytes = rng.integers(0, 2**31, 3000).astype(float)
    for op in ("all_reduce", "all_gather", "send"):
        for share in (0.05, 0.9, LIVE_SHARE_APART / 2, 1.0, 0.0):
            live = rng.random(3000) < share
            got = t.time_rows(op, bus_factor(op, n) * nbytes, n, k, live)
            want = np.where(live, bw.time(op, nbytes, n, k), 0.0)
            assert np.array_equal(got.view(np.int64), want.view(np.int64)), (op, share)
