"""The formulation's closed-form calls equal the predictor's stage programs, call for call and byte for byte."""

from __future__ import annotations

import random
from collections import Counter

import pandas as pd
import pytest

from llmcomm.overhead.iteration import _candidates, _stage_layers, comm_items, parallel_row
from llmcomm.predict import program
from llmcomm.predict.calls import Context
from llmcomm.specs import ParallelConfig, load_model


def predictor_stage(model, parallel, stage):
    ctx = Context(model, parallel)
    out: Counter = Counter()
    for call in program.stage_program(ctx, stage):
        key = (call.parallelism, call.op, call.phase)
        out[key + ("n",)] += 1
        out[key + ("bytes",)] += call.bytes
    return out


def closed_form(model, parallel, cls):
    row = parallel_row(parallel)
    row["seq_len"] = row["seq_len"] or model.seq_length
    c = _candidates(model, pd.DataFrame([row]))
    layers = _stage_layers(model, c["pp"], c["vpp"])[cls]
    m = parallel.num_microbatches
    out: Counter = Counter()
    for it in comm_items(model, c, cls, 8, layers):
        n = int(it.count[0]) * (m if it.per == "microbatch" else 1)
        if n:
            key = (it.parallelism, it.op, it.phase)
            out[key + ("n",)] += n
            out[key + ("bytes",)] += n * int(it.nbytes[0])
    return out


def configs(seed: int, count: int):
    rng = random.Random(seed)
    models = [load_model(n) for n in ("gpt3-1.3b", "llama2-7b", "megatron-gpt-3.6b", "mixtral-8x7b", "tiny-gpt",
                                      "tiny-moe")]
    out = []
    while len(out) < count:
        model = rng.choice(models)
        tp = rng.choice([1, 2, 4, 8])
        pp = rng.choice([1, 2, 3, 4])
        dp = rng.choice([1, 2, 4])
        ep = rng.choice([1, 2]) if model.is_moe else 1
        vpp = rng.choice([1, 1, 2])
        b = rng.choice([1, 2])
        m = rng.choice([1, 2, 4, 8])
        kw = dict(tp=tp, pp=pp, dp=dp, ep=ep, vpp=vpp, micro_batch=b, global_batch=b * dp * m,
                  seq_len=rng.choice([128, 256]), sp=tp > 1 and (rng.random() < 0.5 or ep > 1),
                  recompute=rng.choice(["none", "selective", "full"]),
                  distributed_optimizer=rng.random() < 0.5, schedule=rng.choice(["1f1b", "gpipe"]),
                  act_dtype=rng.choice(["bf16", "fp16"]), create_attention_mask_in_dataloader=rng.random() < 0.5,
                  moe_aux_loss_coeff=rng.choice([0.0, 0.01]) if model.is_moe else 0.0)
        kw["pipe_partitioned"] = not kw["sp"] and rng.random() < 0.3  # DeepSpeed's pipeline engine
        try:
            p = ParallelConfig(**kw)
            from llmcomm.specs import validate

            validate(model, p)
            _candidates(model, pd.DataFrame([{**parallel_row(p), "seq_len": p.seq_len}]))
        except Exception:
            continue
        if model.is_moe and model.moe_layer_freq != 1:
            continue
        out.append((model, p))
    return out


@pytest.mark.parametrize("model,parallel", configs(0, 100), ids=lambda x: getattr(x, "name", None) or "")
def test_closed_form_equals_predictor(model, parallel):
    stages = {"first": 0, "last": parallel.pp - 1}
    if parallel.pp >= 3:
        stages["mid"] = 1
    for cls, r in stages.items():
        if cls == "last" and parallel.pp == 1:
            continue
        want = predictor_stage(model, parallel, r)
        got = closed_form(model, parallel, cls)
        assert +got == +want, (cls, parallel, set(got.items()) ^ set(want.items()))


def test_many_configurations_counted():
    cfgs = configs(0, 100)
    assert len(cfgs) == 100
    assert any(p.pp >= 2 and p.vpp > 1 for _, p in cfgs)
    assert any(p.pp >= 3 for _, p in cfgs)
    assert any(p.sp for _, p in cfgs) and any(p.recompute == "full" for _, p in cfgs)
    assert any(m.is_moe and p.ep > 1 for m, p in cfgs)
    assert any(p.act_dtype == "fp16" and p.distributed_optimizer for _, p in cfgs)
    assert any(m.is_moe and p.moe_aux_loss_coeff > 0 and p.tp > 1 for m, p in cfgs)
    assert any(m.position_embedding_type == "learned_absolute" and p.sp for m, p in cfgs)
    assert any(p.pipe_partitioned and p.tp > 1 and p.pp >= 3 for _, p in cfgs)
