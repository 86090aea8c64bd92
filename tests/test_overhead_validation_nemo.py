"""validate(name): the vTrain multi-node set and NVIDIA's DGX-H100 rows, predicted or refused with what is missing."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import yaml

from llmcomm.errors import DataError, UsageError
from llmcomm.overhead import nemo_rows, validation
from llmcomm.specs import data_dir

# what a 2026 DGX-H100 Llama 3 70B row runs that the formulation cannot express today
# every setting of the 2026 DGX-H100 Llama 3 70B row is modelled now (fp8, fp8_recipe, fp8_param_gather,
# tp_comm_overlap, overlap_param_gather, attention_backend): it is predicted


@pytest.fixture(scope="module")
def nemo():
    return validation.validate("nemo-h100")


def test_every_row_is_predicted_or_refused_with_a_reason(nemo):
    t, s = nemo
    assert s["rows"] == len(t) == 48 and s["predicted"] + s["refused"] == 48
    refused = t[t["predicted_s"].isna()]
    assert (refused["refused"].str.len() > 0).all()
    assert (t.loc[t["predicted_s"].notna(), "refused"] == "").all()
    # only the FP8 factor is fitted on these rows, on one release (named); nothing else
    assert s["fitted_on_these_rows"] == bool(s["fitted_on"])
    assert len({r.split("/")[0] for r in s["fitted_on"]}) <= 1
    # the predicted rows the factor was not fitted on (a fitted row the recipe file later leaves unknown is refused)
    names = {f"{r.container}/{r.model}/{int(r.num_gpus)}" for r in t[t["predicted_s"].notna()].itertuples()}
    assert s["not_fitted_on"]["rows"] == s["predicted"] - len(names & set(s["fitted_on"]))


def test_refusals_name_the_missing_mechanism(nemo):
    t, s = nemo
    row = t[(t["container"] == "26.04") & (t["model"] == "LLAMA3_70B")].iloc[0]
    assert row["refused"] == "" and row["predicted_s"] > 0
    nano = t[t["model"] == "Nemotron_3_Nano"]
    assert nano["refused"].str.contains("Mamba").all() and (nano["needs"] == "model:mamba-hybrid").all()
    # the 25.09 table prints no precision: rows whose sizes match only FP8 blocks of the perf matrix are FP8 with
    # the recipe unknown where the blocks disagree (delayed vs current scaling), the others' precision unknown
    r09 = t[t["container"] == "25.09"].set_index("model")["needs"]
    assert "unknown:fp8_recipe" in r09["LLAMA3_70B"].split(";")
    assert "unknown:precision" in r09["LLAMA3.1_405B"].split(";")
    assert "unknown:fp8_recipe" not in r09["Qwen3_30B_a3B (tokendrop)"]  # only its fp8_cs block matches
    # every refusal is named by mechanism: model:*, unknown:*, setting:<name>, rule:<rules.py name>
    from llmcomm.rules import BY_NAME

    names = [n for v in t.loc[t["predicted_s"].isna(), "needs"] for n in v.split(";")]
    assert names and all(re.fullmatch(r"(model|unknown|setting|rule):[\w.-]+", n) for n in names), names
    assert all(n[5:] in BY_NAME for n in names if n.startswith("rule:"))
    assert sum(s["needs"].values()) == len(names)  # summary: one count per row and mechanism
    assert not t["needs"].str.contains("rule:cost-cp").any()  # context parallelism is modelled (issue 20)


def test_qwen3_rows_carry_the_distributed_optimizer_of_their_library_recipe():
    """Qwen3's library recipe (qwen3_moe.py) sets use_distributed_optimizer and, for 235B, account_for_embedding/
    loss_in_pipeline_split: read, they reach the columns (before, fp8_param_gather broke the DistOpt rule)."""
    rows = nemo_rows.read()
    for model in ("Qwen3_30B_a3B", "Qwen3_235B_a22B"):
        row = rows[(rows["container"] == "26.04") & (rows["model"] == model)].iloc[0]
        st = nemo_rows.settings(row)
        assert st.columns["distributed_optimizer"] is True and st.columns["fp8_param_gather"] is True
        assert "qwen3_moe.py" in st.cites["distributed_optimizer"]
    row = rows[(rows["container"] == "26.04") & (rows["model"] == "Qwen3_235B_a22B")].iloc[0]
    c = nemo_rows.settings(row).columns
    # 94 layers + embedding + loss = 96 = pp 8 x vp 4 x 3: Megatron's uneven split, expressed by the kit's fields
    assert c["account_for_embedding_in_pipeline_split"] and c["account_for_loss_in_pipeline_split"]
    assert c["etp"] == 1 and c["moe_token_dispatcher_type"] == "alltoall"


def test_2407_rows_read_fp8_format_and_delayed_recipe():
    rows = nemo_rows.read()
    row = rows[(rows["container"] == "24.07") & (rows["model"] == "LLAMA2-70B")].iloc[0]
    st = nemo_rows.settings(row)
    assert st.columns["fp8"] == "hybrid" and st.columns["fp8_recipe"] == "delayed"
    assert "llama2_70b_fp8.sh" in st.cites["fp8"] or "fp8_hybrid" in st.cites["fp8"]
    assert st.columns["grad_reduce_dtype"] == "bf16"  # +training.model.optim.grad_sync_dtype=bf16 of the script
    assert st.columns["distributed_optimizer"] is True  # optim.name: distributed_fused_adam
    assert st.unknown == {}


def test_settings_become_columns_by_parallelconfig_field(monkeypatch):
    """No list of supported mechanisms: a recipe setting becomes a candidate column exactly when ParallelConfig
    has a field of its (Megatron) name; simulate a field another engineer adds by widening _fields."""
    rows = nemo_rows.read()
    row = rows[(rows["container"] == "26.04") & (rows["model"] == "Qwen3_235B_a22B")].iloc[0]
    st = nemo_rows.settings(row)
    fields = nemo_rows._fields()
    assert set(st.columns) - {"recompute"} <= fields | {"recompute"}
    if "moe_a2a_overlap" not in fields:
        assert st.setting["moe_a2a_overlap"] is True and "moe_a2a_overlap" not in st.columns
        monkeypatch.setattr(nemo_rows, "_fields", lambda: fields | {"moe_a2a_overlap"})
        st = nemo_rows.settings(row)
    assert st.columns["moe_a2a_overlap"] is True and "moe_a2a_overlap" not in st.setting
    # the table's layout wins over the recipe's, aliases map Megatron-Bridge names onto the kit's fields
    assert st.columns["tp"] == 2 and st.columns["pp"] == 8 and st.columns["vpp"] == 4 and st.columns["dp"] == 16
    assert "use_distributed_optimizer" not in st.columns and "expert_tensor_parallel_size" not in st.columns


def test_refusal_needs_hand_worked():
    assert validation.refusal_needs("model:mamba-hybrid", {"fp8": "x"}, ["a=1"], "") == ["model:mamba-hybrid"]
    msg = "m: candidate row 0 {} breaks the rule 'cost-cp': cp=2 > 1 is not modelled [kit: a, b]"
    assert validation.refusal_needs("", {"fp8_recipe": "?"}, ["moe_a2a_overlap=True", "x=[1, 2]"], msg) == [
        "unknown:fp8_recipe", "setting:moe_a2a_overlap", "setting:x", "rule:cost-cp"]


def test_relax_is_a_named_diagnostic():
    t, s = validation.validate("nemo-h100", relax=("fp8", "fp8_recipe", "fp8_param_gather", "tp_comm_overlap",
                                                   "overlap_param_gather", "attention_backend"))
    p = t[t["predicted_s"].notna()]
    assert len(p) >= 5 and (p["relaxed"] != "").any() and "fp8" in s["relaxed"]
    assert s["mape"] == pytest.approx(p["ape"].mean())
    assert np.allclose(p["ape"], (p["predicted_s"] - p["time_s"]).abs() / p["time_s"])


def test_summary_hand_worked():
    pred = pd.DataFrame({"predicted_s": [1.1, 0.8, np.nan], "time_s": [1.0, 1.0, 2.0], "flagged": [False, True, False],
                         "group": ["a", "a", "b"], "refused": ["", "", "model: x"], "unknown": ["", "fp8", ""],
                         "needs": ["", "", "model:not-in-catalogue"], "caveats": ["", "", ""],
                         "container": ["24.07", "26.04", "26.04"],
                         "total_s_lo": [1.0, 0.7, np.nan], "total_s_hi": [1.2, 0.9, np.nan]})
    pred["ape"] = (pred["predicted_s"] - pred["time_s"]).abs() / pred["time_s"]
    s = validation.summary_nemo(pred)
    assert s["predicted"] == 2 and s["refused"] == 1 and s["coverage"] == pytest.approx(2 / 3)
    assert s["mape"] == pytest.approx(0.15) and s["worst_ape"] == pytest.approx(0.2)
    assert s["unflagged"]["rows"] == 1 and s["unflagged"]["mape"] == pytest.approx(0.1)
    assert s["recipe_fully_known"]["rows"] == 1
    assert s["interval_coverage_90"] == pytest.approx(0.5)  # 1.0 in [1.0, 1.2], not in [0.7, 0.9]
    assert s["needs"] == {"model:not-in-catalogue": 1}
    assert s["containers"]["24.07"]["mape"] == pytest.approx(0.1) and s["containers"]["26.04"]["rows"] == 1


def test_validate_names():
    t, s = validation.validate("vtrain-multi")
    assert s["rows"] == 109
    with pytest.raises(UsageError, match="not one of"):
        validation.validate("nope")


def test_read_rejects_malformed_tables(tmp_path, external):
    src = pd.read_csv(external(nemo_rows.FILE), dtype={"container": str})
    p = tmp_path / "t.csv"
    src.drop(columns=["tp"]).to_csv(p, index=False)
    with pytest.raises(DataError, match="missing column"):
        nemo_rows.read(str(p))
    bad = src.copy()
    bad.loc[3, "step_time_s_derived"] = -1
    bad.to_csv(p, index=False)
    with pytest.raises(DataError, match="row 3.*step_time_s_derived"):
        nemo_rows.read(str(p))
    bad = src.copy()
    bad.loc[2, "num_gpus"] = 100  # tp 4 x pp 8
    bad.to_csv(p, index=False)
    with pytest.raises(DataError, match="row 2.*does not divide"):
        nemo_rows.read(str(p))


def test_recipe_file_cites_every_setting_it_states(external):
    doc = yaml.safe_load((data_dir() / nemo_rows.RECIPES).read_text())
    rows = pd.read_csv(external(nemo_rows.FILE), dtype={"container": str})
    assert len(doc["rows"]) == len(rows)
    cite = re.compile(r"^(src|scripts|launcher_scripts|examples)/[\w/.]+\.(py|yaml|sh)(:\d+)?")
    read = 0
    for r in doc["rows"]:
        assert r["status"] in ("read", "partial", "not_read")
        if r["status"] == "not_read":
            assert r["unknown"]
        for name, v in (r.get("settings") or {}).items():
            assert cite.match(v["cite"]), (r["row"], name, v)
        if r["status"] == "read":
            read += 1
            src = r["recipe_source"]
            assert (src["repo"] == "NVIDIA-NeMo/Megatron-Bridge" and len(src["commit"]) == 40) or (
                src["repo"] == "NVIDIA/NeMo-Framework-Launcher" and src["tag"] == "24.07")
            agree = all(c["agree"] for k, c in r["checks"].items() if k in ("tp", "pp", "cp", "vp", "gbs"))
            assert agree or r.get("caveats"), r["row"]  # a disagreement is said
    assert read >= 10


@pytest.mark.parametrize("model", ["GPT3-5B", "GPT3-20B", "Nemotron-8B", "Nemotron-22B"])
def test_new_catalogue_models_match_the_published_flops_per_token(model):
    """The 24.07 table prints model TFLOP/s (attention counted non-causally): its GFLOP/token =
    3 x forward FLOPs/token of the architecture read from the launcher config (and, for Nemotron, the 256,000
    vocabulary, which the config leaves to the run's tokenizer)."""
    from llmcomm.specs import load_model

    rows = nemo_rows.read()
    row = rows[(rows["container"] == "24.07") & (rows["model"] == model)].iloc[0]
    m = load_model(nemo_rows.CATALOGUE[model])
    assert 3 * m.flops_per_token(int(row["seq_len"])) / 1e9 == pytest.approx(row["gflop_per_token_derived"], rel=2e-3)
    assert "NeMo-Framework-Launcher tag 24.07" in m.source


def test_fp8_factor_scales_the_fp8_rule_and_is_named():
    import json

    from llmcomm.overhead import fp8_fit, gemm

    with fp8_fit.trial_factor(1.0):
        g1 = gemm.load_gemm_model("H100")
    with fp8_fit.trial_factor(0.6):
        g6 = gemm.load_gemm_model("H100")
    assert g6.ceiling("fp8") == pytest.approx(0.6 * g1.ceiling("fp8"))
    assert g6.ceiling("bf16") == g1.ceiling("bf16")  # bf16 untouched
    t1, t6 = g1.time(8192, 8192, 8192, 1, "fp8"), g6.time(8192, 8192, 8192, 1, "fp8")
    assert float(t6) == pytest.approx(float(t1) / 0.6, rel=1e-6)  # a big GEMM sits at the ceiling
    p = data_dir() / gemm.FP8_CALIBRATION
    if p.is_file():  # the shipped factor: fitted on one release only, named, inside its bounds
        doc = json.loads(p.read_text())
        assert {r.split("/")[0] for r in doc["fitted_on"]} == {doc["fitted_on_release"]}
        assert fp8_fit.BOUNDS[0] <= doc["factor"] <= fp8_fit.BOUNDS[1]
        assert not set(doc["held_out_rows"]) & set(doc["fitted_on"])
        assert validation.fp8_fitted_on() == doc["fitted_on"]


def test_iteration_time_follows_a_trial_fp8_factor():
    """The formulation's cached GEMM model is keyed by the FP8 factor: the fit's trial values reach the time."""
    from llmcomm.overhead import fp8_fit
    from llmcomm.overhead.iteration import iteration_time
    from llmcomm.specs import ParallelConfig, load_cluster, load_model

    m, c = load_model("llama2-7b"), load_cluster("h100-80g-ndr400")
    p = ParallelConfig(tp=1, pp=1, dp=8, global_batch=128, micro_batch=1, seq_len=4096, fp8="hybrid",
                       attention_backend="fused", distributed_optimizer=True)
    with fp8_fit.trial_factor(1.0):
        fast = iteration_time(m, p, c).total_s
    with fp8_fit.trial_factor(0.5):
        slow = iteration_time(m, p, c).total_s
    assert slow > 1.2 * fast
