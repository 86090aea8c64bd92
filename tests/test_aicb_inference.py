"""AICB workloads' configuration read from the calls they hold (issue 12, item 11)."""

from __future__ import annotations

import csv

from llmcomm.ingest import ingest_trace
from llmcomm.ingest.aicb import infer_configuration


def _rows(path) -> list[dict[str, str]]:
    lines = path.read_text().splitlines()
    return list(csv.DictReader(lines[1:] if lines[0].startswith("[") else lines))


def test_a100_example_sp_distributed_optimizer_and_batch(external):
    path = external("aicb/A100_example.csv")
    rows = _rows(path)
    par, info = infer_configuration(rows, path.name)
    # the file itself: forward all-gathers/reduce-scatters on the TP group (MegatronColumnLinear /
    # MegatronRowLinear stages) are sequence parallelism ...
    fwd_sp = [r for r in rows if r["comm_group"] == "CommGroup.tp_group" and r["stage"].startswith("forward.Megatron")
              and r["comm_type"] in ("CommType.all_gather", "CommType.reduce_scatter")]
    assert len(fwd_sp) == 1280 and par.sp
    # ... the step's DP reduce-scatter (fp32 grads) + all-gather (bf16 params) is the distributed optimizer ...
    step = {(r["comm_type"], r["msg_size"]) for r in rows if r["stage"] == "step" and r["comm_group"] == "CommGroup.dp_group"}
    assert step == {("CommType.reduce_scatter", "35634282496"), ("CommType.all_gather", "17817141248")}
    assert par.distributed_optimizer
    # ... and each of the 10 iterations runs two forward embeddings: 2 micro-batches on dp 4 -> global batch 8
    emb = [r for r in rows if r["stage"] == "forward.MegatronEmbedding"]
    assert len(emb) == 20 and par.num_microbatches == 2 and par.global_batch == 8
    inf = info["inferred"]
    assert inf["ep"] is None and any("ep group size is not inferable" in a for a in info["assumptions"])
    assert par.ep == 1  # not assumed equal to dp
    assert "1280" in inf["sp"] and "step" in inf["distributed_optimizer"] and inf["num_microbatches"].startswith("2")
    assert any("micro_batch" in a for a in info["assumptions"])


def test_a100_example_tags_sp_like_the_predictor(external):
    t = ingest_trace(external("aicb/A100_example.csv"))
    ev = t.events
    meta = t.meta["per_file"][0]
    assert meta["inferred"]["ep"] is None and t.meta["parallel"]["sp"] is True
    tp_group = ev[[list(g) == [0, 1] for g in ev["group"]]]
    gs = tp_group[tp_group["op"].isin(["all_gather", "reduce_scatter"])]
    assert (gs["parallelism"] == "sp").all() and len(gs) > 0
    assert set(tp_group.loc[tp_group["op"] == "all_reduce", "parallelism"]) == {"tp"}
    ep = ev[ev["parallelism"] == "ep"]
    assert all(list(g) == [0] for g in ep["group"])  # EP peers unknown: only this rank, as the meta says


def test_llama7b_workload_is_plain_tp_with_distributed_optimizer(external):
    path = external("aicb/L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1.csv")
    par, info = infer_configuration(_rows(path), path.name)
    assert (par.tp, par.dp, par.sp, par.distributed_optimizer, par.num_microbatches) == (2, 64, False, True, 1)
    assert "ep" not in info["inferred"]
