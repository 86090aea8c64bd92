"""Megatron-LM's overlap of the DP gradient reduction, the pipeline send/recv and the MoE all-to-alls with compute
(llmcomm.overhead.overlap), each on a case worked by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from stub_bandwidth import StubBandwidth, call

from llmcomm import load_model, step
from llmcomm.errors import ConfigError
from llmcomm.overhead import Utilization, iteration_time
from llmcomm.overhead import overlap as O
from llmcomm.predict import dp
from llmcomm.predict.calls import Context
from llmcomm.specs import Cluster, ModelSpec, ParallelConfig

MODEL = ModelSpec(name="small", num_layers=4, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                  vocab_size=128, add_bias_linear=True, position_embedding_type="learned_absolute",
                  max_position_embeddings=32, seq_length=32)
MOE = ModelSpec(name="small-moe", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                vocab_size=128, seq_length=32, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128)
GEMM_ONLY = Utilization(coef=(1.0, 0.0, 0.0, 0.0, 0.0))


def cluster(peak: float) -> Cluster:
    return Cluster(name="test", gpus_per_node=8, gpu="test GPU", peak_bf16_flops=peak, gpu_memory_bytes=80e9,
                   intra_node_bandwidth=1e9, inter_node_bandwidth=1e9)


SLOW, FAST = cluster(1e6), cluster(1e30)  # compute of seconds (hides every call) or of nothing


def one(x):
    return np.array([x], dtype=np.float64)


# ------------------------------------------------------------------------------ the equations, by hand
def test_pipelined_exposed_by_hand():
    # 4 buckets of 1 s filling over a 10 s backward: only the last one waits; over 2 s: the queue outruns it
    assert O.pipelined_exposed(one(4.0), one(10.0), one(4))[0] == pytest.approx(1.0)
    assert O.pipelined_exposed(one(4.0), one(2.0), one(4))[0] == pytest.approx(4.0 - 2.0 * 3 / 4)
    assert O.pipelined_exposed(one(4.0), one(100.0), one(1))[0] == pytest.approx(4.0)  # one bucket: all of it


def test_grad_reduce_exposed_by_hand():
    v, L, b = one(2), one(2), one(1.0)
    # stage 0, interleaved: chunk 1 (2 s) launched 2 steps before the end, chunk 0 (3 s, the embedding's) at the
    # end: 3 s exposed; with chunk 1 of 5 s its queue runs 3 s past the end and delays chunk 0: 6 s
    args = dict(first=True, v=v, L=L, b=b, lead=0.0, bucketed0=one(99.0))  # (1F1B only)
    assert O.grad_reduce_exposed(one(3.0), one(2.0), 0, one(0.5), **args)[0] == pytest.approx(3.5)
    assert O.grad_reduce_exposed(one(3.0), one(5.0), 0, one(0.0), **args)[0] == pytest.approx(6.0)
    # stage 3 (lead 3 steps), no edge chunk: chunk 1 would launch 2 steps before stage 0's end but stage 3 has
    # ended 3 steps before it, chunk 0 after its end: both at -3, serially: -3 + 2 + 2 = 1
    a3 = dict(args, first=False, lead=one(3.0))
    assert O.grad_reduce_exposed(one(0.0), one(2.0), -1, one(0.0), **a3)[0] == pytest.approx(1.0)
    # align_grad_reduce=False: each stage launches a chunk when it finishes it. Stage 0, chunk 1 (1 s) at -2, its
    # bucketed chunk 0 (3 s in one call, 1 s past its backward when bucketed) queues behind: done at 2 (aligned: 3)
    un = dict(args, align=False, bucketed0=one(1.0))
    assert O.grad_reduce_exposed(one(3.0), one(1.0), 0, one(0.0), **un)[0] == pytest.approx(2.0)
    assert O.grad_reduce_exposed(one(3.0), one(1.0), 0, one(0.0), **dict(un, align=True))[0] == pytest.approx(3.0)
    # stage 3: chunk 1 at -(2 + 3) = -5, chunk 0 at -3: done at -1 (aligned: chunk 1 at -3, chunk 0 at 1)
    assert O.grad_reduce_exposed(one(0.0), one(2.0), -1, one(0.0), **dict(a3, align=False))[0] == pytest.approx(-1.0)
    # 1F1B (v = 1), stage 0: its bucketed first chunk (given) and the rest (0.5 s)
    a1 = dict(args, v=one(1), bucketed0=one(1.0))
    assert O.grad_reduce_exposed(one(4.0), one(0.0), 0, one(0.5), **a1)[0] == pytest.approx(1.5)
    # 4 buckets of 1 s, ready at 1/4, 1/2, 3/4 and the end of a 10 s backward: only the last waits (1 s); over
    # a 2 s backward the queue started at 0.5 s runs to 4.5 s: 2.5 s past the end
    ready, before = np.array([0.25, 0.5, 0.75, 1.0]), np.array([0.0, 0.25, 0.5, 0.75])
    assert O.first_chunk_exposed(np.array([4.0, 4.0]), np.array([10.0, 2.0]), ready, before).tolist() == \
        pytest.approx([1.0, 2.5])
    # 1F1B, a later stage: its one bucket after its cool-down, r steps before stage 0 ends (as without overlap)
    a2 = dict(args, first=False, v=one(1), lead=one(3.0))
    assert O.grad_reduce_exposed(one(0.0), one(4.0), -1, one(0.5), **a2)[0] == pytest.approx(4.0 - 3.0 + 0.5)


def test_p2p_and_a2a_equations_by_hand():
    # 2 forward sends of 3 s under 1 s of backward, 1 backward send of 3 s under 5 s of forward
    assert O.p2p_exposed(one(2), one(3.0), one(1), one(3.0), one(5.0), one(1.0))[0] == pytest.approx(4.0)
    # combine 2 under attention 1 (fwd) and 2 (bwd); 2 dispatches of 2 under 3 x MLP 1
    assert O.a2a_pair_exposed(one(2.0), one(2.0), one(1.0), one(1.0))[0] == pytest.approx(1.0 + 1.0 + 0.0)
    assert O.a2a_pair_exposed(one(2.0), one(2.0), one(9.0), one(9.0))[0] == 0.0
    m, pp, v = np.array([4, 8]), np.array([1, 2]), np.array([1, 2])
    # pp = 1: the first forward and the last backward are alone; pp=2, v=2, stage 0: 2 + 1*2 = 4 warm-up of 16
    assert O.paired_share(m, pp, v, 0, np.array([1, 2])).tolist() == pytest.approx([3 / 4, 1 - 4 / 16])


# --------------------------------------------------------------------- the bucket rule: one home, two users
def test_bucket_rule_is_the_predictors():
    m = load_model("gpt3-1.3b")
    p = ParallelConfig(tp=1, pp=2, dp=8, vpp=2, global_batch=64, overlap_grad_reduce=True, bucket_size=20_000_000)
    ctx = Context(m, p)
    assert [dp.chunk_bucket_size(ctx, s, c) for s in (0, 1) for c in (0, 1)] == [20_000_000, None, None, None]
    assert dp.chunk_is_bucketed(True, np.array([0, 0, 1]), np.array([0, 1, 0])).tolist() == [True, False, False]
    assert dp.bucket_elements(8, 2, None, None, 0) == 40_000_000 and dp.bucket_elements(64, 1, -1, -1, 0) == 64e6
    # the formulation's profile of stage 0's first-chunk buckets is the predictor's layout
    bl = dp.buckets(ctx, 0, 0)
    ready, before = O.bucket_profile(m, p)
    sizes = np.array([b.numel for b in bl], dtype=float)
    assert len(ready) == len(bl) > 1 and ready[-1] == 1.0 and np.all(np.diff(ready) >= 0)
    assert before.tolist() == pytest.approx((np.cumsum(sizes) - sizes) / sizes.sum())
    assert [len(dp.buckets(ctx, s, c)) for s, c in ((0, 1), (1, 0), (1, 1))] == [1, 1, 1]  # not bucketed


# ------------------------------------------------------------------ overlap_grad_reduce in iteration_time
def _params(nd: int, first: bool, last: bool) -> int:
    o = np.ones(1, np.int64)
    d, e, _ = step.stage_parameters(MODEL, o, o, o, 2 * o, nd * o, 0 * o, np.array([first]), np.array([last]))
    return int(d[0] + e[0])


def test_grad_reduce_1f1b_stage0_buckets_by_hand():
    """pp = 1, dp = 2, buckets of a quarter of the parameters: under a backward of seconds only the last bucket
    (its share of the one-call time; the embedding's, ready at the end) and the calls after finish_grad_sync
    (world and loss all-reduces, 4 and 8 bytes) stay exposed; with a backward of no time the whole reduction
    is, as without overlap."""
    o = np.ones(1, np.int64)
    d, e, _ = step.stage_parameters(MODEL, o, o, o, o, 4 * o, 0 * o, o > 0, o > 0)
    P = int(d[0] + e[0])
    par = ParallelConfig(dp=2, global_batch=4, overlap_grad_reduce=True, bucket_size=-(-P // 4),
                         attention_backend="unfused")
    bl = dp.buckets(Context(MODEL, par), 0, 0)
    assert len(bl) > 1 and bl[-1].layer == -1  # the last bucket holds the embedding
    rest = call(4) + call(8)
    slow = iteration_time(MODEL, par, SLOW, StubBandwidth(), GEMM_ONLY)
    assert slow.dp_comm_s == pytest.approx(call(4 * P) * bl[-1].numel / P + rest, rel=1e-12)
    fast = iteration_time(MODEL, par, FAST, StubBandwidth(), GEMM_ONLY)
    assert fast.dp_comm_s == pytest.approx(call(4 * P) + rest, rel=1e-12)
    off = iteration_time(MODEL, dataclasses.replace(par, overlap_grad_reduce=False), SLOW, StubBandwidth(),
                         GEMM_ONLY)
    assert off.dp_comm_s == pytest.approx(call(4 * P) + rest, rel=1e-12)


def test_grad_reduce_interleaved_first_layers_are_exposed():
    """pp = 2, vpp = 2 (one layer per chunk), dp = 2, compute of seconds: every chunk's reduction hides behind
    the backward still to run on stage 0 except stage 0's chunk 0 (embedding + layer 0), dispatched after the
    last backward; even split into 4 buckets it hides behind nothing (no_sync during the chunk's own last
    backward). Without overlap the exposed time is stage 0's whole reduction, so the difference is exactly
    stage 0's chunk-1 call."""
    layer = _params(1, False, False)
    base = ParallelConfig(pp=2, dp=2, vpp=2, global_batch=8, attention_backend="unfused")
    off = iteration_time(MODEL, base, SLOW, StubBandwidth(), GEMM_ONLY)
    on = iteration_time(MODEL, dataclasses.replace(base, overlap_grad_reduce=True), SLOW, StubBandwidth(), GEMM_ONLY)
    assert on.dp_comm_s == pytest.approx(off.dp_comm_s - call(4 * layer), rel=1e-12)
    chunk0 = _params(1, True, False)
    four = dataclasses.replace(base, overlap_grad_reduce=True, bucket_size=-(-chunk0 // 4))
    assert iteration_time(MODEL, four, SLOW, StubBandwidth(), GEMM_ONLY).dp_comm_s == pytest.approx(
        on.dp_comm_s, rel=1e-12)
    # --no-align-grad-reduce: stage 0 dispatches chunk 0's buckets as they fill; the last two wait: the one that
    # holds layer 0's first tensors (their gradients are the backward's last) and the embedding's
    bl = dp.buckets(Context(MODEL, four), 0, 0)
    assert len(bl) == 4 and bl[-2].layer == 0 and bl[-1].layer == -1
    free = iteration_time(MODEL, dataclasses.replace(four, align_grad_reduce=False), SLOW, StubBandwidth(), GEMM_ONLY)
    tail = (bl[-2].numel + bl[-1].numel) / chunk0
    assert free.dp_comm_s == pytest.approx(on.dp_comm_s - call(4 * chunk0) * (1 - tail), rel=1e-12)


# --------------------------------------------------------------------------------------- overlap_p2p_comm
def test_overlap_p2p_comm_by_hand():
    """Interleaved pp = 2, vpp = 2: per micro-batch stage 0 sends 2 activations forward and 1 gradient backward
    (b·s·h·2 = 4,096 bytes each). Under compute of seconds every send hides; with no compute nothing does;
    without interleaving the flag is off (as Megatron sets it)."""
    base = ParallelConfig(pp=2, dp=1, vpp=2, global_batch=4, attention_backend="unfused")
    on = dataclasses.replace(base, overlap_p2p_comm=True)
    off = iteration_time(MODEL, base, SLOW, StubBandwidth(), GEMM_ONLY)
    assert off.pp_comm_s == pytest.approx(4 * 3 * call(32 * 64 * 2), rel=1e-12)  # m = 4, either stage: 3 sends
    assert iteration_time(MODEL, on, SLOW, StubBandwidth(), GEMM_ONLY).pp_comm_s == 0.0
    assert iteration_time(MODEL, on, FAST, StubBandwidth(), GEMM_ONLY).pp_comm_s == pytest.approx(
        iteration_time(MODEL, base, FAST, StubBandwidth(), GEMM_ONLY).pp_comm_s, rel=1e-12)
    plain = ParallelConfig(pp=2, global_batch=4, attention_backend="unfused")
    assert iteration_time(MODEL, dataclasses.replace(plain, overlap_p2p_comm=True), SLOW, StubBandwidth(),
                          GEMM_ONLY).pp_comm_s == iteration_time(MODEL, plain, SLOW, StubBandwidth(),
                                                                 GEMM_ONLY).pp_comm_s


# ---------------------------------------------------------------------------------------- moe_a2a_overlap
def test_moe_a2a_overlap_by_hand():
    """pp = 1, dp = ep = 2, m = 4: per micro-batch and MoE layer 2 token all-to-alls (T·k·h·2 = 8,192 bytes)
    and 1 of probabilities (T·k·2 = 128 bytes) each way. Under compute of seconds the 3 paired micro-batches
    hide them all: ep_comm_s drops by 3/4 of the all-to-all seconds."""
    par = ParallelConfig(dp=2, ep=2, global_batch=8, attention_backend="unfused")
    a2a = 2 * 2 * (2 * call(32 * 2 * 64 * 2) + call(32 * 2 * 2))  # 2 layers x (fwd + bwd), per micro-batch
    off = iteration_time(MOE, par, SLOW, StubBandwidth(), GEMM_ONLY)
    on = iteration_time(MOE, dataclasses.replace(par, moe_a2a_overlap=True), SLOW, StubBandwidth(), GEMM_ONLY)
    assert off.ep_comm_s - on.ep_comm_s == pytest.approx(4 * 0.75 * a2a, rel=1e-12)
    fast = iteration_time(MOE, dataclasses.replace(par, moe_a2a_overlap=True), FAST, StubBandwidth(), GEMM_ONLY)
    assert fast.ep_comm_s == pytest.approx(iteration_time(MOE, par, FAST, StubBandwidth(), GEMM_ONLY).ep_comm_s,
                                           rel=1e-12)


def test_overlap_rules_name_the_mechanism():
    bw = StubBandwidth()
    with pytest.raises(ConfigError, match="ep > 1"):
        iteration_time(MOE, ParallelConfig(dp=2, moe_a2a_overlap=True, global_batch=2), SLOW, bw, GEMM_ONLY)
    with pytest.raises(ConfigError, match="needs vpp > 1"):
        iteration_time(MOE, ParallelConfig(pp=2, dp=2, ep=2, moe_a2a_overlap=True, global_batch=4), SLOW, bw,
                       GEMM_ONLY)
    with pytest.raises(ConfigError, match="recompute"):
        iteration_time(MOE, ParallelConfig(dp=2, ep=2, recompute="full", moe_a2a_overlap=True, global_batch=2),
                       SLOW, bw, GEMM_ONLY)
    with pytest.raises(ConfigError, match="HybridEP kernels"):
        iteration_time(MOE, ParallelConfig(dp=2, ep=2, moe_flex_dispatcher_backend="hybridep", global_batch=2),
                       SLOW, bw, GEMM_ONLY)
    with pytest.raises(ConfigError, match="moe_flex_dispatcher_backend"):
        ParallelConfig(moe_flex_dispatcher_backend="nvshmem")


def test_time_takes_the_overlap_flags(capsys) -> None:
    """`llmcomm time` takes --overlap-p2p-comm, --moe-a2a-overlap and --moe-flex-dispatcher-backend and each
    reaches the formulation: the interleaved sends and the MoE all-to-alls hide (shorter), flex is refused."""
    from llmcomm.cli import main

    def total(*args: str) -> float:
        assert main(["time", *args, "--cluster", "h100-80g-ndr400", "-q"]) == 0
        return float(capsys.readouterr().out.split()[0])

    dense = ("gpt3-175b", "--tp", "8", "--pp", "8", "--dp", "4", "--vpp", "2", "--sp", "--global-batch", "256",
             "--recompute", "selective", "--distributed-optimizer", "--overlap-grad-reduce")
    assert total(*dense, "--overlap-p2p-comm") < total(*dense)
    assert total(*dense, "--no-align-grad-reduce") != total(*dense)
    moe = ("qwen3-30b-a3b", "--dp", "16", "--ep", "16", "--global-batch", "256", "--recompute", "selective")
    assert total(*moe, "--moe-a2a-overlap") < total(*moe)
    assert main(["time", *moe, "--moe-flex-dispatcher-backend", "deepep", "--cluster", "h100-80g-ndr400"]) != 0
    assert "DeepEP/HybridEP kernels" in capsys.readouterr().err


def test_grad_reduce_interleaved_paced_by_the_slowest_stage_by_hand():
    # pp = 2, v = 2, L = 2. Stage 0's backward step 1 s per chunk (2 s over 2 chunks), the last stage's 3 s: in
    # the cool-down stage 0 waits for each gradient of stage 1, so its chunk 1 ends 2 paced steps (2·3 s) before
    # its end, not 2·1 s. Chunk 1 (4 s) launched at -6 s ends at -2 s, chunk 0 (1 s, at the end): exposed 1 s
    # (stage 0's own pace: chunk 1 from -2 s to 2 s, chunk 0 after it: 3 s). The last stage has nothing to reduce.
    from types import SimpleNamespace

    def cls(edge, plain):
        return {"g_edge": one(edge), "g_shared": one(0.0), "g_expert": one(0.0), "g_plain": one(plain),
                "g_all": one(edge + plain)}

    def per(bwd, dp_):
        return {"bwd": one(bwd), "rec": one(0.0), "tp": one(0.0), "ep": one(0.0), "pp": one(0.0), "dp": one(dp_)}

    st = SimpleNamespace(vpp=np.array([2]), pp=np.array([2]), vp_last_group=np.array([2]), grad_buckets=[],
                         align_grad_reduce=None, cls={"first": cls(1.0, 4.0), "mid": cls(0.0, 0.0),
                                                      "last": cls(0.0, 0.0)})
    p = {"first": per(2.0, 5.0), "mid": per(0.0, 0.0), "last": per(6.0, 0.0)}
    out = O.stage_grad_reduce(st, p, np.array([False]), np.array([True]))
    assert out[0] == pytest.approx(1.0)
    # stage 0 the slowest (last stage's step 0.5 s): its own pace, chunk 1 from -2 s to 2 s, chunk 0 after: 3 s
    p["last"] = per(1.0, 0.0)
    assert O.stage_grad_reduce(st, p, np.array([False]), np.array([True]))[0] == pytest.approx(3.0)


def test_more_recomputation_is_never_faster_deepseek_moe():
    # DeepSeek-MoE 16B (dense first layer, MoE after it) on 1,024 H100s: recompute none <= selective (mlp) /
    # selective (moe) <= full, over interleaved and 1F1B pipelines with and without overlap_grad_reduce; before
    # the cool-down pace, selective (mlp) (stage 0's dense layer recomputed, stage 0 not critical) hid more of the
    # chunk reductions than it added: 0.47 % faster than none at tp=1 pp=4 dp=256 ep=2 vpp=7
    import pandas as pd

    from llmcomm.overhead import iteration_times
    from llmcomm.specs import load_cluster
    model, cl = load_model("deepseek-moe-16b"), load_cluster("h100-80g-ndr400", num_nodes=128)
    rows = [dict(tp=tp, pp=pp, dp=1024 // (tp * pp), ep=ep, vpp=v, micro_batch=1, global_batch=2048, sp=tp > 1,
                 overlap_grad_reduce=ogr)
            for tp, pp, ep, v in ((1, 4, 2, 7), (1, 4, 8, 1), (2, 2, 4, 2), (2, 4, 8, 7), (1, 2, 1, 2))
            for ogr in (False, True)]
    base = pd.DataFrame(rows)
    tot = {}
    for name, rec, mods in (("none", "none", None), ("mlp", "selective", ("mlp",)), ("moe", "selective", ("moe",)),
                            ("full", "full", None)):
        d = base.assign(recompute=rec)
        d["recompute_modules"] = [mods] * len(d)
        tot[name] = iteration_times(model, d, cl, interval=False)["total_s"].to_numpy()
    for a, b in (("none", "mlp"), ("none", "moe"), ("mlp", "full"), ("moe", "full")):
        assert np.all(tot[b] >= tot[a] * (1 - 1e-12)), (a, b, base[tot[b] < tot[a]])
