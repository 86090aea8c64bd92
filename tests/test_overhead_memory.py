"""Memory model: each term against the figures published for it (Korthikanti et al. 2022; ZeRO; Megatron-LM's
distributed-optimizer table), and the vectorized table against the one-configuration path."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import llmcomm as lc
from llmcomm.overhead.memory import (
    chunks_in_flight,
    layer_activation_bytes,
    memory,
    memory_table,
    model_state,
    model_state_bytes,
)

GPT3 = lc.load_model("gpt3-175b")
S, B, H, A, L = 2048, 1, 12288, 96, 96


def _layer(par: dict) -> float:
    kw = dict(seq=S, micro_batch=B, tp=8, sp=False, recompute="none", act_bytes=2)
    kw.update(par)
    return float(layer_activation_bytes(GPT3, False, **kw))


def test_korthikanti_table2_per_layer() -> None:
    """Table 2 of Korthikanti et al. (MLSys 2023), bytes per layer, t = 8."""
    t = 8
    sbh = S * B * H
    assert _layer({}) == pytest.approx(sbh * (10 + 24 / t + 5 * A * S / (H * t)))
    assert _layer({"sp": True}) == pytest.approx(sbh / t * (34 + 5 * A * S / H))
    assert _layer({"recompute": "selective"}) == pytest.approx(sbh * (10 + 24 / t))
    assert _layer({"sp": True, "recompute": "selective"}) == pytest.approx(sbh * 34 / t)
    assert _layer({"recompute": "full"}) == pytest.approx(2 * sbh)
    assert _layer({"tp": 1}) == pytest.approx(sbh * (34 + 5 * A * S / H))  # no parallelism: 34 + 5as/h


def test_pipeline_in_flight_matches_korthikanti() -> None:
    """Stage 0 keeps p micro-batches of L/p layers under 1F1B (= L layers) and L·(1 + (p−1)/(p·v)) layers
    interleaved; GPipe keeps every micro-batch."""
    p, v, m = 16, 3, 64
    assert chunks_in_flight(0, pp=p, vpp=1, microbatches=m, gpipe=False) * (L // p) == L
    layers = chunks_in_flight(0, pp=p, vpp=v, microbatches=m, gpipe=False) * L / (p * v)
    assert layers == pytest.approx(L * (1 + (p - 1) / (p * v)))
    assert chunks_in_flight(p - 1, pp=p, vpp=1, microbatches=m, gpipe=False) == 1
    assert chunks_in_flight(3, pp=p, vpp=1, microbatches=m, gpipe=True) == m
    assert chunks_in_flight(0, pp=p, vpp=1, microbatches=4, gpipe=False) == 4  # fewer micro-batches than stages


@pytest.mark.parametrize("param, grad, dist, d, per_param", [
    (2, 2, False, 64, 2 + 2 + 12),          # ZeRO (Rajbhandari et al. 2020): 2 + 2 + 12 = 16 bytes
    (2, 4, False, 64, 18),                  # Megatron-LM dist_optimizer.md: bf16 params, fp32 grads
    (2, 4, True, 64, 6 + 12 / 64),          # ... with the distributed optimizer: 6 + 12/d
    (4, 4, False, 8, 16),                   # fp32 params and grads: 16
    (4, 4, True, 8, 8 + 8 / 8),             # ... distributed: 8 + 8/d
])
def test_model_state_bytes_per_parameter(param, grad, dist, d, per_param) -> None:  # noqa: ANN001
    w, g, o = model_state_bytes(1e9, 0.0, dp_cp=d, expert_dp=d, param_bytes=param, grad_bytes=grad,
                                distributed_optimizer=dist, fsdp=False)
    assert (w + g + o) / 1e9 == pytest.approx(per_param)


def test_gpt3_175b_published_configuration_fits_an_80gb_gpu() -> None:
    """Megatron-LM trains GPT-3 175B at tp8·pp16 with SP and selective recomputation on 80 GB A100s."""
    par = lc.ParallelConfig(tp=8, pp=16, dp=8, global_batch=1536, sp=True, recompute="selective",
                            distributed_optimizer=True)
    m = memory(GPT3, par)
    assert m.stage == 0
    assert m.weights == pytest.approx(2 * 1.46e9, rel=0.03)  # ~175B/128 parameters per GPU plus the embedding
    assert m.activations == pytest.approx(L * S * B * H * 34 / 8 + S * B * H / 8 * 16, rel=1e-9)
    assert m.total < 80e9
    unsplit = lc.ParallelConfig(tp=1, pp=1, dp=1024, global_batch=1024)
    assert memory(GPT3, unsplit).total > 80e9 * 10


def test_table_equals_single_configurations() -> None:
    model = lc.load_model("mixtral-8x7b")
    rows = []
    for tp in (1, 2, 4):
        for pp in (1, 2, 4):
            for ep in (1, 2, 8):
                for rec in ("none", "selective", "full"):
                    rows.append(dict(tp=tp, pp=pp, dp=8, ep=ep, vpp=2 if pp == 4 else 1, sp=tp > 1,
                                     micro_batch=2, global_batch=64, recompute=rec, distributed_optimizer=tp == 2,
                                     schedule="interleaved" if pp == 4 else "1f1b"))
    table = memory_table(model, pd.DataFrame(rows))
    for i, r in enumerate(rows):
        one = memory(model, lc.ParallelConfig(**r))
        assert table.loc[i, "total_bytes"] == pytest.approx(one.total, rel=1e-12)
        assert table.loc[i, "stage"] == one.stage
    assert np.isfinite(table.to_numpy()).all()


def test_model_state_is_the_largest_stage_state_of_the_memory_model() -> None:
    model = lc.load_model("mixtral-8x7b")
    for pp, vpp, dist in ((1, 1, False), (1, 1, True), (4, 1, False), (4, 2, True), (8, 1, True)):
        par = lc.ParallelConfig(tp=2, pp=pp, vpp=vpp, dp=8, ep=4, sp=True, global_batch=64,
                                distributed_optimizer=dist, schedule="interleaved" if vpp > 1 else "1f1b")
        w, g, o = model_state(model, par)
        one = memory(model, par)  # the stage with the most memory in all, activations included
        if pp == 1:
            assert (w, g, o) == pytest.approx((one.weights, one.gradients, one.optimizer), rel=1e-12)
        else:  # no stage holds more model state than the one model_state picks
            assert w + g + o >= (one.weights + one.gradients + one.optimizer) * (1 - 1e-12)
        held = w / lc.vocab.dtype_bytes(par.param_dtype)
        assert g == pytest.approx(held * lc.vocab.dtype_bytes(par.grad_reduce_dtype), rel=1e-12)


def test_memory_validates() -> None:
    with pytest.raises(lc.ConfigError, match="tp=5 does not divide"):
        memory(GPT3, lc.ParallelConfig(tp=5))


def test_unsplit_model_by_hand() -> None:
    """tp = pp = ep = 1: every parameter on one GPU (padded vocabulary), one micro-batch of activations; unfused
    attention keeps the 5·a·s score tensors per token, a fused kernel (Megatron's default, auto) does not."""
    model = lc.load_model("mixtral-8x7b")
    par = lc.ParallelConfig(dp=4, micro_batch=1, global_batch=8, seq_len=4096, attention_backend="unfused")
    m = memory(model, par)
    params = model.num_parameters() + 2 * (model.padded_vocab_size(1) - model.vocab_size) * model.hidden_size
    assert m.weights == pytest.approx(2 * params) and m.gradients == pytest.approx(4 * params)
    assert m.optimizer == pytest.approx(12 * params)
    h, f, s = 4096, 14336, 4096
    per_token = 10 * h + (2 * h + 4 * 1024 + 2 * h) + 2 * (2 * 2 * f + 2 * f) + 5 * 32 * s  # GQA 8x128, top-2 SwiGLU
    sbh = s * h
    assert m.activations == pytest.approx(32 * s * per_token + sbh + 4 * sbh * (1 + model.padded_vocab_size(1) / h))
    fused = memory(model, lc.ParallelConfig(dp=4, micro_batch=1, global_batch=8, seq_len=4096))
    assert m.activations - fused.activations == pytest.approx(32 * s * 5 * 32 * s)


def test_fused_attention_keeps_no_scores_korthikanti() -> None:
    """A fused kernel stores no s² tensors: with no recomputation it keeps Korthikanti's selective-recomputation
    figure (34·s·b·h/t with SP, Table 2), the log-sum-exp being b·a·s fp32 (< 0.1 % here)."""
    sbh = S * B * H
    assert _layer({"sp": True, "fused_attention": True}) == pytest.approx(sbh * 34 / 8)
    assert _layer({"fused_attention": True}) == pytest.approx(sbh * (10 + 24 / 8))


def test_fp8_activations_keep_the_linear_inputs_in_one_byte() -> None:
    """GPT with SP and selective recomputation, Korthikanti's 34·s·b·h/t term by term: the QKV and fc1 inputs
    (2h each, replicated), the projection input (2h) and the fc2 input (8h) at 1 byte: 34 − 1 − 1 − 1 − 4 = 27."""
    sbh = S * B * H
    assert _layer({"sp": True, "recompute": "selective", "fp8": True}) == pytest.approx(sbh * 27 / 8)
    assert _layer({"recompute": "full", "fp8": True}) == pytest.approx(2 * sbh)  # only the layer input: bf16


def test_fp8_weight_copies_by_hand() -> None:
    """FP8 adds the row-wise and column-wise FP8 copies of the linear weights (2 bytes each parameter);
    fp8_param_gather makes them the primary weights (no bf16 copy of those)."""
    model = lc.load_model("llama3-8b")
    base = dict(tp=2, pp=1, dp=4, sp=True, global_batch=8, distributed_optimizer=True)
    bf16 = memory(model, lc.ParallelConfig(**base))
    fp8 = memory(model, lc.ParallelConfig(**base, fp8="hybrid"))
    primary = memory(model, lc.ParallelConfig(**base, fp8="hybrid", fp8_param_gather=True))
    lin = model.num_layers * model.layer_parameter_split(0, 2).sharded  # the layers' TP-sharded parameters
    assert fp8.weights - bf16.weights == pytest.approx(2 * lin)
    assert primary.weights == pytest.approx(bf16.weights)  # 1 + 1 FP8 bytes instead of 2 bf16 bytes
    assert fp8.gradients == bf16.gradients and fp8.optimizer == bf16.optimizer
    assert primary.total < fp8.total
    assert fp8.activations < bf16.activations


def test_context_parallel_activations_are_per_cp_rank_plus_buffers() -> None:
    """cp = 2 at sequence s keeps what cp = 1 keeps at s/2 (Korthikanti at the local sequence), plus the ring's
    two K/V receive buffers of the running layer, 2·2·g·d·(s/cp)·b/tp bytes·2 (bf16)."""
    model = lc.load_model("llama3-8b")
    g, d = model.query_groups, model.head_dim
    kw = dict(tp=2, pp=2, sp=True, micro_batch=1, distributed_optimizer=True)
    cp2 = memory(model, lc.ParallelConfig(cp=2, dp=2, global_batch=8, seq_len=16384, **kw))
    half = memory(model, lc.ParallelConfig(cp=1, dp=2, global_batch=8, seq_len=8192, **kw))
    ring = 2 * (2 * g * d * 8192 * 1 / 2) * 2
    assert cp2.activations == pytest.approx(half.activations + ring)
    # the other kinds, by their formulas (cp_comm_type where ParallelConfig has it)
    from llmcomm.overhead.memory import cp_buffer_bytes

    a = model.num_attention_heads
    common = dict(cp=4, seq_local=4096, micro_batch=1, tp=2, act_bytes=2)
    assert cp_buffer_bytes(model, cp_comm_type="a2a", **common) == pytest.approx((a * d + 2 * g * d) * 4096 / 2 * 2)
    assert cp_buffer_bytes(model, cp_comm_type="allgather", **common) == pytest.approx(2 * g * d * 4 * 4096 / 2 * 2)
    assert cp_buffer_bytes(model, cp_comm_type="p2p", **{**common, "cp": 1}) == 0


def test_model_state_counts_the_fp8_weight_copies() -> None:
    model = lc.load_model("llama3-8b")
    for fpg in (False, True):
        par = lc.ParallelConfig(tp=2, pp=1, dp=4, sp=True, global_batch=8, distributed_optimizer=True, fp8="hybrid",
                                fp8_param_gather=fpg)
        assert model_state(model, par)[0] == pytest.approx(memory(model, par).weights, rel=1e-12)


@pytest.mark.parametrize("name, gpus, batch, seq, dims", [
    ("mixtral-8x7b", 16, 64, None, {"etp": (1, 2), "cp_comm_type": ("p2p", "all_gather", "a2a")}),
    ("llama3-405b", 16384, 2048, 8192, {"recompute": ("selective", "full")}),
    ("qwen3-30b-a3b", 64, 128, None, {"recompute": ("none", "full")})])
def test_table_equals_each_row_alone_bit_for_bit(name, gpus, batch, seq, dims) -> None:  # noqa: ANN001
    """memory_rows computes every layout of one pipeline depth at once; each row alone (its own layout, the path
    of memory()) gives the same bytes to the bit, over full tuner spaces (MoE folding, CP with every
    cp_comm_type, FSDP, FP8, uneven stages, recomputation) and rows with --recompute-method."""
    from llmcomm.overhead.memory import memory_rows
    from llmcomm.parallel_table import ParallelTable
    from llmcomm.tune.space import SearchSpace, enumerate_base

    model = lc.load_model(name)
    df = enumerate_base(model, gpus, batch, seq, SearchSpace(**dims).for_cluster(lc.load_cluster("h100-80g-ndr400")))
    extra = df.iloc[::max(1, len(df) // 40)].assign(recompute="full", recompute_method="block",
                                                    recompute_num_layers=2)
    extra.loc[extra.index[::2], "recompute_method"] = "uniform"
    df = pd.concat([df, extra], ignore_index=True)
    tab = ParallelTable.from_frame(df, model)
    table = memory_rows(model, tab)
    assert df["pp"].nunique() > 2 and df["fsdp"].any() and (df["cp"] > 1).any()
    sample = np.unique(np.concatenate([np.random.default_rng(0).choice(len(df), 200, replace=False),
                                       np.arange(len(df) - len(extra), len(df))]))
    for i in sample:
        one = memory_rows(model, tab.take(np.array([i])))
        assert (one[0] == table[i]).all(), (i, one[0], table[i])
