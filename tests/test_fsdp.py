"""FSDP (predictor, time, memory) and Megatron-LM's --recompute-modules (rules, time, memory, calls): hand-worked."""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import pytest

import llmcomm as lc
from llmcomm.errors import ConfigError
from llmcomm.overhead import fsdp_time
from llmcomm.overhead import utilization as U
from llmcomm.overhead.iteration import iteration_time, layer_times, stages
from llmcomm.overhead.memory import memory
from llmcomm.parallel_table import ParallelTable
from llmcomm.predict import predict_traffic
from llmcomm.specs import ParallelConfig, load_cluster, load_model
from llmcomm.step import layer_activation_bytes

A100 = load_cluster("a100-80g-hdr200")


# ------------------------------------------------------------------------------------------- exposure
def _r(a, ab, r, a_e, ab_e, r_e, nd=4, nm=0):
    one = np.ones(1)
    return {"q": {"nd": nd * one, "nm": nm * one}, "fsdp:ag_f:d": a * one, "fsdp:ag_b:d": ab * one,
            "fsdp:rs_b:d": r * one, "fsdp:ag_f:e": a_e * one, "fsdp:ag_b:e": ab_e * one, "fsdp:rs_b:e": r_e * one}


def test_exposed_by_hand():
    """4 dense units, all-gather 3 s, reduce-scatter 2 s, forward 2 s, backward 4 s per unit; a non-layer unit of
    1 s per call. Forward: 3 + 3·max(0, 3 − 2) = 6; backward: 3 + 2 (first gather, last reduce-scatter)
    + 3·max(0, 3 + 2 − 4) = 8; the non-layer unit 3 in full: 17."""
    f, b = (np.array([2.0]), np.zeros(1)), (np.array([4.0]), np.zeros(1))
    assert fsdp_time.exposed(_r(3, 3, 2, 1, 1, 1), f, b, np.array([1]))[0] == pytest.approx(17.0)
    # two chunks of two units: two first gathers and two last reduce-scatters, 2 interior units
    assert fsdp_time.exposed(_r(3, 3, 2, 1, 1, 1), f, b, np.array([2]))[0] == pytest.approx(
        2 * 3 + 2 * 1 + 2 * 5 + 2 * 1 + 3)
    # shards kept after the forward: no backward gathers; the reduce-scatter (2 s) hides under a 4 s backward
    assert fsdp_time.exposed(_r(3, 0, 2, 1, 0, 1), f, b, np.array([1]))[0] == pytest.approx(6 + 2 + 0 + 2)
    # a fast network: only the first gather and the last reduce-scatter of the chain stay
    assert fsdp_time.exposed(_r(0.5, 0.5, 0.5, 0, 0, 0), f, b, np.array([1]))[0] == pytest.approx(0.5 + 1.0)


class _Linear:
    """A bandwidth model of 1 ns per byte for every collective (a hand-workable network)."""

    def time(self, op, nbytes, n, k):
        return np.where(np.asarray(n) > 1, np.asarray(nbytes, dtype=np.float64) * 1e-9, 0.0)


def test_fsdp_exposed_time_in_the_iteration_by_hand():
    """gpt3-125m, dp 4, 2 micro-batches, 1 ns/byte: a layer unit gathers 7,087,872 bf16 parameters (14.2 ms) and
    reduce-scatters their fp32 gradients (28.4 ms); the non-layer unit (word and position embeddings, final norm:
    40,207,872) 80.4 ms + 80.4 ms + 160.8 ms, exposed in full. dp_comm_s = 2 · (the module equation) + the
    per-iteration scalars (bytes, ~ns)."""
    m = load_model("gpt3-125m")
    layer = 12 * 768 ** 2 + 13 * 768
    edge = 50304 * 768 + 2048 * 768 + 2 * 768
    assert m.layer_parameter_split(0, 1, 1).total == layer
    p = ParallelConfig(dp=4, global_batch=8, micro_batch=1, seq_len=512, fsdp=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = iteration_time(m, p, A100, bandwidth=_Linear())
    st = stages(m, ParallelTable.from_parallel(p, m), A100, _Linear())
    util = U.Utilization.default()
    (fd, _), (bd, _) = layer_times(st.cls["first"]["q"], util)
    a, r, ae, re_ = 2 * layer * 1e-9, 4 * layer * 1e-9, 2 * edge * 1e-9, 4 * edge * 1e-9
    per_mb = (ae + ae + re_) + (a + a + r) + 11 * (max(0.0, a - fd[0]) + max(0.0, a + r - bd[0]))
    assert b.dp_comm_s == pytest.approx(2 * per_mb, abs=1e-6)
    assert b.dp_comm_total_s == pytest.approx(2 * (12 * (2 * a + r) + 2 * ae + re_), abs=1e-6)
    assert b.total_s > iteration_time(m, ParallelConfig(dp=4, global_batch=8, micro_batch=1, seq_len=512,
                                                        distributed_optimizer=True), A100, bandwidth=_Linear()).total_s


# ------------------------------------------------------------------------------------------- predictor
def _dp_calls(p: ParallelConfig, model: str = "gpt3-125m"):
    ev = predict_traffic(load_model(model), p, aggregate=False).events
    ev = ev[(ev["rank"] == 0) & (ev["parallelism"] == "dp")]
    return ev.groupby(["phase", "op"], observed=True).size().to_dict()


def test_reshard_flag_removes_the_backward_all_gathers():
    """12 layers + the non-layer unit, 2 micro-batches: 26 gathers forward, 26 backward (resharded) or none."""
    base = dict(dp=2, global_batch=4, seq_len=128, fsdp=True)
    on, off = _dp_calls(ParallelConfig(**base)), _dp_calls(ParallelConfig(**base, fsdp_reshard_after_forward=False))
    assert on[("forward", "all_gather")] == off[("forward", "all_gather")] == 2 * 13
    assert on[("backward", "all_gather")] == 2 * 13 and ("backward", "all_gather") not in off
    assert on[("backward", "reduce_scatter")] == off[("backward", "reduce_scatter")] == 2 * 13


def test_megatron_fsdp_takes_the_distributed_optimizer_without_its_bucket_gathers():
    """fsdp + distributed_optimizer is Megatron-FSDP (arguments.py:1128-1135): accepted with overlap_grad_reduce,
    the layers' calls of torch FSDP2, the non-layer parameters gathered once per iteration and kept (reduce-scattered
    every micro-batch), none of the distributed optimizer's post-step all-gathers."""
    base = dict(dp=2, global_batch=4, seq_len=128, fsdp=True)
    mfsdp = _dp_calls(ParallelConfig(**base, distributed_optimizer=True, overlap_grad_reduce=True))
    torch2 = _dp_calls(ParallelConfig(**base))
    assert mfsdp[("forward", "all_gather")] == 2 * 12 + 1 and torch2[("forward", "all_gather")] == 2 * 13
    assert mfsdp[("backward", "all_gather")] == 2 * 12 and torch2[("backward", "all_gather")] == 2 * 13
    assert mfsdp[("backward", "reduce_scatter")] == torch2[("backward", "reduce_scatter")] == 2 * 13
    assert ("optimizer", "all_gather") not in mfsdp
    with pytest.raises(ConfigError, match="overlap_grad_reduce"):
        predict_traffic(load_model("gpt3-125m"), ParallelConfig(**base, distributed_optimizer=True))
    with pytest.raises(ConfigError, match="torch FSDP2"):
        predict_traffic(load_model("gpt3-125m"), ParallelConfig(**base, distributed_optimizer=True,
                                                                 overlap_grad_reduce=True,
                                                                 fsdp_reshard_after_forward=False))
    with pytest.raises(ConfigError, match="needs fsdp=True"):
        ParallelConfig(fsdp_reshard_after_forward=False)


# ------------------------------------------------------------------------------------------- memory
def test_fsdp_memory_per_gpu_by_hand():
    """gpt3-125m on dp 4 (P = 12 layers + the non-layer unit = 125,262,336; the largest unit is the non-layer one,
    40,207,872): weights P/4·2 + 2·40,207,872·2, gradients P/4·4 + 2·40,207,872·4, Adam 12·P/4; without
    resharding all P stay gathered."""
    m = load_model("gpt3-125m")
    P, unit = 12 * (12 * 768 ** 2 + 13 * 768) + 50304 * 768 + 2048 * 768 + 2 * 768, 50304 * 768 + 2048 * 768 + 2 * 768
    assert P == 125_262_336
    mem = memory(m, ParallelConfig(dp=4, seq_len=128, fsdp=True))
    assert (mem.weights, mem.gradients, mem.optimizer) == (P / 4 * 2 + 2 * unit * 2, P / 4 * 4 + 2 * unit * 4,
                                                           12 * P / 4)
    kept = memory(m, ParallelConfig(dp=4, seq_len=128, fsdp=True, fsdp_reshard_after_forward=False))
    assert kept.weights == P / 4 * 2 + P * 2 and kept.gradients == mem.gradients
    # Megatron-FSDP: the layer is the unit (7,087,872); the non-layer parameters stay gathered
    layer = 12 * 768 ** 2 + 13 * 768
    mf = memory(m, ParallelConfig(dp=4, seq_len=128, fsdp=True, distributed_optimizer=True, overlap_grad_reduce=True))
    assert (mf.weights, mf.gradients) == (P / 4 * 2 + 2 * layer * 2 + unit * 2, P / 4 * 4 + 2 * layer * 4)
    plain = memory(m, ParallelConfig(dp=4, seq_len=128))
    assert plain.weights == P * 2 and plain.activations == mem.activations


# ------------------------------------------------------------------------------------------- --recompute-modules
def test_recompute_modules_rules():
    with pytest.raises(ConfigError, match="each must be one of"):
        ParallelConfig(recompute="selective", recompute_modules=("mhc",))
    with pytest.raises(ConfigError, match="needs recompute='selective'"):
        ParallelConfig(recompute="full", recompute_modules=("mlp",))
    with pytest.raises(ConfigError, match="Delayed scaling"):
        ParallelConfig(recompute="selective", recompute_modules=("layernorm", "moe_act"), fp8="hybrid")
    ok = ParallelConfig(recompute="selective", recompute_modules=["layernorm", "moe_act"], fp8="hybrid",
                        fp8_recipe="tensorwise")  # NVIDIA's GPT-OSS 120B recipe's modules
    assert ok.recompute_modules == ("layernorm", "moe_act")
    with pytest.raises(ConfigError, match="multi-latent attention"):
        lc.validate(load_model("llama2-7b"), ParallelConfig(recompute="selective", recompute_modules=("mla_up_proj",)))


def _rec(model, cluster, **kw):
    p = ParallelConfig(global_batch=4, micro_batch=1, seq_len=1024, recompute="selective", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return iteration_time(model, p, cluster).recompute_s


def test_recompute_modules_added_compute_by_hand():
    """llama2-7b on 4 A100s (tp 4, no SP; FLOPs/peak GEMMs), 4 micro-batches of 1,024 tokens: "mlp" adds per layer
    its fc1 (gated: 2·f) and fc2 GEMMs, 2·T·3·h·f/4 FLOPs, at θ_gemm/peak, and 6·T·f/4 (the fused SwiGLU: reads
    2f, writes f) + 2·2·T·h (the fused pre-MLP norm, full width without SP) bytes at θ_mem/HBM; "layernorm" adds
    nothing to a dense layer (TE fuses its norms)."""
    m, cl = load_model("llama2-7b"), A100
    util = U.Utilization.default()
    th_g, th_m = util.coef[U.I["gemm"]] / util.scale, util.coef[U.I["mem"]] / util.scale
    T, h, f = 1024, m.hidden_size, m.ffn_hidden_size
    per_layer = (th_g * 2 * T * 3 * h * f / 4 / cl.peak_bf16_flops
                 + th_m * (6 * T * f / 4 + 4 * T * h) / U.hbm_bandwidth(cl))
    core = _rec(m, cl, tp=4)
    got = _rec(m, cl, tp=4, recompute_modules=("core_attn", "mlp")) - core
    assert got == pytest.approx(4 * 32 * per_layer, rel=1e-9)
    assert _rec(m, cl, tp=4, recompute_modules=("core_attn", "layernorm")) == core
    assert _rec(m, cl, tp=4, recompute_modules=()) == 0.0  # selective with no module recomputes nothing


def test_recompute_moe_act_added_compute_by_hand():
    """mixtral-8x7b, tp 4 (SP), pp 4, ep 1: "moe_act" adds 6·T·top-k·f_e/tp bytes (the fused SwiGLU reads 2·f_e and
    writes f_e per token and expert) per MoE layer at θ_mem/HBM."""
    m, cl = load_model("mixtral-8x7b"), load_cluster("h100-80g-ndr400")
    util = U.Utilization.default()
    th_m = util.coef[U.I["mem"]] / util.scale
    kw = dict(tp=4, pp=4, sp=True)
    extra = th_m * 6 * 1024 * m.moe_router_topk * m.expert_ffn_hidden_size / 4 / U.hbm_bandwidth(cl)
    got = _rec(m, cl, recompute_modules=("core_attn", "moe_act"), **kw) - _rec(m, cl, **kw)
    assert got == pytest.approx(4 * (m.num_layers // 4) * extra, rel=1e-9)


def test_recompute_modules_memory():
    """What each module does not keep, per token of one layer (bf16, tp 1, no SP)."""
    m, moe = load_model("llama2-7b"), load_model("mixtral-8x7b")

    def act(model, is_moe, mods):
        return float(layer_activation_bytes(model, is_moe, seq=1024, micro_batch=1, tp=1, sp=False,
                                            recompute="selective", act_bytes=2, recompute_modules=mods)) / 1024

    h, f = m.hidden_size, m.ffn_hidden_size
    assert act(m, False, ("core_attn",)) - act(m, False, ("core_attn", "mlp")) == 2 * h + (2 * 2 * f + 2 * f)
    assert act(m, False, ("core_attn",)) == act(m, False, None) == act(m, False, ("core_attn", "layernorm"))
    assert act(m, False, ()) - act(m, False, ("core_attn",)) == 5 * m.num_attention_heads * 1024
    H, fe, k = moe.hidden_size, moe.expert_ffn_hidden_size, moe.moe_router_topk
    base = act(moe, True, ("core_attn",))
    assert base - act(moe, True, ("core_attn", "layernorm")) == 2 * H
    assert base - act(moe, True, ("core_attn", "moe_act")) == k * 2 * fe
    assert base - act(moe, True, ("core_attn", "moe")) == k * (2 * 2 * fe + 2 * fe)


def test_recompute_mlp_replays_the_mlp_calls():
    """tp 2 without SP: "mlp" adds the MLP block's forward all-reduce to each layer's backward."""
    m = load_model("gpt3-125m")
    base = dict(tp=2, global_batch=1, seq_len=128, recompute="selective")

    def tp_ar(**kw):
        ev = predict_traffic(m, ParallelConfig(**base, **kw), aggregate=False).events
        ev = ev[(ev["rank"] == 0) & (ev["op"] == "all_reduce") & (ev["phase"] == "backward")]
        return len(ev)

    assert tp_ar(recompute_modules=("core_attn", "mlp")) - tp_ar() == 12


def test_cli_flags():
    from llmcomm.cli_options import add_parallel, parallel_from_args

    ap = argparse.ArgumentParser()
    add_parallel(ap, extras=("recompute", "fsdp", "distributed_optimizer"))
    p = parallel_from_args(ap.parse_args(["--dp", "2", "--fsdp", "--fsdp-no-reshard-after-forward", "--recompute",
                                          "selective", "--recompute-modules", "layernorm", "moe_act"]))
    assert p.fsdp and not p.fsdp_reshard_after_forward and p.recompute_modules == ("layernorm", "moe_act")
    assert parallel_from_args(ap.parse_args([])).fsdp_reshard_after_forward
