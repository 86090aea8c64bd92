"""MoE parallel folding in the formulation (llmcomm.overhead.moe_fold): expert TP ``etp`` other than ``tp``, EP spanning
``dp·cp·tp``; the closed-form calls equal the predictor's, the time worked by hand, the rules, and the inter-node
all-to-all's NIC rule (llmcomm.overhead.bandwidth.all_to_all_nic_factor)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from stub_bandwidth import StubBandwidth, call
from test_overhead_bytes import GPN, ORDERS, accepted, assert_closed_form_equals_predictor

from llmcomm import rules, step
from llmcomm.errors import ConfigError
from llmcomm.overhead import Utilization, iteration_time
from llmcomm.overhead.iteration import arrays, candidate_table, comm_items, for_class
from llmcomm.parallel_table import ParallelTable
from llmcomm.specs import Cluster, ModelSpec, ParallelConfig, load_cluster, load_model, validate

MOE_MODELS = ("mixtral-8x7b", "tiny-moe", "deepseek-moe-16b", "qwen3-30b-a3b")


def etp_configs(seed: int, count: int):
    """``count`` valid MoE configurations with an expert TP drawn apart from tp (mostly different) and an EP that
    may span the attention TP, CP and DP ranks (``world % (etp·ep·pp) == 0`` is the only grid rule)."""
    rng = random.Random(seed)
    models = [load_model(n) for n in MOE_MODELS]
    out = []
    while len(out) < count:
        model = rng.choice(models)
        tp, etp = rng.choice([1, 2, 4]), rng.choice([1, 2, 4])
        pp, dp, cp = rng.choice([1, 2, 3]), rng.choice([1, 2, 4]), rng.choice([1, 1, 2])
        ep = rng.choice([1, 2, 4, 8])
        vpp = rng.choice([1, 1, 2])
        b, m = rng.choice([1, 2]), rng.choice([1, 2, 4])
        kw = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, micro_batch=b, global_batch=b * dp * m,
                  seq_len=rng.choice([128, 256]), sp=tp > 1, recompute=rng.choice(["none", "selective", "full"]),
                  distributed_optimizer=rng.random() < 0.5, act_dtype=rng.choice(["bf16", "fp16"]),
                  moe_aux_loss_coeff=rng.choice([0.0, 0.01]), order=rng.choice(ORDERS),
                  cp_comm_type=rng.choice(["p2p", "all_gather"]))
        p = accepted(model, ParallelConfig, **kw)
        if p is not None:
            out.append((model, p))
    return out


ETP_CONFIGS = etp_configs(5, 60)


@pytest.mark.parametrize("model,parallel", ETP_CONFIGS, ids=lambda x: getattr(x, "name", None) or "")
def test_closed_form_equals_predictor_with_folding(model, parallel):
    """Call for call and byte for byte, on groups of the same size and ranks per node: the expert-TP calls on the
    expert-TP group, the tp_ep token counts over etp·ep, the expert gradients over world/(etp·ep·pp), the expert
    optimizer's gradient statistics over etp·ep·pp."""
    assert_closed_form_equals_predictor(model, parallel)


def test_folding_configurations_counted():
    cfgs = ETP_CONFIGS
    assert len(cfgs) == 60
    assert sum(p.expert_tp != p.tp for _, p in cfgs) >= 30
    assert any(p.etp == 1 and p.tp > 1 and p.ep > p.dp * p.cp for _, p in cfgs)  # EP spanning attention TP
    assert any(p.expert_tp > p.tp for _, p in cfgs)
    assert any(p.expert_tp > 1 and p.expert_tp != p.tp for _, p in cfgs)  # expert-TP calls on their own group
    assert any(p.expert_tp != p.tp and p.expert_dp > 1 and p.distributed_optimizer for _, p in cfgs)
    assert any(p.expert_tp != p.tp and p.cp > 1 for _, p in cfgs)
    assert any(p.expert_tp != p.tp and p.world_size > GPN and p.order != "tp-cp-ep-dp-pp" for _, p in cfgs)
    assert any(p.expert_tp != p.tp and p.recompute == "full" for _, p in cfgs)


# ------------------------------------------------------------------------------------------ time by hand
CLUSTER = Cluster(name="test", gpus_per_node=8, gpu="NVIDIA H100 test", peak_bf16_flops=1e12,
                  gpu_memory_bytes=80e9, intra_node_bandwidth=1e9, inter_node_bandwidth=1e9)
MOE = ModelSpec(name="small-moe", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                vocab_size=128, num_experts=4, moe_router_topk=2, seq_length=32, tied_embeddings=False)
GEMM_ONLY = Utilization(coef=(1.0, 0.0, 0.0, 0.0, 0.0))


def _par(**kw) -> ParallelConfig:
    return ParallelConfig(**{**dict(tp=2, pp=1, dp=2, sp=True, micro_batch=1, global_batch=4), **kw})


def test_folded_expert_calls_by_hand():
    """tp 2 (SP), dp 2, ep 4, etp 1 on 4 GPUs (the Qwen3-235B recipe's shape: EP across the attention-TP pair):
    a rank enters the MoE layer with T/tp = 16 of the 32 tokens; per MoE layer and micro-batch the alltoall
    dispatcher issues the tp_ep token-count all-gather (etp·ep·E int64 = 1·4·4·8 bytes), the dispatch and combine
    all-to-alls of 16·k·h·act = 4,096 bytes (splits of 1,024 to each of the 4 EP ranks) and the probabilities'
    (16·k·act = 64 bytes), and no expert-TP call (etp = 1): the all-to-alls in ep_comm_s, nothing of the experts in
    tp_comm_s. Against tp 2 = etp 2, ep 2 (no folding), tp_comm_s differs by the expert-TP calls alone: forward AG of
    the gathered tokens (etp·16·k·h·act = 8,192) and probabilities (128), RS of the output (8,192); backward AG
    (8,192), RS tokens (8,192), RS probabilities (128); m = 2 micro-batches, 2 MoE layers."""
    m, L = 2, 2
    b = iteration_time(MOE, _par(ep=4, etp=1), CLUSTER, StubBandwidth(), GEMM_ONLY)
    per_layer = call(1 * 4 * 4 * 8) + 4 * call(4 * 1024) + 2 * call(4 * 16)
    assert b.ep_comm_s == pytest.approx(m * L * per_layer, rel=1e-12)
    unfolded = iteration_time(MOE, _par(ep=2), CLUSTER, StubBandwidth(), GEMM_ONLY)
    etp_calls = 4 * call(8192) + 2 * call(128)
    assert unfolded.tp_comm_s - b.tp_comm_s == pytest.approx(m * L * etp_calls, rel=1e-9)
    # expert FLOPs per rank do not depend on etp (1/(etp·ep) of the experts' work on etp·ep ranks' tokens)
    assert b.forward_s == pytest.approx(unfolded.forward_s, rel=1e-12)


def test_expert_gradients_over_the_expert_data_parallel_group():
    """tp 2, dp 2, ep 2, etp 1: the expert grid is etp 1 · ep 2 · edp 2; each rank holds E/ep = 2 whole experts
    (2·2·h·f = 32,768 parameters, not split by tp), reduced in fp32 over edp = 2 ranks: one all-reduce of
    131,072 bytes per iteration (2 layers) on top of the dense buffer's; with ep 1 all four experts over edp 4 (the
    experts live in a buffer of their own since etp != tp, even with ep = 1); with etp = tp = 2, ep 2 the expert
    data-parallel group has one rank and nothing is reduced."""
    folded = iteration_time(MOE, _par(ep=2, etp=1), CLUSTER, StubBandwidth(), GEMM_ONLY)
    experts = 2 * 2 * 64 * 128
    assert MOE.layer_parameter_split(0, 2, 2, etp=1).expert == experts
    assert MOE.layer_parameter_split(0, 2, 2, etp=2).expert == experts // 2

    for kw, edp, n_expert in ((dict(ep=2, etp=1), 2, 2 * experts), (dict(ep=1, etp=1), 4, 4 * experts),
                              (dict(ep=2, etp=2), 1, 0)):
        par = _par(**kw)
        t = candidate_table(MOE, ParallelTable.from_parallel(par, MOE))
        c = arrays(MOE, t, GPN)
        layers = step.stage_classes(MOE, c["pp"], c["vpp"], {k: c[k] for k in step.UNEVEN})["first"]
        its = [it for it in comm_items(MOE, for_class(c, "first"), "first", layers) if it.grad == "expert"
               and it.count[0] > 0]
        assert sum(int(it.nbytes[0]) * int(it.count[0]) for it in its) == n_expert * 4, kw
        assert all(int(it.size[0]) == edp for it in its), kw
    assert folded.dp_comm_s > 0


# ------------------------------------------------------------------------------------------------ rules
def test_cost_etp_rule_is_gone_and_the_expert_grid_rules_stay():
    assert "cost-etp" not in rules.BY_NAME
    m = load_model("qwen3-235b-a22b")
    p = ParallelConfig(tp=2, pp=8, dp=16, ep=32, etp=1, sp=True, vpp=4, micro_batch=1, global_batch=8192,
                       account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    rules.check(m, p, ("config", "job", "megatron", "cost"))
    with pytest.raises(ConfigError, match="etp\\*ep\\*pp"):  # world % (etp·ep·pp)
        ParallelConfig(tp=2, pp=8, dp=16, ep=32, etp=2, sp=True, micro_batch=1, global_batch=16)
    bad = dataclasses.replace(m, moe_ffn_hidden_size=1537)
    with pytest.raises(ConfigError, match="does not divide the expert FFN size 1537"):
        validate(bad, ParallelConfig(tp=1, dp=4, ep=2, etp=2, micro_batch=1, global_batch=4))
    with pytest.raises(ConfigError, match="does not end with pp"):  # parallel_state.py:898-902
        rules.check(m, ParallelConfig(tp=2, pp=2, dp=2, ep=4, etp=1, sp=True, micro_batch=1, global_batch=4,
                                      order="tp-pp-dp"), ("config", "job", "megatron"))


# ------------------------------------------------------------------------------------ inter-node all-to-all
def test_inter_node_all_to_all_is_nic_bound():
    """An all-to-all across nodes sends each rank's (n−k)/n share through its own NIC, which the carried all-reduce
    regime shares k ways: per bus byte k·(n−k)/(n−1) times the all-reduce's β (32 ranks, 8 per node: 8·24/31);
    inside a node and with one rank per node nothing changes."""
    from llmcomm.overhead.bandwidth import Bandwidth, all_to_all_nic_factor, bus_factor, eval_pieces

    assert all_to_all_nic_factor(32, 8) == pytest.approx(8 * 24 / 31)
    assert all_to_all_nic_factor(4, 1) == 1.0 and all_to_all_nic_factor(8, 8) == 1.0
    bw = Bandwidth.default(load_cluster("h100-80g-ndr400"))
    S = 128 * 2**20
    for n, k, f in ((32, 8, 8 * 24 / 31), (16, 8, 8 * 8 / 15), (8, 8, 1.0), (4, 1, 1.0)):
        x_lo, alpha, beta = bw._resolve_carried("all_to_all", n, k)
        want = eval_pieces(np.array([float(bus_factor("all_to_all", n)) * S]), x_lo, alpha, beta * f)[0][0]
        assert float(bw.time("all_to_all", S, n, k)) == pytest.approx(want, rel=1e-12), (n, k)
    # a 128 MiB dispatch over 4 DGX-H100 nodes is bound by one NIC: at most its line rate, 50 GB/s
    t = float(bw.time("all_to_all", S, 32, 8))
    assert S * 24 / 32 / t <= 50e9


# ------------------------------------------------------------------------------------------ the tuner's etp
def test_space_folds_ep_over_tp_with_etp_given():
    """etp given: EP over the divisors of tp·cp·dp (here ep 8 with dp 4 under tp 2 at etp 1), every row valid for
    the expert grid; etp not given: the space as before (EP divides dp, etp left to tp)."""
    from llmcomm.tune.space import SearchSpace, enumerate_base, expert_shapes

    m = load_model("mixtral-8x7b")
    folded = enumerate_base(m, 16, 64, space=SearchSpace(tp=(2,), pp=(2,), etp=(1, 2)))
    assert ((folded["etp"] == 1) & (folded["ep"] == 8) & (folded["dp"] == 4)).any()
    assert ((16 // folded["pp"]) % (folded["etp"] * folded["ep"]) == 0).all()
    plain = enumerate_base(m, 16, 64, space=SearchSpace(tp=(2,), pp=(2,)))
    assert (plain["etp"] == -1).all() and (plain["dp"] % plain["ep"] == 0).all()
    assert expert_shapes(load_model("gpt3-1.3b"), 2, 1, 4, SearchSpace(etp=(1,))) == [(1, -1)]


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# not tiny-moe: on H100 its unfused attention times below the fused one (llmcomm.overhead.attention_time), so the
# unfused-dominated rule misses the optimum there in the default space already (tune("tiny-moe", 8, H100, 64):
# 0.0096031 s exhaustive, 0.0096032 s pruned) — a finding about that rule, not about etp
@given(name=st.sampled_from(["mixtral-8x7b", "qwen3-30b-a3b"]), gpus=st.sampled_from([8, 16]),
       batch=st.sampled_from([64, 128]), cluster=st.sampled_from(["a100-80g-hdr200", "h100-80g-ndr400"]),
       etps=st.sampled_from([(1,), (1, 2), (1, 2, 4)]))
# found by this test: with etp 1 under tp 4 at dp 1 the distributed optimizer still shards the expert state and
# changes the expert optimizer's gradient statistics, so 'same-as-without' must not call it a tie there
@example(name="qwen3-30b-a3b", gpus=8, batch=64, cluster="a100-80g-hdr200", etps=(1,))
def test_pruned_optimum_equals_exhaustive_with_etp(name, gpus, batch, cluster, etps):
    """The tuner's property (tests/test_tune.py) over the space with expert TP as a dimension and EP folded over
    tp·cp·dp: the pruned search finds the exhaustive optimum and the counts add up."""
    from llmcomm.tune import tune
    from llmcomm.tune.space import SearchSpace

    model, hw, space = load_model(name), load_cluster(cluster), SearchSpace(etp=etps)
    try:
        full = tune(model, gpus, hw, batch, space=space, prune=False)
    except ConfigError:
        with pytest.raises(ConfigError):
            tune(model, gpus, hw, batch, space=space, prune=True)
        return
    pruned = tune(model, gpus, hw, batch, space=space, prune=True)
    assert pruned.best["total_s"] == full.best["total_s"]
    assert pruned.stats["evaluated"] + pruned.stats["pruned"] == full.stats["enumerated"] == pruned.stats["enumerated"]
    assert full.stats["evaluated"] + full.stats["pruned"] == full.stats["enumerated"]


def test_memory_shards_expert_weights_by_etp_times_ep():
    """Expert weights per GPU go with etp·ep (etp 1 · ep 32 holds what etp 2 · ep 16 holds, and less than etp 1 ·
    ep 16 by exactly the experts' half); the expert optimizer state is sharded over edp = world/(etp·ep·pp), so
    with the distributed optimizer it is the same in all three (the expert parameters / edp do not change)."""
    from llmcomm.overhead.memory import model_state

    m = load_model("qwen3-235b-a22b")
    kw = dict(tp=2, pp=8, dp=16, sp=True, vpp=4, micro_batch=1, global_batch=8192, distributed_optimizer=True,
              account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    a, b, c = (model_state(m, ParallelConfig(**kw, ep=ep, etp=etp)) for etp, ep in ((1, 32), (2, 16), (1, 16)))
    assert a == b
    assert c[0] > a[0] and c[2] == a[2]
    per_layer = m.layer_parameter_split(1, 2, 16, etp=1).expert - m.layer_parameter_split(1, 2, 32, etp=1).expert
    assert per_layer == 128 // 32 * 3 * 4096 * 1536


def test_cli_time_takes_etp(capsys):
    """``llmcomm time --etp`` (Megatron's --expert-tensor-parallel-size) reaches the formulation; a size the expert
    grid refuses is an error naming the rule's numbers."""
    from llmcomm.cli import main

    base = ["time", "tiny-moe", "--tp", "2", "--dp", "2", "--ep", "4", "--sp", "--global-batch", "4",
            "--cluster", "h100-80g-ndr400", "--quiet"]
    assert main([*base, "--etp", "1"]) == 0
    capsys.readouterr()
    assert main([*base, "--etp", "2"]) != 0  # etp 2 · ep 4 on 4 GPUs
    assert "etp*ep*pp=8" in capsys.readouterr().err
