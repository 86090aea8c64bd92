"""The bytes TransformerEngine sends for the SP collectives under FP8 (llmcomm.predict.fp8_wire): the predictor's
calls per recipe on a hand-worked case, the closed form equal to the predictor on FP8 configurations, and BF16
configurations unchanged."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from test_overhead_bytes import accepted, assert_closed_form_equals_predictor, configs

from llmcomm.errors import ConfigError
from llmcomm.overhead.iteration import arrays, candidate_table, comm_items, for_class
from llmcomm.parallel_table import ParallelTable
from llmcomm.predict import fp8_wire, tp
from llmcomm.predict.calls import Context
from llmcomm.specs import ParallelConfig, load_model

# llama2-7b (h = 4096), tp = 4 with SP, b = 1, s = 4096: n = b·s·h = 16,777,216 elements per gathered buffer
N = 4096 * 4096
BF16 = 2 * N  # 33,554,432 bytes


def _calls(**kw):
    m = load_model("llama2-7b")
    ctx = Context(m, ParallelConfig(tp=4, sp=True, micro_batch=1, seq_len=4096, **kw))
    fwd_a = [(c.op, c.bytes, c.dtype) for part in tp.attention_forward(ctx, 0, 0) for c in part]
    fwd_m = [(c.op, c.bytes, c.dtype) for c in tp.block_forward(ctx, 0, 0)]
    bwd = [(c.op, c.bytes, c.dtype) for c in tp.block_backward(ctx, 0, 0)]
    return fwd_a, fwd_m, bwd


def test_bf16_unchanged():
    fa, fm, b = _calls()
    assert fa == fm == [("all_gather", BF16, "bf16"), ("reduce_scatter", BF16, "bf16")]
    assert b == [("all_gather", BF16, "bf16"), ("all_gather", BF16, "bf16"), ("reduce_scatter", BF16, "bf16")]


def test_delayed_gathers_fp8_scatters_bf16():
    """TE 1.8 / 2.x DelayedScaling: the qkv/fc1 input gathered in FP8 (1 byte/element), the grad output and the
    re-gathered input too; the proj/fc2 output and the dgrad reduce-scattered in BF16."""
    fa, fm, b = _calls(fp8="hybrid")
    assert fa == fm == [("all_gather", N, "fp8"), ("reduce_scatter", BF16, "bf16")]
    assert b == [("all_gather", N, "fp8"), ("all_gather", N, "fp8"), ("reduce_scatter", BF16, "bf16")]


def test_tensorwise_adds_amax_allreduce():
    """Current scaling: a 4-byte MAX all-reduce of the amax over TP before the forward and grad-output casts."""
    fa, fm, b = _calls(fp8="hybrid", fp8_recipe="tensorwise")
    amax = ("all_reduce", 4, "fp32")
    assert fa == fm == [amax, ("all_gather", N, "fp8"), ("reduce_scatter", BF16, "bf16")]
    assert b == [amax, ("all_gather", N, "fp8"), ("all_gather", N, "fp8"), ("reduce_scatter", BF16, "bf16")]
    m = load_model("llama2-7b")
    pre, post = tp.attention_backward(Context(m, ParallelConfig(tp=4, sp=True, micro_batch=1, seq_len=4096,
                                                                fp8="hybrid", fp8_recipe="tensorwise")), 0, 0)
    assert [c.op for c in pre] == ["all_reduce", "all_gather"] and [c.op for c in post] == ["all_gather",
                                                                                          "reduce_scatter"]


def test_mxfp8_and_blockwise_scales():
    """MXFP8: + n/32 bytes of E8M0 scales per usage, the grad output in both usages; blockwise: + 4·n/128."""
    for recipe in ("mxfp8", "blockwise"):
        one = N + N // 32  # 17,301,504 (4/128 = 1/32 for blockwise as well)
        fa, fm, b = _calls(fp8="hybrid", fp8_recipe=recipe)
        assert fa == [("all_gather", one, "fp8"), ("reduce_scatter", BF16, "bf16")], recipe
        assert b == [("all_gather", 2 * one, "fp8"), ("all_gather", one, "fp8"), ("reduce_scatter", BF16, "bf16")]


def test_userbuffers_fp8_buf_reduce_scatter():
    """With tp_comm_overlap and fp8_buf on proj_fprop only (NeMo 24.07's ub_cfg_h100_h12288_tp4_mbs2_seqlen2048),
    the attention projection's forward reduce-scatter moves FP8, the MLP's stays BF16; without overlap it is
    NCCL's BF16 reduce-scatter whatever the buffer config."""
    fa, fm, _ = _calls(fp8="hybrid", tp_comm_overlap=True, tp_comm_overlap_fp8_buf=("proj_fprop",))
    assert fa == [("all_gather", N, "fp8"), ("reduce_scatter", N, "fp8")]
    assert fm == [("all_gather", N, "fp8"), ("reduce_scatter", BF16, "bf16")]
    fa, _, _ = _calls(fp8="hybrid", tp_comm_overlap_fp8_buf=("proj_fprop", "fc2_fprop"))
    assert fa[1] == ("reduce_scatter", BF16, "bf16")


def test_mla_up_projection_gathers_fp8():
    """DeepSeek-V3 (q_lora 1536, kv_lora 512, d_rope 64), tp = 2, b = 1, s = 4096, delayed: the up projections'
    gathers (TE column-parallel linears) move T·width bytes, the rotary-key gather (Megatron's) stays BF16; backward
    the projection's grad output T·h in FP8, the up projections' re-gathers FP8 and their dgrad RS BF16."""
    m = load_model("deepseek-v3")
    ctx = Context(m, ParallelConfig(tp=2, sp=True, micro_batch=1, seq_len=4096, fp8="hybrid"))
    T = 4096
    pre, post = tp.attention_forward(ctx, 0, 0)
    assert [(c.bytes, c.dtype) for c in pre] == [(2 * T * 64, "bf16"), (T * 1536, "fp8"), (T * 512, "fp8")]
    assert [(c.bytes, c.dtype) for c in post] == [(2 * T * 7168, "bf16")]
    pre, post = tp.attention_backward(ctx, 0, 0)
    assert [(c.bytes, c.dtype) for c in pre] == [(T * 7168, "fp8")]
    assert [(c.op, c.bytes) for c in post] == [("all_gather", T * 512), ("reduce_scatter", 2 * T * 512),
                                               ("all_gather", T * 1536), ("reduce_scatter", 2 * T * 1536),
                                               ("reduce_scatter", 2 * T * 64)]


def test_bad_inputs_refused():
    with pytest.raises(ConfigError, match="tp_comm_overlap_fp8_buf"):
        ParallelConfig(tp=4, sp=True, tp_comm_overlap_fp8_buf=("qkv_fprop",))
    with pytest.raises(ConfigError, match="must be a list of userbuffers layer names"):
        ParallelConfig(tp=4, sp=True, tp_comm_overlap_fp8_buf=5)  # type: ignore[arg-type]
    assert ParallelConfig(tp=4, sp=True, tp_comm_overlap_fp8_buf=float("nan")).tp_comm_overlap_fp8_buf == ()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="custom"):
        _calls(fp8="hybrid", fp8_recipe="custom")
    from llmcomm.predict import predict_traffic
    with pytest.raises(ConfigError, match="fp8-wire-recipe"):
        predict_traffic(load_model("tiny-gpt"), ParallelConfig(tp=2, sp=True, fp8="hybrid", fp8_recipe="custom"))


def test_without_sp_nothing_changes():
    m = load_model("llama2-7b")
    for kw in ({}, {"fp8": "hybrid", "fp8_recipe": "tensorwise"}):
        ctx = Context(m, ParallelConfig(tp=4, sp=False, micro_batch=1, seq_len=4096, **kw))
        assert [(c.op, c.bytes) for c in tp.block_forward(ctx, 0, 0) + tp.block_backward(ctx, 0, 0)] == [
            ("all_reduce", BF16), ("all_reduce", BF16)]


def test_closed_form_bytes_follow_rule():
    """The time model's items (comm_items) carry the rule's bytes: the blocks' SP all-gathers n, reduce-scatters 2n
    (the embedding's and output layer's are Megatron's own BF16 collectives)."""
    m = load_model("llama2-7b")
    p = ParallelConfig(tp=4, sp=True, micro_batch=1, seq_len=4096, fp8="hybrid")
    t = candidate_table(m, ParallelTable.from_parallel(p, m))
    c = arrays(m, t, 8)
    items: dict = {}
    for it in comm_items(m, for_class(c, "first"), "first", (np.array([32]), np.array([0]))):
        if it.parallelism == "sp" and it.count[0] > 0:  # the blocks' items come first (then embedding, output)
            items.setdefault((it.op, it.phase), int(it.nbytes[0]))
    assert items[("all_gather", "forward")] == N and items[("reduce_scatter", "forward")] == BF16
    assert items[("all_gather", "backward")] == N and items[("reduce_scatter", "backward")] == BF16


def fp8_configs(seed: int, count: int):
    """FP8 variants (delayed / tensorwise, with and without tp_comm_overlap and fp8_buf) of the drawn
    configurations with SP that the kit's rules accept."""
    rng = random.Random(seed)
    out = []
    for model, p in configs(seed, 4 * count):
        if not p.sp or p.act_dtype != "bf16":
            continue
        kw = dict(fp8=rng.choice(["hybrid", "e4m3"]), fp8_recipe=rng.choice(["delayed", "tensorwise"]),
                  tp_comm_overlap=rng.random() < 0.5,
                  tp_comm_overlap_fp8_buf=rng.choice([(), ("proj_fprop",), ("proj_fprop", "fc2_fprop")]))
        q = accepted(model, dataclasses.replace, p, **kw)
        if q is not None and q.tp_comm_overlap:
            try:  # userbuffers need the TP group on one node (arrays' rule): else without overlap
                arrays(model, candidate_table(model, ParallelTable.from_parallel(q, model)), 8)
            except ConfigError:
                q = dataclasses.replace(q, tp_comm_overlap=False)
        if q is not None:
            out.append((model, q))
        if len(out) == count:
            break
    return out


FP8_CONFIGS = fp8_configs(5, 24)


def test_fp8_configurations_counted():
    assert len(FP8_CONFIGS) >= 12
    assert any(p.fp8_recipe == "tensorwise" and p.recompute == "full" for _, p in FP8_CONFIGS)
    assert any(p.tp_comm_overlap and "proj_fprop" in p.tp_comm_overlap_fp8_buf for _, p in FP8_CONFIGS)


@pytest.mark.parametrize("model,parallel", FP8_CONFIGS, ids=lambda x: getattr(x, "name", None) or "")
def test_closed_form_equals_predictor_fp8(model, parallel):
    assert_closed_form_equals_predictor(model, parallel)


def test_block_bytes_bf16_identity():
    """Without FP8 rows every entry is the very array elements·act (the items of a BF16 table unchanged)."""
    e, a = np.array([10, 20]), np.array([2, 2])
    w = fp8_wire.block_bytes(e, a, np.array([False, False]), np.array(["delayed", "delayed"], dtype=object))
    assert all(np.array_equal(v, e * a) for v in w.values()) and "amax" not in w
