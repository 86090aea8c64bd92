"""llmcomm.overhead.ablation: the formulation's mechanisms switched on one at a time (issue 20, deliverable 12)."""

from __future__ import annotations

import dataclasses

import pytest

from llmcomm.errors import UsageError
from llmcomm.overhead import ablation as A
from llmcomm.overhead import iteration_time
from llmcomm.specs import ParallelConfig, load_cluster, load_model

MODEL = load_model("llama3-8b")
H100 = load_cluster("h100-80g-ndr400").for_world(16)
TARGET = ParallelConfig(tp=2, pp=2, dp=4, vpp=2, sp=True, micro_batch=1, global_batch=64, seq_len=4096,
                        distributed_optimizer=True, recompute="selective", attention_backend="flash",
                        tp_comm_overlap=True, overlap_grad_reduce=True, overlap_param_gather=True, fp8="hybrid")
OFF = dataclasses.replace(TARGET, attention_backend="unfused", tp_comm_overlap=False, overlap_grad_reduce=False,
                          overlap_param_gather=False, fp8=None)


def test_steps_in_the_stated_order_from_the_baseline_to_the_target():
    t = A.ablation(MODEL, TARGET, H100)
    assert list(t["mechanism"]) == ["baseline", "measured GEMM efficiency", "attention_backend fused",
                                    "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "fp8"]
    assert list(t["status"]) == ["baseline"] + ["on"] * 6
    base = iteration_time(MODEL, OFF, H100, measured_gemms=False)
    assert t.loc[0, "total_s"] == base.total_s and t.loc[0, "tp_comm_s"] == base.tp_comm_s
    one = iteration_time(MODEL, OFF, H100)  # step 1: only the measured GEMMs on
    assert t.loc[1, "total_s"] == one.total_s and t.loc[1, "compute_s"] == one.compute_s
    last = iteration_time(MODEL, TARGET, H100)
    assert t.iloc[-1]["total_s"] == last.total_s and t.iloc[-1]["exposed_comm_s"] == last.exposed_comm_s
    assert t["delta_s"].sum() == pytest.approx(last.total_s - base.total_s, rel=1e-12)
    assert t.loc[0, "delta_s"] == 0.0
    # each mechanism moves what it is about: fused attention the compute, TP overlap the TP term, ...
    assert t.loc[2, "compute_s"] < t.loc[1, "compute_s"]
    assert t.loc[3, "tp_comm_s"] < t.loc[2, "tp_comm_s"] and t.loc[3, "compute_s"] == t.loc[2, "compute_s"]
    assert t.loc[4, "dp_comm_s"] <= t.loc[3, "dp_comm_s"] and t.loc[4, "tp_comm_s"] == t.loc[3, "tp_comm_s"]
    assert t.loc[6, "compute_s"] < t.loc[5, "compute_s"]
    assert (t["total_s_lo"] < t["total_s"]).all() and (t["total_s"] < t["total_s_hi"]).all()


def test_unused_mechanisms_are_left_out_and_a100_has_no_measured_gemm_step():
    plain = dataclasses.replace(TARGET, tp_comm_overlap=False, fp8=None)
    t = A.ablation(MODEL, plain, H100)
    assert "tp_comm_overlap" not in set(t["mechanism"]) and "fp8" not in set(t["mechanism"])
    bf16 = dataclasses.replace(plain, overlap_param_gather=False)
    a100 = A.ablation(MODEL, bf16, load_cluster("a100-80g-hdr200").for_world(16))
    assert list(a100["mechanism"]) == ["baseline", "attention_backend fused", "overlap_grad_reduce"]


def test_a_refused_mechanism_is_listed_and_stays_off():
    # Megatron-LM: overlap_param_gather needs overlap_grad_reduce; asked first, it is refused by that rule
    order = ["measured GEMM efficiency", "overlap_param_gather", "overlap_grad_reduce"]
    target = dataclasses.replace(TARGET, tp_comm_overlap=False, fp8=None, attention_backend="unfused")
    t = A.ablation(MODEL, target, H100, order=order)
    assert list(t["status"]) == ["baseline", "on", "refused", "on"]
    assert "overlap_param_gather" in t.loc[2, "note"] and t[["total_s"]].iloc[2].isna().all()
    after = iteration_time(MODEL, dataclasses.replace(target, overlap_param_gather=False), H100)
    assert t.loc[3, "total_s"] == after.total_s  # the refused one stays off
    assert t.loc[3, "delta_s"] == pytest.approx(after.total_s - t.loc[1, "total_s"], rel=1e-12)


def test_mechanisms_detected_by_field(monkeypatch):
    assert "tp_comm_overlap" in [m.name for m in A.mechanisms()]
    monkeypatch.setattr(A, "_FIELDS", A._FIELDS - {"tp_comm_overlap"})
    names = [m.name for m in A.mechanisms()]
    assert "tp_comm_overlap" not in names and "measured GEMM efficiency" in names
    with pytest.raises(UsageError, match="not mechanisms"):
        A.mechanisms(["warp speed"])


def test_recipe_case_is_the_row_validate_predicts():
    from llmcomm.overhead import nemo_rows, validation

    c = A.recipe_case("25.11", "LLAMA3_70B")
    assert c.cluster.num_gpus == 64 and c.parallel.world_size == 64 and c.measured_s > 0
    rows = nemo_rows.read()
    row = rows[(rows["container"].astype(str) == "25.11") & (rows["model"] == "LLAMA3_70B")]
    pred = validation.predict_nemo(row)
    t = A.ablation(c.model, c.parallel, c.cluster)
    applied = t[t["status"] != "refused"]
    if (t["status"] == "refused").any():
        pytest.skip("a mechanism of the recipe is refused: the last row is not the recipe's prediction")
    assert applied.iloc[-1]["total_s"] == pytest.approx(float(pred["predicted_s"].iloc[0]), rel=1e-12)
    with pytest.raises(UsageError, match="need exactly one"):
        A.recipe_case("99.99", "LLAMA3_70B")
