"""The MoE layer's work beyond its linear GEMMs (llmcomm.overhead.moe_time), hand-worked."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from llmcomm.overhead import iteration as it
from llmcomm.overhead import moe_time
from llmcomm.specs import load_cluster, load_model


class LinearGemm:
    """A GEMM model whose time is ``1 µs + m·n·k·b / 1e15`` seconds: easy to add by hand."""

    def time(self, m, n, k, b, dtype):  # noqa: D102 - the GemmModel interface
        m, n, k, b = (np.asarray(x, dtype=np.float64) for x in (m, n, k, b))
        return 1e-6 + m * n * k * b / 1e15 * (0.5 if dtype == "fp8" else 1.0)


def one(x):
    return np.array([x])


def test_grouped_gemm_rounds_of_four_streams():
    g = LinearGemm()
    m, n, k = one(1024), one(2048), one(512)
    mnk = 1024 * 2048 * 512 / 1e15
    # 6 experts on 4 streams: one round of 4 (b=4) and one of the remaining 2 (b=2)
    t = moe_time.grouped_gemm_seconds(g, m, n, k, one(6), "bf16")
    assert t[0] == pytest.approx((1e-6 + 4 * mnk) + (1e-6 + 2 * mnk))
    # 16 experts: four rounds of four; 3 experts: one GEMM of b=3; 4: one round
    assert moe_time.grouped_gemm_seconds(g, m, n, k, one(16), "bf16")[0] == pytest.approx(4 * (1e-6 + 4 * mnk))
    assert moe_time.grouped_gemm_seconds(g, m, n, k, one(3), "bf16")[0] == pytest.approx(1e-6 + 3 * mnk)
    assert moe_time.grouped_gemm_seconds(g, m, n, k, one(4), "fp8")[0] == pytest.approx(1e-6 + 4 * mnk / 2)


def test_fp8_pads_expert_rows_to_sixteen():
    r = moe_time.padded_rows(np.array([1000, 1024, 1]), np.array([True, True, False]))
    assert r.tolist() == [1008, 1024, 1]


def _c(tp=1, sp=False, etp=1, ep=8, fp8=False, tensorwise=False):
    return {"tp": one(tp), "sp": one(sp), "etp": one(etp), "ep": one(ep), "act_dtype": one(2),
            "fp8": one(fp8), "fp8_tensorwise": one(tensorwise)}


def test_dispatch_bytes_qwen3_30b_by_hand():
    """Qwen3-30B-A3B (h 2,048, 128 experts, top-8) at ep 8, tp 1, T = 8,192 tokens: L = 8,192, N = N_r = 65,536,
    16 local experts (both chunk sorts run), no bias."""
    m = load_model("qwen3-30b-a3b")
    permute = 2 * 2 * 65536 * 2048 + 4 * 8192 * 128 + 4 * 65536
    sort = 2 * 2 * 2 * 65536 * 2048 + 8 * 65536
    unpermute = 2 * (65536 + 8192) * 2048
    router = 4 * 4 * 8192 * 128
    got = moe_time.dispatch_bytes(m, _c(), one(8192))
    assert got[0] == pytest.approx(permute + sort + unpermute + router)
    # ep 128: one local expert, no sort
    got1 = moe_time.dispatch_bytes(m, _c(ep=128), one(8192))
    assert got1[0] == pytest.approx(permute + unpermute + router)


def test_dispatch_bytes_sequence_parallel_and_expert_tp():
    """tp 2 with SP: L = T/2 tokens; etp 2 gathers the rows of both TP ranks (N_r = 2·N); the bias (GPT-OSS)
    on the N_r expert-output rows."""
    m = load_model("gpt-oss-120b")  # h 2,880, 128 experts, top-4, add_bias_linear
    L, h = 2048, 2880
    N, Nr = L * 4, 2 * L * 4
    want = (2 * 2 * N * h + 4 * L * 128 + 4 * N) + (2 * 2 * 2 * Nr * h + 8 * Nr) + 2 * (N + L) * h \
        + 16 * L * 128 + 6 * 2 * Nr * h
    got = moe_time.dispatch_bytes(m, _c(tp=2, sp=True, etp=2, ep=8), one(4096))
    assert got[0] == pytest.approx(want)


def test_dense_model_has_no_moe_work():
    m = load_model("llama3-8b")
    assert moe_time.dispatch_bytes(m, _c(), one(4096)).tolist() == [0.0]
    assert moe_time.expert_input_cast_bytes(m, _c(fp8=True), one(4096)).tolist() == [0.0]


def test_expert_input_cast_bytes():
    m = load_model("qwen3-30b-a3b")
    Nr, h = 8192 * 8, 2048
    assert moe_time.expert_input_cast_bytes(m, _c(), one(8192))[0] == 0.0
    assert moe_time.expert_input_cast_bytes(m, _c(fp8=True), one(8192))[0] == pytest.approx(3 * Nr * h)
    assert moe_time.expert_input_cast_bytes(m, _c(fp8=True, tensorwise=True), one(8192))[0] == \
        pytest.approx(5 * Nr * h)


def _q(model, row, cluster="h100-80g-ndr400"):
    cl = load_cluster(cluster).for_world(row["tp"] * row["pp"] * row["dp"])
    t = it.candidate_table(model, pd.DataFrame([row]))
    bw, _ = it._resolve(cl, None, None)
    return it.stages(model, t, cl, bw).cls["first"]["q"], cl


def test_moe_layer_features_carry_the_dispatch_bytes():
    """The MoE layer's memory feature holds the dense-style counts plus dispatch_bytes / HBM (one forward pass)
    and the q/k norms and the query's reshape copy of layer_kernels, and its GEMM feature the grouped GEMMs of
    moe_time (measured H100 model)."""
    from llmcomm.overhead import layer_kernels
    from llmcomm.overhead import utilization as U

    m = load_model("qwen3-30b-a3b")
    row = {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 64, "seq_len": 4096,
           "attention_backend": "flash"}
    q, cl = _q(m, row)
    hbm = U.hbm_bandwidth(cl)
    c = {"tp": one(1), "sp": one(False), "etp": one(1), "ep": one(8), "act_dtype": one(2), "fp8": one(False),
         "fp8_tensorwise": one(False)}
    extra = (moe_time.dispatch_bytes(m, c, one(4096))[0] + layer_kernels.qk_norm_bytes(m, c, one(4096))[0][0]
             + layer_kernels.query_copy_bytes(m, c, one(4096))[0]) / hbm
    b, s = one(1), one(4096)
    fe = 8 * 768
    base, _ = U.layer_features(b, s, one(1), 2048, 32, 4, 128, fe, 3, cl.peak_bf16_flops, hbm, one(1), one(True),
                               activation="swiglu")
    assert q["Lm"][0, U.I["mem"]] == pytest.approx(base[0, U.I["mem"]] + extra)
    gm = it.measured_gemm(cl)
    rows = 4096 * 8 * 8 // 128
    g1 = moe_time.grouped_gemm_seconds(gm, one(rows), one(2 * 768), one(2048), one(16), "bf16")
    g2 = moe_time.grouped_gemm_seconds(gm, one(rows), one(2048), one(768), one(16), "bf16")
    assert g1[0] == pytest.approx(4 * gm.time(one(rows), one(1536), one(2048), one(4), "bf16")[0])
    shapes = it.layer_gemm_shapes(m, one(4096), one(1), one(1), one(8))
    dense = sum(gm.time(*shapes[k], "bf16")[0] for k in ("qkv", "proj"))
    router = 2.0 * 4096 * 2048 * 128 / cl.peak_bf16_flops
    assert q["Lm"][0, U.I["gemm"]] - q["Cm"][0, U.I["gemm"]] == pytest.approx(dense + g1[0] + g2[0] + router)


def test_optimizer_bytes_shards_experts_over_expert_dp():
    """GPT-OSS-like stage: 0.3 B dense parameters over dp 16, 3.6 B expert parameters over edp 2 (ep 8, pp 4 on 64
    GPUs): 40 bytes each -> 40·(0.3e9/16 + 3.6e9/2); where edp = dp the old (dense + expert)/dp, bit for bit."""
    d, e = np.array([0.3e9, 0.3e9]), np.array([3.6e9, 3.6e9])
    got = moe_time.optimizer_bytes(d, e, np.array([16, 16]), np.array([2, 16]), 40)
    assert got[0] == pytest.approx(40 * (0.3e9 / 16 + 3.6e9 / 2))
    assert got[1] == 40 * (0.3e9 + 3.6e9) / 16


def test_gpt_oss_optimizer_term_uses_expert_dp():
    """iteration_time's optimizer term on GPT-OSS 120B (tp 1, pp 4, ep 8, dp 16: edp = 16/8 = 2) is the largest
    stage's 40·(dense/16 + expert/2) bytes at HBM bandwidth (no utilization scale on the measured H100 path)."""
    m = load_model("gpt-oss-120b")
    row = {"tp": 1, "pp": 4, "dp": 16, "ep": 8, "micro_batch": 1, "global_batch": 1280, "seq_len": 4096,
           "distributed_optimizer": True}
    cl = load_cluster("h100-80g-ndr400").for_world(64)
    t = it.candidate_table(m, pd.DataFrame([row]))
    c = it.arrays(m, t, cl.gpus_per_node)
    assert int(moe_time_edp(c)) == 2
    bw, _ = it._resolve(cl, None, None)
    st = it.stages(m, t, cl, bw)
    from llmcomm import step

    layers = step.stage_classes(m, c["pp"], c["vpp"], {k: c[k] for k in step.UNEVEN})
    best = 0.0
    for cls in ("first", "mid", "last"):
        hf, hl = step.holds_edges(cls, c["pp"])
        dense, expert, _ = it._stage_params(m, c, *layers[cls], hf, hl)
        best = max(best, 40 * (float(dense[0]) / 16 + float(expert[0]) / 2))
    assert st.optimizer_bytes[0] == pytest.approx(best)


def moe_time_edp(c):
    from llmcomm.overhead import moe_fold

    return moe_fold.expert_dp(c)[0]
