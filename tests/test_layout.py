"""Rank layout against hand-worked layouts, and its invariants over random configurations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmcomm as lc
from llmcomm.layout import Layout


def test_hand_worked_tp2_pp4_dp2() -> None:
    L = Layout(lc.ParallelConfig(tp=2, pp=4, dp=2))
    assert L.groups("tp").tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert L.groups("dp").tolist() == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert L.groups("pp").tolist() == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    c = L.coords.set_index("rank")
    assert tuple(c.loc[13, ["tp", "dp", "pp", "node"]]) == (1, 0, 3, 1)
    assert L.rank_of(tp=1, dp=0, pp=3) == 13
    assert L.group_of(9, "pp") == [1, 5, 9, 13]


def test_hand_worked_expert_layout() -> None:
    """tp=2, dp=4, ep=2: EP groups are consecutive DP members, expert-DP the strided rest."""
    L = Layout(lc.ParallelConfig(tp=2, dp=4, ep=2))
    assert L.groups("dp").tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert L.groups("ep").tolist() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert L.groups("edp").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_other_order_dp_before_pp() -> None:
    """order tp-pp-dp: PP neighbours are adjacent TP blocks, DP groups stride over whole pipelines."""
    L = Layout(lc.ParallelConfig(tp=2, pp=2, dp=2, order="tp-pp-dp"))
    assert L.groups("pp").tolist() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert L.groups("dp").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_nodes() -> None:
    L = Layout(lc.ParallelConfig(tp=8, dp=4), gpus_per_node=8)
    assert L.coords["node"].tolist() == [r // 8 for r in range(32)]
    assert all(len(set(L.coords.set_index("rank").loc[g, "node"])) == 1 for g in L.groups("tp").tolist())


def test_bad_rank() -> None:
    with pytest.raises(lc.ConfigError, match="outside"):
        Layout(lc.ParallelConfig(tp=2)).group_of(7, "tp")


pow2 = st.sampled_from([1, 2, 4])


@settings(max_examples=60, deadline=None)
@given(tp=pow2, pp=pow2, dp=pow2, cp=st.sampled_from([1, 2]), ep_div=st.sampled_from([1, 2]),
       order=st.sampled_from(["tp-cp-ep-dp-pp", "tp-cp-pp-dp", "tp-pp-cp-dp", "dp-tp-cp-pp"]))
def test_groups_partition_the_world(tp, pp, dp, cp, ep_div, order) -> None:
    ep = ep_div if (cp * dp) % ep_div == 0 else 1
    par = lc.ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, order=order)
    L = Layout(par)
    c = L.coords.set_index("rank")
    for p in ("tp", "cp", "dp", "pp", "ep", "edp"):
        g = L.groups(p)
        assert sorted(g.ravel().tolist()) == list(range(par.world_size)), p
        size = {"ep": ep, "edp": cp * dp // ep}[p] if p in ("ep", "edp") else getattr(par, p)
        assert g.shape[1] == size
        # members of a group share every other coordinate
        others = {"tp": ["cp", "dp", "pp"], "cp": ["tp", "dp", "pp"], "dp": ["tp", "cp", "pp"],
                  "pp": ["tp", "cp", "dp"], "ep": ["tp", "pp", "edp"], "edp": ["tp", "pp", "ep"]}[p]
        for row in g[:4]:
            assert (c.loc[row, others].nunique() == 1).all(), (p, row)
    # coordinates -> rank is the inverse of rank -> coordinates
    for r in np.linspace(0, par.world_size - 1, 5).astype(int):
        assert L.rank_of(**{d: int(c.loc[r, d]) for d in ("tp", "cp", "dp", "pp")}) == r


def test_large_layout_is_fast() -> None:
    L = Layout(lc.ParallelConfig(tp=8, pp=16, dp=128))
    assert L.groups("dp").shape == (128, 128)
    assert len(L.coords) == 16384


def test_dpcp_groups_fold_cp_into_dp() -> None:
    """``dpcp``: the ranks that share TP and PP coordinates, in rank order (what DP reduces over with CP)."""
    L = Layout(lc.ParallelConfig(tp=2, cp=2, dp=2, pp=2))
    assert L.groups("dpcp").tolist() == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert L.size("dpcp") == 4 and L.size("edp") == 4
