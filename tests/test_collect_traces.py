"""Structural properties of the curated recorded traces (data/traces/), read without torch.

Each check compares what torch issued against a formula of the model and the configuration (see
llmcomm/collect/WHAT_TORCH_ISSUES.md), so a change in torch, in the workload or in the recorder shows up here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from llmcomm import Layout, ModelSpec, ParallelConfig, read_trace
from llmcomm.collect.curated import RUNS
from llmcomm.specs import data_dir

TRACES = data_dir() / "traces"
F32 = 4


def load(name: str):
    p = TRACES / f"{name}.parquet"
    assert p.exists(), f"{p} is missing: the curated traces are committed; regenerate with `make traces`"
    t = read_trace(p)
    return t, ModelSpec.from_dict(t.meta["model_spec"]), ParallelConfig.from_dict(t.meta["parallel"])


def steady(t) -> pd.DataFrame:
    """Events of the training iterations, without the setup calls."""
    e = t.events
    return e[e["phase"] != "setup"]


ALL = ["gpt_tp2pp2dp2", "gpt_tp2pp2_timeline", "gpt_tp4", "gpt_pp4", "gpt_pp4_gpipe", "gpt_dp4", "gpt_tp2sp_pp2dp2", "moe_ep4dp4",
       "moe_ep2tp2"]


@pytest.mark.parametrize("name", ALL)
def test_manifest_and_groups_match_layout(name: str) -> None:
    t, spec, par = load(name)
    m = t.meta
    assert m["source"] == "recorded" and m["world_size"] == par.world_size
    assert m["torch_version"].startswith("2.") and m["command"].startswith("llmcomm collect")
    assert m["model"] == spec.name and len(m["loss"]) == m["iterations"]
    assert m["loss"][-1] < m["loss"][0] - 0.3, "training loss must fall"
    lay = Layout(par)
    e = t.events
    assert set(e["rank"]) == set(range(par.world_size))
    for tag, dim in (("tp", "tp"), ("sp", "tp"), ("pp", "pp"), ("dp", "dp"), ("ep", "ep")):
        sub = e[e["parallelism"] == tag]
        if not len(sub):
            continue
        want = {tuple(int(x) for x in g) for g in lay.groups(dim)}
        got = {tuple(int(x) for x in g) for g in sub["group"]}
        assert got <= want, f"{name}: {tag} groups {got - want} are not Layout groups"
    p2p = e[e["op"].isin(["send", "recv"])]
    assert (p2p["peer"] >= 0).all()
    assert (e["t_end_ns"].dropna() >= e.loc[e["t_end_ns"].notna(), "t_start_ns"]).all()


@pytest.mark.parametrize("name", ["gpt_tp4", "gpt_tp2pp2dp2"])
def test_tp_calls_per_layer_and_microbatch(name: str) -> None:
    t, spec, par = load(name)
    b, s, h, V = par.micro_batch, par.sequence_length(spec), spec.hidden_size, spec.vocab_size
    e = steady(t)
    tp = e[e["parallelism"] == "tp"]
    per_stage = spec.num_layers // par.pp
    lay = Layout(par).coords
    for (rank, _it, _mb), g in tp.groupby(["rank", "iteration", "microbatch"]):
        stage = int(lay["pp"].iat[rank])
        layers = g[g["layer"] >= 0]
        assert set(layers["layer"]) == set(range(stage * per_stage, (stage + 1) * per_stage))
        c = layers.groupby(["layer", "phase", "op"]).size()
        assert (c.xs("all_reduce", level="op") == 2).all(), c
        assert (layers["bytes"] == b * s * h * F32).all()
        outer = g[g["layer"] < 0]
        want = []
        if stage == 0:
            want.append(("forward", "all_reduce", b * s * h * F32))
        if stage == par.pp - 1:
            want += [("forward", "all_gather", b * s * V * F32), ("backward", "all_reduce", b * s * h * F32)]
        assert sorted(zip(outer["phase"], outer["op"], outer["bytes"], strict=True)) == sorted(want)
    n_mb = par.num_microbatches
    assert tp.groupby(["rank", "iteration"])["microbatch"].nunique().eq(n_mb).all()


def test_sp_turns_all_reduces_into_gathers_and_scatters() -> None:
    t, spec, par = load("gpt_tp2sp_pp2dp2")
    b, s, h = par.micro_batch, par.sequence_length(spec), spec.hidden_size
    e = steady(t)
    layer_calls = e[(e["layer"] >= 0) & (e["parallelism"].isin(["tp", "sp"]))]
    per = layer_calls.groupby(["rank", "iteration", "microbatch", "layer", "phase", "op"]).size()
    assert set(per.index.get_level_values("op")) == {"all_gather", "reduce_scatter"}
    assert (per == 2).all()
    assert (layer_calls["bytes"] == b * s * h * F32).all()
    # LayerNorm weight/bias gradient all-reduces: once per iteration, h·4 bytes each
    ar = e[(e["parallelism"] == "tp") & (e["op"] == "all_reduce")]
    assert (ar["bytes"] == h * F32).all()
    per_stage = spec.num_layers // par.pp
    lay = Layout(par).coords
    for (rank, _it), g in ar.groupby(["rank", "iteration"]):
        last = int(lay["pp"].iat[rank]) == par.pp - 1
        assert len(g) == 4 * per_stage + (2 if last else 0)
    pp = e[(e["parallelism"] == "pp")]
    assert (pp["bytes"] == b * (s // par.tp) * h * F32).all()


@pytest.mark.parametrize("name", ["gpt_pp4", "gpt_pp4_gpipe", "gpt_tp2pp2dp2"])
def test_pp_sends_and_receives_pair_up(name: str) -> None:
    t, spec, par = load(name)
    e = steady(t)
    pp = e[e["parallelism"] == "pp"]
    key = ["iteration", "microbatch", "phase"]
    sends = pp[pp["op"] == "send"].rename(columns={"rank": "src", "peer": "dst"})[key + ["src", "dst", "bytes"]]
    recvs = pp[pp["op"] == "recv"].rename(columns={"rank": "dst", "peer": "src"})[key + ["src", "dst", "bytes"]]
    a = sends.sort_values(key + ["src", "dst"]).reset_index(drop=True)
    c = recvs.sort_values(key + ["src", "dst"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, c)
    lay = Layout(par).coords
    stage = lay["pp"].to_numpy()
    fwd = a[a["phase"] == "forward"]
    assert (stage[fwd["dst"]] == stage[fwd["src"]] + 1).all()
    bwd = a[a["phase"] == "backward"]
    assert (stage[bwd["dst"]] == stage[bwd["src"]] - 1).all()
    per_it = len(a) / t.meta["iterations"]
    assert per_it == 2 * (par.pp - 1) * par.tp * par.dp * par.num_microbatches


def _block_params(spec: ModelSpec, tp: int, layer: int, ep: int) -> int:
    h, f = spec.hidden_size, spec.ffn_hidden_size
    p = 4 * h * h // tp + 4 * h
    if spec.moe_layer_pattern()[layer]:
        p += h * spec.num_experts + (0 if ep > 1 else spec.num_experts * 2 * h * spec.expert_ffn_hidden_size)
    else:
        p += 2 * h * f // tp
    return p


@pytest.mark.parametrize("name", ["gpt_dp4", "gpt_tp2pp2dp2", "moe_ep4dp4"])
def test_dp_all_reduce_bytes_equal_gradient_bytes(name: str) -> None:
    t, spec, par = load(name)
    h, V = spec.hidden_size, spec.vocab_size
    e = steady(t)
    dp = e[e["parallelism"] == "dp"]
    assert (dp["op"] == "all_reduce").all() and (dp["dtype"] == "fp32").all()
    assert (dp["microbatch"] == par.num_microbatches - 1).all(), "gradient sync runs on the last micro-batch"
    lay = Layout(par).coords
    per_stage = spec.num_layers // par.pp
    for (rank, _it), g in dp.groupby(["rank", "iteration"]):
        stage = int(lay["pp"].iat[rank])
        layers = range(stage * per_stage, (stage + 1) * per_stage)
        blocks = sorted(_block_params(spec, par.tp, i, par.ep) * F32 for i in layers)
        root = (V * h // par.tp if stage == 0 else 0) + (V * h // par.tp + 2 * h if stage == par.pp - 1 else 0)
        got = g.sort_values("t_start_ns")["bytes"].tolist()
        # without PP the root's all-reduce comes last (blocks overlap the backward); with PP the stage
        # issues them all after its last backward, the root's first
        root_pos = 0 if par.pp > 1 else -1
        assert got[root_pos] == root * F32
        rest = got[1:] if par.pp > 1 else got[:-1]
        assert sorted(rest) == blocks


@pytest.mark.parametrize("name", ["moe_ep4dp4", "moe_ep2tp2"])
def test_all_to_all_splits_follow_routing(name: str) -> None:
    t, spec, par = load(name)
    h, E, k = spec.hidden_size, spec.num_experts, spec.moe_router_topk
    T = par.micro_batch * par.sequence_length(spec)
    r = t.routing
    assert r is not None and r["iteration"].nunique() >= 300
    # every rank routes T·k assignments per MoE layer and micro-batch
    tot = r.groupby(["iteration", "microbatch", "layer", "src_rank"])["tokens"].sum()
    assert (tot == T * k).all()
    counts = r.set_index(["iteration", "microbatch", "layer", "src_rank", "expert"])["tokens"]
    e = steady(t)
    a2a = e[(e["op"] == "all_to_all")]
    assert (a2a["parallelism"] == "ep").all()
    local = E // par.ep
    checked = 0
    for (rank, it, mb, layer), g in a2a[a2a["phase"] == "forward"].groupby(
            ["rank", "iteration", "microbatch", "layer"]):
        g = g.sort_values("t_start_ns")
        assert g["dtype"].tolist() == ["int64", "fp32", "fp32"]
        group = list(g["group"].iloc[1])
        mine = counts.loc[(it, mb, layer, rank)].to_numpy()
        dispatch = [int(mine[j * local:(j + 1) * local].sum()) * h * F32 for j in range(par.ep)]
        assert list(g["split_bytes"].iloc[1]) == dispatch
        me = group.index(rank)
        combine = [int(counts.loc[(it, mb, layer, src)].to_numpy()[me * local:(me + 1) * local].sum()) * h * F32
                   for src in group]
        assert list(g["split_bytes"].iloc[2]) == combine
        bwd = a2a[(a2a["phase"] == "backward") & (a2a["rank"] == rank) & (a2a["iteration"] == it)
                  & (a2a["microbatch"] == mb) & (a2a["layer"] == layer)].sort_values("t_start_ns")
        assert [list(x) for x in bwd["split_bytes"]] == [dispatch, combine]
        checked += 1
    assert checked == t.meta["record_iterations"] * par.world_size * par.num_microbatches * spec.num_moe_layers


def test_dense_iterations_repeat_exactly() -> None:
    t, _, _ = load("gpt_tp2pp2dp2")
    e = steady(t)
    cols = ["rank", "microbatch", "layer", "phase", "parallelism", "op", "peer", "bytes"]
    seqs = [tuple(map(tuple, g.sort_values(["rank", "t_start_ns"])[cols].astype(str).to_numpy()))
            for _, g in e[e["iteration"] >= 1].groupby("iteration")]
    assert len(seqs) >= 2 and all(s == seqs[0] for s in seqs)


def test_same_global_batch_gives_same_loss_whatever_the_parallelism() -> None:
    """The parallelized model is the same function: equal global batches train identically."""
    losses = [load(n)[0].meta["loss"] for n in ("gpt_tp2pp2dp2", "gpt_pp4", "gpt_dp4", "gpt_tp2sp_pp2dp2")]
    for other in losses[1:]:
        np.testing.assert_allclose(other, losses[0], rtol=2e-3)


def test_curated_files_are_small() -> None:
    for p in Path(TRACES).glob("*.parquet"):
        assert p.stat().st_size < 5_000_000, p


@pytest.mark.parametrize("name", [r.name for r in RUNS])
def test_every_recorded_call_has_a_start_and_an_end(name: str) -> None:
    """Functional collectives end at their ``wait_tensor``, which torch often calls on a view of the output
    (the recorder matches by storage): none may be left without ``t_end_ns`` (issue 13, item 10)."""
    e = load(name)[0].events
    assert e["t_start_ns"].notna().all()
    missing = e[e["t_end_ns"].isna()]
    assert missing.empty, missing.groupby(["phase", "parallelism", "op"]).size().to_dict()
    assert (e["t_end_ns"] >= e["t_start_ns"]).all()
