"""The FFN activation kernel by activation kind (llmcomm.step.ffn_activation_bytes) and the q/k norms of
``qk_layernorm`` (llmcomm.overhead.layer_kernels), hand-worked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from llmcomm import step
from llmcomm.errors import ConfigError
from llmcomm.overhead import iteration as it
from llmcomm.overhead import layer_kernels as lk
from llmcomm.overhead import utilization as U
from llmcomm.parallel_table import ParallelTable
from llmcomm.specs import ModelSpec, ParallelConfig, load_cluster, load_model

# 16 hidden, 4 heads of 4 in 2 query groups, SwiGLU of width 32, per-head q/k RMSNorm
QK = ModelSpec(name="tiny-qk", num_layers=2, hidden_size=16, ffn_hidden_size=32, num_attention_heads=4,
               num_query_groups=2, vocab_size=256, gated_mlp=True, qk_layernorm=True, normalization="RMSNorm",
               seq_length=4)
# the same with 4 experts of width 8, top-2, one shared expert
QK_MOE = dataclasses.replace(QK, name="tiny-qk-moe", num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=8,
                             num_shared_experts=1)


def one(x):
    return np.array([x])


def _c(tp=1):
    return {"tp": one(tp), "act_dtype": one(2)}


def test_ffn_activation_counts_by_kernel():
    """Per element of the f-wide output, 2 bytes an access: bias-GeLU forward read + write (4), backward read
    the gradient and the input, write the gradient, the bias gradient's sum reads it (8). SwiGLU forward reads
    both halves of the 2f input and writes f (6); backward reads the gradient (f) and the input (2f) and writes
    the input's gradient (2f): 10. Squared ReLU (no bias) forward reads x and writes y (4); backward reads the
    gradient and x, writes x's gradient (6). Another name is refused naming the field."""
    assert step.ffn_activation_bytes("gelu") == (2 * 2, 2 * 4)
    assert step.ffn_activation_bytes("swiglu") == (2 * (2 + 1), 2 * (1 + 2 + 2))
    assert step.ffn_activation_bytes("squared_relu") == (2 * 2, 2 * 3)
    with pytest.raises(ConfigError, match="activation='relu'"):
        step.ffn_activation_bytes("relu")


def test_gated_layer_bytes_by_hand():
    """b=1, s=4 (T=4), tp=2, h=8, a=2 heads of d=4, f=32, no SP, unfused, H=1 byte/s, gated:
    22·4·8 + 6·4·32/2 + 13·1·(2/2)·4·4 = 704 + 384 + 208 = 1296 bytes (1168 with the bias-GeLU's 4)."""
    one_ = np.array([1.0])
    args = (one_, np.array([4.0]), np.array([2.0]), 8, 2, 2, 4, 32, 3, 1.0, 1.0, one_, np.array([False]))
    X, _ = U.layer_features(*args, activation="swiglu")
    assert X[0, U.I["mem"]] == 1296.0
    X0, _ = U.layer_features(*args)
    assert X0[0, U.I["mem"]] == 1168.0


def test_ffn_backward_extra_by_hand():
    """T = 8 tokens, tp 2: SwiGLU's backward is 10 − 2·6 = −2 B per element of T·f_eff/tp: dense f 32 ->
    −2·8·32/2 = −256; MoE (top-2 + 1 shared)·8 = 24 -> −2·8·24/2 = −192. The bias-GeLU's is exactly twice its
    forward: 0."""
    d, m = lk.ffn_backward_extra(QK_MOE, one(8), one(2))
    assert (d[0], m[0]) == (-256.0, -192.0)
    d0, m0 = lk.ffn_backward_extra(dataclasses.replace(QK_MOE, gated_mlp=False), one(8), one(2))
    assert (d0[0], m0[0]) == (0.0, 0.0)
    # squared ReLU: 6 − 2·4 = −2 B per element, as SwiGLU
    sq = dataclasses.replace(QK_MOE, gated_mlp=False, activation="squared_relu")
    assert tuple(x[0] for x in lk.ffn_backward_extra(sq, one(8), one(2))) == (-256.0, -192.0)


def test_query_copy_bytes_by_hand():
    """T = 8 tokens, 4 heads of d 4 in 2 groups, 2-byte activations. tp 1: 2 groups on the rank and 2 heads a
    group, the reshape copies the query: 2·2·8·4·4 = 512. tp 2: one group on a rank (a view): 0; tp 4 (g < tp,
    one group kept): 0. Multi-head (4 groups of 1 head): 0 at any tp; multi-latent attention: 0."""
    for tp, want in ((1, 512.0), (2, 0.0), (4, 0.0)):
        assert lk.query_copy_bytes(QK, _c(tp), one(8))[0] == want, tp
    mha = dataclasses.replace(QK, num_query_groups=4)
    assert lk.query_copy_bytes(mha, _c(1), one(8))[0] == 0.0
    mla = dataclasses.replace(load_model("deepseek-v3"), num_query_groups=8)
    assert lk.query_copy_bytes(mla, _c(1), one(8))[0] == 0.0


def test_query_copied_once_with_or_without_qk_norm():
    """With ``qk_layernorm`` the query is copied exactly once: by the reshape (query_copy_bytes) or else by TE's
    ``.contiguous()`` (inside qk_norm_bytes), never both: the two together hold 2·2·E_q of query copies at every
    tp (E_q = 8·(4/tp)·4), beside the key's copy 2·2·8·max(2/tp, 1)·4."""
    for tp in (1, 2, 4):
        f = lk.qk_norm_bytes(QK, _c(tp), one(8))[0][0] + lk.query_copy_bytes(QK, _c(tp), one(8))[0]
        eq, ek = 8 * 4 / tp * 4, 8 * max(2 / tp, 1) * 4
        rows = 8 * 4 / tp + 8 * max(2 / tp, 1)
        assert f == 2 * 2 * (eq + ek) + 4 * rows + 2 * 2 * ek + 2 * 2 * eq, tp


def test_hook_adds_the_query_copy_for_a_gelu_gqa_model():
    """A bias-GeLU model without q/k norms whose reshape copies (2 groups of 2 heads, tp 1): the hook adds the
    copy's 512 B to ``Ld`` and −2·512 to ``Bd`` (its backward is no kernel), nothing to ``Lm`` (dense)."""
    m = dataclasses.replace(QK, gated_mlp=False, qk_layernorm=False)
    out = {"Ld": np.zeros((1, U.K)), "Lm": np.zeros((1, U.K))}
    lk.add_layer_work(m, _c(1), one(8), out, 1.0)
    mem = U.I["mem"]
    assert (out["Ld"][0, mem], out["Bd"][0, mem], out["Lm"][0, mem], out["Bm"][0, mem]) == (512.0, -1024.0, 0, 0)
    assert np.count_nonzero(out["Ld"]) == 1


def test_qk_norm_bytes_by_hand():
    """T = 8 tokens, 4 heads of d 4 in 2 groups, 2-byte activations.

    tp 1: query 8·4 = 32 rows (128 elements), key 8·2 = 16 rows (64); g/tp = 2 > 1 and a/g = 2 > 1, so Megatron's
    reshape has already copied the query: only the key is copied (2·2·64 = 256). Forward: norms 2·2·192 = 768,
    rstdevs 4·48 = 192, copy 256 -> 1,216; backward 3·2·192 + 192 = 1,344.
    tp 2: 16 + 8 rows (64 + 32 elements), g/tp = 1: the query arrives strided and is copied too:
    4·96 + 4·24 + 4·96 = 864; backward 6·96 + 96 = 672.
    tp 4: g < tp, each rank one key head: 8 + 8 rows (32 + 32): 4·64 + 4·16 + 4·64 = 576; backward 6·64 + 64 = 448.
    LayerNorm keeps a mean beside the rstdev (8 B a row): tp 1 -> 1,216 + 192 = 1,408 and 1,344 + 192 = 1,536."""
    for tp, fwd, bwd in ((1, 1216.0, 1344.0), (2, 864.0, 672.0), (4, 576.0, 448.0)):
        f, b = lk.qk_norm_bytes(QK, _c(tp), one(8))
        assert (f[0], b[0]) == (fwd, bwd), tp
    f, b = lk.qk_norm_bytes(dataclasses.replace(QK, normalization="LayerNorm"), _c(1), one(8))
    assert (f[0], b[0]) == (1408.0, 1536.0)
    assert lk.qk_norm_bytes(dataclasses.replace(QK, qk_layernorm=False), _c(1), one(8))[0][0] == 0.0


def test_qk_norm_bytes_qwen3_235b_row():
    """Qwen3-235B-A22B at tp 2, b 1, s 4,096: 32 query heads and 2 key heads of 128 on a rank, 131,072 + 8,192
    rows, 16,777,216 + 1,048,576 elements; the query already contiguous (4 groups > tp 2, 16 heads a group).
    Forward 4·17,825,792 + 4·139,264 + 4·1,048,576 = 76,054,528; backward 6·17,825,792 + 4·139,264 =
    107,511,808."""
    f, b = lk.qk_norm_bytes(load_model("qwen3-235b-a22b"), _c(2), one(4096))
    assert (f[0], b[0]) == (76054528.0, 107511808.0)


def test_qk_norm_not_counted_with_mla():
    """MLA's ``qk_layernorm`` is the latent norms inside TE's LayerNormLinear: nothing here."""
    m = dataclasses.replace(load_model("deepseek-v3"), qk_layernorm=True)
    assert lk.qk_norm_bytes(m, _c(8), one(4096))[0][0] == 0.0


def _stage_q(model, cfg):
    cl = load_cluster("h100-80g-ndr400").for_world(cfg.tp * cfg.pp * cfg.dp)
    bw = it._resolve(cl, None, None)[0]
    return it.stages(model, ParallelTable.from_parallel(cfg, model), cl, bw).cls["first"]["q"], U.hbm_bandwidth(cl)


def test_hook_adds_the_qk_norms_and_the_swiglu_backward():
    """Qwen3-30B-A3B, BF16, tp 1, ep 8, b 1, s 4,096 (T 4,096), ``moe_act`` recomputed: with ``qk_layernorm`` minus
    without it is the norms' bytes over HBM bandwidth (forward in ``Lm``, backward beyond twice it in ``Bm``);
    without it, ``Bm``'s memory feature is the SwiGLU's −2·T·8·768/tp less twice the query's reshape copy
    (32 heads in 4 groups at tp 1: 2·2·T·32·128) and ``Rm``'s the replayed activation's 6·T·8·768/tp (the fused
    attention core's measured backward is in the gemm feature only)."""
    m = load_model("qwen3-30b-a3b")
    plain = dataclasses.replace(m, qk_layernorm=False)
    cfg = ParallelConfig(tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=64, seq_len=4096,
                         recompute="selective", recompute_modules=("moe_act",), attention_backend="flash",
                         distributed_optimizer=True)
    q1, hbm = _stage_q(m, cfg)
    q0, _ = _stage_q(plain, cfg)
    mem = U.I["mem"]
    nf, nb = lk.qk_norm_bytes(m, {"tp": one(1), "act_dtype": one(2)}, one(4096))
    assert q1["Lm"][0, mem] - q0["Lm"][0, mem] == pytest.approx(nf[0] / hbm, rel=1e-9)
    assert q1["Bm"][0, mem] - q0["Bm"][0, mem] == pytest.approx((nb[0] - 2 * nf[0]) / hbm, rel=1e-9)
    copy = 2.0 * 2 * 4096 * 32 * 128
    assert q0["Bm"][0, mem] == pytest.approx((-2.0 * 4096 * 8 * 768 - 2 * copy) / hbm, rel=1e-12)
    assert q0["Rm"][0, mem] == pytest.approx(6.0 * 4096 * 8 * 768 / hbm, rel=1e-12)
    others = [i for i in range(U.K) if i != mem]
    assert np.array_equal(q1["Lm"][:, others], q0["Lm"][:, others])


def test_dense_gated_layer_and_its_mlp_recompute():
    """Llama-3 8B, BF16, tp 2 with SP, b 1, s 4,096 (T 4,096), ``mlp`` recomputed: the dense layer's memory
    feature holds 6 B per element of T·f/tp (f 14,336) where the bias-GeLU held 4, its backward 2 B below twice
    that, and the recomputed MLP replays 6·T·f/tp + 4·T·h/tp (the activation and the pre-MLP norm). 8 groups of
    4 heads, 4 groups on a rank: the reshape copies the query, 2·2·T·(32/2)·128 more forward bytes and twice that
    less backward."""
    m = load_model("llama3-8b")
    cfg = ParallelConfig(tp=2, pp=1, dp=4, sp=True, micro_batch=1, global_batch=64, seq_len=4096,
                         recompute="selective", recompute_modules=("mlp",), attention_backend="flash",
                         distributed_optimizer=True)
    q, hbm = _stage_q(m, cfg)
    mem = U.I["mem"]
    T, f, h = 4096.0, 14336.0, 4096.0
    peak = load_cluster("h100-80g-ndr400").peak_bf16_flops
    args = (one(1.0), one(4096.0), one(2.0), 4096, 32, 8, 128, 14336, 3, peak, hbm, one(2.0), one(True))
    assert U.layer_features(*args, activation="swiglu")[0][0, mem] - U.layer_features(*args)[0][0, mem] == \
        pytest.approx(2.0 * T * f / 2 / hbm, rel=1e-12)
    copy = 2.0 * 2 * T * 16 * 128 / hbm
    assert q["Ld"][0, mem] == pytest.approx(U.layer_features(*args, activation="swiglu")[0][0, mem] + copy,
                                            rel=1e-12)
    assert q["Bd"][0, mem] == pytest.approx(-2.0 * T * f / 2 / hbm - 2 * copy, rel=1e-12)
    assert q["Rd"][0, mem] == pytest.approx((6.0 * T * f / 2 + 4.0 * T * h / 2) / hbm, rel=1e-12)


def test_non_gated_without_qk_norm_is_untouched():
    """A bias-GeLU model without q/k norms (vTrain's GPTs): the hook adds nothing, not even a zero ``Bd``."""
    m = load_model("gpt3-1.3b")
    out = {"Ld": np.ones((1, U.K)), "Lm": np.zeros((1, U.K))}
    lk.add_layer_work(m, {"tp": one(1), "act_dtype": one(2)}, one(2048), out, 1.0)
    assert set(out) == {"Ld", "Lm"} and np.array_equal(out["Ld"], np.ones((1, U.K)))
