"""The step description (llmcomm.step), the configuration table (llmcomm.parallel_table) and the validity rules
(llmcomm.rules): by hand, against the predictor, and scalar against vectorized."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

import llmcomm as lc
from llmcomm import rules, step
from llmcomm.errors import ConfigError
from llmcomm.overhead import iteration_times
from llmcomm.overhead import utilization as U
from llmcomm.parallel_table import ParallelTable
from llmcomm.predict import dp as pdp
from llmcomm.predict.calls import Context
from llmcomm.specs import ParallelConfig
from llmcomm.tune.space import enumerate_candidates


def test_chunk_layers_by_hand():
    # 8 layers, pp 2, vpp 2: virtual stages 0..3 of 2 layers; stage 1 holds chunks 1 and 3
    p = ParallelConfig(pp=2, vpp=2, global_batch=2)
    assert list(step.chunk_layers(8, p, 1, 0)) == [2, 3]
    assert list(step.chunk_layers(8, p, 1, 1)) == [6, 7]
    assert step.stage_layers(8, p, 0) == [0, 1, 4, 5]


def test_uneven_pipeline_split_by_hand():
    """Megatron-LM's uneven stages (transformer_block.py get_num_layers_to_build, transformer_layer.py
    get_transformer_layer_offset), worked by hand."""
    # LLaMA-3 405B's 126 layers on 16 stages, embedding and loss counted as a layer each: 128/16 = 8 per stage,
    # stage 0 builds 7 (the embedding's slot), stage 15 builds 7 (the loss's)
    split = step.pipeline_split(126, 16, 1, None, None, True, True)
    assert split[0] == ((0, 7),) and split[1] == ((7, 8),) and split[15] == ((119, 7),)
    # 10 layers, pp 4, first 1 and last 3: middle stages 3 each -> [0], [1..3], [4..6], [7..9]
    assert [r[0] for r in step.pipeline_split(10, 4, 1, 1, 3)] == [(0, 1), (1, 3), (4, 3), (7, 3)]
    # interleaved: 12 layers, pp 2, vpp 2, first 4 -> last stage (the middle one) 8: chunks of 2 and 4;
    # total per virtual round 2 + 4 = 6: stage 0 [0,1] [6,7]; stage 1 [2..5] [8..11]
    assert step.pipeline_split(12, 2, 2, 4, None) == (((0, 2), (6, 2)), ((2, 4), (8, 4)))
    # every layer exactly once
    for args in ((126, 16, 1, None, None, True, True), (10, 4, 1, 1, 3), (12, 2, 2, 4, None), (31, 4, 2, None, None,
                                                                                                  True, False)):
        layers = sorted(la for row in step.pipeline_split(*args) for s0, n in row for la in range(s0, s0 + n))
        assert layers == list(range(args[0])), args


@pytest.mark.parametrize("kw, rule", [
    (dict(pp=4, num_layers_in_first_pipeline_stage=1, num_layers_in_last_pipeline_stage=2), "must split evenly"),
    (dict(pp=4, num_layers_in_first_pipeline_stage=2, account_for_loss_in_pipeline_split=True), "cannot be combined"),
    (dict(pp=4, account_for_embedding_in_pipeline_split=True), r"pp\*vpp=4 does not divide num_layers \+ embedding"),
    (dict(pp=1, num_layers_in_first_pipeline_stage=8), "need pp >= 2"),
])
def test_uneven_rules(kw, rule):
    model = lc.load_model("llama2-7b")  # 32 layers
    with pytest.raises(ConfigError, match=rule):
        lc.validate(model, ParallelConfig(global_batch=8, **kw))


def test_uneven_stages_in_predictor_memory_and_time():
    """LLaMA-2 7B's 32 layers on pp 3 (not divisible) with first 10 and last 10: the predictor sends each stage's
    layers' gradients, memory counts them, and the cost model accepts it; the first stage's DP gradient bytes are
    10 layers + the embedding."""
    from llmcomm.overhead import iteration_time
    from llmcomm.overhead.memory import memory

    model = lc.load_model("llama2-7b")
    p = ParallelConfig(tp=2, pp=3, dp=2, global_batch=8, num_layers_in_first_pipeline_stage=10,
                       num_layers_in_last_pipeline_stage=10)
    assert [len(step.stage_layers(32, p, r)) for r in range(3)] == [10, 12, 10]
    ctx = Context(model, p)
    want = 10 * model.layer_parameter_split(0, 2).dense + model.padded_vocab_size(2) * model.hidden_size // 2
    assert pdp.stage_parameters(ctx, 0).dense == want
    tr = lc.predict_traffic(model, p)
    dp_bytes = tr.select(rank=0, parallelism="dp", op="all_reduce").events["bytes"].max()
    assert dp_bytes == want * 4  # fp32 gradients
    b = iteration_time(model, p, lc.load_cluster("a100-80g-hdr200"))
    assert b.critical_stage == "mid" and b.total_s > 0
    assert memory(model, p).stage in (0, 1)


def test_stage_classes_pick_the_middle_stage_with_most_moe_layers():
    m = lc.load_model("deepseek-moe-16b")  # layer 0 dense, the rest MoE
    got = step.stage_classes(m, np.array([4]), np.array([1]))
    per = m.num_layers // 4
    assert (int(got["first"][0][0]), int(got["first"][1][0])) == (1, per - 1)
    assert (int(got["mid"][0][0]), int(got["mid"][1][0])) == (0, per)
    assert (int(got["last"][0][0]), int(got["last"][1][0])) == (0, per)


@pytest.mark.parametrize("name", ["gpt3-1.3b", "tiny-moe", "deepseek-moe-16b", "mixtral-8x7b", "qwen2-57b-a14b"])
def test_stage_parameters_equal_the_predictors(name):
    model = lc.load_model(name)
    rng = random.Random(1)
    for _ in range(12):
        tp = rng.choice([1, 2, 4])
        ep = rng.choice([1, 2, 4]) if model.is_moe else 1
        etp = rng.choice([None, 1, tp]) if model.is_moe else None
        pp = rng.choice([1, 2, 4])
        try:
            p = ParallelConfig(tp=tp, pp=pp, dp=ep * 2, ep=ep, etp=etp, sp=tp > 1, global_batch=8 * ep)
            lc.validate(model, p)
        except ConfigError:
            continue
        t = ParallelTable.from_parallel(p, model)
        layers = step.stage_classes(model, t.pp, t.vpp)
        ctx = Context(model, p)
        stage_of = {"first": 0, "last": pp - 1}
        for cls, r in stage_of.items():
            hf, hl = step.holds_edges(cls, t.pp)
            dense, expert, repl = step.stage_parameters(model, t.tp, t.ep, t.expert_tp, t.pp, *layers[cls], hf, hl)
            want = pdp.stage_parameters(ctx, r)
            if not pdp.experts_in_own_buffer(ctx):  # experts share the dense buffer (ep = 1, etp = tp)
                dense, expert = dense + expert, 0 * expert
            assert (int(dense[0]), int(expert[0]), int(repl[0])) == (want.dense, want.expert,
                                                                     want.replicated_norms), (cls, p)


def test_describe_matches_the_utilization_features():
    """Σ GEMM FLOPs + attention-core FLOPs of one layer = the utilization model's GEMM feature · peak; element-
    wise + score bytes = its memory feature · HBM bandwidth (dense and MoE layers, SP on and off)."""
    for name, par in (("llama2-7b", dict(tp=2, pp=2, dp=1, global_batch=2, sp=True, micro_batch=1)),
                      ("gpt3-1.3b", dict(tp=4, pp=1, dp=2, global_batch=4, micro_batch=2)),
                      ("tiny-moe", dict(tp=2, pp=1, dp=2, ep=2, sp=True, global_batch=2)),
                      ("llama2-7b", dict(tp=2, pp=1, dp=1, global_batch=1, attention_backend="unfused"))):
        model, p = lc.load_model(name), ParallelConfig(**par)
        st = step.describe(model, p)
        s, tp = p.sequence_length(model), p.tp
        k = 3 if model.gated_mlp else 2
        for layer in st.stages[0].layers:
            f_eff = ((model.moe_router_topk + model.num_shared_experts) * model.expert_ffn_hidden_size
                     if layer.moe else model.ffn_hidden_size)
            X, _ = U.layer_features(np.array([p.micro_batch]), np.array([s]), np.array([tp]), model.hidden_size,
                                    model.num_attention_heads, model.query_groups, model.head_dim, f_eff, k, 1.0,
                                    1.0, np.array([tp if p.sp else 1]), np.array([layer.core.fused]),
                                    model.activation_kind)
            router = 2.0 * p.micro_batch * s * model.hidden_size * model.num_experts if layer.moe else 0.0
            # the router GEMM is replicated over TP: full FLOPs on every rank (iteration._compute adds it so too)
            assert layer.gemm_flops + layer.core.flops == pytest.approx(X[0, U.I["gemm"]] + router, rel=1e-12)
            assert layer.elementwise_bytes + layer.core.score_bytes() == pytest.approx(X[0, U.I["mem"]], rel=1e-9)
            assert layer.forward_calls and layer.backward_calls
            assert layer.params == model.layer_parameter_split(layer.layer, tp, p.ep, etp=p.expert_tp)
        assert st.stages[-1].chunks[-1].holds_output and st.stages[-1].chunks[-1].edge_gemms


def test_parallel_table_round_trip_and_defaults():
    df = pd.DataFrame({"tp": [2, 1], "pp": [2, 1], "dp": [2, 4], "vpp": [2, 1], "global_batch": [8, np.nan],
                       "recompute": ["full", "none"]})
    t = ParallelTable.from_frame(df, lc.load_model("gpt3-1.3b"))
    p0 = t.row(0)
    assert p0 == ParallelConfig(tp=2, pp=2, dp=2, vpp=2, global_batch=8, recompute="full", seq_len=2048)
    assert p0.schedule == "interleaved" and t.row(1).global_batch == 4  # unset: micro_batch · dp
    assert list(t.recompute_code) == [2, 0] and list(t.dtype_bytes("grad_reduce_dtype")) == [4, 4]
    q = ParallelConfig(tp=4, pp=2, dp=2, ep=2, etp=2, sp=True, global_batch=16, order="tp-pp-dp")
    assert ParallelTable.from_parallel(q).row(0) == q
    assert ParallelTable.from_frame(ParallelTable.from_parallel(q).to_frame()).row(0) == q
    with pytest.raises(ConfigError, match="'act_dtype' holds 'int4', not one of"):
        ParallelTable.from_frame(pd.DataFrame({"tp": [1], "pp": [1], "dp": [1], "act_dtype": ["int4"]})).dtype_bytes(
            "act_dtype")


def test_rules_scalar_and_vectorized_agree():
    """A random configuration breaks a rule in ParallelConfig/validate exactly when the table says so."""
    model = lc.load_model("mixtral-8x7b")
    rng = random.Random(3)
    rows, ok_scalar = [], []
    for _ in range(400):
        kw = dict(tp=rng.choice([1, 2, 3, 4]), pp=rng.choice([1, 2, 3, 4]), dp=rng.choice([1, 2, 4, 6]),
                  ep=rng.choice([1, 2, 4]), cp=rng.choice([1, 2]), vpp=rng.choice([1, 2]), sp=rng.random() < 0.5,
                  micro_batch=rng.choice([1, 2]), global_batch=rng.choice([4, 8, 12, 16]),
                  schedule=rng.choice(["1f1b", "interleaved", "gpipe"]), seq_len=rng.choice([96, 128]))
        try:
            lc.validate(model, ParallelConfig(**kw))
            ok_scalar.append(True)
        except ConfigError:
            ok_scalar.append(False)
        rows.append(kw)
    t = ParallelTable.from_frame(pd.DataFrame(rows), model)
    ok_table = rules.valid(model, t, ("config", "job"))
    assert list(ok_table) == ok_scalar
    assert 20 < sum(ok_scalar) < 380


def test_each_rule_once_with_its_source():
    names = [r.name for r in rules.RULES]
    assert len(names) == len(set(names))
    for r in rules.RULES:
        assert r.scope in rules.SCOPES
        assert r.source.startswith("kit:") or (".py:" in r.source and r.source.split(".py:")[1][:1].isdigit()), r
    # "tp > 1 with ep > 1 needs sp": one rule, used by the predictor, the cost model and the tuner
    assert [r.name for r in rules.RULES if "sp" in r.name and "moe" in r.name] == ["moe-tp-needs-sp"]
    m = lc.load_model("mixtral-8x7b")
    p = ParallelConfig(tp=2, dp=4, ep=2, global_batch=4)
    with pytest.raises(ConfigError, match="sequence parallelism must be used"):
        lc.predict_traffic(m, p)
    with pytest.raises(ConfigError, match="moe-tp-needs-sp"):
        iteration_times(m, pd.DataFrame([{"tp": 2, "pp": 1, "dp": 4, "ep": 2}]),
                                    lc.load_cluster("a100-80g-hdr200"))
    space = enumerate_candidates(m, 16, 64)
    assert not ((space["tp"] > 1) & (space["ep"] > 1) & ~space["sp"]).any()


def test_first_rows_and_group_rows_hand_worked() -> None:
    """first_rows: where a factorize code first appears; group_rows: rows equal in every key share a code, numbered
    in order of first appearance, with the first row of each group (the groups numpy.unique of the tuples gives)."""
    assert step.first_rows(np.array([0, 1, 0, 2, 1, 3])).tolist() == [0, 1, 3, 5]
    assert step.first_rows(np.zeros(0, np.int64)).tolist() == []
    a, b = np.array([4, 7, 4, 9, 7, 4]), np.array([1, 1, 1, 1, 2, 1])
    codes, first = step.group_rows([a, b])
    assert codes.tolist() == [0, 1, 0, 2, 3, 0] and first.tolist() == [0, 1, 3, 4]
    # a constant key adds nothing; keys too wide for one product (2^40 each) are recoded, not overflowed
    wide = np.array([0, 2**40, 0, 2**40], np.int64)
    codes, first = step.group_rows([wide, np.full(4, 5), wide[::-1].copy(), wide])
    assert codes.tolist() == [0, 1, 0, 1] and first.tolist() == [0, 1]
    rng = np.random.default_rng(0)
    keys = [rng.integers(-3, 4, 500), rng.integers(0, 2**45, 500) % 5 * 2**45, rng.integers(0, 3, 500)]
    codes, first = step.group_rows(keys)
    _, inv = np.unique(np.stack(keys, axis=1), axis=0, return_inverse=True)
    assert len(first) == inv.max() + 1
    assert np.array_equal(pd.factorize(inv.reshape(-1))[0], codes)  # the same partition of the rows
    assert all(all(k[f] == k[codes == j][0] for k in keys) for j, f in enumerate(first))
