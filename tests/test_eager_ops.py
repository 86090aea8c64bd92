"""Megatron-LM's eager element-wise kernels around its fused paths (llmcomm.overhead.eager_ops), hand-worked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from llmcomm.errors import ConfigError
from llmcomm.overhead import eager_ops
from llmcomm.overhead import iteration as it
from llmcomm.overhead import utilization as U
from llmcomm.parallel_table import ParallelTable
from llmcomm.specs import ModelSpec, ParallelConfig, load_cluster, load_model

# 16 hidden, 4 heads of 4 in 2 query groups, 4 experts of width 8, top-2, clamped GLU, YaRN
TINY = ModelSpec(name="tiny-oss", num_layers=4, hidden_size=16, ffn_hidden_size=32, num_attention_heads=4,
                 num_query_groups=2, vocab_size=256, gated_mlp=True, num_experts=4, moe_router_topk=2,
                 moe_ffn_hidden_size=8, position_embedding_type="yarn", activation_func_clamp_value=7.0,
                 seq_length=4)


def one(x):
    return np.array([x])


def _c(tp=1, sp=False, etp=1, micro_batch=2):
    return {"tp": one(tp), "sp": one(sp), "etp": one(etp), "act_dtype": one(2), "micro_batch": one(micro_batch)}


def test_clamped_glu_bytes_by_hand():
    """T = 8 tokens, tp 2 with SP: L = 4 tokens, top-2 -> N_r = 8 rows of 2·8 = 16 columns (128 elements):
    forward two half clamps + cat = 4 accesses · 2 bytes · 128 = 1,024; backward 5 accesses = 1,280."""
    f, b = eager_ops.clamped_glu_bytes(TINY, _c(tp=2, sp=True), one(8))
    assert (f[0], b[0]) == (1024.0, 1280.0)
    # expert TP 2: twice the rows (the etp group's tokens), half the columns each: the same 128 elements
    f2, _ = eager_ops.clamped_glu_bytes(TINY, _c(tp=2, sp=True, etp=2), one(8))
    assert f2[0] == 1024.0
    # without SP the rank's 8 tokens all enter: 16 rows
    f3, _ = eager_ops.clamped_glu_bytes(TINY, _c(tp=2), one(8))
    assert f3[0] == 2048.0
    # no clamp, or no experts: nothing
    assert eager_ops.clamped_glu_bytes(dataclasses.replace(TINY, activation_func_clamp_value=None),
                                       _c(), one(8))[0][0] == 0.0


def test_clamped_glu_bytes_gpt_oss_row():
    """GPT-OSS 120B at tp 1, etp 1, 4,096 tokens: N_r = 16,384 rows of 2·2,880 -> 94,371,840 elements,
    forward 8 B each (754,974,720), backward 10 B (943,718,400)."""
    f, b = eager_ops.clamped_glu_bytes(load_model("gpt-oss-120b"), _c(micro_batch=1), one(4096))
    assert (f[0], b[0]) == (754974720.0, 943718400.0)


def test_rope_bytes_by_hand():
    """b 2, s 4 (T = 8), tp 2: query 8·2·4 = 64 and key 8·1·4 = 32 elements (96); forward 12 accesses · 2 B ·
    96 = 2,304 plus the frequencies' cos/sin 2 calls · 44 B · s 4 · d 4 = 1,408; backward 10 · 2 · 96 = 1,920."""
    f, b = eager_ops.rope_bytes(TINY, _c(tp=2), one(8))
    assert (f[0], b[0]) == (2304.0 + 1408.0, 1920.0)
    # plain RoPE keeps TE's fused kernel: nothing added
    f0, b0 = eager_ops.rope_bytes(dataclasses.replace(TINY, position_embedding_type="rope"), _c(tp=2), one(8))
    assert (f0[0], b0[0]) == (0.0, 0.0)


def test_clamp_needs_a_gated_mlp_and_a_positive_value():
    with pytest.raises(ConfigError, match="activation_func_clamp_value needs gated_mlp"):
        dataclasses.replace(TINY, gated_mlp=False)
    with pytest.raises(ConfigError, match="activation_func_clamp_value=-1.0 must be a positive"):
        dataclasses.replace(TINY, activation_func_clamp_value=-1.0)


def test_hook_adds_exactly_the_bytes_to_the_layer_features():
    """GPT-OSS 120B's NeMo 26.02 layout (tp 1, pp 4, ep 8, selective recompute of moe_act): the stage features with
    YaRN and the clamp minus those without them are the module's bytes over HBM bandwidth — forward in ``Lm``,
    the backward beyond twice it in ``Bm``, the clamp's replay in ``Rm``."""
    oss = load_model("gpt-oss-120b")
    plain = dataclasses.replace(oss, position_embedding_type="rope", activation_func_clamp_value=None)
    cfg = ParallelConfig(tp=1, pp=4, dp=16, ep=8, micro_batch=1, global_batch=1280, seq_len=4096,
                         recompute="selective", recompute_modules=("layernorm", "moe_act"),
                         attention_backend="auto", distributed_optimizer=True)
    cl = load_cluster("h100-80g-ndr400").for_world(64)
    hbm = U.hbm_bandwidth(cl)
    bw = it._resolve(cl, None, None)[0]
    q1 = it.stages(oss, ParallelTable.from_parallel(cfg, oss), cl, bw).cls["mid"]["q"]
    q0 = it.stages(plain, ParallelTable.from_parallel(cfg, plain), cl, bw).cls["mid"]["q"]
    mem = U.I["mem"]
    rf, rb = 12 * 2 * 4096 * (64 + 8) * 64 + 2 * 44 * 4096 * 64, 10 * 2 * 4096 * (64 + 8) * 64
    gf, gb = 754974720.0, 943718400.0
    assert q1["Lm"][0, mem] - q0["Lm"][0, mem] == pytest.approx((rf + gf) / hbm, rel=1e-12)
    assert q1["Bm"][0, mem] - q0["Bm"][0, mem] == pytest.approx((rb + gb - 2 * (rf + gf)) / hbm, rel=1e-12)
    assert q1["Rm"][0, mem] - q0["Rm"][0, mem] == pytest.approx(gf / hbm, rel=1e-12)
    # the GEMM and launch features are untouched
    others = [i for i in range(U.K) if i != mem]
    assert np.array_equal(q1["Lm"][:, others], q0["Lm"][:, others])


def test_rope_bytes_mla_rotary_part():
    """MLA (DeepSeek-V3's shapes, 128 heads, rotary part 64) with YaRN at tp 8, b 1, s 4,096: the rotary part of
    16 query heads and the one shared key head, E = 4,096·17·64 = 4,456,448; forward 24 B each plus the
    frequencies' 88·4,096·64; backward 20 B each."""
    m = dataclasses.replace(load_model("deepseek-v3"), position_embedding_type="yarn")
    f, b = eager_ops.rope_bytes(m, _c(tp=8, micro_batch=1), one(4096))
    assert (f[0], b[0]) == (24 * 4456448 + 88 * 4096 * 64, 20 * 4456448)
