"""ConfigTuner: the space holds only valid configurations, pruning never loses the optimum, the rules' safety
conditions hold in the formulation, bad input says what would work, and the command runs."""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmcomm as lc
from llmcomm.overhead.iteration import iteration_times
from llmcomm.tune import SearchSpace, enumerate_candidates, rule_of_thumb, to_parallel, tune
from llmcomm.tune.space import DIMENSIONS, divisors

A100 = lc.load_cluster("a100-80g-hdr200")


def test_divisors() -> None:
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]


def test_every_candidate_is_valid_and_the_space_is_complete() -> None:
    model = lc.load_model("mixtral-8x7b")
    cands = enumerate_candidates(model, 64, 256)
    for r in cands.sample(300, random_state=0).to_dict("records"):
        lc.validate(model, to_parallel(r))
    # completeness on one dimension: every tp dividing heads, groups, FFN and 64 GPUs appears
    assert sorted(cands["tp"].unique()) == [1, 2, 4, 8]
    assert set(cands["recompute"]) == {"none", "selective", "full"}
    assert (cands.loc[cands["ep"] > 1, "dp"] % cands.loc[cands["ep"] > 1, "ep"] == 0).all()
    assert not ((cands["ep"] > 1) & (cands["tp"] > 1) & ~cands["sp"]).any()


def test_space_narrows() -> None:
    model = lc.load_model("gpt3-13b")
    cands = enumerate_candidates(model, 64, 512, space=SearchSpace(tp=(8,), recompute=("full",), sp=(True,)))
    assert set(cands["tp"]) == {8} and set(cands["recompute"]) == {"full"} and cands["sp"].all()
    with pytest.raises(lc.ConfigError, match="unknown dimension"):
        SearchSpace.from_dict({"dcp": (2,)})


def test_stage_splits_place_126_layers_on_16_stages() -> None:
    from llmcomm.rules import check_split
    from llmcomm.tune.space import UNSET, stage_splits

    s = stage_splits(126, 16, 2)
    assert (7, 7) in s and (6, UNSET) in s and (UNSET, 6) in s and (UNSET, UNSET) not in s
    assert stage_splits(128, 16, 2, uneven=(False,)) == [(UNSET, UNSET)]
    for n, pp in ((126, 16), (126, 8), (96, 2), (80, 3), (61, 4)):
        for f, la in stage_splits(n, pp, 2):  # each split is one Megatron-LM accepts
            check_split(n, lc.ParallelConfig(pp=pp, dp=1, num_layers_in_first_pipeline_stage=None if f < 0 else f,
                                             num_layers_in_last_pipeline_stage=None if la < 0 else la))


def test_dimensions_the_cost_model_refuses_are_named_by_its_rule() -> None:
    from llmcomm.tune.space import accepted_values, refusals

    model = lc.load_model("llama3-8b")
    assert accepted_values(model, "cp", [1, 2, 4]) == [1, 2, 4]  # context parallelism is in the formulation
    assert accepted_values(model, "fsdp", [False, True]) == [False, True]  # FSDP is in the formulation (issue 20)
    assert set(enumerate_candidates(model, 16, 64)["cp_comm_type"]) == {"p2p"}  # Megatron's default only
    cands = enumerate_candidates(model, 16, 64, space=SearchSpace(cp_comm_type=("p2p", "all_gather", "a2a")))
    assert set(cands["cp"]) == {1, 2, 4, 8, 16} and set(cands.loc[cands["cp"] == 1, "cp_comm_type"]) == {"p2p"}
    # a2a needs cp dividing the 8 KV heads of each TP rank (rule cp-a2a-heads): not at tp 2 · cp 8
    a2a = cands[cands["cp_comm_type"] == "a2a"]
    assert len(a2a) and not ((a2a["tp"] == 2) & (a2a["cp"] == 8)).any()
    assert set(cands.loc[cands["cp"] > 1, "cp_comm_type"]) == {"p2p", "all_gather", "a2a"}
    assert not ((cands["cp"] > 1) & (cands["attention_backend"] == "unfused")).any()  # rule cp-te-attention
    why = refusals(model, 16, 64, 8192, SearchSpace(cp=(1, 2), fsdp=(True,)))
    assert "cp=2" not in why and "fsdp=True" not in why
    why = refusals(model, 16, 64, 8192, SearchSpace(cp=(2,), cp_comm_type=("a2a+p2p",)))
    assert "cp-hierarchical" in why["cp_comm_type=a2a+p2p"]
    moe = lc.load_model("mixtral-8x7b")
    why = refusals(moe, 64, 256, None, SearchSpace(tp=(2,), etp=(1, 3)))  # etp 1 under tp 2: MoE parallel folding
    assert "etp=1" not in why and "expert-grid" in why["etp=3"]


# full spaces whose rules are checked on the factors of the product (llmcomm.tune.factored): dense and MoE, expert
# folding, CP with every cp_comm_type, FSDP, FP8 (H100), uneven stages
FACTORED = (("llama3-8b", 16, 64, 8192, {"cp_comm_type": ("p2p", "all_gather", "a2a")}, "h100-80g-ndr400"),
            ("gpt3-13b", 16, 64, None, {}, "h100-80g-ndr400"),
            ("deepseek-moe-16b", 8, 32, None, {}, "h100-80g-ndr400"),
            ("mixtral-8x7b", 8, 16, 4096, {"etp": (1, 2), "cp_comm_type": ("p2p", "all_gather", "a2a")},
             "h100-80g-ndr400"),
            ("gpt3-175b", 64, 512, None, {"attention_backend": ("auto", "unfused", "local")}, "a100-80g-hdr200"))


@pytest.mark.parametrize("name, gpus, batch, seq, dims, cluster", FACTORED)
def test_rules_on_the_factors_equal_the_rules_on_every_row(name, gpus, batch, seq, dims, cluster) -> None:  # noqa: ANN001
    """The space checks the rules on its factors (shape rows × categorical combinations); its rows are exactly
    those of llmcomm.rules.valid over every row of the product, in the same order, with the same twin counts."""
    import pandas as pd

    from llmcomm import rules
    from llmcomm.tune.space import SCOPES, TWIN_COLUMNS, _frame, _raw_columns, enumerate_base

    model = lc.load_model(name)
    space = SearchSpace(**dims).for_cluster(lc.load_cluster(cluster))
    for dominated in (False, True):
        cols, table = _raw_columns(model, gpus, batch, seq, space, dominated)
        ok = rules.valid(model, table, SCOPES)
        want = _frame(cols, ok)
        if dominated:  # a left-out unfused twin counts only where the rules accept it
            has = want["unfused_twins"].to_numpy() > 0
            twin = table.take(np.flatnonzero(ok)[has])
            twin.columns["attention_backend"] = np.full(int(has.sum()), "unfused", dtype=object)
            u = want["unfused_twins"].to_numpy().copy()
            u[np.flatnonzero(has)[~rules.valid(model, twin, SCOPES)]] = 0
            want["unfused_twins"] = u
        else:
            want = want.drop(columns=list(TWIN_COLUMNS))
        got = enumerate_base(model, gpus, batch, seq, space, dominated=dominated)
        assert len(got) and len(got) < len(table)
        pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_rules_on_the_factors_equal_each_rows_own_check() -> None:
    """Every row of two full (narrowed) spaces, dense with CP and uneven stages and MoE with expert folding, FSDP
    and FP8: accepted by the space exactly where rules.check accepts the row's own ParallelConfig."""
    from llmcomm import rules
    from llmcomm.tune.space import SCOPES, _raw_columns, enumerate_base

    for name, gpus, batch, seq, dims in (
            ("llama3-8b", 8, 8, 8192, {"cp_comm_type": ("p2p", "a2a"), "uneven": (True,),
                                       "recompute": ("none", "full"), "micro_batch": (1,)}),
            ("mixtral-8x7b", 8, 8, 4096, {"etp": (1, 2), "micro_batch": (1,), "recompute": ("selective",),
                                          "cp": (1, 2), "pp": (1, 2), "vpp": (1, 2), "attention_backend": ("auto",),
                                          "cp_comm_type": ("p2p", "a2a")})):
        model = lc.load_model(name)
        space = SearchSpace(**dims).for_cluster(H100)
        cols, table = _raw_columns(model, gpus, batch, seq, space)
        accepted = np.zeros(len(table), bool)
        for i in range(len(table)):
            try:
                rules.check(model, table.row(i), SCOPES)
            except lc.ConfigError:
                continue
            accepted[i] = True
        got = enumerate_base(model, gpus, batch, seq, space)
        assert 0 < accepted.sum() < len(table) and len(got) == accepted.sum()
        for c in ("tp", "cp", "pp", "ep", "etp", "micro_batch", "vpp", "num_layers_in_first_pipeline_stage",
                  "num_layers_in_last_pipeline_stage", "sp", "fsdp", "distributed_optimizer"):
            assert (got[c].to_numpy() == cols[c][accepted]).all(), c
        for c in ("recompute", "attention_backend", "fp8", "cp_comm_type"):
            assert list(got[c]) == list(cols[c][accepted]), c


H100 = lc.load_cluster("h100-80g-ndr400")
# (model, GPUs, batch, cluster) of the rule-safety checks: A100 (BF16) and H100 (FP8 in the space too)
SAFETY = (("gpt3-13b", 64, 512, A100), ("llama3-8b", 32, 256, A100), ("mixtral-8x7b", 64, 256, A100),
          ("gpt3-13b", 32, 256, H100), pytest.param("mixtral-8x7b", 32, 128, H100, marks=pytest.mark.slow))


def _evaluated(name: str, gpus: int, batch: int, cluster: lc.Cluster, seq: int | None = None,
               opened: tuple[tuple[str, tuple[bool, ...]], ...] = ()):  # noqa: ANN202
    """Every candidate of the full space (flags, FP8 where the GPU has it; ``opened``: SearchSpace fields set),
    timed. Deterministic, so computed once per session (the rule-safety and lower-bound tests share cases) and
    handed out as a copy (no test sees another's edits)."""
    return _evaluated_once(name, gpus, batch, cluster, seq, opened).copy()


@functools.cache
def _evaluated_once(name: str, gpus: int, batch: int, cluster: lc.Cluster, seq: int | None,
                    opened: tuple[tuple[str, tuple[bool, ...]], ...]):  # noqa: ANN202
    model = lc.load_model(name)
    space = SearchSpace(**dict(opened)).for_cluster(cluster)
    cands = _runnable(enumerate_candidates(model, gpus, batch, seq, space=space), cluster)
    return iteration_times(model, cands, cluster.for_world(gpus))


def _runnable(cands, cluster: lc.Cluster):  # noqa: ANN001, ANN202
    """The candidates without the rows whose userbuffers would span nodes (what ``tune`` drops: rule
    tp-comm-overlap-intra-node)."""
    from llmcomm.overhead.iteration import userbuffers_unavailable
    from llmcomm.parallel_table import ParallelTable

    return cands[~userbuffers_unavailable(ParallelTable.from_frame(cands), cluster.gpus_per_node)].reset_index(drop=True)


def _twins(t, dim: str):  # noqa: ANN001, ANN202
    """``total_s`` of rows equal in everything but ``dim``, one column per value of ``dim``."""
    if dim == "recompute":  # Megatron's default modules (the other module sets: tests/test_tune_modules.py)
        t = t[t["recompute_modules"].isna()]
    key = [c for c in DIMENSIONS if c != dim and not (dim == "recompute" and c == "recompute_modules")]
    filled = t.assign(**{c: t[c].astype(object).where(t[c].notna(), "none") for c in key})
    return filled.pivot_table(index=key, columns=dim, values="total_s")


@pytest.mark.parametrize("name, gpus, batch, cluster", SAFETY)
def test_unfused_rule_is_safe_in_the_formulation(name, gpus, batch, cluster) -> None:  # noqa: ANN001
    """The unfused-dominated rule needs time(fused) <= time(unfused), all else equal (every flag, FP8 too)."""
    wide = _twins(_evaluated(name, gpus, batch, cluster), "attention_backend")
    wide = wide.dropna()  # rows with cp > 1 have no unfused twin (rule cp-te-attention)
    assert len(wide) and (wide["auto"] <= wide["unfused"] * (1 + 1e-12)).all(), name


@pytest.mark.parametrize("name, gpus, batch, cluster", SAFETY)
def test_recompute_rule_is_safe_in_the_formulation(name, gpus, batch, cluster) -> None:  # noqa: ANN001
    """The recompute-dominated rule needs time(none) <= time(selective) <= time(full), all else equal, for every
    combination of the overlap flags and FP8 (it acts before they are expanded)."""
    wide = _twins(_evaluated(name, gpus, batch, cluster), "recompute")
    assert (wide["none"] <= wide["selective"] * (1 + 1e-12)).all(), name
    assert (wide["selective"] <= wide["full"] * (1 + 1e-12)).all(), name


@pytest.mark.parametrize("name, gpus, batch", [("llama3-8b", 16, 128),
                                               pytest.param("gpt3-13b", 32, 256, marks=pytest.mark.slow),
                                               pytest.param("mixtral-8x7b", 32, 128, marks=pytest.mark.slow)])
def test_flag_rules_are_safe_in_the_formulation(name, gpus, batch) -> None:  # noqa: ANN001
    """fp8-param-gather-dominated: time(on) <= time(off); overlap-dominated: overlap_param_gather on <= off with
    the distributed optimizer and overlap_grad_reduce on; all else equal."""
    t = _evaluated(name, gpus, batch, H100)
    fpg = _twins(t[t["fp8"].notna() & t["distributed_optimizer"]], "fp8_param_gather").dropna()
    assert len(fpg) and (fpg[True] <= fpg[False] * (1 + 1e-12)).all()
    opg = _twins(t[t["distributed_optimizer"] & t["overlap_grad_reduce"]], "overlap_param_gather").dropna()
    assert len(opg) and (opg[True] <= opg[False] * (1 + 1e-12)).all()
    # the memory model reads none of the time-only flags; fp8_param_gather never needs more memory
    from llmcomm.overhead.memory import memory_table

    mem = memory_table(lc.load_model(name), t)["total_bytes"]
    fp = _twins(t.assign(total_s=mem)[t["fp8"].notna() & t["distributed_optimizer"]], "fp8_param_gather").dropna()
    assert (fp[True] <= fp[False]).all()


def test_overlap_rules_not_applied_where_not_provable() -> None:
    """The two comparisons the overlap rule leaves to evaluation do go both ways somewhere (why they are not
    rules): tp_comm_overlap on and off, the distributed optimizer's overlaps both on and both off."""
    t = _evaluated("gpt3-13b", 32, 256, H100)
    tpo = _twins(t[(t["tp"] > 1) & t["sp"]], "tp_comm_overlap").dropna()
    assert (tpo[True] <= tpo[False]).mean() > 0.5  # mostly better; evaluated because not always
    m = _evaluated("mixtral-8x7b", 32, 128, H100)  # overlap_grad_reduce: its buckets' latency where they cannot hide
    ogr = _twins(m[~m["distributed_optimizer"]], "overlap_grad_reduce").dropna()
    assert (ogr[True] > ogr[False]).any() and (ogr[True] <= ogr[False]).mean() > 0.5


def test_same_as_without_rule_is_an_exact_tie() -> None:
    model = lc.load_model("gpt3-13b")
    for cluster in (A100, H100):
        space = SearchSpace(tp=(8,), pp=(1,), overlap_param_gather=(False,), fp8_param_gather=(False,))
        cands = enumerate_candidates(model, 8, 64, space=space.for_cluster(cluster))
        t = iteration_times(model, cands, cluster.for_world(8))
        t = t[~t["fsdp"]]  # FSDP (torch FSDP2 here: no distributed optimizer) has no DistOpt twin
        key = ["micro_batch", "sp", "recompute", "attention_backend", "tp_comm_overlap", "overlap_grad_reduce"]
        a = t[t["distributed_optimizer"] & t["fp8"].isna()].sort_values(key)["total_s"].to_numpy()
        b = t[~t["distributed_optimizer"] & t["fp8"].isna()].sort_values(key)["total_s"].to_numpy()
        assert len(a) and np.array_equal(a, b)
    t = _evaluated("gpt3-1.3b", 8, 64, H100)  # tp_comm_overlap at tp = 1: nothing to overlap
    tie = _twins(t[t["tp"] == 1], "tp_comm_overlap").dropna()
    assert len(tie) and (tie[True] == tie[False]).all()


OPEN_FLAGS = {"overlap_p2p_comm": (False, True), "moe_a2a_overlap": (False, True)}  # off in the default space
BOUND_CASES = (("gpt3-13b", 32, 256, H100, None, {}), ("llama3-8b", 32, 256, A100, None, {}),
               ("llama3-8b", 16, 16, H100, 32768, {}),  # context parallelism (cp up to 16) and FSDP
               ("mixtral-8x7b", 16, 32, H100, None, OPEN_FLAGS),  # MoE: EP, its all-to-all overlap opened
               pytest.param("mixtral-8x7b", 32, 128, H100, None, OPEN_FLAGS, marks=pytest.mark.slow),
               pytest.param("deepseek-moe-16b", 64, 256, H100, None, OPEN_FLAGS, marks=pytest.mark.slow),
               pytest.param("gpt3-175b", 64, 128, H100, None, OPEN_FLAGS, marks=pytest.mark.slow))


@pytest.mark.parametrize("name, gpus, batch, cluster, seq, opened", BOUND_CASES)
def test_lower_bound_is_below_the_time_of_every_candidate(name, gpus, batch, cluster, seq, opened) -> None:  # noqa: ANN001
    """The branch-and-bound's safety (llmcomm.tune.bound): bound <= total_s on every candidate of the full space
    (flags, FP8, CP, FSDP, uneven stages; the pipeline and all-to-all overlaps opened where asked), and the
    stage seconds computed once per compute key equal those computed row by row."""
    from llmcomm.tune.bound import lower_bounds

    model = lc.load_model(name)
    t = _evaluated(name, gpus, batch, cluster, seq, tuple(opened.items()))
    lb = lower_bounds(model, t, cluster.for_world(gpus))
    assert len(t) > 1000 and np.all(lb > 0)
    assert np.all(lb <= t["total_s"].to_numpy()), (t["total_s"].to_numpy() - lb).min()
    if seq:
        assert (t["cp"] > 1).any() and t["fsdp"].any()
    if opened and lc.load_model(name).is_moe:
        assert t["moe_a2a_overlap"].any() and t["overlap_p2p_comm"].any()
    sample = t.sample(min(len(t), 400), random_state=0).reset_index(drop=True)
    assert np.array_equal(lower_bounds(model, sample, cluster.for_world(gpus)),
                          lower_bounds(model, sample, cluster.for_world(gpus), dedupe=False))
    # and it prunes: most candidates are bounded above the optimum
    assert (lb > t["total_s"].min()).mean() > 0.5


@pytest.mark.parametrize("name, gpus, batch, cluster, seq, opened", [c for c in BOUND_CASES if not hasattr(c, "marks")])
def test_the_bounds_stage_seconds_are_those_of_stages(name, gpus, batch, cluster, seq, opened) -> None:  # noqa: ANN001
    """iteration.stage_compute (the bound's: only the TP/EP/pipeline calls, only the classes that exist) gives
    stages()' numbers bit for bit: each class's compute (class_times), TP, EP, pipeline and SP-backward seconds on
    every row where the class exists (mixed pipeline depths, CP, FSDP, FP8, MoE; H100 and A100)."""
    from llmcomm.overhead import iteration as it
    from llmcomm.parallel_table import ParallelTable

    model = lc.load_model(name)
    world = cluster.for_world(gpus)
    cands = _runnable(enumerate_candidates(model, gpus, batch, seq, space=SearchSpace(**opened).for_cluster(cluster)),
                      cluster)
    t = ParallelTable.from_frame(cands.sample(min(len(cands), 3000), random_state=1).reset_index(drop=True), model)
    bw, util = it._resolve(world, None, None)
    full, part = it.stages(model, t, world, bw), it.stage_compute(model, t, world, bw)
    u = it.combine_utilization(full, util)
    assert it.combine_utilization(part, util) == u
    fwd, bwd, rec = it.class_times(part.q, u)
    got = {k: part.by_class(v) for k, v in {"compute": fwd + bwd + rec, **part.sums}.items()}
    pp = np.asarray(t.pp)
    assert {1, 2}.issubset(set(pp.tolist())) and (pp >= 3).any()
    for cls, exists in (("first", pp >= 1), ("mid", pp >= 3), ("last", pp >= 2)):
        r = full.cls[cls]
        f, b, c = it.class_times(r["q"], u)
        want = {"compute": f + b + c, **{k: np.asarray(r[k]) for k in part.sums}}
        for k, v in want.items():
            assert np.array_equal(got[k][cls][exists], v[exists]), (cls, k)


def test_branch_and_bound_keeps_the_top_rows() -> None:
    """With the bound the first exact_top rows of the table are those of the search without it."""
    for name, gpus, batch, top in (("gpt3-13b", 64, 512, 10), ("mixtral-8x7b", 32, 128, 3)):
        a = tune(name, gpus, H100, batch, exact_top=top)
        b = tune(name, gpus, H100, batch, exact_top=None)
        cols = [*DIMENSIONS, "total_s"]
        assert a.table.head(top)[cols].equals(b.table.head(top)[cols])
        assert a.stats["evaluated"] < b.stats["evaluated"] and a.stats["pruned_by_rule"]["lower-bound"] > 0
        assert a.stats["evaluated"] + a.stats["pruned"] == a.stats["enumerated"] == b.stats["enumerated"]


SMALL = ["gpt3-1.3b", "gpt3-6.7b", "gpt3-13b", "llama2-7b", "llama3-8b", "megatron-gpt-18b", "mixtral-8x7b"]


def _odd_layers(name: str, layers: int) -> lc.ModelSpec:
    """A catalogue model with a layer count no pipeline depth divides evenly (as LLaMA-3 405B's 126 on 16)."""
    import dataclasses

    return dataclasses.replace(lc.load_model(name), num_layers=layers, name=f"{name}-{layers}l")


@pytest.mark.slow
@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(SMALL), gpus=st.sampled_from([8, 16, 32, 64, 96, 128]),
       batch=st.sampled_from([64, 96, 128, 256, 512]), layers=st.sampled_from([0, 0, 14, 30, 38]),
       cluster=st.sampled_from(["a100", "h100"]), opened=st.booleans())
def test_pruned_optimum_equals_exhaustive(name: str, gpus: int, batch: int, layers: int, cluster: str,
                                          opened: bool) -> None:
    """Over the whole space (uneven stages, both attention backends, every recompute, the overlap flags, on H100
    FP8 and its parameter gather too; ``opened``: the pipeline and all-to-all overlaps too), odd layer counts
    too; the counts add up to the exhaustive enumeration; the branch-and-bound (llmcomm.tune.bound) keeps the
    top 10 of the pruned search without it."""
    model = _odd_layers(name, layers) if layers else lc.load_model(name)
    hw = A100 if cluster == "a100" else H100
    space = OPEN_FLAGS if opened else None
    try:
        full = tune(model, gpus, hw, batch, prune=False, space=space)
    except lc.ConfigError:
        with pytest.raises(lc.ConfigError):
            tune(model, gpus, hw, batch, prune=True, space=space)
        return
    pruned = tune(model, gpus, hw, batch, prune=True, space=space)
    unbounded = tune(model, gpus, hw, batch, prune=True, space=space, exact_top=None)
    assert pruned.best["total_s"] == full.best["total_s"]
    assert np.array_equal(pruned.table["total_s"].head(10), unbounded.table["total_s"].head(10))
    assert pruned.stats["evaluated"] <= full.stats["evaluated"]
    assert pruned.stats["evaluated"] + pruned.stats["pruned"] == full.stats["enumerated"] == pruned.stats["enumerated"]
    assert full.stats["evaluated"] + full.stats["pruned"] == full.stats["enumerated"]


def test_result_tables() -> None:
    r = tune("gpt3-13b", 64, A100, 512)
    t = r.table
    assert (np.diff(t["total_s"].to_numpy()) >= 0).all()
    assert (t["total_bytes"] <= 0.9 * A100.gpu_memory_bytes).all()
    assert set(r.pruned["rule"]) <= {"memory", "recompute-dominated", "unfused-dominated", "same-as-without",
                                     "fp8-param-gather-dominated", "overlap-dominated", "lower-bound"}
    assert r.stats["enumerated"] == len(t) + r.pruned["rows"].sum()
    best = r.best_parallel()
    assert best.world_size == 64 and best.global_batch == 512
    assert 0 < t["tflops_per_gpu"].iloc[0] < A100.peak_bf16_flops / 1e12


def test_uneven_stages_open_gpu_counts() -> None:
    """96 = 3·32 GPUs: 40 layers go on 3 stages only unevenly (13 + 14 + 13), which the space now holds."""
    r = tune("gpt3-13b", 96, A100, 64)
    assert (r.table["pp"] % 3 == 0).all()
    assert (r.table["num_layers_in_first_pipeline_stage"] >= 0).any()
    with pytest.raises(lc.ConfigError, match="no tp·pp·dp split is valid"):
        tune("gpt3-13b", 96, A100, 64, space=SearchSpace(uneven=(False,)))


def test_rule_of_thumb() -> None:
    r = rule_of_thumb(lc.load_model("gpt3-175b"), 1024, A100, 1536)
    assert r["tp"] == 8 and r["micro_batch"] == 1 and r["total_bytes"] <= 0.9 * 80e9
    smaller = enumerate_candidates(lc.load_model("gpt3-175b"), 1024, 1536,
                                   space=SearchSpace(tp=(8,), cp=(1,), micro_batch=(1,), vpp=(1,), sp=(False,),
                                                     uneven=(False,), fsdp=(False,)))  # the rule of thumb: no CP
    from llmcomm.overhead.memory import memory_table

    fits = smaller[memory_table(lc.load_model("gpt3-175b"), smaller)["total_bytes"] <= 0.9 * 80e9]
    assert r["pp"] == fits["pp"].min()


def test_rule_of_thumb_takes_the_largest_tp_the_model_accepts() -> None:
    """8 heads in 2 query groups: TP 8 and 4 would split a query group; the rule falls back to TP 2."""
    gqa = lc.ModelSpec(name="gqa", num_layers=4, hidden_size=512, ffn_hidden_size=2048, num_attention_heads=8,
                       num_query_groups=2, vocab_size=32000, seq_length=1024)
    r = rule_of_thumb(gqa, 16, A100, 16)
    assert r["tp"] == 2


@pytest.mark.parametrize("args, rule", [
    (("gpt3-175b", 8, 1536), "does not fit on 8 .* smallest power-of-two multiple of 8 GPUs on which a "
                             "configuration fits is 64"),
    (("gpt3-175b", 1000, 1536), "no tp·pp·dp split is valid .* GPU counts that work with this batch: \\[1024"),
    (("gpt3-13b", 104, 64), "no tp·pp·dp split is valid"),  # 104 = 13·8: 40 layers on 13 stages fit no split
    (("gpt3-13b", 0, 64), "gpus=0 must be a positive integer"),
])
def test_bad_input_says_what_would_work(args, rule) -> None:  # noqa: ANN001
    with pytest.raises(lc.ConfigError, match=rule):
        tune(args[0], args[1], A100, args[2])


def test_does_not_fit_hint_stays_within_the_tuners_gpu_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The "does not fit" error's search for a GPU count that would work never goes past MAX_TUNE_GPUS (it
    tried up to 256x the GPUs asked for, so near the bound it enumerated spaces the tuner itself refuses)."""
    from llmcomm import bounds

    monkeypatch.setattr(bounds, "MAX_TUNE_GPUS", 32)
    with pytest.raises(lc.ConfigError, match="does not fit on 32 GPUs either \\(the most the tuner enumerates is 32\\)"):
        tune("gpt3-175b", 8, A100, 1536)
    monkeypatch.setattr(bounds, "MAX_TUNE_GPUS", 8)
    with pytest.raises(lc.ConfigError, match="no larger GPU count is searched: 16 is above the 8"):
        tune("gpt3-175b", 8, A100, 1536)


def test_expert_dimensions_on_a_dense_model_are_refused() -> None:
    """``etp=1`` (or an ``ep`` above 1) on a model without experts was accepted and silently ignored."""
    with pytest.raises(lc.ConfigError, match="gpt3-13b, which has no experts"):
        tune("gpt3-13b", 64, A100, 512, space={"etp": (1,)})
    with pytest.raises(lc.ConfigError, match="apply to MoE models only"):
        tune("gpt3-13b", 64, A100, 512, space={"ep": (2,)})
    assert len(tune("gpt3-13b", 64, A100, 512, space={"ep": (1,), "tp": (8,)}).table)


def test_cli() -> None:
    r = subprocess.run([sys.executable, "-m", "llmcomm", "tune", "gpt3-13b", "--gpus", "64", "--cluster",
                        "a100-80g-hdr200", "--global-batch", "512", "--top", "3", "--tp", "2,4,8"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "candidates" in r.stdout and "time_s" in r.stdout and "predicted" in r.stdout
    body = [ln for ln in r.stdout.splitlines()[4:] if ln.strip()]
    assert len(body) == 3 and all(ln.split()[0].split("·")[0] in ("tp2", "tp4", "tp8") for ln in body)
    assert all(w in r.stdout for w in ("bubble", "tp_comm", "dp_comm", "memory_GB"))
    bad = subprocess.run([sys.executable, "-m", "llmcomm", "tune", "gpt3-175b", "--gpus", "8", "--cluster",
                          "a100-80g-hdr200", "--global-batch", "64"], capture_output=True, text=True)
    assert bad.returncode != 0 and "does not fit" in bad.stderr and "Traceback" not in bad.stderr


def test_measured_regret_and_published(external) -> None:  # noqa: ANN001
    from llmcomm.overhead import validation
    from llmcomm.tune.measured import published_runs, published_table, regret_table

    pred, _ = validation.validate_multi()
    reg = regret_table(pred)
    assert list(reg["group"]) == ["3.6B", "18.4B", "39.1B", "175B"]
    assert (reg["regret"] >= 0).all()
    assert (reg["regret"] <= 0.05).all(), reg[["group", "regret"]]  # the target, met today
    runs = published_runs()
    assert len(runs) == 10 and set(runs["tp"]) == {1, 2, 4, 8}
    pub = published_table(runs.head(2))
    assert (pub["predicted_speedup"] >= 1 - 1e-12).all()
    assert pub["published_error"].abs().max() < 0.25



def test_public_entry_point() -> None:
    """``llmcomm.tune`` is the package (``import llmcomm`` loads it on first use); ``llmcomm.tune.tune`` the
    entry point."""
    r = lc.tune.tune("gpt3-13b", 64, "a100-80g-hdr200", 512)
    assert r.best["total_s"] == tune("gpt3-13b", 64, A100, 512).best["total_s"]


def _tune_cli(capsys, *extra: str) -> tuple[int, str, str]:  # noqa: ANN001
    from llmcomm.cli import main

    rc = main(["tune", "gpt3-13b", "--gpus", "64", "--batch", "512", "--seq", "2048", "--cluster",
               "a100-80g-hdr200", "--top", "3", *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_explain_names_the_terms_that_differ(capsys) -> None:  # noqa: ANN001
    rc, out, _ = _tune_cli(capsys, "--explain")
    assert rc == 0
    lines = out.split("(runner-up) loses to")[1].splitlines()[1:]
    sentences = [ln for ln in lines if ln.strip()]
    assert 2 <= len(sentences) <= 4 and sentences[-1].strip().startswith("In all the runner-up is")
    assert all("predicted" in s for s in sentences)


def test_cli_constraints_narrow_and_errors_name_the_constraint(capsys) -> None:  # noqa: ANN001
    rc, out, _ = _tune_cli(capsys, "--constraints", "max_tp=2,cp=1,fp8=off,recompute=full,mb=1")
    assert rc == 0
    body = out.split("memory per GPU:")[1].splitlines()[2:]
    assert body and all(ln.split()[0].split("·")[0] in ("tp1", "tp2") and "full" in ln and "mb1" in ln
                        for ln in body if ln.strip())
    for bad, words in (("tq=2", "unknown constraint 'tq'"), ("tp=two", "'tp=two': 'two' is not an integer"),
                       ("fp8=maybe", "fp8 takes on, off, hybrid or e4m3"), ("sp=maybe", "'maybe' is not on/off"),
                       ("max_tp=0", "must be a positive integer"), ("recompute=some", "recompute takes"),
                       ("cp=2,cp_comm_type=a2a+p2p", "cp_comm_type=a2a+p2p is refused by rule 'cp-hierarchical'"),
                       ("cp_comm_type=ring", "cp_comm_type takes"),
                       # a constraint no split holds (3 divides no GPU count of 64) is named, with what works
                       ("cp=3", "no configuration is left by --constraints cp=3 (values that work here: 1, 2, 4, 8")):
        rc, _, err = _tune_cli(capsys, "--constraints", bad)
        assert rc != 0 and words in err and "Traceback" not in err, (bad, err)


def test_rule_of_thumb_keeps_even_pipeline_stages() -> None:
    """A user's starting point has even stages: with uneven splits in the space the rule had picked
    gpt3-175b tp8·pp2 with a 47-layer first stage and full recomputation (1.70× slower than the tuner's pick)."""
    import llmcomm as lc
    from llmcomm.tune import rule_of_thumb

    spec, hw = lc.load_model("gpt3-175b"), lc.load_cluster("a100-80g-hdr200")
    r = rule_of_thumb(spec, 1024, hw, 1536, None)
    assert r["num_layers_in_first_pipeline_stage"] == -1 and r["num_layers_in_last_pipeline_stage"] == -1
    assert (r["tp"], r["pp"]) == (8, 4)


def test_pipeline_and_moe_overlap_flags_when_opened() -> None:
    """overlap_p2p_comm and moe_a2a_overlap (off in the default space): opened, the pruned search keeps the
    exhaustive optimum and the counts add up; without the interleaved schedule overlap_p2p_comm is an exact tie."""
    space = {"overlap_p2p_comm": (False, True), "moe_a2a_overlap": (False, True)}
    full = tune("mixtral-8x7b", 32, H100, 128, space=space, prune=False)
    pruned = tune("mixtral-8x7b", 32, H100, 128, space=space)
    assert pruned.best["total_s"] == full.best["total_s"]
    assert pruned.stats["evaluated"] + pruned.stats["pruned"] == full.stats["enumerated"]
    t = full.table
    assert t["moe_a2a_overlap"].any() and t["overlap_p2p_comm"].any()
    assert not (t["moe_a2a_overlap"] & (t["recompute"] == "full")).any()  # Megatron's rule
    tie = _twins(t[t["vpp"] == 1], "overlap_p2p_comm").dropna()
    assert len(tie) and (tie[True] == tie[False]).all()


@pytest.mark.parametrize("name, gpus, batch, cluster, opened", [
    ("llama3-8b", 8, 64, H100, {}),  # dp·cp = 1 rows: the distributed optimizer's tie
    ("gpt3-1.3b", 16, 64, A100, {}),  # tp = 1 rows: tp_comm_overlap's tie
    ("mixtral-8x7b", 16, 32, H100, OPEN_FLAGS),  # overlap_p2p_comm's tie, the all-to-all overlap opened
    ("gpt3-13b", 32, 256, H100, {})])
def test_flag_rules_on_the_grid_equal_the_rules_on_the_expanded_rows(name, gpus, batch, cluster, opened) -> None:  # noqa: ANN001
    """search.flag_rules (the time-only flags' rules on rows × combinations) removes the rows that
    userbuffers_unavailable, overlap_dominated and same_as_without remove on the expanded frame, in order, and
    the bound's key from the memory-model rows equals compute_key of the expanded rows."""
    from llmcomm.overhead.iteration import userbuffers_unavailable
    from llmcomm.parallel_table import ParallelTable
    from llmcomm.tune.bound import compute_key
    from llmcomm.tune.search import _tp_spans_nodes, flag_rules, overlap_dominated, same_as_without
    from llmcomm.tune.space import enumerate_base, expand_time_flags, time_flag_grid

    model = lc.load_model(name)
    space = SearchSpace(**opened).for_cluster(cluster)
    base = enumerate_base(model, gpus, batch, None, space)
    world = cluster.for_world(gpus)
    combos, ok = time_flag_grid(model, base, space)
    expanded, drops = flag_rules(base, combos, ok, _tp_spans_nodes(base, world), True)
    want = expand_time_flags(model, base, space)
    assert expanded.equals(want)
    cross = userbuffers_unavailable(ParallelTable.from_frame(want), world.gpus_per_node)
    assert np.array_equal(drops["tp-comm-overlap-intra-node"], cross)
    rest = np.flatnonzero(~cross)
    od = overlap_dominated(want.iloc[rest])
    assert np.array_equal(drops["overlap-dominated"], np.isin(np.arange(len(want)), rest[od]))
    rest = rest[~od]
    saw = same_as_without(want.iloc[rest])
    assert np.array_equal(drops["same-as-without"], np.isin(np.arange(len(want)), rest[saw]))
    assert sum(d.sum() for d in drops.values()) and drops["same-as-without"].any()
    assert np.array_equal(np.unique(compute_key(base)[np.nonzero(ok)[0]], return_inverse=True)[1],
                          np.unique(compute_key(want), return_inverse=True)[1])


def test_cli_table_shows_the_interval_and_every_term(capsys) -> None:  # noqa: ANN001
    """Each printed row: the predicted time inside its 90% interval (lo_s, hi_s: the tuner's total_s_lo/hi),
    every term of the breakdown (cp_comm too), memory."""
    from llmcomm.tune.cli import BREAKDOWN

    rc, out, _ = _tune_cli(capsys)
    assert rc == 0 and "90% interval" in out
    lines = out.split("memory per GPU:")[1].splitlines()[1:]
    header, body = lines[0].split(), [ln.split() for ln in lines[1:] if ln.strip()]
    assert header[:4] == ["config", "time_s", "lo_s", "hi_s"] and "cp_comm" in header and "memory_GB" in header
    assert [h for h in header if h + "_s" in BREAKDOWN] == [c.removesuffix("_s") for c in BREAKDOWN]
    r = tune("gpt3-13b", 64, A100, 512, 2048)
    assert len(body) == 3
    for row, (_, want) in zip(body, r.table.head(3).iterrows(), strict=True):
        t, lo, hi = (float(x) for x in row[1:4])
        assert lo < t < hi
        assert (row[2], row[3]) == (f"{want['total_s_lo']:.3f}", f"{want['total_s_hi']:.3f}")
    assert "-0.000" not in out


def test_label_names_the_expert_parallel_size() -> None:
    """A MoE configuration's label carries its EP size (ep 1 and dense rows do not)."""
    from llmcomm.tune.report import label

    row = {"tp": 2, "cp": 1, "pp": 8, "dp": 16, "ep": 32, "etp": 1, "micro_batch": 1, "vpp": 4, "sp": True,
           "recompute": "none", "distributed_optimizer": True}
    assert label(row).startswith("tp2·pp8·dp16·ep32·etp1·mb1·v4")
    assert "·ep" not in label({**row, "ep": 1, "etp": -1})
    r = tune("mixtral-8x7b", 32, H100, 128)
    ep = int(r.best["ep"])
    assert (f"·ep{ep}·" in label(r.best)) == (ep > 1)


@pytest.mark.slow
@pytest.mark.parametrize("name, gpus, batch, seq, dims", [
    # MoE parallel folding (EP over tp·cp·dp with expert TP 1 or 2) and every cp_comm_type, with the pipeline and
    # all-to-all overlaps opened: dimensions the hypothesis test's default space leaves out
    ("mixtral-8x7b", 16, 32, 4096, {"etp": (1, 2), "cp_comm_type": ("p2p", "all_gather", "a2a"), **OPEN_FLAGS}),
    ("llama3-8b", 16, 16, 32768, {"cp_comm_type": ("p2p", "all_gather", "a2a")})])  # 32K: CP up to 16
def test_pruned_optimum_equals_exhaustive_with_folding_and_every_cp_comm_type(name, gpus, batch, seq, dims) -> None:  # noqa: ANN001
    full = tune(name, gpus, H100, batch, seq, space=dims, prune=False)
    pruned = tune(name, gpus, H100, batch, seq, space=dims)
    unbounded = tune(name, gpus, H100, batch, seq, space=dims, exact_top=None)
    assert pruned.best["total_s"] == full.best["total_s"]
    assert np.array_equal(pruned.table["total_s"].head(10), unbounded.table["total_s"].head(10))
    assert pruned.stats["evaluated"] + pruned.stats["pruned"] == full.stats["enumerated"] == pruned.stats["enumerated"]
    t = full.table
    assert (t["cp"] > 1).any() and set(t.loc[t["cp"] > 1, "cp_comm_type"]) >= {"p2p", "all_gather"}
    if lc.load_model(name).is_moe:  # folded rows are in the space and evaluated: EP beyond DP
        assert (t["ep"] > t["dp"]).any() and set(t["etp"]) == {1, 2}


def test_branch_and_bound_evaluates_ahead_without_changing_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand-worked: bounds 0..19, times bound + 10 but row 3 at 3.2, top 1, chunks of 2 then 4. The sequential
    search evaluates rows 0-1 (threshold 10), then rows 2-5 (threshold 3.2) and stops at row 6 (bound 6 > 3.2).
    The second call also takes rows 6-10 (bounds <= 10, the threshold when it is made): their times are dropped,
    the table holds rows 0-5 in order and the mask says 0-5."""
    import pandas as pd

    from llmcomm.tune import search

    monkeypatch.setattr(search, "FIRST_CHUNK", 2)
    b = np.arange(20.0)
    cands = pd.DataFrame({"row": np.arange(20), search.BOUND: b})
    calls: list[list[int]] = []

    def evaluate(c: pd.DataFrame) -> pd.DataFrame:
        calls.append(c["row"].tolist())
        return c.assign(total_s=np.where(c["row"] == 3, 3.2, c["row"] + 10.0))

    table, evaluated = search._branch_and_bound(cands, evaluate, 1)
    assert calls == [[0, 1], list(range(2, 11))]
    assert table["row"].tolist() == [0, 1, 2, 3, 4, 5] and list(table.columns) == ["row", "total_s"]
    assert table["total_s"].tolist() == [10.0, 11.0, 12.0, 3.2, 14.0, 15.0]
    assert np.array_equal(evaluated, np.arange(20) < 6)
    # many rows under the threshold: only the next chunk's are taken with a chunk (here 2-13: chunks 4 and 8)
    monkeypatch.setattr(search, "SPECULATE_ROWS", 0)
    calls.clear()
    table, evaluated = search._branch_and_bound(cands.assign(**{search.BOUND: b / 10}), evaluate, 1)
    assert calls[:2] == [[0, 1], list(range(2, 14))] and evaluated.all()


def test_frame_string_columns_from_their_values_equal_the_plain_frame() -> None:
    """space._frame builds the str columns (recompute, attention backend, cp_comm_type, schedule) by one take of
    their few values: the same frame, dtypes included, as pandas builds from the row arrays."""
    import pandas as pd

    from llmcomm.tune import space as sp

    model = lc.load_model("llama3-8b")
    cols = sp._valid_columns(model, 32, 64, 16384, SearchSpace(cp_comm_type=("p2p", "all_gather", "a2a")))
    assert set(cols.strings) == set(sp.STRING_COLUMNS)
    fast, plain = sp._frame(cols), sp._frame(dict(cols))
    pd.testing.assert_frame_equal(fast, plain, check_exact=True)
    assert set(fast["cp_comm_type"]) == {"p2p", "all_gather", "a2a"} and set(fast["schedule"]) == {"1f1b", "interleaved"}


def test_shape_rows_are_the_product_of_splits_micro_batches_and_vpp() -> None:
    """space._shape_rows (shape rows repeated by per-(pp, dp) blocks) against the plain nested loop over every
    (tp, cp, pp, dp, ep, etp), pipeline split, micro-batch and vpp, in the same order."""
    import itertools
    import math

    from llmcomm.tune import space as sp

    model, gpus, batch = lc.load_model("mixtral-8x7b"), 64, 256
    space = SearchSpace(etp=(1, 2), max_stage_offset=1)
    want = []
    for tp, cp, pp, dp in sp.splits(model, gpus, batch, None, None, sp._cp_values(model, space, gpus)):
        for ep, et in sp.expert_shapes(model, tp, cp, dp, space):
            mbs = [m for m in divisors(batch // dp) if m <= space.max_micro_batch]
            for f, la in sp.stage_splits(model.num_layers, pp, space.max_stage_offset, space.uneven):
                g = math.gcd(*sp._stage_layers(model.num_layers, pp, f, la))
                vs = [v for v in divisors(g) if v <= space.max_vpp and (v == 1 or pp >= 2)]
                want += [(tp, cp, pp, dp, ep, et, m, v, f, la, batch // dp // m) for m, v in itertools.product(mbs, vs)]
    got = sp._shape_rows(model, gpus, batch, space)
    assert got.dtype == np.int64 and got.tolist() == [list(r) for r in want] and len(want) > 1000
