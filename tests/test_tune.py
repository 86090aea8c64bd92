"""ConfigTuner: the space holds only valid configurations, pruning never loses the optimum, the rules' safety
conditions hold in the formulation, bad input says what would work, and the command runs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmcomm as lc
from llmcomm.overhead.iteration import iteration_times
from llmcomm.tune import SearchSpace, enumerate_candidates, rule_of_thumb, to_parallel, tune
from llmcomm.tune.space import divisors

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
        SearchSpace.from_dict({"cp": (2,)})


def test_recompute_rule_is_safe_in_the_formulation() -> None:
    """The recompute-dominated rule needs time(none) <= time(selective) <= time(full), all else equal."""
    for name, gpus, batch in (("gpt3-13b", 64, 512), ("llama3-8b", 32, 256), ("mixtral-8x7b", 64, 256)):
        model = lc.load_model(name)
        cands = enumerate_candidates(model, gpus, batch)
        t = iteration_times(model, cands, A100.for_world(gpus))
        key = ["tp", "pp", "dp", "ep", "micro_batch", "vpp", "sp", "distributed_optimizer"]
        wide = t.pivot_table(index=key, columns="recompute", values="total_s")
        assert (wide["none"] <= wide["selective"] * (1 + 1e-12)).all(), name
        assert (wide["selective"] <= wide["full"] * (1 + 1e-12)).all(), name


def test_same_as_without_rule_is_an_exact_tie() -> None:
    model = lc.load_model("gpt3-13b")
    cands = enumerate_candidates(model, 8, 64, space=SearchSpace(tp=(8,), pp=(1,)))
    t = iteration_times(model, cands, A100.for_world(8))
    a = t[t["distributed_optimizer"]].sort_values(["micro_batch", "sp", "recompute"])["total_s"].to_numpy()
    b = t[~t["distributed_optimizer"]].sort_values(["micro_batch", "sp", "recompute"])["total_s"].to_numpy()
    assert np.array_equal(a, b)


SMALL = ["gpt3-1.3b", "gpt3-6.7b", "gpt3-13b", "llama2-7b", "llama3-8b", "megatron-gpt-18b", "mixtral-8x7b"]


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(SMALL), gpus=st.sampled_from([8, 16, 32, 64, 96, 128]),
       batch=st.sampled_from([64, 96, 128, 256, 512]))
def test_pruned_optimum_equals_exhaustive(name: str, gpus: int, batch: int) -> None:
    model = lc.load_model(name)
    try:
        full = tune(model, gpus, A100, batch, prune=False)
    except lc.ConfigError:
        with pytest.raises(lc.ConfigError):
            tune(model, gpus, A100, batch, prune=True)
        return
    pruned = tune(model, gpus, A100, batch, prune=True)
    assert pruned.best["total_s"] == full.best["total_s"]
    assert pruned.stats["evaluated"] <= full.stats["evaluated"]
    assert pruned.stats["evaluated"] + pruned.stats["pruned"] == full.stats["enumerated"]


def test_result_tables() -> None:
    r = tune("gpt3-13b", 64, A100, 512)
    t = r.table
    assert (np.diff(t["total_s"].to_numpy()) >= 0).all()
    assert (t["total_bytes"] <= 0.9 * A100.gpu_memory_bytes).all()
    assert set(r.pruned["rule"]) <= {"memory", "recompute-dominated", "same-as-without"}
    assert r.stats["enumerated"] == len(t) + len(r.pruned)
    best = r.best_parallel()
    assert best.world_size == 64 and best.global_batch == 512
    assert 0 < t["tflops_per_gpu"].iloc[0] < A100.peak_bf16_flops / 1e12


def test_rule_of_thumb() -> None:
    r = rule_of_thumb(lc.load_model("gpt3-175b"), 1024, A100, 1536)
    assert r["tp"] == 8 and r["micro_batch"] == 1 and r["total_bytes"] <= 0.9 * 80e9
    smaller = enumerate_candidates(lc.load_model("gpt3-175b"), 1024, 1536,
                                   space=SearchSpace(tp=(8,), micro_batch=(1,), vpp=(1,), sp=(False,)))
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
    (("gpt3-13b", 96, 64), "no tp·pp·dp split is valid"),  # 96 = 3·32 but no factor 3 in heads or layers
    (("gpt3-13b", 0, 64), "gpus=0 must be a positive integer"),
])
def test_bad_input_says_what_would_work(args, rule) -> None:  # noqa: ANN001
    with pytest.raises(lc.ConfigError, match=rule):
        tune(args[0], args[1], A100, args[2])


def test_cli() -> None:
    r = subprocess.run([sys.executable, "-m", "llmcomm", "tune", "gpt3-13b", "--gpus", "64", "--cluster",
                        "a100-80g-hdr200", "--global-batch", "512", "--top", "3", "--tp", "2,4,8"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "candidates" in r.stdout and "time_s" in r.stdout
    body = [ln for ln in r.stdout.splitlines()[3:] if ln.strip()]
    assert len(body) == 3 and all(int(ln.split()[0]) in (2, 4, 8) for ln in body)
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
