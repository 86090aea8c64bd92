"""MoE predictability metrics (llmcomm.analysis.moe) on constructed inputs with known answers, and the routing
envelope (llmcomm.predict.envelope) against the predictor it builds on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from llmcomm.analysis import moe as M
from llmcomm.errors import AnalysisError, DataError
from llmcomm.specs import ModelSpec, ParallelConfig, load_model

PAR = ParallelConfig(dp=4, ep=4, micro_batch=2, global_batch=8, act_dtype="fp32", grad_reduce_dtype="fp32",
                     param_dtype="fp32")


def _cells(stack: np.ndarray, time: str = "iteration") -> pd.DataFrame:
    t, a, b = np.meshgrid(*(np.arange(n) for n in stack.shape), indexing="ij")
    return pd.DataFrame({time: t.ravel(), "layer": 0, "ep_group": 0, "src": a.ravel(), "dst": b.ravel(),
                         "value": stack.ravel().astype(float)})


# ------------------------------------------------------------------------------------------ uniformity
def test_uniformity_of_uniform_matrix() -> None:
    u = M.uniformity_stats(np.full((1, 16), 5.0)).iloc[0]
    assert u["cv"] == pytest.approx(0) and u["gini"] == pytest.approx(0)
    assert u["max_over_mean"] == pytest.approx(1) and u["norm_entropy"] == pytest.approx(1)


@pytest.mark.parametrize("m", [2, 4, 8])
def test_uniformity_of_permutation_matrix(m: int) -> None:
    perm = np.eye(m)[np.random.default_rng(m).permutation(m)]
    u = M.matrix_uniformity(_cells(perm[None])).iloc[0]
    assert u["cv"] == pytest.approx(np.sqrt(m - 1))
    assert u["gini"] == pytest.approx(1 - 1 / m)
    assert u["max_over_mean"] == pytest.approx(m)
    assert u["norm_entropy"] == pytest.approx(0.5)


def test_uniformity_gini_by_definition() -> None:
    x = np.random.default_rng(0).integers(0, 50, size=(5, 12)).astype(float)
    g = M.uniformity_stats(x)["gini"].to_numpy()
    ref = np.abs(x[:, :, None] - x[:, None, :]).sum(axis=(1, 2)) / (2 * x.shape[1] ** 2 * x.mean(axis=1))
    np.testing.assert_allclose(g, ref)


def test_uniformity_leaves_out_diagonal() -> None:
    a = np.eye(4) * 7 + 1  # off-diagonal uniform
    assert M.matrix_uniformity(_cells(a[None]), include_self=False).iloc[0]["cv"] == pytest.approx(0)
    assert M.matrix_uniformity(_cells(a[None])).iloc[0]["cv"] > 0.5


# ------------------------------------------------------------------------------------------ identities
def _a2a_events(mats: list[np.ndarray], phases: list[str], group: list[int]) -> pd.DataFrame:
    rows = []
    t = 0
    for r_pos, rank in enumerate(group):
        for mat, ph in zip(mats, phases, strict=True):
            t += 1
            rows.append(dict(rank=rank, iteration=0, microbatch=0, layer=1, phase=ph, parallelism="ep",
                             op="all_to_all", group=np.array(group), peer=-1, bytes=int(mat[r_pos].sum()),
                             dtype="fp32", split_bytes=np.asarray(mat[r_pos], dtype=np.int64), t_start_ns=t,
                             t_end_ns=t + 1))
    return pd.DataFrame(rows)


def test_identities_of_a_transposed_pair() -> None:
    d = np.random.default_rng(1).integers(1, 100, size=(4, 4)) * 256
    ev = _a2a_events([d, d.T, d, d.T], ["forward", "forward", "backward", "backward"], [0, 2, 4, 6])
    s = M.identity_summary(M.a2a_identities(ev)).set_index(["call_a", "call_b"])
    assert s.loc[("forward 0", "forward 1"), "transpose"] == 1.0
    assert s.loc[("forward 0", "backward 0"), "equal"] == 1.0
    assert s.loc[("forward 0", "backward 1"), "transpose"] == 1.0
    assert s.loc[("forward 1", "backward 1"), "equal"] == 1.0
    assert (s["neither"] == 0).all() and (s["compared"] == 1).all()


def test_identities_detect_a_broken_pair_and_symmetry() -> None:
    d = np.arange(16).reshape(4, 4) * 8
    sym = d + d.T
    ev = _a2a_events([d, d.T + 8, sym, sym], ["forward", "forward", "backward", "backward"], [0, 1, 2, 3])
    rel = M.a2a_identities(ev).set_index(["call_a", "call_b"])["relation"]
    assert rel[("forward 0", "forward 1")] == "neither"
    assert rel[("backward 0", "backward 1")] == "equal+transpose"


def test_pooled_identity_summary_weights_by_matrices_compared() -> None:
    d = np.random.default_rng(2).integers(1, 100, size=(4, 4)) * 256
    good = M.identity_summary(M.a2a_identities(
        _a2a_events([d, d.T, d, d.T], ["forward", "forward", "backward", "backward"], [0, 1, 2, 3])))
    broken = M.identity_summary(M.a2a_identities(
        _a2a_events([d, d + 1, d, d.T], ["forward", "forward", "backward", "backward"], [0, 1, 2, 3])))
    pooled = M.pooled_identity_summary(pd.concat([good, good, broken], ignore_index=True))
    row = pooled.loc[("forward 0", "forward 1")]
    assert row["compared"] == 3
    assert row["transpose"] == pytest.approx(2 / 3) and row["neither"] == pytest.approx(1 / 3)
    assert np.allclose(pooled[["equal", "transpose", "equal+transpose", "neither"]].sum(axis=1), 1.0)


def test_identity_panel_cells_are_dense_and_labelled_in_issue_order() -> None:
    d = np.arange(16).reshape(4, 4) * 8  # a zero cell (0, 0) must still be drawn
    cells = M.a2a_cells(_a2a_events([d, d.T, d.T, d], ["forward", "forward", "backward", "backward"],
                                    [0, 1, 2, 3]))
    panels = M.identity_panel_cells(cells, iteration=0, microbatch=0, layer=1)
    assert list(pd.unique(panels["panel"])) == ["forward: dispatch (call 0)", "forward: combine (call 1)",
                                                "backward: combine's grad (call 2)", "backward: dispatch's grad (call 3)"]
    first = panels[panels["panel"] == "forward: dispatch (call 0)"].pivot(index="src", columns="dst", values="value")
    assert first.shape == (4, 4) and np.array_equal(first.to_numpy(), d)
    with pytest.raises(AnalysisError, match="2 payload all-to-alls, expected 4"):
        M.identity_panel_cells(cells[cells["call"] < 2], iteration=0, microbatch=0, layer=1)


def test_incomplete_matrix_is_an_error() -> None:
    d = np.ones((4, 4), dtype=int)
    ev = _a2a_events([d], ["forward"], [0, 1, 2, 3])
    with pytest.raises(DataError, match="not recorded by every rank"):
        M.a2a_cells(ev[ev["rank"] != 3])


# ------------------------------------------------------------------------------------------ over training
def test_consecutive_distance_known_answers() -> None:
    base = np.random.default_rng(2).integers(1, 9, size=(4, 4)).astype(float)
    const = M.consecutive_distance(_cells(np.stack([base] * 5)))
    assert len(const) == 4 and (const["rel_l1"] == 0).all()
    doubling = M.consecutive_distance(_cells(np.stack([base, 2 * base, 4 * base])))
    np.testing.assert_allclose(doubling["rel_l1"], [1.0, 1.0])


def _routing(load: np.ndarray, layer: int = 0) -> pd.DataFrame:
    """One rank's routing: ``load[t, e]`` tokens to expert e in iteration t."""
    t, e = np.meshgrid(np.arange(load.shape[0]), np.arange(load.shape[1]), indexing="ij")
    return pd.DataFrame({"iteration": t.ravel(), "microbatch": 0, "layer": layer, "src_rank": 0,
                         "expert": e.ravel(), "tokens": load.ravel()})


def test_load_autocorrelation_constant_and_alternating() -> None:
    const = M.load_autocorrelation(_routing(np.full((50, 4), 32)), layer=0, nlags=3)
    assert (const.query("lag == 0")["acf"] == 1).all() and const.query("lag > 0")["acf"].isna().all()
    alt = np.tile([[48, 16], [16, 48]], (25, 1))  # expert 0's share alternates 0.75, 0.25
    a = M.load_autocorrelation(_routing(alt), layer=0, nlags=2).query("expert == 0").set_index("lag")["acf"]
    assert a[1] < -0.9 and a[2] > 0.9


def test_load_uniformity_and_expert_load() -> None:
    r = _routing(np.array([[10, 10, 10, 10], [40, 0, 0, 0]]))
    u = M.load_uniformity(r).set_index("iteration")
    assert u.loc[0, "cv"] == pytest.approx(0) and u.loc[1, "max_over_mean"] == pytest.approx(4)
    assert M.expert_load(r).query("iteration == 1 and expert == 0")["share"].item() == 1.0


def test_ep_matrices_map_experts_to_ranks() -> None:
    par = ParallelConfig(dp=2, ep=2, micro_batch=1, global_batch=2)
    r = pd.DataFrame({"iteration": 0, "microbatch": 0, "layer": 1, "src_rank": [0, 0, 0, 0, 1, 1, 1, 1],
                      "expert": [0, 1, 2, 3] * 2, "tokens": [1, 2, 3, 4, 5, 6, 7, 8]})
    c = M.ep_matrices(r, par, num_experts=4, bytes_per_token=10)
    _, a = M.matrix_stack(c, ["iteration", "layer", "ep_group"])
    np.testing.assert_array_equal(a[0], [[30, 70], [110, 150]])
    with pytest.raises(DataError, match="src_rank"):
        M.ep_matrices(r.assign(src_rank=5), par, num_experts=4)
    with pytest.raises(DataError, match="routing"):
        M.ep_matrices(None, par, num_experts=4)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ predictors
def test_predictors_on_constant_history_are_exact() -> None:
    stack = np.stack([np.full((4, 4), 3.0)] * 6)
    e = M.predictor_errors(_cells(stack), window=3).dropna()
    assert e["rel_l1"].max() < 1e-12 and set(e["predictor"]) == {"uniform", "last", "ema", "window"}


def test_predictors_on_alternating_permutations() -> None:
    m = 4
    p, q = np.eye(m), np.roll(np.eye(m), 1, axis=1)  # disjoint permutations
    stack = np.stack([p if t % 2 == 0 else q for t in range(10)])
    e = M.predictor_errors(_cells(stack), window=2, alpha=1.0)
    at = e[e["iteration"] >= 2].groupby("predictor")["rel_l1"]
    assert at.min()["last"] == pytest.approx(2) and at.max()["last"] == pytest.approx(2)
    assert at.max()["ema"] == pytest.approx(2)  # alpha = 1 is "last"
    assert at.max()["window"] == pytest.approx(1) and at.min()["window"] == pytest.approx(1)
    assert at.max()["uniform"] == pytest.approx(2 * (m - 1) / m)
    assert e.query("iteration == 0 and predictor != 'uniform'")["rel_l1"].isna().all()


def test_predictors_use_only_the_past() -> None:
    rng = np.random.default_rng(3)
    stack = rng.integers(0, 9, size=(8, 3, 3)).astype(float)
    changed = stack.copy()
    changed[5] += 100
    for meth in ("last", "ema", "window"):
        a, b = M.predict_next(stack, meth, window=3), M.predict_next(changed, meth, window=3)
        np.testing.assert_array_equal(a[:6], b[:6])  # P_t for t <= 5 does not see M_5
    np.testing.assert_allclose(M.predict_next(stack, "window", window=3)[4], stack[1:4].mean(axis=0))


# ------------------------------------------------------------------------------------------ exact vs bounded
def test_exact_bounded_split_known_shares() -> None:
    rows = []
    for t in range(4):
        fixed = np.full((2, 2), 10.0)                          # call 0: never changes
        moving = np.array([[t, 20 - t], [20 - t, t]], float)   # call 1: rows and columns sum to 20
        for call, mat in enumerate((fixed, moving)):
            for s in range(2):
                for d in range(2):
                    rows.append(dict(iteration=t, call=call, src=s, dst=d, value=mat[s, d]))
    sp = M.exact_bounded_split(pd.DataFrame(rows), ["call", "src", "dst"]).set_index("quantity")
    assert sp.loc["exact_pairs", "share"] == pytest.approx(0.5)
    assert sp.loc["bounded_pairs", "share"] == pytest.approx(0.5)
    assert sp.loc["bounded_floor", "bytes"] == pytest.approx(0 + 0 + 17 + 17)
    assert sp.loc["bounded_band", "bytes"] == pytest.approx(4 * 3)
    for q in ("exact_send_totals", "exact_recv_totals", "exact_call_totals"):
        assert sp.loc[q, "share"] == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------ call sequences
def test_sequence_variation_names_the_varying_call() -> None:
    d = np.full((2, 2), 256)
    ev = []
    for it, extra in enumerate([0, 0, 256]):
        e = _a2a_events([d, d + np.eye(2, dtype=int) * extra], ["forward", "forward"], [0, 1])
        ev.append(e.assign(iteration=it, t_start_ns=e["t_start_ns"] + 100 * it))
    ev = pd.concat(ev, ignore_index=True)
    v = M.sequence_variation(ev, reference_iteration=0).set_index("slot")
    assert v.loc[0, "identical"] == 1.0 and v.loc[1, "identical"] == 0.5
    rep = M.moe_repeatability(ev, reference_iteration=0)
    assert rep.set_index(["rank", "iteration"])["identical"].to_dict() == {
        (0, 0): True, (0, 1): True, (0, 2): False, (1, 0): True, (1, 1): True, (1, 2): False}


# ------------------------------------------------------------------------------------------ envelope
def test_envelope_of_one_iteration_is_the_routed_prediction() -> None:
    from llmcomm.predict import predict_traffic
    from llmcomm.predict.envelope import a2a_envelope, sample_routing

    spec = load_model("tiny-moe-8e")
    r = sample_routing(spec, PAR, np.array([0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05]), 1, seed=4,
                       framework="torch")
    env = a2a_envelope(spec, PAR, r, framework="torch")
    assert (env["min_bytes"] == env["max_bytes"]).all()
    ev = predict_traffic(spec, PAR, framework="torch", routing=r).events
    disp = ev[(ev["op"] == "all_to_all") & (ev["dtype"] == "fp32") & (ev["phase"] == "forward")]
    disp = disp.groupby(["rank", "layer", "microbatch"]).head(1)  # the dispatch precedes the combine
    for row in disp.itertuples():
        got = env[(env["src"] == row.rank) & (env["layer"] == row.layer) & (env["microbatch"] == row.microbatch)]
        got = got.set_index("dst")["max_bytes"].reindex(list(row.group)).to_numpy()
        np.testing.assert_array_equal(got, np.asarray(row.split_bytes))


def test_envelope_under_a_distribution() -> None:
    from llmcomm.predict import predict_traffic
    from llmcomm.predict.envelope import a2a_envelope, sample_routing

    spec = load_model("tiny-moe-8e")
    r = sample_routing(spec, PAR, np.full(8, 1 / 8), 300, seed=0, framework="torch")
    t_k = 2 * 64 * 2  # b·s tokens × top-2
    assert (r.groupby(["iteration", "layer", "microbatch", "src_rank"])["tokens"].sum() == t_k).all()
    env = a2a_envelope(spec, PAR, r, framework="torch")
    uni = predict_traffic(spec, PAR, framework="torch").events.query("op == 'all_to_all' and dtype == 'fp32'")
    assert (env["uniform_bytes"] == int(uni["split_bytes"].iloc[0][0])).all()
    assert ((env["hard_min_bytes"] <= env["min_bytes"]) & (env["min_bytes"] <= env["expected_bytes"])
            & (env["expected_bytes"] <= env["max_bytes"]) & (env["max_bytes"] <= env["hard_max_bytes"])).all()
    np.testing.assert_allclose(env["expected_bytes"], env["uniform_bytes"], rtol=0.05)
    # each token's two copies go to distinct experts: a rank holding 2 experts gets 0, 1 or 2 of them
    assert (env["hard_max_bytes"] == t_k * 64 * 4).all() and (env["hard_min_bytes"] == 0).all()


def test_envelope_rejects_dense_and_bad_probs() -> None:
    from llmcomm.errors import ConfigError
    from llmcomm.predict.envelope import a2a_envelope, sample_routing

    with pytest.raises(ConfigError, match="not an MoE model"):
        a2a_envelope("tiny-gpt", PAR, pd.DataFrame())
    with pytest.raises(ConfigError, match="sum to 1"):
        sample_routing("tiny-moe-8e", PAR, np.full(8, 0.2), 1)


# ------------------------------------------------------------------------------------------ workload
def test_tiny_moe_8e_parameters_and_aux_switch() -> None:
    from llmcomm.collect.model import build_model
    from llmcomm.collect.moe import MoE

    spec = load_model("tiny-moe-8e")
    model = build_model(spec, aux_loss_coef=0.0)
    assert sum(p.numel() for p in model.parameters()) == spec.published_parameters
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    assert len(moes) == 2 and all(m.aux_loss_coef == 0.0 and m.num_experts == 8 and m.topk == 2 for m in moes)
    assert all(m.aux_loss_coef == 0.01 for m in build_model(spec).modules() if isinstance(m, MoE))


def test_curated_noaux_command_round_trips_through_the_cli() -> None:
    import argparse
    import shlex

    from llmcomm.collect import cli
    from llmcomm.collect.curated import RUNS

    ap = argparse.ArgumentParser()
    cli.register(ap.add_subparsers())
    runs = {r.name: r for r in RUNS}
    for name, coef in (("moe8e_ep4_aux", 0.01), ("moe8e_ep4_noaux", 0.0)):
        args = ap.parse_args(shlex.split(runs[name].command())[1:])
        assert args.aux_loss_coef == coef and args.model == "tiny-moe-8e" and args.iters >= 2000
        assert args.routing_iters == 4 and args.ep == 4


# ------------------------------------------------------------------------------------------ notebook 09's tables
def _varying_trace():
    """Two ranks, three iterations of a dispatch and a combine; in iteration 2 rank 0's combine sends rank 1
    256 B more, so its size (not the order) differs from the reference."""
    from llmcomm.trace import Trace

    d = np.full((2, 2), 256)
    bump = np.array([[0, 256], [0, 0]])
    ev = []
    for it, extra in enumerate([0, 0, 1]):
        e = _a2a_events([d, d + bump * extra], ["forward", "forward"], [0, 1])
        ev.append(e.assign(iteration=it, t_start_ns=e["t_start_ns"] + 100 * it, t_end_ns=e["t_end_ns"] + 100 * it))
    ev = pd.concat(ev, ignore_index=True).assign(count=1, source="recorded")
    setup = ev.iloc[:1].assign(phase="setup", iteration=0, op="all_reduce", split_bytes=None)
    return Trace(pd.concat([setup, ev], ignore_index=True), {})


def test_reference_iteration_skips_setup_and_the_first() -> None:
    ev = pd.DataFrame({"iteration": [5, 3, 3, 4, 9], "phase": ["forward", "forward", "backward", "forward", "setup"]})
    assert M.reference_iteration(ev) == 4
    assert M.reference_iteration(ev, skip_first=False) == 3
    with pytest.raises(AnalysisError, match="needs 2"):
        M.reference_iteration(ev[ev["iteration"] == 3])


def test_call_variation_known_answers() -> None:
    t = _varying_trace()
    row = M.call_variation(t, reference_iteration=1)
    assert row["iterations compared"] == 2
    assert row["identical call order (op, group)"] == 1.0          # same ops and groups throughout
    assert row["identical call sequences"] == pytest.approx(3 / 4)  # only rank 0's iteration 2 differs
    assert row["calls identical to reference"] == pytest.approx(7 / 8)  # rank 0's combine in iteration 2
    # off-diagonal bytes: 512 each way in iterations 0 and 1; iteration 2 adds 256 to 0 → 1
    assert row["matrix change per iteration (rel. L1)"] == pytest.approx((0 + 256 / 1024) / 2)
    table = M.call_variation_table({"run": t, "replay": t}, replays=["replay"])
    assert list(table.index) == ["run", "replay"] and list(table.columns) == list(M.VARIATION_COLUMNS)
    # the replay is compared with iteration 0, which iteration 1 repeats and 2 does not: the same shares here
    assert table.loc["replay", "identical call sequences"] == pytest.approx(3 / 4)


def test_training_phase_and_phase_tables() -> None:
    df = pd.DataFrame({"run": ["a"] * 10 + ["b"] * 10, "iteration": list(range(10)) * 2,
                       "layer": 0, "x": list(range(10)) + [10.0] * 10})
    kw = {"window": 3, "iterations": 10}
    assert list(M.training_phase(df, "early", **kw)["iteration"].unique()) == [0, 1, 2]
    assert list(M.training_phase(df, "late", **kw)["iteration"].unique()) == [7, 8, 9]
    assert M.training_phase(df, "all", **kw) is df
    with pytest.raises(AnalysisError, match="middle"):
        M.training_phase(df, "middle", **kw)
    means = M.phase_means({"mean x": (df, "x")}, ["b", "a"], **kw)
    assert list(means.columns) == [("b", "early"), ("b", "late"), ("a", "early"), ("a", "late")]
    assert means.loc["mean x"].tolist() == [10.0, 10.0, 1.0, 8.0]
    piv = M.phase_pivot(df, "x", "layer", **kw)
    assert piv.loc["a", ("early", 0)] == 1.0 and piv.loc["a", ("late", 0)] == 8.0 and piv.loc["b", ("late", 0)] == 10


def _moe_run(load: np.ndarray):
    """A recorded MoE run without its events: 2 ranks (ep 2, 4 experts), both routing ``load[t, e]`` tokens,
    h = 1."""
    from llmcomm.trace import Trace

    spec = ModelSpec(name="stand-in", num_layers=2, hidden_size=1, ffn_hidden_size=4, num_attention_heads=1,
                     vocab_size=8, seq_length=4, num_experts=4, moe_router_topk=1, moe_ffn_hidden_size=4)
    par = ParallelConfig(dp=2, ep=2, micro_batch=1, global_batch=2)
    r = pd.concat([_routing(load).assign(src_rank=rank) for rank in (0, 1)], ignore_index=True)
    return Trace.from_events(pd.DataFrame(), {"model_spec": spec.to_dict(), "parallel": par.to_dict()}, r)


def test_uniformity_over_training_and_dispatch_split() -> None:
    from llmcomm.vocab import DTYPE_BYTES

    even = _moe_run(np.full((6, 4), 8))
    skew = _moe_run(np.array([[8, 8, 8, 8]] * 3 + [[32, 0, 0, 0]] * 3))
    load, uni, dist = M.uniformity_over_training({"even": even, "skew": skew})
    assert set(load["run"]) == set(uni["run"]) == set(dist["run"]) == {"even", "skew"}
    assert (load.query("run == 'even'")["cv"] == 0).all() and (dist.query("run == 'even'")["rel_l1"] == 0).all()
    assert load.query("run == 'skew' and iteration == 5")["max_over_mean"].item() == pytest.approx(4)
    # the skewed run's matrix changes once, at iteration 3: each row 16, 16 → 32, 0 (‖ΔM‖₁ = 64 = ‖M‖₁)
    assert dist.query("run == 'skew'").set_index("iteration")["rel_l1"].tolist() == pytest.approx([0, 0, 1, 0, 0])
    sp = M.dispatch_exact_bounded({"even": even, "skew": skew}, window=3, iterations=6)
    assert list(pd.unique(sp["scope"])) == ["even, dispatch, all iterations", "even, dispatch, late iterations",
                                            "skew, dispatch, all iterations", "skew, dispatch, late iterations"]
    share = sp.set_index(["scope", "quantity"])["share"]
    assert share[("even, dispatch, all iterations", "exact_pairs")] == 1.0
    assert share[("skew, dispatch, all iterations", "exact_pairs")] < 1.0
    assert share[("skew, dispatch, late iterations", "exact_pairs")] == 1.0  # constant after iteration 3
    assert share[("skew, dispatch, all iterations", "exact_send_totals")] == 1.0  # rows total 32 tokens always
    b = DTYPE_BYTES[ParallelConfig(dp=2, ep=2, micro_batch=1, global_batch=2).act_dtype]
    split, rows = M.routed_uniform_split(skew)
    assert split == 32 * b / 2 and rows == 6 * 2
    uneven = _moe_run(np.full((2, 4), 8))
    uneven.routing.loc[0, "tokens"] = 9
    assert np.isnan(M.routed_uniform_split(uneven)[0])


def test_envelope_summary_known_ratios() -> None:
    env = pd.DataFrame({"source": ["b", "b", "a"], "min_bytes": [50, 100, 10], "max_bytes": [150, 300, 10],
                        "uniform_bytes": [100, 100, 10], "hard_max_bytes": [400, 400, 40]})
    s = M.envelope_summary(env)
    assert list(s.index) == ["a", "b"] and s.index.name == "source"
    assert s.loc["b"].tolist() == [3.0, 0.5, 4.0] and s.loc["a"].tolist() == [1.0, 1.0, 4.0]


def test_position_duration_spread_known_answers() -> None:
    # one rank, three iterations of two calls: call 0 always 2 ms, call 1 takes 1, 2, 3 ms
    ms = {0: [2, 2, 2], 1: [1, 2, 3]}
    ev = pd.DataFrame([{"rank": 0, "iteration": it, "parallelism": "ep", "op": "all_to_all",
                        "t_start_ns": 0, "t_end_ns": int(ms[pos][it] * 1e6)} for it in range(3) for pos in (0, 1)])
    d = M.position_duration_spread(ev).set_index(["parallelism", "op"]).loc[("ep", "all_to_all")]
    assert d["worst ms"] == 3.0
    assert d["median CV of duration over iterations"] == pytest.approx(np.median([0.0, 1.0 / 2.0]))
