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
