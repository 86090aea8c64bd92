"""--recompute-method / --recompute-num-layers (Megatron-LM megatron/core/recompute.py:157-183): which layers full
recomputation checkpoints, in the rules, the predictor, the closed-form calls, time and memory."""

from __future__ import annotations

import dataclasses
import random
import warnings

import pandas as pd
import pytest
from test_overhead_bytes import accepted, assert_closed_form_equals_predictor, configs

from llmcomm import step
from llmcomm.errors import ConfigError
from llmcomm.overhead.iteration import iteration_times
from llmcomm.overhead.memory import memory_table
from llmcomm.predict import program
from llmcomm.predict.calls import Context
from llmcomm.specs import ParallelConfig, load_cluster, load_model


def test_groups_follow_megatron():
    """recompute.py:160-166 (uniform: consecutive groups, the last shorter) and :173-181 (block: the first N)."""
    assert step.recompute_groups(5, None, None) == ((0,), (1,), (2,), (3,), (4,))
    assert step.recompute_groups(5, "uniform", 2) == ((0, 1), (2, 3), (4,))
    assert step.recompute_groups(5, "uniform", 1) == step.recompute_groups(5, None, None)
    assert step.recompute_groups(5, "block", 2) == ((0,), (1,))
    assert step.recompute_groups(3, "block", 7) == ((0,), (1,), (2,))
    with pytest.raises(ValueError):
        step.recompute_groups(3, "blocks", 1)


@pytest.mark.parametrize("kw", [dict(recompute_method="block"), dict(recompute="full", recompute_method="block"),
                                dict(recompute="full", recompute_num_layers=2),
                                dict(recompute="full", recompute_method="row", recompute_num_layers=2),
                                dict(recompute="selective", recompute_method="uniform", recompute_num_layers=1),
                                dict(recompute="full", recompute_method="block", recompute_num_layers=0)])
def test_rules_refuse(kw):
    with pytest.raises(ConfigError):
        ParallelConfig(**kw)


def _method_configs(seed: int, count: int, cp: bool = False):
    rng = random.Random(seed)
    out = []
    for model, p in configs(seed, 4 * count, with_cp=cp):
        method = rng.choice(["block", "block", "uniform"])
        q = dataclasses.replace(p, recompute="full", recompute_method=method, recompute_num_layers=rng.choice([1, 2, 3]),
                                recompute_modules=None)
        if accepted(model, dataclasses.replace, q) is None:
            continue
        out.append((model, q))
        if len(out) == count:
            break
    return out


CASES = _method_configs(11, 40) + _method_configs(12, 12, cp=True)


@pytest.mark.parametrize("model,parallel", CASES, ids=lambda x: getattr(x, "name", None) or "")
def test_closed_form_equals_predictor(model, parallel):
    """Call for call and byte for byte: only the checkpointed layers' forward calls run again in the backward."""
    assert_closed_form_equals_predictor(model, parallel)


def test_cases_cover_the_mechanism():
    assert any(p.recompute_method == "block" and p.tp > 1 and m.is_moe for m, p in CASES)
    assert any(p.recompute_method == "block" and p.cp > 1 for m, p in CASES)
    assert any(p.recompute_method == "uniform" and p.recompute_num_layers > 1 for m, p in CASES)
    assert any(p.recompute_method == "block" and p.vpp > 1 for m, p in CASES)


def test_block_replays_only_its_layers_in_the_program():
    """llama2-7b, one stage of 32 layers, tp 2 with SP: block of 5 replays 5 layers' 4 SP calls."""
    m = load_model("llama2-7b")
    base = dict(tp=2, sp=True, dp=1, micro_batch=1, global_batch=1, seq_len=256)
    count = {}
    for name, kw in {"none": {}, "full": dict(recompute="full"),
                     "block5": dict(recompute="full", recompute_method="block", recompute_num_layers=5)}.items():
        calls = program.stage_program(Context(m, ParallelConfig(**base, **kw)), 0)
        count[name] = sum(1 for c in calls if c.phase == "backward" and c.parallelism == "sp")
    assert count["full"] - count["none"] == 32 * 4
    assert count["block5"] - count["none"] == 5 * 4


def _one_stage(name: str, **kw) -> pd.DataFrame:
    m = load_model(name)
    rows = [dict(tp=1, pp=1, dp=8, micro_batch=1, global_batch=64, seq_len=4096, distributed_optimizer=True, **kw, **r)
            for r in (dict(recompute="none"), dict(recompute="full"),
                      dict(recompute="full", recompute_method="block", recompute_num_layers=5),
                      dict(recompute="full", recompute_method="block", recompute_num_layers=32),
                      dict(recompute="full", recompute_method="uniform", recompute_num_layers=4))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = iteration_times(m, pd.DataFrame(rows), load_cluster("h100-80g-ndr400", num_nodes=1))
    return it.join(memory_table(m, pd.DataFrame(rows)))


def test_time_and_memory_of_block_and_uniform():
    """One stage of 32 dense layers: block of 5 recomputes 5/32 of full's forward work and keeps 5 layers'
    inputs beside 27 layers' full activations; block of 32 is full; uniform of 4 recomputes every layer and keeps
    8 group inputs."""
    t = _one_stage("llama3-8b")
    none, full, b5, b32, u4 = (t.iloc[i] for i in range(5))
    assert none.recompute_s == 0
    assert b5.recompute_s == pytest.approx(5 / 32 * full.recompute_s, rel=1e-12)
    assert b32.recompute_s == pytest.approx(full.recompute_s, rel=1e-12)
    assert u4.recompute_s == pytest.approx(full.recompute_s, rel=1e-12)
    assert none.total_s < b5.total_s < full.total_s
    m = load_model("llama3-8b")
    per_full = float(step.layer_activation_bytes(m, False, seq=4096, micro_batch=1, tp=1, sp=False, recompute="full",
                                                 act_bytes=2))
    assert per_full == 4096 * 2 * 4096  # the layer's input, 2·h bytes per token (bf16)
    extra = full.activations_bytes - 32 * per_full  # embedding output and logits of the one stage
    per_none = (none.activations_bytes - extra) / 32
    assert b5.activations_bytes == pytest.approx(5 * per_full + 27 * per_none + extra, rel=1e-9)
    assert b32.activations_bytes == pytest.approx(full.activations_bytes, rel=1e-12)
    assert u4.activations_bytes == pytest.approx(8 * per_full + extra, rel=1e-9)


def test_step_description_keeps_per_layer():
    m = load_model("llama3-8b")
    base = dict(dp=1, micro_batch=1, global_batch=1, seq_len=1024)
    acts = {}
    for name, kw in {"none": {}, "full": dict(recompute="full"),
                     "b5": dict(recompute="full", recompute_method="block", recompute_num_layers=5),
                     "u4": dict(recompute="full", recompute_method="uniform", recompute_num_layers=4)}.items():
        s = step.describe(m, ParallelConfig(**base, **kw), calls=False)
        acts[name] = [la.activation_bytes for la in s.stages[0].chunks[0].layers]
    assert acts["b5"] == acts["full"][:5] + acts["none"][5:]
    assert acts["u4"] == [acts["full"][i] if i % 4 == 0 else 0.0 for i in range(32)]


def test_hardware_flops_counts_the_checkpointed_share():
    from llmcomm.overhead.sweep import hardware_flops

    m = load_model("llama3-8b")
    f = {k: hardware_flops(m, ParallelConfig(dp=8, global_batch=64, **kw)) for k, kw in {
        "none": {}, "full": dict(recompute="full"),
        "b5": dict(recompute="full", recompute_method="block", recompute_num_layers=5)}.items()}
    assert f["b5"] - f["none"] == pytest.approx(5 / 32 * (f["full"] - f["none"]), rel=1e-12)


def test_time_cli_takes_the_method(capsys):
    from llmcomm.cli import main

    main(["time", "llama3-8b", "--tp", "1", "--pp", "1", "--dp", "8", "--global-batch", "128", "--seq-len", "8192",
          "--cluster", "h100-80g-ndr400", "--recompute", "full", "--recompute-method", "block",
          "--recompute-num-layers", "5", "--fsdp", "--distributed-optimizer", "--overlap-grad-reduce"])
    assert "recompute=full (block 5)" in capsys.readouterr().out
