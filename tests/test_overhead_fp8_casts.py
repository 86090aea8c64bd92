"""FP8 casts and transposes under delayed scaling, per GEMM operand as TransformerEngine 1.x runs them
(llmcomm.overhead.fp8_casts), by hand, and how the formulation carries them (forward in the layer pass, the
backward's beyond twice the forward in Bd/Bm)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from llmcomm.overhead import fp8_casts, iteration
from llmcomm.overhead import utilization as U
from llmcomm.specs import ParallelConfig, load_cluster, load_model


def _shapes(T, h, ad, gd2, f, tp):
    one = np.array([1])
    T = np.array([T])
    return {"qkv": (T, (ad + gd2) // tp * one, h * one, one), "proj": (T, h * one, ad // tp * one, one),
            "fc1": (T, f // tp * one, h * one, one), "fc2": (T, h * one, f // tp * one, one)}


def test_sp_layer_by_hand():
    """Nemotron-3 8B's layer on one rank: T = 16,384 tokens, h = 4096, MHA (a·d = 2·g·d/2 = 4096), squared-ReLU
    f = 16,384, tp = 2 with SP, m = 2 micro-batches. X/Y/W per GEMM (qkv 4096/6144/6144·4096, proj 2048/4096,
    fc1 4096/8192, fc2 8192/4096, all × T for X and Y). Forward: weights 4·100,663,296/2 = 201,326,592; proj and
    fc2 inputs cast 3·T·(2048 + 8192) = 503,316,480; sum 704,643,072. Backward: qkv 2·4096 + 4·6144 = 32,768;
    fc1 2·4096 + 4·8192 = 40,960; proj 2·2048 + 3·4096/2 + 2·4096 = 18,432; fc2 2·8192 + 6144 + 8192 = 30,720:
    122,880·T = 2,013,265,920."""
    sh = _shapes(16384, 4096, 4096, 8192, 16384, 2)
    fwd, bwd = fp8_casts.delayed_cast_bytes(sh, np.array([True]), np.array([2]), np.array([2]))
    assert fwd[0] == 704_643_072
    assert bwd[0] == 2_013_265_920
    # the formulation's former rule, 3·X of proj and fc2 forward and twice that backward: 9·T·10,240 in all
    assert fwd[0] + bwd[0] - 9 * 16384 * 10240 == 1_207_959_552


def test_no_sp_layer_by_hand():
    """tp = 1 (no SP): proj and fc2 cast and transpose their input in one kernel in the forward (4·X), their grad
    output likewise (4·Y), no transposes left for the backward. T = 4, h = 8, a·d = 8, 2·g·d = 16, f = 32, m = 1:
    W = 24·8 + 8·8 + 32·8 + 8·32 = 768; forward 4·768 + 4·4·(8 + 32) = 3712; backward qkv 2·32 + 4·96 = 448,
    fc1 2·32 + 4·128 = 576, proj 4·32 = 128, fc2 4·32 = 128: 1280."""
    sh = _shapes(4, 8, 8, 16, 32, 1)
    fwd, bwd = fp8_casts.delayed_cast_bytes(sh, np.array([False]), np.array([1]), np.array([1]))
    assert (fwd[0], bwd[0]) == (3712, 1280)
    # SP on with tp = 1 is no SP (nothing is gathered)
    f2, b2 = fp8_casts.delayed_cast_bytes(sh, np.array([True]), np.array([1]), np.array([1]))
    assert (f2[0], b2[0]) == (3712, 1280)


def test_formulation_carries_the_casts():
    """``_delayed_casts`` adds the forward bytes to the layer's memory feature and the backward's beyond twice
    them to Bd (seconds at the HBM bandwidth); rows not on delayed scaling get nothing."""
    model = load_model("nemotron3-8b")
    c = {"global_batch": np.array([256, 256]), "micro_batch": np.array([4, 4]), "dp": np.array([32, 32]),
         "sp": np.array([True, True]), "tp": np.array([2, 2])}
    T = np.array([16384, 16384])
    sh = iteration.layer_gemm_shapes(model, T, c["tp"], np.array([2, 2]), np.array([1, 1]))
    Ld, Lm = np.zeros((2, U.K)), np.zeros((2, U.K))
    xb: dict[str, np.ndarray] = {}
    iteration._delayed_casts(model, c, sh, np.array([True, False]), Ld, Lm, xb, hbm=2.0)
    fb, bb = fp8_casts.delayed_cast_bytes(sh, c["sp"], c["tp"], np.array([2, 2]))
    assert Ld[0, U.I["mem"]] == pytest.approx(fb[0] / 2.0) and Ld[1, U.I["mem"]] == 0.0
    assert xb["Bd"][0, U.I["mem"]] == pytest.approx((bb[0] - 2 * fb[0]) / 2.0) and xb["Bd"][1, U.I["mem"]] == 0.0
    assert not xb["Bm"].any() and not Lm.any()


@pytest.mark.filterwarnings("ignore::llmcomm.overhead.capacity.MemoryWarning")  # activations: not what is tested
def test_casts_reach_the_step_where_memory_bound(monkeypatch):
    """A memory-heavy FP8 layer (Nemotron-3 8B, b=8, s=4096, tp=2, delayed scaling) on H100: with the casts
    counted, forward and backward are slower than with them zeroed, by exactly the layers' memory time of those
    bytes: every layer pass is above the elementwise launch floor even without them (at b=4 it is not, and the
    casts then show only in part)."""
    model = load_model("nemotron3-8b")
    cl = load_cluster("h100-80g-ndr400").for_world(64)
    cfg = ParallelConfig(tp=2, pp=1, dp=32, micro_batch=8, global_batch=512, seq_len=4096, sp=True,
                         fp8="hybrid", fp8_recipe="delayed", distributed_optimizer=True)
    with_casts = iteration.iteration_time(model, cfg, cl)
    real = fp8_casts.delayed_cast_bytes
    monkeypatch.setattr(fp8_casts, "delayed_cast_bytes",
                        lambda *a, **k: tuple(np.zeros_like(x) for x in real(*a, **k)))
    monkeypatch.setattr(iteration, "_STAGES", OrderedDict())  # the one-configuration stage cache
    without = iteration.iteration_time(model, cfg, cl)
    assert with_casts.forward_s > without.forward_s and with_casts.backward_s > without.backward_s
    sh = iteration.layer_gemm_shapes(model, np.array([32768]), np.array([2]), np.array([2]), np.array([1]))
    fb, bb = real(sh, np.array([True]), np.array([2]), np.array([2]))
    hbm = U.hbm_bandwidth(cl)
    util = U.Utilization.default()
    th = util.coef[U.I["mem"]] / util.scale  # the memory side's seconds per feature second
    assert with_casts.forward_s - without.forward_s == pytest.approx(32 * 2 * th * fb[0] / hbm, rel=1e-6)
    assert with_casts.backward_s - without.backward_s == pytest.approx(32 * 2 * th * bb[0] / hbm, rel=1e-6)


def test_moe_layer_by_hand():
    """An MoE layer (moe=True): qkv and proj as in a dense layer; the experts' linears cast + transpose their
    input (4·X) and grad output (4·Y), except that the routed experts' first linear adds only the transposed copy
    (1·X): quantizing the dispatched rows is moe_time.expert_input_cast_bytes'. tp = 1, m = 1, T = 4, h = 8,
    a·d = 8, 2·g·d = 16; 2 experts of 6 rows each, f_e = 16 (non-gated): expert_fc1 (6, 16, 8, 2) X = 96, Y = 192,
    W = 256; expert_fc2 (6, 8, 16, 2) X = 192, Y = 96, W = 256. Forward: weights 4·(192 + 64 + 256 + 256) = 3072,
    proj 4·32 = 128, expert_fc1 96, expert_fc2 768: 4064. Backward: qkv 2·32 + 4·96 = 448, proj 4·32 = 128,
    expert_fc1 4·192 = 768, expert_fc2 4·96 = 384: 1728."""
    one = np.array([1])
    sh = _shapes(4, 8, 8, 16, 32, 1)
    sh["expert_fc1"] = (6 * one, 16 * one, 8 * one, 2 * one)
    sh["expert_fc2"] = (6 * one, 8 * one, 16 * one, 2 * one)
    fwd, bwd = fp8_casts.delayed_cast_bytes(sh, np.array([False]), np.array([1]), np.array([1]), moe=True)
    assert (fwd[0], bwd[0]) == (4064, 1728)
