"""Context parallelism per ``cp_comm_type``: the predictor's calls and bytes worked by hand (TransformerEngine's
AttnFuncWithCPAndKVP2P / KVAllGather / QKVOA2A, llmcomm.predict.cp), the rules, and the exposed CP time and the
attention work per CP rank in the iteration time (llmcomm.overhead.cp_time), each against numbers worked by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import TINY
from stub_bandwidth import StubBandwidth, call

from llmcomm import predict_traffic
from llmcomm.cli import main
from llmcomm.errors import ConfigError
from llmcomm.overhead import Utilization, iteration_time
from llmcomm.overhead.cp_time import exposed
from llmcomm.specs import Cluster, ParallelConfig, load_model

LLAMA3 = load_model("llama3-8b")  # h 4096, 32 query heads, 8 KV heads of 128
S, TP, CP = 8192, 2, 4
TOK = S // CP  # tokens of a CP rank
Q = TOK * (32 // TP) * 128 * 2  # 8,388,608 bytes (bf16)
K = V = TOK * (8 // TP) * 128 * 2  # 2,097,152
O_ = Q  # the attention output: as many bytes as Q
KV = K + V


def _cp_calls(kind: str) -> tuple[list, list, object]:
    p = ParallelConfig(tp=TP, cp=CP, sp=True, seq_len=S, cp_comm_type=kind)
    t = predict_traffic(LLAMA3, p)
    e = t.events
    e = e[(e["parallelism"] == "cp") & (e["rank"] == 0) & (e["layer"] == 0)]
    fwd, bwd = e[e["phase"] == "forward"], e[e["phase"] == "backward"]
    return ([(r.op, int(r.bytes)) for r in fwd.itertuples()], [(r.op, int(r.bytes)) for r in bwd.itertuples()],
            (t, e))


def test_p2p_ring_by_hand():
    """cp - 1 ring steps of K,V forward (to CP rank + 1), cp backward (to rank - 1): KV, 2KV, 2KV, KV."""
    fwd, bwd, (t, e) = _cp_calls("p2p")
    assert [x for x in fwd if x[0] == "send"] == [("send", KV)] * (CP - 1)
    assert [x for x in bwd if x[0] == "send"] == [("send", KV), ("send", 2 * KV), ("send", 2 * KV), ("send", KV)]
    m = t.matrix("direct", parallelism="cp", layer=0).toarray()
    # order tp-cp-ep-dp-pp: rank 0's CP group is 0, 2, 4, 6; forward to 2, backward to 6
    assert m[0, 2] == 3 * KV and m[0, 6] == 6 * KV and m[0, 4] == 0


def test_all_gather_by_hand():
    """Forward: all_gather K, V over the CP group (cp·K gathered bytes each); backward: the gathers again, then
    reduce_scatter dK, dV of the gathered size (context_parallel.py:3215, :3788, :4122)."""
    fwd, bwd, (t, e) = _cp_calls("all_gather")
    assert fwd == [("all_gather", CP * K), ("all_gather", CP * V)]
    assert bwd == [("all_gather", CP * K), ("all_gather", CP * V), ("reduce_scatter", CP * K),
                   ("reduce_scatter", CP * V)]
    assert all(list(g) == [0, 2, 4, 6] for g in e["group"])
    m = t.matrix("direct", parallelism="cp", layer=0).toarray()
    # direct: each gather sends the rank's shard to every peer, each reduce-scatter a 1/cp slice: 3·KV per peer,
    # the ring's 9·KV spread over three peers
    assert m[0, 2] == m[0, 4] == m[0, 6] == 3 * KV
    assert m[0].sum() == 9 * KV


def test_a2a_by_hand():
    """Forward all-to-alls of Q, K, V, then O; backward dO, then dQ, dK, dV; evenly split over the CP group."""
    fwd, bwd, (t, e) = _cp_calls("a2a")
    assert fwd == [("all_to_all", Q), ("all_to_all", K), ("all_to_all", V), ("all_to_all", O_)]
    assert bwd == [("all_to_all", O_), ("all_to_all", Q), ("all_to_all", K), ("all_to_all", V)]
    assert [list(s) for s in e["split_bytes"]][:1] == [[Q // CP] * CP]
    m = t.matrix("direct", parallelism="cp", layer=0).toarray()
    assert m[0, 2] == 2 * (Q + K + V + O_) // CP and m[0, 0] == 0


def test_cp_rules():
    with pytest.raises(ConfigError, match="cp_comm_type='a2a' needs cp=4 dividing the heads"):  # 8 KV heads / tp 4
        predict_traffic(LLAMA3, ParallelConfig(tp=4, cp=4, sp=True, seq_len=S, cp_comm_type="a2a"))
    with pytest.raises(ConfigError, match="hierarchical_context_parallel_sizes"):
        ParallelConfig(cp=4, cp_comm_type="a2a+p2p")
    with pytest.raises(ConfigError, match="is not one of"):
        ParallelConfig(cp=2, cp_comm_type="allgather")
    with pytest.raises(ConfigError, match="fused attention backend"):
        predict_traffic(LLAMA3, ParallelConfig(cp=2, seq_len=S, attention_backend="unfused"))


# ------------------------------------------------------------------------------------------------ time
CLUSTER = Cluster(name="test", gpus_per_node=8, gpu="NVIDIA H100 test", peak_bf16_flops=1e12,
                  gpu_memory_bytes=80e9, intra_node_bandwidth=1e9, inter_node_bandwidth=1e9)
GEMM_ONLY = Utilization(coef=(1.0, 0.0, 0.0, 0.0, 0.0))
M = dataclasses.replace(TINY, name="cp-small")  # 4 layers, h 64, 4 heads of 16 (MHA), FFN 256, vocab 1000


def _time(**kw):
    p = ParallelConfig(micro_batch=1, global_batch=2, **kw)  # 2 micro-batches
    return iteration_time(M, p, CLUSTER, StubBandwidth(), GEMM_ONLY)


def t_attn(s: int, cp: int) -> float:
    """One layer's fused causal attention forward on one CP rank: 4·b·s²·a·d/2/cp FLOPs at 1 TFLOP/s."""
    return 0.5 * 4 * s * s * 4 * 16 / cp / 1e12


def test_p2p_exposed_by_hand():
    """cp 2, s 1024: KV = 512 tokens · 4 heads · (16 + 16) · 2 B = 131,072 B; the forward's one step hides
    t_a/2 of it, the backward's two steps 2·t_a/2 each."""
    m, L = 2, 4
    kv = 512 * 4 * 32 * 2
    ta = t_attn(1024, 2)
    per_layer = (call(kv) - ta / 2) + 2 * (call(kv) - ta)
    b = _time(cp=2, seq_len=1024)
    assert b.cp_comm_s == pytest.approx(m * L * per_layer, rel=1e-12)
    # cp 4: 3 forward steps of KV; backward KV, 2KV, 2KV, KV, each under 2·t_a/4
    kv4, ta4 = 256 * 4 * 32 * 2, t_attn(1024, 4)
    per4 = 3 * (call(kv4) - ta4 / 4) + 2 * (call(kv4) - ta4 / 2) + 2 * (call(2 * kv4) - ta4 / 2)
    assert _time(cp=4, seq_len=1024).cp_comm_s == pytest.approx(m * L * per4, rel=1e-12)
    # full recomputation: the forward's steps again, under the recomputed forward
    full = _time(cp=2, seq_len=1024, recompute="full")
    assert full.cp_comm_s == pytest.approx(m * L * (per_layer + (call(kv) - ta / 2)), rel=1e-12)
    # s 8192: each step's kernel outlasts its transfer: nothing exposed, and no cp row in the breakdown
    hidden = _time(cp=2, seq_len=8192)
    assert 8192 // 2 * 4 * 32 * 2 * 1e-9 + 1e-6 < t_attn(8192, 2) / 2
    assert hidden.cp_comm_s == 0.0 and "cp_comm" not in set(hidden.to_frame()["term"])
    assert "cp_comm" in set(b.to_frame()["term"]) and b.exposed_comm_s > b.tp_comm_s + b.dp_comm_s


def test_all_gather_and_a2a_exposed_by_hand():
    """all_gather: 2 gathers forward, 2 gathers + 2 reduce-scatters backward, of cp·K = 2·(1024·4·16·2) B each;
    a2a: 4 all-to-alls forward and 4 backward of 1024·4·16·2 B: all exposed, per layer and micro-batch."""
    m, L, k = 2, 4, 1024 * 4 * 16 * 2
    ag = _time(cp=2, seq_len=2048, cp_comm_type="all_gather")
    assert ag.cp_comm_s == pytest.approx(m * L * 6 * call(2 * k), rel=1e-12)
    a2a = _time(cp=2, seq_len=2048, cp_comm_type="a2a")
    assert a2a.cp_comm_s == pytest.approx(m * L * 8 * call(k), rel=1e-12)
    # the compute is the same whatever the type: the attention work per rank is F_attn/cp for each
    p2p = _time(cp=2, seq_len=2048)
    assert ag.forward_s == a2a.forward_s == p2p.forward_s


def test_exposed_unit():
    cp = np.array([2, 2])
    calls = [("ring_f", np.array([3.0, 1.0]), np.array([1, 1])), ("ring_b1", np.array([3.0, 3.0]), np.array([2, 2])),
             ("exposed", np.array([0.5, 0.5]), np.array([4, 0]))]
    # step = t_a/cp = 2: forward max(0, 3 - 2), backward 2·max(0, 3 - 4); exposed 4·0.5
    assert list(exposed(calls, cp, np.array([4.0, 4.0]))) == [1.0 + 0.0 + 2.0, 0.0]


def test_cp2_at_8k_moves_attention_work():
    """cp 2 at s 8192: each rank runs its 4,096 tokens through the linear layers and the output layer and half
    of the causal attention of the whole sequence (two load-balanced chunks), not the attention of a 4,096-token
    sequence. With GEMM FLOPs only, per micro-batch and rank:
    4 layers · (98,304 FLOPs per token · 4,096 + 2·8192²·64/2) + 131,072 · 4,096 (output, vocab padded to 1,024)."""
    s, T = 8192, 4096
    linear, attn, out = 2 * (4 * 64 * 64 + 2 * 64 * 256) * T, 0.5 * 4 * s * s * 64 / 2, 2 * 64 * 1024 * T
    b = _time(cp=2, seq_len=s)
    assert b.forward_s == pytest.approx(2 * (4 * (linear + attn) + out) / 1e12, rel=1e-12)
    one = _time(cp=1, seq_len=s)
    assert one.forward_s == pytest.approx(2 * b.forward_s, rel=1e-12)  # every term halves with cp = 2
    assert 2 * attn == 0.5 * 4 * s * s * 64  # the two ranks' attention adds up to the whole sequence's (causal)
    wrong = 0.5 * 4 * T * T * 64  # F_attn of a 4,096-token sequence: a quarter of the full, not a half
    assert b.forward_s > 2 * (4 * (linear + wrong) + out) / 1e12 * 1.5


def test_dp_over_dp_cp():
    """The DP gradient all-reduce runs over dp·cp ranks: cp 2 dp 2 times it on a group of 4, like dp 4."""
    seen = []

    class Recording(StubBandwidth):
        def time(self, op, nbytes, group_size, ranks_per_node):
            if op == "all_reduce":
                seen.extend(np.atleast_1d(group_size).tolist())
            return super().time(op, nbytes, group_size, ranks_per_node)

    iteration_time(M, ParallelConfig(cp=2, dp=2, global_batch=2, seq_len=64), CLUSTER, Recording(), GEMM_ONLY)
    assert 4 in seen and 2 not in seen  # the gradients, the loss report: dp·cp; the rerun check: the world, 4


def test_cli_cp_comm_type(capsys):
    assert main(["time", "llama3-8b", "--tp", "2", "--cp", "4", "--seq-len", "32768", "--sp",
                 "--distributed-optimizer", "--cp-comm-type", "a2a", "--global-batch", "8", "--cluster",
                 "h100-80g-ndr400"]) == 0
    out = capsys.readouterr().out
    assert "cp=4 (a2a)" in out and "cp_comm" in out
    assert main(["predict", "llama3-8b", "--tp", "2", "--cp", "2", "--seq-len", "8192", "--sp",
                 "--cp-comm-type", "all_gather"]) == 0
    assert "cp /" in capsys.readouterr().out
