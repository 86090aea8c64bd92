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
    assert not s["fitted_on_these_rows"]


def test_refusals_name_the_missing_mechanism(nemo):
    t, _ = nemo
    row = t[(t["container"] == "26.04") & (t["model"] == "LLAMA3_70B")].iloc[0]
    assert row["refused"] == "" and row["predicted_s"] > 0
    r405 = t[(t["container"] == "26.06") & (t["model"] == "LLAMA3.1_405B")]["refused"].iloc[0]
    # the uneven split (account_for_embedding/loss_in_pipeline_split), fp8 and the overlaps are modelled now
    assert "account_for_embedding_in_pipeline_split" not in r405 and "fp8" not in r405
    # context parallelism is modelled too (issue 20); its interleaved embedding/loss slot is not
    assert "'cost-cp'" not in r405 and "'cost-account-interleaved'" in r405
    nano = t[t["model"] == "Nemotron_3_Nano"]["refused"]
    assert nano.str.contains("Mamba").all()
    # the 25.09 table prints no precision: rows whose sizes match only FP8 blocks of the perf matrix are FP8 of
    # an unknown recipe, the others unknown; none is predicted as BF16
    r09 = t[t["container"] == "25.09"].set_index("model")["refused"]
    assert r09["LLAMA3_70B"] == "not in the formulation: fp8=unknown"
    assert r09["LLAMA3.1_405B"].startswith("unknown:")


def test_rows_start_predicting_once_the_formulation_accepts_their_settings(monkeypatch):
    """No list of supported mechanisms lives in validation: the settings the formulation accepts are read from
    it (its candidate columns / ParallelConfig fields); once they include a row's settings, the row's plan has
    nothing missing and carries them as columns (simulated by widening the accepted set)."""
    extra = {"fp8", "fp8_recipe", "fp8_param_gather", "tp_comm_overlap", "overlap_param_gather"}
    rows = nemo_rows.read()
    row = rows[(rows["container"] == "26.04") & (rows["model"] == "LLAMA3_70B")].iloc[0]
    _, _, missing, _ = validation._plan(row, ())
    assert {m.split("=")[0] for m in missing} == extra - validation._accepted()  # attention_backend is in now
    wider = validation._accepted() | extra
    monkeypatch.setattr(validation, "_accepted", lambda: wider)
    _, cand, missing, _ = validation._plan(row, ())
    assert missing == [] and cand["fp8"] == "hybrid" and cand["tp_comm_overlap"] is True
    assert cand["tp"] == 4 and cand["pp"] == 8 and cand["vpp"] == 5 and cand["dp"] == 2


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
                         "total_s_lo": [1.0, 0.7, np.nan], "total_s_hi": [1.2, 0.9, np.nan]})
    pred["ape"] = (pred["predicted_s"] - pred["time_s"]).abs() / pred["time_s"]
    s = validation.summary_nemo(pred)
    assert s["predicted"] == 2 and s["refused"] == 1 and s["coverage"] == pytest.approx(2 / 3)
    assert s["mape"] == pytest.approx(0.15) and s["worst_ape"] == pytest.approx(0.2)
    assert s["unflagged"]["rows"] == 1 and s["unflagged"]["mape"] == pytest.approx(0.1)
    assert s["recipe_fully_known"]["rows"] == 1
    assert s["interval_coverage_90"] == pytest.approx(0.5)  # 1.0 in [1.0, 1.2], not in [0.7, 0.9]
    assert s["refusals"] == {"model": 1}


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
    cite = re.compile(r"^(src|scripts|launcher_scripts)/[\w/.]+\.(py|yaml)(:\d+)?")
    read = 0
    for r in doc["rows"]:
        assert r["status"] in ("read", "partial", "not_read")
        if r["status"] == "not_read":
            assert r["unknown"]
        for name, v in (r.get("settings") or {}).items():
            assert cite.match(v["cite"]), (r["row"], name, v)
        if r["status"] == "read":
            read += 1
            assert r["recipe_source"]["repo"] == "NVIDIA-NeMo/Megatron-Bridge"
            assert len(r["recipe_source"]["commit"]) == 40
            assert all(c["agree"] for k, c in r["checks"].items() if k in ("tp", "pp", "cp", "vp", "gbs")), r["row"]
    assert read >= 10
