"""The 25.09 rows' recipes read (data/published/nemo_h100_recipes.yaml) and the 25.11 Llama 3 8B row's block
recomputation: no row is refused for a recipe not read."""

from __future__ import annotations

import pytest

from llmcomm.overhead import nemo_rows, validation


@pytest.fixture(scope="module")
def nemo():
    return validation.validate("nemo-h100")


def _row(t, container, model):
    return t[(t["container"] == container) & (t["model"] == model)].iloc[0]


def test_no_row_refused_for_an_unread_recipe(nemo):
    t, s = nemo
    assert "unknown:recipe" not in s["needs"]
    for v in t["needs"]:
        assert "unknown:recipe" not in v.split(";")


def test_2509_settings_read_from_the_recipe_chain():
    rec = {k[1]: v for k, v in nemo_rows.recipes().items() if k[0] == "25.09"}
    ds = rec["DeepSeekV3 (dropless)"]["settings"]
    # the page's parenthesis note: the main number is FP8 at per-tensor granularity, the perf matrix's fp8_cs
    assert ds["fp8_recipe"]["value"] == "tensorwise" and "performance-summary" in ds["fp8_recipe"]["cite"]
    assert ds["moe_token_dispatcher_type"]["value"] == "flex" and ds["overlap_grad_reduce"]["value"] is False
    q30 = rec["Qwen3_30B_a3B (tokendrop)"]["settings"]
    # the recipe's enable_recompute (full/uniform/1) is cleared by the perf YAML's ConfigContainer block
    assert q30["recompute_granularity"]["value"] is None and q30["recompute_granularity"]["overrides"]
    assert q30["overlap_p2p_comm"]["value"] is True  # pp 2, vp 24: CommOverlapConfig turns it on
    l70 = rec["LLAMA3_70B"]["settings"]
    assert l70["tp_comm_overlap"]["value"] is True
    assert l70["tp_comm_overlap_cfg"]["value"] == "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192"
    assert "fp8_recipe" in rec["LLAMA3_70B"]["unknown"]  # fp8_cs and fp8_ds both match: not stated
    assert rec["LLAMA3_8B"]["settings"]["use_megatron_fsdp"]["value"] is True


def test_2511_llama3_8b_block_recompute_with_megatron_fsdp(nemo):
    t, _ = nemo
    row = _row(t, "25.11", "LLAMA3_8B")
    assert row["refused"] == "" and row["predicted_s"] > 0
    st = nemo_rows.settings(nemo_rows.read().query("container == '25.11' and model == 'LLAMA3_8B'").iloc[0])
    assert st.columns["recompute"] == "full"
    assert st.columns["recompute_method"] == "block" and st.columns["recompute_num_layers"] == 5
    assert st.columns["fsdp"] and st.columns["distributed_optimizer"]  # Megatron-FSDP runs with DistOpt


def test_later_releases_read_overlap_p2p_comm_from_comm_overlap_setup(nemo):
    """After 25.09 the recipe's CommOverlapConfig goes through runtime_config_update -> setup as well, which turns
    overlap_p2p_comm on for pp > 1 with vp > 1; GPT-OSS's H100 chain builds no CommOverlapConfig (nothing read)."""
    rec = nemo_rows.recipes()
    later = [(k, v) for k, v in rec.items() if k[0] not in ("24.07", "25.09")]
    on = {(k[0], k[1]) for k, v in later if (v.get("settings") or {}).get("overlap_p2p_comm", {}).get("value")}
    for cont in ("25.11", "26.02", "26.02.01", "26.04", "26.04.01"):
        assert (cont, "LLAMA3_70B") in on  # tp4 pp8 vp5
    for cont in ("25.11", "26.02", "26.04.01", "26.06"):
        assert (cont, "LLAMA3.1_405B") in on  # tp8 pp8 vp8
    for k, v in later:
        p2p = (v.get("settings") or {}).get("overlap_p2p_comm")
        if k[1] == "GPT OSS 120B":
            assert p2p is None
        if p2p is not None:
            assert "comm_overlap.py:" in p2p["cite"] and "runtime_config_update" in p2p["cite"]
            assert "CommOverlapConfig" in p2p["cite"]
    t, _ = nemo
    row = _row(t, "26.02", "LLAMA3_70B")
    assert row["refused"] == "" and "overlap_p2p_comm" in row["columns"]


def test_2407_attention_kernel_read_from_the_launchers_environment(nemo):
    """NeMo 24.07's launcher exports NVTE_FUSED_ATTN=0 to every job (config.yaml:72): TE's FlashAttention runs
    (attention_backend flash); the 175B 64-node config states NVTE_FUSED_ATTN: 1 (cuDNN, TE chooses: auto); the
    175B 16-node row is read at the tag, whose environment (0) the perf team's script at its node count (1) contradicts."""
    rec = {(k[1], v["row"]["num_gpus"]): v for k, v in nemo_rows.recipes().items() if k[0] == "24.07"}
    for model in ("GPT3-5B", "Nemotron-8B", "Nemotron-22B", "LLAMA3-70B"):
        key = next(k for k in rec if k[0] == model)
        a = rec[key]["settings"]["attention_backend"]
        assert a["value"] == "flash" and a["cite"].startswith("launcher_scripts/conf/config.yaml:")
    assert rec[("GPT3-175B", 512)]["settings"]["attention_backend"]["value"] is None
    assert "NVTE_FUSED_ATTN=1" in rec[("GPT3-175B", 512)]["settings"]["attention_backend"]["cite"]
    assert "attention_backend" in rec[("GPT3-175B", 128)]["unknown"]
    t, _ = nemo
    row = t[(t["container"] == "24.07") & (t["model"] == "GPT3-175B") & (t["num_gpus"] == 128)].iloc[0]
    assert "unknown:attention_backend" in row["needs"].split(";")
    st = nemo_rows.settings(nemo_rows.read().query("container == '24.07' and model == 'Nemotron-8B'").iloc[0])
    assert st.columns["attention_backend"] == "flash"
    st = nemo_rows.settings(nemo_rows.read().query("container == '24.07' and model == 'LLAMA2-7B'").iloc[0])
    assert st.columns["attention_backend"] == "flash" and "use_flash_attention" in st.ignored
