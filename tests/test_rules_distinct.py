"""The rules' per-column shortcuts (speed only): a column's distinct values found once per ``check_table`` call
(``rules._each``'s memo) and the object comparisons through them (``_equals``, ``_differs``, ``_method_bad``) give
the verdicts of the plain elementwise expressions, row for row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from llmcomm import load_model, rules
from llmcomm.parallel_table import ParallelTable

SCOPES = ("config", "job", "megatron", "cost")


def _objects(values: list) -> np.ndarray:  # type: ignore[type-arg]
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _mixed(n: int, rng: np.random.Generator) -> np.ndarray:
    pool = [None, "full", "selective", "a2a", ("moe", "layernorm"), float("nan"), "block", ("core_attn",)]
    return _objects([pool[i] for i in rng.integers(0, len(pool), n)])


@pytest.mark.parametrize("n", [10, 300, 5000])
def test_equals_and_differs_are_the_elementwise_comparisons(n: int) -> None:
    rng = np.random.default_rng(n)
    for values in (_mixed(n, rng), _objects(["full"] * n), _objects([None] * n)):
        for value in (None, "full", "a2a"):
            want_eq = np.asarray(values, dtype=object) == value
            want_ne = np.not_equal(np.asarray(values, dtype=object), value)
            assert np.array_equal(np.asarray(rules._equals(values, value), dtype=bool), want_eq.astype(bool))
            assert np.array_equal(np.asarray(rules._differs(values, value), dtype=bool), want_ne.astype(bool))
        a = np.asarray(values, dtype=object)
        want = ~((a == None) | (a == "uniform") | (a == "block"))  # noqa: E711
        assert np.array_equal(np.asarray(rules._method_bad(values), dtype=bool), want.astype(bool))


def test_every_rule_gives_the_same_rows_with_and_without_the_memo() -> None:
    """Each rule's rows on a table whose object columns vary (and repeat), evaluated the way ``check_table`` does
    (one memo of distinct values for all rules) and with no memo, are equal."""
    rng = np.random.default_rng(0)
    n = 2000
    df = pd.DataFrame({
        "tp": rng.choice([1, 2, 4, 8], n), "pp": rng.choice([1, 2, 4], n), "dp": rng.choice([1, 2, 4], n),
        "recompute": rng.choice(["none", "selective", "full"], n),
        "fp8_recipe": rng.choice(["delayed", "tensorwise", "mxfp8"], n),
        "cp_comm_type": rng.choice(["p2p", "a2a", "all_gather"], n), "cp": rng.choice([1, 2], n)})
    t = ParallelTable.from_frame(df, None)
    t.columns["fp8"] = _objects([[None, "hybrid", "e4m3"][i] for i in rng.integers(0, 3, n)])
    t.columns["recompute_modules"] = _objects(
        [[None, ("mlp",), ("moe_act", "layernorm"), ("core_attn", "moe")][i] for i in rng.integers(0, 4, n)])
    t.columns["recompute_method"] = _objects([[None, "uniform", "block", "bad"][i] for i in rng.integers(0, 4, n)])
    for name in ("gpt3-175b", "mixtral-8x7b"):
        model = load_model(name)
        plain = [np.broadcast_to(np.asarray(r.bad(model, t), dtype=bool), (n,)) for r in rules.rules(SCOPES)]
        rules._DISTINCT.append({})
        try:
            memo = [np.broadcast_to(np.asarray(r.bad(model, t), dtype=bool), (n,)) for r in rules.rules(SCOPES)]
            assert rules._DISTINCT[-1], "the memo held the object columns' distinct values"
        finally:
            rules._DISTINCT.pop()
        for r, a, b in zip(rules.rules(SCOPES), plain, memo, strict=True):
            assert np.array_equal(a, b), (name, r.name)
