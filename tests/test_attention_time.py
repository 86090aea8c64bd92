"""The fused attention core at cuDNN's (flash: FlashAttention-2's) measured H100 rate and sliding-window attention
(llmcomm.overhead.attention_time), by hand, and in the iteration time."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from llmcomm.overhead import attention_time as A
from llmcomm.overhead import iteration as it
from llmcomm.parallel_table import ParallelTable
from llmcomm.specs import ParallelConfig, load_cluster, load_model


def test_rates_at_the_measured_points_and_between():
    # measured points (FlashAttention-3, Fig. 5 (d): causal forward, head dim 128, 4k: 518 TFLOP/s)
    assert A.rate("fwd", 128, 4096, causal=True) == pytest.approx(518e12)
    assert A.rate("fwd", 64, 16384, causal=False) == pytest.approx(413e12)
    # halfway in log2(s) between 2k and 4k, and halfway in d between 64 and 128
    assert A.rate("fwd", 128, 2 ** 11.5, causal=True) == pytest.approx((484 + 518) / 2 * 1e12)
    assert A.rate("fwd", 96, 4096, causal=True) == pytest.approx((363 + 518) / 2 * 1e12)
    # held at the ends: s < 512 at 512's rate, d > 128 at 128's
    assert A.rate("fwd", 128, 128, causal=True) == pytest.approx(315e12)
    assert A.rate("fwd", 192, 4096, causal=True) == pytest.approx(518e12)


def test_causal_backward_scaled_by_the_forward_causal_ratio():
    # not published: non-causal backward (Fig. 6 (b), 4k: 499) x forward causal/non-causal (518/609)
    assert A.rate("bwd", 128, 4096, causal=True) == pytest.approx(499 * 518 / 609 * 1e12)
    assert A.rate("bwd", 128, 4096, causal=False) == pytest.approx(499e12)


def test_flash_backend_runs_at_flashattention2s_rate():
    # FlashAttention-2's bars of the same figures (Fig. 5 (d) causal forward d128 at 4k: 319; Fig. 6 (b) backward
    # d128 at 4k: 310, non-causal forward Fig. 5 (c) 4k: 368), cuDNN's where the mask is off
    assert A.rate("fwd", 128, 4096, causal=True, flash=True) == pytest.approx(319e12)
    assert A.rate("bwd", 128, 4096, causal=True, flash=True) == pytest.approx(310 * 319 / 368 * 1e12)
    assert A.rate("fwd", 64, 512, causal=True, flash=True) == pytest.approx(180e12)
    got = A.rate("fwd", 128, np.array([4096.0, 4096.0]), causal=True, flash=np.array([True, False]))
    assert got == pytest.approx([319e12, 518e12])
    # one layer of Llama-3 8B at 8k (causal FLOPs 2·8192²·32·128): FlashAttention-2 at 333 and (318·333/370) TFLOP/s
    f = np.array([2.0 * 8192 ** 2 * 32 * 128])
    t_f, t_b = A.core_seconds(f, 128, np.array([8192.0]), np.array([8192.0]), flash=True)
    assert t_f[0] == pytest.approx(f[0] / 333e12)
    assert t_b[0] == pytest.approx(2.5 * f[0] / (318 * 333 / 370 * 1e12))


def test_window_pairs_by_hand():
    # s = 10 queries, a window of 3 to the left: min(i, 4) summed = 1 + 2 + 3 + 4·7 = 34
    assert A.window_pairs(np.array([10.0]), 3)[0] == 34
    # a window wider than the sequence is the causal triangle
    assert A.window_pairs(np.array([10.0]), 50)[0] == 55


def test_windowed_share_follows_megatron():
    # is_layer_window_attention: layer l (1-indexed) windowed unless l % k == 0
    assert A.windowed_share(36, 128, 2) == 0.5
    assert A.windowed_share(5, 128, 2) == pytest.approx(3 / 5)
    assert A.windowed_share(36, 128, None) == 1.0
    assert A.windowed_share(36, None, 2) == 0.0


def test_core_seconds_by_hand():
    f = np.array([1e12])
    t_f, t_b = A.core_seconds(f, 128, np.array([4096.0]), np.array([4096.0]))
    assert t_f[0] == pytest.approx(1e12 / 518e12)
    assert t_b[0] == pytest.approx(2.5e12 / (499 * 518 / 609 * 1e12))
    # half the layers windowed (w = 127, the kernel's key extent 128 -> 512's rate): the windowed half computes
    # pairs(4096, 127) / (4096·4097/2) of the causal FLOPs
    s = np.array([4096.0])
    t_fw, t_bw = A.core_seconds(f, 128, s, s, window_size=127, windowed=0.5)
    share = (128 * 129 / 2 + (4096 - 128) * 128) / (4096 * 4097 / 2)
    assert t_fw[0] == pytest.approx(0.5e12 / 518e12 + 0.5e12 * share / 315e12)
    assert t_bw[0] == pytest.approx(0.5 * 2.5e12 / (499 * 518 / 609 * 1e12)
                                    + 0.5 * 2.5e12 * share / (305 * 315 / 497 * 1e12))


def _config(**kw):
    base = dict(tp=1, pp=1, dp=8, micro_batch=1, global_batch=32, seq_len=4096, attention_backend="fused",
                distributed_optimizer=True)
    base.update(kw)
    return ParallelConfig(**base)


@pytest.mark.parametrize("backend", ["fused", "flash"])
def test_backward_beyond_twice_forward_is_the_measured_attention_backward(backend):
    """Llama-3 8B on one H100, fused attention: backward − 2·forward = m · layers · (t_bwd − 2·t_fwd) of one
    layer's attention core, its causal FLOPs 2·b·s²·a·d = 2·4096²·32·128; cuDNN's kernel under ``fused``,
    FlashAttention-2's under ``flash``."""
    model, cl = load_model("llama3-8b"), load_cluster("h100-80g-ndr400").for_world(8)
    b = it.iteration_time(model, _config(attention_backend=backend), cl)
    f = 2.0 * 4096 ** 2 * 32 * 128
    t_f, t_b = A.core_seconds(np.array([f]), 128, np.array([4096.0]), np.array([4096.0]), flash=backend == "flash")
    assert b.backward_s - 2 * b.forward_s == pytest.approx(4 * 32 * (t_b[0] - 2 * t_f[0]), rel=1e-9)


def test_flash_backend_slower_than_cudnn_by_the_attention_core_alone():
    """The same configuration under ``flash`` and ``fused``: only the attention core's seconds differ, by the
    FlashAttention-2/cuDNN rates (forward m·layers·F·(1/R_fa2 − 1/R_cudnn))."""
    model, cl = load_model("llama3-8b"), load_cluster("h100-80g-ndr400").for_world(8)
    fu = it.iteration_time(model, _config(attention_backend="fused"), cl)
    fl = it.iteration_time(model, _config(attention_backend="flash"), cl)
    f = 2.0 * 4096 ** 2 * 32 * 128
    assert fl.forward_s - fu.forward_s == pytest.approx(4 * 32 * f * (1 / 319e12 - 1 / 518e12), rel=1e-9)
    assert fl.tp_comm_s == fu.tp_comm_s and fl.dp_comm_s == fu.dp_comm_s


def test_a100_keeps_backward_twice_forward():
    """No measured kernel model on A100: the utilization fit's terms as before (backward = 2·forward)."""
    model, cl = load_model("llama3-8b"), load_cluster("a100-80g-hdr200").for_world(8)
    b = it.iteration_time(model, _config(), cl)
    assert b.backward_s == pytest.approx(2 * b.forward_s, rel=1e-12)


def test_sliding_window_shortens_the_attention_time():
    """GPT-OSS's window (128 on every other layer) against the same model without it: the windowed half of the
    layers computes pairs(4096, w) of the causal pairs at the short kernel's rate (core_seconds)."""
    oss = load_model("gpt-oss-120b")
    full = dataclasses.replace(oss, window_size=None, window_attn_skip_freq=None)
    cl = load_cluster("h100-80g-ndr400").for_world(32)
    p = _config(pp=4, dp=8, ep=8, global_batch=8)  # one micro-batch per rank, 9 layers per stage
    bw, bf = it.iteration_time(oss, p, cl), it.iteration_time(full, p, cl)
    assert bw.forward_s < bf.forward_s
    s = np.array([4096.0])
    f = np.array([2.0 * 4096 ** 2 * 64 * 64])
    tw, _ = A.core_seconds(f, 64, s, s, oss.window_size, 0.5)
    tf, _ = A.core_seconds(f, 64, s, s)
    assert bf.forward_s - bw.forward_s == pytest.approx(9 * (tf[0] - tw[0]), rel=1e-9)


def test_output_layer_timed_by_the_measured_gemm_model():
    """The logits GEMM (T × V'/tp × h, BF16) on the last stage: the measured model's seconds, not FLOPs/peak."""
    model, cl = load_model("llama3-8b"), load_cluster("h100-80g-ndr400").for_world(16)
    t = ParallelTable.from_parallel(_config(pp=2), model)
    st = it.stages(model, it.candidate_table(model, t), cl, it._resolve(cl, None, None)[0])
    g = it.measured_gemm(cl)
    e = st.cls["last"]["q"]["E"][0, 0]
    assert e == pytest.approx(float(g.time(4096, model.padded_vocab_size(1), 4096, 1, "bf16")), rel=1e-12)
    assert e > 2.0 * 4096 * model.padded_vocab_size(1) * 4096 / cl.peak_bf16_flops


def test_unfused_core_matmuls_by_the_measured_gemm_model():
    """Unfused on H100: Q·Kᵀ and scores·V as b·a/tp batched GEMMs (s×s×d, s×d×s) timed by the measured model."""
    model, cl = load_model("llama3-8b"), load_cluster("h100-80g-ndr400").for_world(8)
    t = ParallelTable.from_parallel(_config(attention_backend="unfused"), model)
    st = it.stages(model, it.candidate_table(model, t), cl, it._resolve(cl, None, None)[0])
    g = it.measured_gemm(cl)
    want = float(g.time(4096, 4096, 128, 32, "bf16") + g.time(4096, 128, 4096, 32, "bf16"))
    assert st.cls["first"]["q"]["Cd"][0, 0] == pytest.approx(want, rel=1e-12)
    assert "Bd" not in st.cls["first"]["q"] or st.cls["first"]["q"]["Bd"][0, 0] == 0.0


def test_fused_backward_extra_enters_the_passes_max() -> None:
    """``backward_beyond_twice``: the fused core's extra backward matmul time is hidden under a launch-bound
    pass's floor and added in full on a matmul-bound one; exactly 0 without it (hand-worked, θ = 1)."""
    from llmcomm.overhead import utilization as U

    util = U.Utilization(coef=(1.0, 1.0, 1.0, 1.0, 0.0))  # θ_gemm, θ_mem, launch floors (s), θ_tp
    L = np.zeros((3, U.K))
    L[:, U.I["launch_gemm"]] = 10.0  # a 10 s launch floor of the matmuls of one pass
    L[:, U.I["gemm"]] = (2.0, 7.0, 3.0)  # matmuls 2 s (launch-bound), 7 s, 3 s
    B = np.zeros((3, U.K))
    B[:, U.I["gemm"]] = (4.0, 4.0, 0.0)
    # backward: max(20, 2·g + b): row 0 max(20, 8) = 20 (hidden, +0); row 1 max(20, 18) = 20 vs 2·max(10, 7) = 20
    # (+0); doubling the floor hides it too. A matmul-bound row: floor 1 s
    assert it.backward_beyond_twice(util, L, B).tolist() == [0.0, 0.0, 0.0]
    L[:, U.I["launch_gemm"]] = 1.0
    assert it.backward_beyond_twice(util, L, B).tolist() == [4.0, 4.0, 0.0]
    L[1, U.I["launch_gemm"]] = 8.0  # 2·7 + 4 = 18 against the doubled floor 16 and 2·max(8, 7) = 16: +2
    assert it.backward_beyond_twice(util, L, B)[1] == 2.0
