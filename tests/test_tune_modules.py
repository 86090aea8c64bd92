"""The selective-recomputation module set (Megatron-LM's ``--recompute-modules``) as a dimension of the tuner's
space (issue 21): which sets a model's default space holds, the partial order the pruning rule reads, its safety
in the formulation (time non-decreasing, memory non-increasing along the order), pruned = exhaustive with the new
dimension, Megatron's rule against ``moe`` with the all-to-all overlap, ``--constraints`` and the label."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmcomm as lc
from llmcomm.overhead.iteration import iteration_times, userbuffers_unavailable
from llmcomm.overhead.memory import memory_table
from llmcomm.parallel_table import ParallelTable
from llmcomm.tune import SearchSpace, enumerate_candidates, tune
from llmcomm.tune.search import recompute_dominated, recomputes_less
from llmcomm.tune.space import DIMENSIONS, module_set, module_sets, partial_modules, row_codes

A100, H100 = lc.load_cluster("a100-80g-hdr200"), lc.load_cluster("h100-80g-ndr400")
# every module the kit's cost model times, alone and in the published recipes' combinations, and all of them
WIDE = (None, (), ("mlp",), ("moe_act",), ("layernorm",), ("moe",), ("shared_experts",), ("core_attn", "mlp"),
        ("layernorm", "moe_act"), ("core_attn", "layernorm", "moe"), ("layernorm", "moe", "moe_act"),
        ("core_attn", "moe_act", "layernorm", "mlp", "moe", "shared_experts"))


def test_module_set_canonical_form() -> None:
    assert module_set(None) is None and module_set(("core_attn",)) is None  # Megatron's default spelled out
    assert module_set("moe_act+layernorm") == module_set(["layernorm", "moe_act", "layernorm"]) == ("moe_act",
                                                                                                     "layernorm")
    assert module_set(()) == ()
    with pytest.raises(lc.ConfigError, match="recompute-modules-names"):
        module_set(("mhc",))
    space = SearchSpace(recompute_modules=(("core_attn",), None, ["mlp"]))
    assert space.recompute_modules == (None, ("mlp",))
    with pytest.raises(lc.ConfigError, match="recompute_modules"):
        SearchSpace(recompute_modules="mlp")


def test_default_module_sets_per_model() -> None:
    """Megatron's default and the published recipes' sets (GPT-OSS 120B's layernorm+moe_act, DeepSeek-V3's
    mla_up_proj+mlp, Nemotron-3 Nano's core_attn+layernorm+moe+moe_act), each reduced to what keeps fewer bytes on
    the model: a dense model (LLaMA-3 405B) keeps mlp only (TE fuses its norms: layernorm saves nothing; no MoE
    layer; mla_up_proj is not in the memory model); an MoE model without dense layers (Qwen3-30B-A3B) has no
    mlp, and moe_act adds nothing beside moe; DeepSeek-MoE 16B (a dense first layer) has the default only: every
    other set holds a module acting on some of its layers only (not pruned against none: asked for explicitly)."""
    dense = module_sets(lc.load_model("llama3-405b"), SearchSpace())
    assert dense == (None, ("mlp",))
    moe = module_sets(lc.load_model("qwen3-30b-a3b"), SearchSpace())
    assert moe == (None, ("moe_act", "layernorm"), ("core_attn", "layernorm", "moe"))
    assert module_sets(lc.load_model("deepseek-moe-16b"), SearchSpace()) == (None,)
    assert module_sets(lc.load_model("qwen3-30b-a3b"), SearchSpace(recompute_modules=(("mlp",),))) == (("mlp",),)
    cands = enumerate_candidates(lc.load_model("gpt3-1.3b"), 8, 64, space=SearchSpace(tp=(1,), pp=(1,)))
    sel = cands[cands["recompute"] == "selective"]["recompute_modules"]
    assert set(sel.map(repr)) == {"None", "('mlp',)"}
    assert cands.loc[cands["recompute"] != "selective", "recompute_modules"].isna().all()


def test_partial_modules() -> None:
    """DeepSeek-MoE 16B (first layer dense, the others MoE with shared experts): mlp acts on the first layer only,
    the MoE modules on the others; a model of one layer kind has none."""
    assert partial_modules(lc.load_model("deepseek-moe-16b")) == {"mlp", "moe_act", "layernorm", "moe",
                                                                   "shared_experts"}
    assert partial_modules(lc.load_model("qwen3-30b-a3b")) == partial_modules(lc.load_model("llama3-8b")) == set()
    mlp = ("selective", ("mlp",))
    assert recomputes_less(("none", None), mlp) and not recomputes_less(("none", None), mlp, frozenset({"mlp"}))
    assert recomputes_less(mlp, ("full", None)) and not recomputes_less(mlp, ("full", None), frozenset({"mlp"}))
    assert recomputes_less(("selective", None), ("full", None), frozenset({"mlp"}))


def test_recomputes_less_is_the_subset_order() -> None:
    none, full = ("none", None), ("full", None)
    core, mlp, both = ("selective", None), ("selective", ("mlp",)), ("selective", ("core_attn", "mlp"))
    assert recomputes_less(none, core) and recomputes_less(none, mlp) and recomputes_less(core, full)
    assert recomputes_less(core, both) and recomputes_less(mlp, both) and recomputes_less(both, full)
    assert not recomputes_less(core, mlp) and not recomputes_less(mlp, core)  # not comparable: both evaluated
    assert not any(recomputes_less(a, a) for a in (none, core, mlp, full))
    assert not recomputes_less(("selective", ()), none) and recomputes_less(none, ("selective", ()))
    # a hand frame: one group; core_attn and mlp fit, not none: both kept (neither holds the other), both+full dropped
    rows = pd.DataFrame({"tp": [1] * 4, "recompute": ["selective", "selective", "selective", "full"],
                         "recompute_modules": [None, ("mlp",), ("core_attn", "mlp"), None]})
    assert list(recompute_dominated(rows)) == [False, False, True, True]
    assert list(recompute_dominated(rows.iloc[2:])) == [False, True]


def _evaluated(name: str, gpus: int, batch: int, cluster: lc.Cluster, seq: int | None, **dims: object
               ) -> pd.DataFrame:
    model = lc.load_model(name)
    space = SearchSpace(recompute_modules=WIDE, **dims).for_cluster(cluster)  # type: ignore[arg-type]
    cands = enumerate_candidates(model, gpus, batch, seq, space)
    cands = cands[~userbuffers_unavailable(ParallelTable.from_frame(cands), cluster.gpus_per_node)]
    t = iteration_times(model, cands.reset_index(drop=True), cluster.for_world(gpus))
    return t.assign(total_bytes=memory_table(model, t)["total_bytes"].to_numpy())


@pytest.mark.parametrize("name, gpus, batch, cluster, seq, dims, left_out_faster", [
    # the grad-reduce pacing bug made mlp faster than none here; fixed (overlap.stage_grad_reduce): none left
    ("deepseek-moe-16b", 8, 16, H100, 2048, dict(pp=(1, 2), micro_batch=(1, 2), moe_a2a_overlap=(False, True),
                                                 overlap_p2p_comm=(False, True), cp=(1, 2)), False),
    # FSDP with SP and userbuffers: full was faster than moe (the userbuffers backward credited the recomputed
    # GEMMs under full only) and, with the replayed blocks pooled, a module set faster than one holding it; fixed
    # (iteration.tp_overlap_exposed: each replayed block against its own GEMMs): none left
    ("deepseek-moe-16b", 16, 64, A100, None, dict(pp=(1, 2, 4), micro_batch=(1,), cp=(1,)), False),
    ("mixtral-8x7b", 16, 32, A100, None, dict(tp=(1, 2, 4), micro_batch=(1,), cp=(1,)), False),
    ("llama3-8b", 8, 16, H100, 4096, dict(micro_batch=(1, 2), cp=(1, 2), uneven=(False,)), False)])
def test_time_and_memory_are_monotone_in_the_module_set(name, gpus, batch, cluster, seq, dims,  # noqa: ANN001
                                                         left_out_faster) -> None:  # noqa: ANN001
    """The recompute-dominated rule's safety over the partial order (:func:`recomputes_less`): for every pair of
    rows equal in everything but (recompute, recompute_modules), the one recomputing less is never slower and
    never needs less memory (all overlap flags, FP8, CP, both attention backends, every module of the kit); the
    pairs left out of the order (a module recomputing some layers only) are faster where the case says so (why:
    :func:`recomputes_less`)."""
    t = _evaluated(name, gpus, batch, cluster, seq, **dims)
    partial = partial_modules(lc.load_model(name))
    group = row_codes(t, [c for c in DIMENSIONS if c not in ("recompute", "recompute_modules")])
    desc = list(zip(t["recompute"], t["recompute_modules"].map(lambda v: v if isinstance(v, tuple) else None),
                    strict=True))
    kinds = list(dict.fromkeys(desc))
    code = np.array([kinds.index(d) for d in desc])
    assert len(kinds) >= 8
    n = int(group.max()) + 1
    time_at = np.full((n, len(kinds)), np.nan)
    mem_at = np.full((n, len(kinds)), np.nan)
    time_at[group, code] = t["total_s"].to_numpy()
    mem_at[group, code] = t["total_bytes"].to_numpy()
    pairs, faster = 0, 0
    for i, a in enumerate(kinds):
        for j, b in enumerate(kinds):
            both = ~np.isnan(time_at[:, i]) & ~np.isnan(time_at[:, j])
            if not recomputes_less(a, b, partial):
                if recomputes_less(a, b):  # left out for a partial module only
                    faster += int((time_at[both, i] > time_at[both, j] * (1 + 1e-12)).sum())
                continue
            pairs += int(both.sum())
            assert (time_at[both, i] <= time_at[both, j] * (1 + 1e-12)).all(), (name, a, b)
            assert (mem_at[both, i] >= mem_at[both, j]).all(), (name, a, b)
    assert pairs > 1000
    assert left_out_faster <= bool(partial)  # only pairs a partial module leaves out of the order can be faster
    assert (faster > 0) == left_out_faster, faster


@pytest.mark.parametrize("name, gpus, batch, cluster, sets", [
    ("mixtral-8x7b", 16, 64, A100, None),  # default sets: 6 of the top 10 recompute some module set
    ("deepseek-moe-16b", 8, 32, A100, WIDE),
    ("gpt3-13b", 8, 64, A100, (None, ("mlp",), ("core_attn", "mlp"), ()))])
def test_pruned_equals_exhaustive_with_module_sets(name, gpus, batch, cluster, sets) -> None:  # noqa: ANN001
    space = SearchSpace(recompute_modules=sets)
    full = tune(name, gpus, cluster, batch, prune=False, space=space)
    pruned = tune(name, gpus, cluster, batch, space=space)
    unbounded = tune(name, gpus, cluster, batch, space=space, exact_top=None)
    assert pruned.best["total_s"] == full.best["total_s"]
    assert np.array_equal(pruned.table["total_s"].head(10), unbounded.table["total_s"].head(10))
    assert pruned.stats["evaluated"] + pruned.stats["pruned"] == full.stats["enumerated"] == pruned.stats["enumerated"]
    assert full.table["recompute_modules"].map(lambda v: isinstance(v, tuple)).any()
    if sets is None:
        assert pruned.table.head(10)["recompute_modules"].map(lambda v: isinstance(v, tuple)).sum() >= 3


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["mixtral-8x7b", "gpt3-6.7b", "llama3-8b", "deepseek-moe-16b"]),
       gpus=st.sampled_from([8, 16, 32]), batch=st.sampled_from([32, 64, 128]),
       sets=st.lists(st.sampled_from(WIDE), min_size=1, max_size=4, unique_by=repr),
       cluster=st.sampled_from(["a100", "h100"]))
def test_pruned_optimum_equals_exhaustive_over_module_sets(name: str, gpus: int, batch: int, sets: list,
                                                           cluster: str) -> None:
    hw = A100 if cluster == "a100" else H100
    space = SearchSpace(recompute_modules=tuple(sets))
    try:
        full = tune(name, gpus, hw, batch, prune=False, space=space)
    except lc.ConfigError:
        with pytest.raises(lc.ConfigError):
            tune(name, gpus, hw, batch, space=space)
        return
    pruned = tune(name, gpus, hw, batch, space=space)
    assert pruned.best["total_s"] == full.best["total_s"]
    assert pruned.stats["evaluated"] + pruned.stats["pruned"] == full.stats["enumerated"] == pruned.stats["enumerated"]


def test_moe_recompute_with_the_a2a_overlap_is_refused() -> None:
    """Megatron-LM (transformer_config.py:3030-3032): 'disable moe in recompute_modules when enabling
    overlap_moe_expert_parallel_comm'; the space never pairs them."""
    from llmcomm import rules

    m = lc.load_model("mixtral-8x7b")
    p = lc.ParallelConfig(dp=8, ep=8, global_batch=8, seq_len=128, recompute="selective",
                          recompute_modules=("moe",), moe_a2a_overlap=True)
    with pytest.raises(lc.ConfigError, match="moe_a2a_overlap needs .moe. out of recompute_modules"):
        rules.check(m, p, ("megatron",))
    rules.check(m, lc.ParallelConfig(dp=8, ep=8, global_batch=8, seq_len=128, recompute="selective",
                                     recompute_modules=("moe_act",), moe_a2a_overlap=True), ("megatron",))
    c = enumerate_candidates(m, 8, 16, space=SearchSpace(recompute_modules=(("moe",), ("moe_act",)), tp=(1,),
                                                         moe_a2a_overlap=(False, True)))
    moe = c["recompute_modules"].map(lambda v: isinstance(v, tuple) and "moe" in v)
    assert moe.any() and c["moe_a2a_overlap"].any() and not (moe & c["moe_a2a_overlap"]).any()
    assert (c["recompute_modules"].map(repr) == "('moe_act',)").to_numpy()[c["moe_a2a_overlap"].to_numpy()].any()


def test_constraints_and_label() -> None:
    from llmcomm.errors import UsageError
    from llmcomm.tune.constraints import parse
    from llmcomm.tune.report import label

    s = parse("recompute_modules=core_attn+moe_act/default/moe_act+layernorm", 64)
    assert s.recompute_modules == (("core_attn", "moe_act"), None, ("moe_act", "layernorm"))
    assert parse("modules=core_attn", 64).recompute_modules == (None,)
    for bad, msg in (("recompute_modules=mhc", "rule recompute-modules-names"),
                     ("recompute_modules=mlp+", "not a module set")):
        with pytest.raises(UsageError, match=msg):
            parse(bad, 64)
    r = tune("mixtral-8x7b", 16, A100, 64, space=parse("recompute_modules=layernorm+moe_act,recompute=selective", 16))
    assert label(r.best).count("·selective(moe_act+layernorm)") == 1
    row = dict(r.best)
    row["recompute_modules"] = None
    assert "·selective·" in label(row)


def test_cli_prints_the_module_set(capsys) -> None:  # noqa: ANN001
    from llmcomm.cli import main

    rc = main(["tune", "mixtral-8x7b", "--gpus", "16", "--batch", "64", "--cluster", "a100-80g-hdr200", "--top", "3",
               "--constraints", "recompute=selective,modules=layernorm+moe_act"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "selective(moe_act+layernorm)" in out


def test_a_refused_module_set_names_its_rule(capsys) -> None:  # noqa: ANN001
    """A module set asked for that a rule removes from every row holding it is named with that rule (refusals,
    and the CLI's --constraints error): ``mla_up_proj`` needs multi-latent attention, which LLaMA-3 8B has not
    (rule recompute-mla-up-proj); before, the set was dropped silently and the search ran without it."""
    from llmcomm.cli import main
    from llmcomm.tune.constraints import parse
    from llmcomm.tune.space import refusals

    m = lc.load_model("llama3-8b")
    why = refusals(m, 16, 64, None, parse("recompute_modules=core_attn+mla_up_proj/mlp", 16))
    assert set(why) == {"recompute_modules=core_attn+mla_up_proj"}  # mlp is kept: not named
    assert why["recompute_modules=core_attn+mla_up_proj"].startswith("rule 'recompute-mla-up-proj':")
    assert refusals(m, 16, 64, None, parse("recompute_modules=mlp", 16)) == {}
    rc = main(["tune", "llama3-8b", "--gpus", "16", "--batch", "64", "--cluster", "a100-80g-hdr200", "--top", "2",
               "--constraints", "recompute_modules=core_attn+mla_up_proj/mlp"])
    _, err = capsys.readouterr()
    assert rc != 0 and ("recompute_modules=core_attn+mla_up_proj is refused by rule 'recompute-mla-up-proj'"
                        in err) and "Traceback" not in err, err
