"""Model and cluster catalogues, parameter counts against published totals, validation rules."""

from __future__ import annotations

import dataclasses

import pytest

import llmcomm as lc
from llmcomm.catalogue import matches_published, significant_digits
from llmcomm.specs import ModelSpec, ParallelConfig, validate
from llmcomm.specs import data_dir as specs_data_dir

CATALOGUE = lc.list_models()
REQUIRED = [
    "gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b",
    "megatron-gpt-1.7b", "megatron-gpt-18b", "megatron-gpt-145b", "megatron-gpt-1t",
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b",
    "mixtral-8x7b", "mixtral-8x22b", "qwen2-57b-a14b", "deepseek-moe-16b",
]


def _matches_published(computed: int, published: float) -> bool:
    return matches_published(computed, published, tolerance=0.02)


def test_catalogue_has_the_required_models() -> None:
    missing = sorted(set(REQUIRED) - set(CATALOGUE))
    assert not missing, f"catalogue lacks {missing}"


@pytest.mark.parametrize("name", CATALOGUE)
def test_parameter_count_matches_published(name: str) -> None:
    m = lc.load_model(name)
    assert m.source, f"{name}: every catalogue entry cites its source"
    assert m.published_parameters, f"{name}: published_parameters missing"
    if m.published_is_nominal:  # only the name states a size ("8B"): within 10 % of it
        assert abs(m.num_parameters() - m.published_parameters) <= 0.10 * m.published_parameters, name
    else:
        assert _matches_published(m.num_parameters(), m.published_parameters), (
            f"{name}: computed {m.num_parameters():,} vs published {m.published_parameters:,.0f}")
    if m.is_moe:
        assert m.published_active_parameters
        assert _matches_published(m.num_active_parameters(), m.published_active_parameters), name
        assert m.num_active_parameters() < m.num_parameters()
    else:
        assert m.num_active_parameters() == m.num_parameters()


def test_gpt3_175b_matches_megatron_closed_form() -> None:
    """12·L·h²·(1 + 13/(12h) + (V+s)/(12·L·h)) is Megatron's formula for its GPT layout; it leaves out the
    final LayerNorm (2h), which the model has."""
    m = lc.load_model("gpt3-175b")
    L, h, V, s = m.num_layers, m.hidden_size, m.vocab_size, m.max_position_embeddings
    closed = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
    assert m.num_parameters() == pytest.approx(closed + 2 * h, rel=1e-12)


def test_mixtral_active_parameters_by_hand() -> None:
    m = lc.load_model("mixtral-8x7b")
    h, f, L = 4096, 14336, 32
    attn = h * 4096 + 2 * h * 8 * 128 + 4096 * h
    per_layer_total = attn + 8 * 3 * h * f + h * 8 + 2 * h
    assert m.num_parameters() == 2 * 32000 * h + h + L * per_layer_total
    assert m.num_active_parameters() == 2 * 32000 * h + h + L * (per_layer_total - 6 * 3 * h * f)


def test_model_roundtrip_and_unknown_field(tmp_path) -> None:
    m = lc.load_model("llama3-8b")
    assert ModelSpec.from_dict(m.to_dict()) == m
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnum_layers: 2\nhidden: 3\n")
    with pytest.raises(lc.ConfigError, match="unknown model field"):
        lc.load_model(bad)
    with pytest.raises(lc.ConfigError, match="neither a file nor in the catalogue"):
        lc.load_model("no-such-model")


@pytest.mark.parametrize("kwargs, rule", [
    (dict(num_attention_heads=30, num_query_groups=4), "num_query_groups=4 does not divide num_attention_heads=30"),
    (dict(hidden_size=0), "hidden_size=0 must be a positive integer"),
    (dict(num_experts=4, moe_router_topk=5), r"moe_router_topk=5 must be in \[1, num_experts=4\]"),
    (dict(activation="relu"), r"activation='relu' is not one of \['gelu', 'swiglu', 'squared_relu'\]"),
    (dict(activation="squared_relu"), "activation='squared_relu' with gated_mlp=True: 'swiglu' is the gated"),
    (dict(gated_mlp=False, activation="swiglu"), "activation='swiglu' with gated_mlp=False"),
])
def test_model_validation_names_the_rule(kwargs, rule) -> None:
    base = lc.load_model("llama2-7b").to_dict()
    base.update(kwargs)
    with pytest.raises(lc.ConfigError, match=rule):
        ModelSpec.from_dict(base)


def test_activation_kind_defaults_from_gated_mlp() -> None:
    """Without ``activation`` a model means what it did before the field: SwiGLU if gated, else the bias-GeLU;
    the Nemotron files name their squared ReLU."""
    assert lc.load_model("gpt3-175b").activation_kind == "gelu"
    assert lc.load_model("llama2-7b").activation_kind == "swiglu"
    for name in ("nemotron3-8b", "nemotron3-22b", "nemotron4-340b"):
        assert lc.load_model(name).activation_kind == "squared_relu", name


@pytest.mark.parametrize("par, cluster_nodes, rule", [
    (dict(tp=3), None, "tp=3 does not divide num_attention_heads=32"),
    (dict(tp=2, pp=4, dp=6), 4, "tp\\*pp\\*dp\\*cp=48 but the cluster a100-40g-hdr200 has 32 GPUs"),
    (dict(pp=5), None, "pp=5 does not divide num_layers=32"),
    (dict(ep=2, dp=2), None, "ep=2 needs an MoE model"),
])
def test_job_validation_names_the_rule(par, cluster_nodes, rule) -> None:
    m = lc.load_model("llama2-7b")
    c = lc.load_cluster("a100-40g-hdr200", num_nodes=cluster_nodes) if cluster_nodes else None
    with pytest.raises(lc.ConfigError, match=rule):
        validate(m, ParallelConfig(**par), c)


@pytest.mark.parametrize("kwargs, rule", [
    (dict(dp=2, micro_batch=3, global_batch=8), "micro_batch\\*dp=6 does not divide global_batch=8"),
    (dict(sp=True), "sp=True needs tp > 1"),
    (dict(dp=3, ep=2), r"world size 3 is not divisible by etp\*ep\*pp=2"),
    (dict(recompute="some"), "recompute='some' is not one of"),
    (dict(act_dtype="int4"), "dtype='int4' is not one of"),
    (dict(pp=1, vpp=2), "needs pp >= 2"),
    (dict(order="tp-pp-xx"), "must be a permutation"),
])
def test_parallel_validation_names_the_rule(kwargs, rule) -> None:
    with pytest.raises(lc.ConfigError, match=rule):
        ParallelConfig(**kwargs)


def test_parallel_derived_quantities() -> None:
    p = ParallelConfig(tp=8, pp=16, dp=128, micro_batch=1, global_batch=1536)
    assert p.world_size == 16384
    assert p.num_microbatches == 12
    assert ParallelConfig(tp=2, pp=2, vpp=2, dp=2, global_batch=8).schedule == "interleaved"


def test_cluster_catalogue() -> None:
    names = lc.list_clusters()
    for n in ("a100-40g-hdr200", "a100-80g-hdr200", "h100-80g-ndr400", "h200-141g-ndr400"):
        assert n in names
        c = lc.load_cluster(n)
        assert c.gpus_per_node == 8 and c.source
        assert c.intra_node_bandwidth > c.inter_node_bandwidth
    c = lc.load_cluster("h100-80g-ndr400")
    assert c.inter_node_bandwidth == 50e9  # 400 Gb/s
    assert c.for_world(20).num_nodes == 3
    assert dataclasses.replace(c, num_nodes=2).num_gpus == 16
    with pytest.raises(lc.ConfigError, match="not found"):
        lc.load_cluster("tpu-v5")


def test_cluster_datasheet_figures() -> None:
    """H100 SXM, H200 and B200 carry their dense peaks (FP8 twice BF16), HBM and NIC, each cited in the file."""
    h100, h200, b200 = (lc.load_cluster(n) for n in ("h100-80g-ndr400", "h200-141g-ndr400", "b200-180g-ndr400"))
    assert h100.peak_bf16_flops == h200.peak_bf16_flops == 989.4e12 and h100.sm_count == h200.sm_count == 132
    for c in (h100, h200, b200):
        assert c.peak_fp8_flops == pytest.approx(2 * c.peak_bf16_flops, rel=1e-3) and c.fabric == "ndr400-ib" and c.nic
    assert (h100.hbm_bandwidth, h200.hbm_bandwidth, b200.hbm_bandwidth) == (3.35e12, 4.8e12, 8.0e12)
    assert b200.intra_node_bandwidth == 2 * h100.intra_node_bandwidth and b200.gpu_memory_bytes == 180e9
    assert lc.load_cluster("a100-40g-hdr200").peak_fp8_flops is None  # Ampere has no FP8 Tensor Cores
    for name in lc.list_clusters():
        text = (specs_data_dir() / "clusters" / f"{name}.yaml").read_text()
        for line in text.splitlines():
            if line.split(":")[0] in ("peak_bf16_flops", "peak_fp8_flops", "hbm_bandwidth", "intra_node_bandwidth",
                                      "inter_node_bandwidth"):
                assert "#" in line, f"{name}: {line!r} cites no source"
    with pytest.raises(lc.ConfigError, match="hbm_bandwidth"):
        dataclasses.replace(h100, hbm_bandwidth=0.0)


def test_padded_vocab() -> None:
    m = lc.load_model("gpt3-175b")
    assert m.padded_vocab_size(tp=1) == 50304
    assert m.padded_vocab_size(tp=8) % (128 * 8) == 0


def test_published_precision_rule() -> None:
    assert significant_digits(1.7e9) == 2 and significant_digits(6738415616) == 10
    assert matches_published(1.652e9, 1.7e9)  # rounds to 1.7B: what the table printed
    assert not matches_published(1.62e9, 1.7e9)  # rounds to 1.6B: a real disagreement
    assert not matches_published(6.9e9, 6.738415616e9)


def test_bad_model_file_names_file_field_and_rule(tmp_path) -> None:
    d = lc.load_model("llama2-7b").to_dict()
    d["num_layers"] = "many"
    import yaml

    f = tmp_path / "broken.yaml"
    f.write_text(yaml.safe_dump(d))
    with pytest.raises(lc.ConfigError, match=r"broken.yaml: model llama2-7b: num_layers='many' must be an integer, got a string"):
        lc.load_model(f)
    c = tmp_path / "cl.yaml"
    c.write_text("name: x\ngpus_per_node: 8\ngpu: g\npeak_bf16_flops: -1\ngpu_memory_bytes: 1\n"
                 "intra_node_bandwidth: 1\ninter_node_bandwidth: 1\n")
    with pytest.raises(lc.ConfigError, match=r"cl.yaml: cluster x: peak_bf16_flops=-1.0 must be > 0"):
        lc.load_cluster(c)
