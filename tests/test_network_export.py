"""llmcomm.network exports (AICB workload, flow list) and the ``llmcomm network`` command."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from llmcomm import ParallelConfig, Trace, ingest_trace, load_model
from llmcomm.cli import main
from llmcomm.compare import compare
from llmcomm.network import link_loads, load_topology
from llmcomm.network.export import flow_list, to_aicb, write_aicb, write_flow_list
from llmcomm.predict import predict_traffic

CASES = [("tiny-gpt", ParallelConfig(tp=2, pp=2, dp=2, global_batch=4)),
         ("tiny-moe", ParallelConfig(tp=2, pp=2, dp=4, ep=2, sp=True, distributed_optimizer=True, global_batch=8))]


@pytest.mark.parametrize(("name", "par"), CASES, ids=[c[0] for c in CASES])
def test_aicb_round_trip_is_exact(tmp_path, name, par):
    model = load_model(name)
    t = predict_traffic(model, par, aggregate=False)
    for rank in (0, par.world_size - 1):
        text, written, dropped = to_aicb(t, rank)
        assert text.startswith(f"[rank0 ~ rank{par.world_size - 1}]\ncomm_type,comm_group,")
        p = tmp_path / f"{name}_{rank}.csv"
        assert write_aicb(t, p, rank).equals(dropped)
        got = ingest_trace(p, par, rank=rank)
        c = compare(got, Trace.from_events(written, meta=t.meta), model=model, parallel=par)
        assert c.exact, c.to_markdown()
        assert c.ordered_ranks == 1  # same calls in the same order
        # every call of the rank is either written or dropped with a reason; the dropped are the groups AICB
        # cannot name (model-parallel / world scalars, embedding group, expert-data-parallel reduction)
        ours = t.select(rank=rank).events
        assert len(written) + len(dropped) == len(ours)
        assert dropped["reason"].str.contains("is not this rank's").all()
        assert (written["bytes"].sum() + dropped["bytes"].sum()) == ours["bytes"].sum()


def test_aicb_refuses_bad_input():
    t = predict_traffic(load_model("tiny-gpt"), ParallelConfig(tp=2, global_batch=1), aggregate=False)
    with pytest.raises(Exception, match="outside the world"):
        to_aicb(t, rank=5)


def test_flow_list_sums_to_the_matrix_and_places():
    par = ParallelConfig(tp=2, pp=2, dp=4, global_batch=8)
    t = predict_traffic(load_model("tiny-gpt"), par)
    fl = flow_list(t, algorithm="ring")
    m = t.matrix("ring").tocoo()
    got = fl.groupby(["src_rank", "dst_rank"])["bytes"].sum()
    want = pd.Series(m.data, index=pd.MultiIndex.from_arrays([m.row, m.col])).sort_index()
    np.testing.assert_allclose(got.sort_index().to_numpy(), want.to_numpy(), rtol=1e-12)
    assert fl["start_ns"].isna().all()  # a prediction has no times unless a timeline gives them
    assert set(fl.columns) >= {"src", "dst", "bytes", "start_ns", "parallelism", "op", "phase"}
    topo = load_topology("llama3-24k")
    placed = flow_list(t, topology=topo, placement="random", seed=1)
    slots = placed.groupby("src_rank")["src"].first()
    assert len(set(slots)) == len(slots) and not (slots.index == slots.to_numpy()).all()


def test_flow_list_of_a_recorded_trace_carries_its_times(tmp_path):
    from llmcomm.paths import data_dir
    from llmcomm.trace import read_trace

    t = read_trace(data_dir() / "traces" / "gpt_tp2pp2_timeline.parquet")
    fl = flow_list(t)
    assert fl["start_ns"].notna().all()
    ev = t.events
    np.testing.assert_array_equal(fl["start_ns"].to_numpy(), ev["t_start_ns"].to_numpy(np.float64)[fl["event"]])
    p = write_flow_list(t, tmp_path / "flows.csv")
    assert len(pd.read_csv(p)) == len(fl)


def test_network_command(capsys, tmp_path):
    out = tmp_path / "flows.parquet"
    rc = main(["network", "tiny-gpt", "--topology", "dgx-superpod-h100", "--tp", "2", "--pp", "2", "--dp", "4",
               "--top", "3", "--flows-out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "bytes per iteration by link tier" in text and "hottest 3 links" in text and "leaf-spine" in text
    assert len(pd.read_parquet(out)) > 0
    aicb = tmp_path / "w.csv"
    rc = main(["network", "tiny-gpt", "--topology", "llama3-24k", "--tp", "2", "--pp", "2", "--aicb-out", str(aicb)])
    assert rc == 0 and aicb.read_text().startswith("[rank0 ~ rank3]\ncomm_type,")
    assert main(["network", str(out), "--topology", "llama3-24k", "--aicb-out", str(aicb)]) == 2
    rc = main(["network", "tiny-gpt", "--topology", "no-such", "--tp", "2"])
    assert rc == 1


def test_loads_of_a_recorded_trace():
    """Any trace: a recorded run (4 ranks, one server) puts all its ring bytes, per iteration, on NVLink."""
    from llmcomm.paths import data_dir
    from llmcomm.trace import read_trace

    t = read_trace(data_dir() / "traces" / "gpt_tp2pp2_timeline.parquet")
    L = link_loads(t, "dgx-superpod-h100")
    n_iter = t.events["iteration"].nunique()
    assert set(L.links["tier"]) == {"nvlink"}
    up = L.links[L.links["direction"] == "up"]["bytes"].sum()
    assert up == pytest.approx(t.matrix("ring").sum() / n_iter, rel=1e-12)
