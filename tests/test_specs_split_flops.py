"""ModelSpec's one parameter split and its FLOP counts, against hand-worked values and Megatron-LM's formula."""

from __future__ import annotations

import dataclasses

import pytest

import llmcomm as lc


@pytest.mark.parametrize("name", lc.list_models())
def test_split_adds_up_to_the_layer(name: str) -> None:
    m = lc.load_model(name)
    for layer in sorted({0, m.num_layers - 1, 1 % m.num_layers}):
        split = m.layer_parameter_split(layer)
        assert split.total == m.layer_parameters(layer)
        assert split.dense == split.sharded + split.replicated
        active = m.layer_parameter_split(layer, active=True)
        assert active.total == m.layer_parameters(layer, active=True)


def test_split_by_hand_gpt3_175b_tp8() -> None:
    m = lc.load_model("gpt3-175b")
    h = 12288
    split = m.layer_parameter_split(0, tp=8)
    # QKV + out (4h²) + their Q/K/V biases (3h) + MLP (8h²) + fc1 bias (4h), all over 8
    assert split.sharded == (4 * h * h) // 8 + (3 * h) // 8 + (8 * h * h) // 8 + (4 * h) // 8
    # two LayerNorms (2·2h) + the row-parallel output biases of attention and MLP (h each)
    assert split.replicated == 4 * h + 2 * h
    assert split.expert == 0


def test_split_by_hand_mixtral_ep8_tp2() -> None:
    m = lc.load_model("mixtral-8x7b")  # h 4096, f_e 14336, 8 experts, top-2, GQA 8 groups, RMSNorm
    h, fe, E = 4096, 14336, 8
    split = m.layer_parameter_split(0, tp=2, ep=8)
    assert split.expert == 1 * 3 * h * fe // 2
    assert split.replicated == 2 * h + h * E
    assert split.sharded == (h * 4096 + 2 * h * 8 * 128 + 4096 * h) // 2
    active = m.layer_parameter_split(0, active=True)
    assert active.expert == 2 * 3 * h * fe


def test_gpt3_flops_match_megatron_formula() -> None:
    """Megatron-LM (Narayanan et al. 2021, eq. 3): 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) per iteration with
    full recomputation = B·s·(4·(linear + attention) + 3·logits) with the per-token terms here."""
    m = lc.load_model("gpt3-175b")
    # the closed form assumes no biases matter (they are not matmul work) and f = 4h
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200
    f = m.forward_flops(s, V)
    iteration = B * s * (4 * (f.linear + f.attention) + 3 * f.logits)
    megatron = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert iteration == pytest.approx(megatron, rel=1e-12)
    assert m.flops_per_token(s, V) == pytest.approx(24 * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h)))


def test_flops_follow_gqa_swiglu_and_moe() -> None:
    llama = lc.load_model("llama3-70b")  # h 8192, 64 heads of 128, 8 KV groups, f 28672, SwiGLU
    h, d, L = 8192, 128, 80
    f = llama.forward_flops(8192, 128256)
    assert f.linear == 2 * L * (h * 64 * d + 2 * h * 8 * d + 64 * d * h + 3 * h * 28672)
    assert f.attention == L * 4 * 64 * d * 8192
    assert f.logits == 2 * h * 128256
    mix = lc.load_model("mixtral-8x7b")
    dense_equivalent = dataclasses.replace(mix, num_experts=0, moe_router_topk=0)
    extra = mix.forward_flops().linear - dense_equivalent.forward_flops().linear
    # top-2 experts instead of one FFN, plus the router's h·E, in each of 32 layers
    assert extra == 2 * 32 * (3 * 4096 * 14336 + 4096 * 8)
