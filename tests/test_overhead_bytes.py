"""The formulation's closed-form calls equal the predictor's stage programs, call for call and byte for byte, on
groups of the same size and the same number of ranks per node (placed by ``Layout`` under each ``order``)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from llmcomm import step
from llmcomm.errors import ConfigError
from llmcomm.layout import Layout
from llmcomm.overhead.iteration import arrays, candidate_table, comm_items, for_class
from llmcomm.parallel_table import ParallelTable
from llmcomm.predict import program
from llmcomm.predict.calls import Context
from llmcomm.specs import ParallelConfig, load_cluster, load_model, validate

GPN = 8
ORDERS = ("tp-cp-ep-dp-pp", "tp-pp-dp", "pp-dp-tp", "tp-dp-pp", "dp-tp-pp")


def _placed(lay: Layout, ranks: np.ndarray, kind: str) -> tuple[int, int]:
    """(size, ranks per node) of the groups of ``kind`` that hold ``ranks``: ``ceil(size / most nodes spanned)``."""
    g = lay.group_rows(kind, ranks)
    nodes = np.sort(g // GPN, axis=1)
    spans = 1 + (np.diff(nodes, axis=1) != 0).sum(axis=1)
    return g.shape[1], -(-g.shape[1] // int(spans.max()))


def predictor_stage(model, parallel, stage, cls):
    """The predictor's calls of ``stage``, keyed with the group size and ranks per node of the groups that hold the
    ranks of the stages class ``cls`` stands for (all middle stages for ``mid``); a send or receive is intra-node
    when every pipeline neighbour pair of those stages shares a node."""
    ctx = Context(model, parallel)
    lay = Layout(parallel, GPN)
    stages = step.class_stages(cls, parallel.pp)
    ranks = lay.coords["rank"].to_numpy()[np.isin(lay.coords["pp"].to_numpy(), stages)]
    pp_groups = lay.groups("pp")
    pairs = [(r, q) for r in stages for q in (r - 1, r + 1) if 0 <= q < parallel.pp]
    same_node_sends = all((pp_groups[:, r] // GPN == pp_groups[:, q] // GPN).all() for r, q in pairs)
    out: Counter = Counter()
    for call in program.stage_program(ctx, stage):
        if call.op in ("send", "recv") and call.parallelism == "cp":  # a CP ring step: inter-node if the group is
            g, k = _placed(lay, ranks, "cp")
            size, k = 2, 2 if k == g else 1
        elif call.op in ("send", "recv"):
            size, k = 2, 2 if same_node_sends else 1
        else:
            size, k = _placed(lay, ranks, call.group)
        key = (call.parallelism, call.op, call.phase, size, k)
        out[key + ("n",)] += 1
        out[key + ("bytes",)] += call.bytes
    return out


def accepted(model, build, *args, **kw):
    """The configuration ``build(*args, **kw)`` makes if the kit's rules accept it (the configuration's own rules, ``validate``
    and the formulation's cost rules), else None: a drawn configuration the rules refuse is drawn again."""
    try:
        p = build(*args, **kw)
        validate(model, p)
        candidate_table(model, ParallelTable.from_parallel(p, model))
    except ConfigError:
        return None
    return p


def closed_form(model, parallel, cls):
    """The formulation's calls of stage class ``cls`` (``comm_items``), counted as :func:`predictor_stage` counts the
    predictor's; with ``recompute_method="block"`` the checkpointed layers counted as ``stages()`` counts them."""
    t = candidate_table(model, ParallelTable.from_parallel(parallel, model))
    c = arrays(model, t, GPN)
    uneven = {k: c[k] for k in step.UNEVEN}
    layers = step.stage_classes(model, c["pp"], c["vpp"], uneven)[cls]
    cc = for_class(c, cls)
    if "rblock" in c:
        cc["rec_d"], cc["rec_m"] = step.recomputed_stage_classes(model, c["pp"], c["vpp"], c["rblock_n"], uneven)[cls]
    m = parallel.num_microbatches
    out: Counter = Counter()
    for it in comm_items(model, cc, cls, layers):
        n = int(it.count[0]) * (m if it.per == "microbatch" else 1)
        if n:
            key = (it.parallelism, it.op, it.phase, int(it.size[0]), int(it.rpn[0]))
            out[key + ("n",)] += n
            out[key + ("bytes",)] += n * int(it.nbytes[0])
    return out


def assert_closed_form_equals_predictor(model, parallel) -> None:
    """Stage 0, the last stage and the middle stage with the most MoE layers: the closed form equals the predictor
    call for call and byte for byte."""
    stages = {"first": 0, "last": parallel.pp - 1}
    if parallel.pp >= 3:
        stages["mid"] = _mid_stage(model, parallel)
    for cls, r in stages.items():
        if cls == "last" and parallel.pp == 1:
            continue
        want = predictor_stage(model, parallel, r, cls)
        got = closed_form(model, parallel, cls)
        assert +got == +want, (cls, parallel, set(got.items()) ^ set(want.items()))


def configs(seed: int, count: int, with_cp: bool = False):
    """``count`` valid configurations; ``with_cp``: each with cp 2 or 4 and a ``cp_comm_type`` (drawn last, so the
    configurations without it are the same draws as before)."""
    rng = random.Random(seed)
    models = [load_model(n) for n in ("gpt3-1.3b", "llama2-7b", "megatron-gpt-3.6b", "mixtral-8x7b", "tiny-gpt",
                                      "tiny-moe", "deepseek-moe-16b")]
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
                  moe_aux_loss_coeff=rng.choice([0.0, 0.01]) if model.is_moe else 0.0, order=rng.choice(ORDERS))
        kw["pipe_partitioned"] = not kw["sp"] and rng.random() < 0.3  # DeepSpeed's pipeline engine
        if pp >= 2 and rng.random() < 0.3:  # uneven stages (Megatron's --decoder-first/last-pipeline-num-layers)
            if rng.random() < 0.5:
                kw["account_for_embedding_in_pipeline_split"] = rng.random() < 0.7
                kw["account_for_loss_in_pipeline_split"] = rng.random() < 0.7
            else:
                per = model.num_layers // pp
                kw["num_layers_in_first_pipeline_stage"] = rng.choice([None, max(vpp, per - vpp)])
                kw["num_layers_in_last_pipeline_stage"] = rng.choice([None, max(vpp, per - vpp), per + vpp])
        if with_cp:
            kw["cp"] = rng.choice([2, 4])
            kw["cp_comm_type"] = rng.choice(["p2p", "all_gather", "a2a"])
        p = accepted(model, ParallelConfig, **kw)  # only the kit's own rule errors
        if p is not None:
            out.append((model, p))
    return out


def _mid_stage(model, parallel) -> int:
    """The middle stage the closed form stands for: the first with the most MoE layers."""
    ctx = Context(model, parallel)
    moe = [sum(ctx.moe_pattern[la] for la in ctx.stage_layers(r)) for r in range(1, parallel.pp - 1)]
    return 1 + int(np.argmax(moe))


@pytest.mark.parametrize("model,parallel", configs(1, 120), ids=lambda x: getattr(x, "name", None) or "")
def test_closed_form_equals_predictor(model, parallel):
    assert_closed_form_equals_predictor(model, parallel)


CP_CONFIGS = configs(2, 60, with_cp=True)


@pytest.mark.parametrize("model,parallel", CP_CONFIGS, ids=lambda x: getattr(x, "name", None) or "")
def test_closed_form_equals_predictor_with_cp(model, parallel):
    """The same, with context parallelism: the CP calls of each ``cp_comm_type`` (llmcomm.overhead.cp_time), the
    tokens per CP rank in every TP/EP/PP call, the DP calls over dp·cp, the router's tp·cp group."""
    test_closed_form_equals_predictor(model, parallel)


def test_cp_configurations_counted():
    for kind in ("p2p", "all_gather", "a2a"):
        assert any(p.cp_comm_type == kind and p.cp == 4 for _, p in CP_CONFIGS), kind
        assert any(p.cp_comm_type == kind and p.recompute == "full" for _, p in CP_CONFIGS), kind
    assert any(m.is_moe and p.ep > 1 and p.moe_aux_loss_coeff > 0 for m, p in CP_CONFIGS)
    assert any(p.distributed_optimizer and p.pp >= 2 for _, p in CP_CONFIGS)
    assert any(p.world_size > GPN and p.order != "tp-cp-ep-dp-pp" for _, p in CP_CONFIGS)


def test_many_configurations_counted():
    cfgs = configs(1, 120)
    assert len(cfgs) == 120
    assert any(p.pp >= 2 and p.vpp > 1 for _, p in cfgs)
    assert any(p.pp >= 3 for _, p in cfgs)
    assert any(p.sp for _, p in cfgs) and any(p.recompute == "full" for _, p in cfgs)
    assert any(m.is_moe and p.ep > 1 for m, p in cfgs)
    assert any(m.is_moe and m.moe_layer_freq != 1 and p.ep > 1 and p.pp >= 2 for m, p in cfgs)
    assert any(p.act_dtype == "fp16" and p.distributed_optimizer for _, p in cfgs)
    assert any(m.is_moe and p.moe_aux_loss_coeff > 0 and p.tp > 1 for m, p in cfgs)
    assert any(m.position_embedding_type == "learned_absolute" and p.sp for m, p in cfgs)
    assert any(p.pipe_partitioned and p.tp > 1 and p.pp >= 3 for _, p in cfgs)
    assert any(p.num_layers_in_first_pipeline_stage or p.num_layers_in_last_pipeline_stage for _, p in cfgs)
    assert any(p.account_for_embedding_in_pipeline_split or p.account_for_loss_in_pipeline_split for _, p in cfgs)
    for order in ORDERS:  # every order, with groups that span nodes
        assert any(p.order == order and p.world_size > GPN for _, p in cfgs), order


# ------------------------------------------------------------------ FSDP and --recompute-modules (issue 20)
MODULES = ("core_attn", "moe_act", "layernorm", "mlp", "moe", "shared_experts")


def fsdp_configs(seed: int, count: int):
    """Configurations of :func:`configs` with FSDP (Megatron-FSDP with the distributed optimizer and
    overlap_grad_reduce, or torch FSDP2 with and without resharding) and selective recompute modules."""
    import dataclasses

    rng = random.Random(seed)
    out = []
    for model, p in configs(seed + 100, 4 * count):
        dist = p.distributed_optimizer
        kw: dict = dict(fsdp=rng.random() < 0.8)
        kw["overlap_grad_reduce"] = dist and kw["fsdp"]  # Megatron-FSDP needs it (rule megatron-fsdp-overlap-grad-reduce)
        kw["fsdp_reshard_after_forward"] = dist or not kw["fsdp"] or rng.random() < 0.5
        if p.recompute == "selective" or rng.random() < 0.4:
            kw["recompute"] = "selective"
            kw["recompute_modules"] = tuple(rng.sample(MODULES, rng.randint(0, 3)))
        q = accepted(model, dataclasses.replace, p, **kw)
        if q is None:
            continue
        out.append((model, q))
        if len(out) == count:
            break
    return out


@pytest.mark.parametrize("model,parallel", fsdp_configs(3, 60), ids=lambda x: getattr(x, "name", None) or "")
def test_closed_form_equals_predictor_fsdp(model, parallel):
    test_closed_form_equals_predictor(model, parallel)


def test_fsdp_configurations_counted():
    cfgs = fsdp_configs(3, 60)
    assert len(cfgs) == 60
    assert any(p.fsdp and p.distributed_optimizer and p.dp > 1 for _, p in cfgs)
    assert any(p.fsdp and not p.fsdp_reshard_after_forward and p.dp > 1 for _, p in cfgs)
    assert any(p.fsdp and m.is_moe and p.ep > 1 and p.dp // p.ep > 1 for m, p in cfgs)
    assert any(p.fsdp and p.vpp > 1 for _, p in cfgs)
    for mod in ("mlp", "moe", "shared_experts"):
        assert any(p.recompute_modules and mod in p.recompute_modules and p.tp > 1 for _, p in cfgs), mod


# ------------------------------------------------- account_for_* with the interleaved schedule (round 5)
def _account_interleaved():
    cases = [("megatron-gpt-3.6b", dict(tp=2, pp=2, vpp=2, dp=2, sp=True, distributed_optimizer=True)),
             ("megatron-gpt-3.6b", dict(tp=1, pp=4, vpp=4, dp=2, distributed_optimizer=False)),
             ("megatron-gpt-3.6b", dict(tp=2, pp=4, vpp=2, dp=2, sp=True, distributed_optimizer=True, cp=2)),
             ("qwen3-30b-a3b", dict(tp=1, pp=2, vpp=5, dp=4, ep=2, distributed_optimizer=True)),
             ("qwen3-30b-a3b", dict(tp=2, pp=2, vpp=5, dp=2, ep=2, sp=True))]
    out = []
    for name, kw in cases:
        m = load_model(name)
        dp = kw["dp"]
        p = ParallelConfig(**kw, micro_batch=1, global_batch=dp * kw["pp"] * 2, seq_len=128,
                           account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
        validate(m, p)
        out.append((m, p))
    return out


@pytest.mark.parametrize("model,parallel", _account_interleaved(), ids=lambda x: getattr(x, "name", None) or "")
def test_closed_form_equals_predictor_account_interleaved(model, parallel):
    """The edge chunk holding one layer fewer (its slot is the embedding / loss): its gradient buffer, the
    expert buffer and the parameter all-gathers, as the predictor issues them — call by call in size, not only in
    the per-kind totals the general test compares."""
    test_closed_form_equals_predictor(model, parallel)
    ctx = Context(model, parallel)
    t = candidate_table(model, ParallelTable.from_parallel(parallel, model))
    c = arrays(model, t, GPN)
    for cls, r in (("first", 0), ("last", parallel.pp - 1)):
        want = sorted(call.bytes for call in program.stage_program(ctx, r)
                      if call.parallelism == "dp" and call.op in ("reduce_scatter", "all_gather", "all_reduce")
                      and call.bytes > 8)
        layers = step.stage_classes(model, c["pp"], c["vpp"], {k: c[k] for k in step.UNEVEN})[cls]
        got = sorted(int(it.nbytes[0]) for it in comm_items(model, for_class(c, cls), cls, layers)
                     if it.parallelism == "dp" and it.op in ("reduce_scatter", "all_gather", "all_reduce")
                     and int(it.nbytes[0]) > 8 for _ in range(int(it.count[0])))
        assert got == want, (cls, got, want)


def test_account_interleaved_refused_for_mixed_layers():
    from llmcomm.overhead.iteration import iteration_time

    m = load_model("deepseek-moe-16b")  # a first dense layer, then MoE layers
    assert not all(m.moe_layer_pattern())
    p = ParallelConfig(tp=1, pp=2, vpp=5, dp=2, ep=2, micro_batch=1, global_batch=8, seq_len=128,
                       account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    validate(m, p)
    with pytest.raises(ConfigError, match="mixing dense and MoE layers"):
        iteration_time(m, p, load_cluster("a100-80g-hdr200"))
