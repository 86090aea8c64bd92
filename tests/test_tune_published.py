"""F7 on NVIDIA's published DGX-H100 recipes (llmcomm.tune.published): the tuner's pick beside each published
configuration, with the predicted speed-up inside the cost model's interval, and the measured regret of the
tuner's ranking where one model was published in several configurations."""

from __future__ import annotations

import numpy as np


def test_recipe_table_sets_the_pick_beside_the_published_configuration(external) -> None:  # noqa: ANN001
    from llmcomm.tune.published import _published, recipe_table

    pub = _published()
    rows = pub[(pub["model_name"] == "llama3-70b") & pub["predicted_s"].notna()].head(2)
    assert len(rows) == 2
    t = recipe_table(rows)
    assert len(t) == 2 and (t["tuner"] != "").all() and (t["tuner_fp8"] == "hybrid").all()  # FP8 rows: FP8 only
    assert (t["predicted_speedup"] == t["published_pred_s"] / t["tuner_pred_s"]).all()
    assert (t["predicted_speedup_lo"] <= t["predicted_speedup"]).all()
    assert (t["predicted_speedup"] <= t["predicted_speedup_hi"]).all()
    assert (t["predicted_speedup_lo"] < 1).all()  # the interval is wider than the gain: said, not hidden
    assert np.isfinite(t["measured_over_pick"]).all()


def test_recipe_table_says_why_a_published_configuration_is_not_predicted(external) -> None:  # noqa: ANN001
    from llmcomm.tune.published import _published, recipe_table

    pub = _published()
    # the flex dispatcher (HybridEP) of the Qwen3-30B rows: refused (cost-dispatcher); expert TP 1 under TP 2 (the
    # Qwen3-235B rows) is predicted since MoE parallel folding (llmcomm.overhead.moe_fold)
    rows = pub[(pub["model_name"] == "qwen3-30b-a3b") & (pub["needs"] == "rule:cost-dispatcher")].head(1)
    assert len(rows) == 1
    assert rows["predicted_s"].isna().all()
    t = recipe_table(rows)
    assert t["published_pred_s"].isna().all() and t["predicted_speedup"].isna().all()
    assert (t["published_refused"] != "").all() and (t["tuner"] != "").all()


def test_recipe_regret_groups_the_configurations_of_one_model(external) -> None:  # noqa: ANN001
    from llmcomm.tune.published import recipe_regret

    r = recipe_regret()
    q = r[r["model_name"] == "qwen3-30b-a3b"].iloc[0]
    assert q["configs"] == 2 and "tp1·pp2·v12·ep8·mb1" in q["measured"] and "tp1·pp1·ep16·mb1" in q["measured"]
    if q["predicted"] >= 2:  # once the formulation takes both configurations
        assert q["regret"] >= 0 and q["pick"] in q["ranking"]
    else:
        assert q["refused"]


def test_outside_space_says_why_the_tuner_cannot_pick_a_published_configuration(external) -> None:  # noqa: ANN001
    """Where the tuner loses to a published recipe, the recipe is not among its candidates, and why: GPT-3 175B
    (24.07, mb 2) needs 75.1 GB, above 90% of 80 GB; Qwen3-30B-A3B (25.11) runs 24 virtual stages (the space's
    max_vpp is 8) and FP8 current scaling; Qwen3-235B-A22B runs ep 32 over dp 16 (MoE parallel folding, in the
    space only with an explicit etp); LLaMA-3 70B (24.07, 62.8 GB) fits, but reduces its gradients in bf16 and
    overlaps its pipeline sends, which the default space does not (fp32, overlap_p2p_comm off); a candidate of
    the space itself is inside."""
    import ast

    import llmcomm as lc
    from llmcomm.tune import SearchSpace
    from llmcomm.tune.published import _published, outside_space

    pub = _published()
    h100 = lc.load_cluster("h100-80g-ndr400")

    def why(model: str, container: str, **match: int) -> str:
        r = pub[(pub["model_name"] == model) & (pub["container"] == container) & pub["predicted_s"].notna()]
        for k, v in match.items():
            r = r[r[k] == v]
        assert len(r) == 1, (model, container, match)
        return outside_space(lc.load_model(model), ast.literal_eval(r["columns"].iloc[0]), SearchSpace(), h100)

    fits = why("llama3-70b", "24.07")  # 62.8 GB
    assert "memory" not in fits and "grad_reduce_dtype=bf16" in fits and "overlap_p2p_comm=True" in fits
    assert why("gpt3-175b", "24.07", mbs=2).startswith("memory 75.1 GB above the tuner's budget 72.0 GB")
    q = why("qwen3-30b-a3b", "25.11")
    assert "vpp 24 above the space's max_vpp=8" in q and "fp8_recipe=tensorwise" in q
    assert "ep 32 does not divide dp 16" in why("qwen3-235b-a22b", "25.11")
    # --recompute-modules (issue 21): GPT-OSS 120B's layernorm+moe_act is a set of the space; DeepSeek-V3's
    # mla_up_proj+mlp is not (the formulation does not time mla_up_proj), and the reason names the sets it holds
    assert "recompute_modules" not in why("gpt-oss-120b", "26.02")
    ds = ast.literal_eval(pub[pub["model_name"] == "deepseek-v3"]["columns"].iloc[0])  # refused (pp-layers)
    assert ("recompute_modules=mla_up_proj+mlp (the space's module sets on deepseek-v3: default)"
            in outside_space(lc.load_model("deepseek-v3"), ds, SearchSpace(), h100))
    from llmcomm.tune.published import RELAX

    assert "recompute_modules" not in RELAX
    big = lc.load_model("qwen3-235b-a22b")
    cand = ast.literal_eval(pub[(pub["model_name"] == "qwen3-235b-a22b") & (pub["container"] == "25.11")]
                            ["columns"].iloc[0])
    assert "ep 32" not in outside_space(big, cand, SearchSpace(etp=(1,)), h100)  # folding opened: inside
    from llmcomm.tune import enumerate_candidates

    gpt = lc.load_model("gpt3-13b")
    rows = enumerate_candidates(gpt, 16, 64, None, SearchSpace().for_cluster(h100))
    fits = rows.iloc[[0, len(rows) // 2, len(rows) - 1]]
    from llmcomm.overhead.memory import memory_table

    for (_, r), mem in zip(fits.iterrows(), memory_table(gpt, fits)["total_bytes"], strict=True):
        got = outside_space(gpt, {k: v for k, v in r.items() if k != "num_microbatches"}, SearchSpace(), h100)
        assert (got == "") if mem <= 0.9 * h100.gpu_memory_bytes else got.startswith("memory "), got
