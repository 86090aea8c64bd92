"""``step._placement`` on a reduced world (``_reduced_placement_shape``) against the whole-world Layout."""

import random
import time

import numpy as np
import pytest

from llmcomm import step
from llmcomm.layout import Layout
from llmcomm.specs import ParallelConfig

ORDERS = ["tp-cp-ep-dp-pp", "tp-pp-dp", "tp-dp-pp", "tp-cp-dp-pp", "tp-dp-cp-pp", "pp-tp-dp", "dp-tp-pp",
          "tp-cp-pp-dp", "cp-tp-dp-pp", "pp-dp-cp-tp", "dp-cp-tp-pp", "tp-pp-cp-dp"]


def _reference(parallel: ParallelConfig, gpn: int) -> dict[str, dict[str, tuple[int, int]]]:
    """The Layout-based computation as it was before the reduction: every group of the whole world."""
    lay = Layout(parallel, gpn)
    stage = lay.coords["pp"].to_numpy()
    pp_groups = lay.groups("pp")
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for cls in step.CLASSES:
        stages = step.class_stages(cls, parallel.pp) or [0]
        ranks = np.flatnonzero(np.isin(stage, stages))
        d = {}
        for kind in step.PLACED_KINDS:
            g, row_of_rank = lay.group_lookup(kind)
            nodes = np.sort(g // gpn, axis=1)
            span = 1 + (np.diff(nodes, axis=1) != 0).sum(axis=1)
            d[kind] = (g.shape[1], -(-g.shape[1] // int(span[row_of_rank[ranks]].max())))
        pairs = [(r, q) for r in stages for q in (r - 1, r + 1) if 0 <= q < parallel.pp]
        same = all((pp_groups[:, r] // gpn == pp_groups[:, q] // gpn).all() for r, q in pairs)
        d["p2p"] = (2, 2 if same else 1)
        out[cls] = d
    return out


def _shape(tp, cp, dp, pp, ep=1, etp=None, order="tp-cp-ep-dp-pp"):
    return ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp, order=order, global_batch=dp)


def test_reduction_hand_worked():
    # tp=8 on 8-GPU nodes, dp=1024, pp=4: the block is one node (the tp axis); the small shape keeps tp and 2 stages
    p = _shape(8, 1, 1024, 4)
    small = step._reduced_placement_shape(p, 8)
    assert small is not None and (small.tp, small.cp, small.dp, small.pp) == (8, 1, 1, 2)
    got = step._placement.__wrapped__(p, 8)
    assert got["first"]["dp"] == (1024, 1) and got["first"]["tp"] == (8, 8) and got["mid"]["p2p"] == (2, 1)
    assert got["last"]["world"] == (8 * 1024 * 4, 8) and got == _reference(p, 8)
    # tp=2 on 8-GPU nodes: dp's stride 2 is below a node, split into a sub-axis of 4 (one node) and the rest
    p = _shape(2, 1, 64, 1)
    small = step._reduced_placement_shape(p, 8)
    assert small is not None and (small.tp, small.dp, small.pp) == (2, 4, 1)
    assert step._placement.__wrapped__(p, 8)["first"]["dp"] == (64, 4) == _reference(p, 8)["first"]["dp"]
    # odd sizes: no block is a boundary (dp=7 with stride 2 on 8-GPU nodes): the whole world is computed
    assert step._reduced_placement_shape(_shape(2, 1, 7, 1), 8) is None


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2, 3))])
def test_reduced_placement_matches_layout(seed):
    rng = random.Random(seed)
    sizes = [1, 1, 2, 2, 3, 4, 4, 6, 8, 9, 16, 5, 12, 32]
    checked = reduced = 0
    while checked < 250:
        tp, cp, dp, pp = (rng.choice(sizes) for _ in range(4))
        if tp * cp * dp * pp > 4096:
            continue
        ep = rng.choice([d for d in range(1, cp * dp + 1) if cp * dp % d == 0])
        etp = rng.choice([d for d in range(1, tp * cp * dp + 1) if (tp * cp * dp) % (d * ep) == 0] + [None] * 3)
        gpn = rng.choice([1, 2, 4, 8, 16, 72])
        p = _shape(tp, cp, dp, pp, ep, etp, rng.choice(ORDERS))
        try:
            ref = _reference(p, gpn)
        except ValueError:  # a data split the layout cannot build (ep across non-adjacent cp/dp); not a shape
            continue
        assert step._placement.__wrapped__(p, gpn) == ref, (p.tp, p.cp, p.dp, p.pp, p.ep, p.etp, p.order, gpn)
        checked += 1
        reduced += step._reduced_placement_shape(p, gpn) is not None
    assert reduced > 50  # the reduction is exercised, not only the fallback


def test_huge_worlds_are_cheap():
    shapes = [(_shape(8, 1, 2 ** 14, 8), 8), (_shape(8, 2, 2 ** 16, 8, ep=8, etp=1), 8),
              (_shape(4, 1, 2 ** 20, 4, ep=16), 4), (_shape(1, 1, 2 ** 24, 1), 8),
              (_shape(2, 1, 2 ** 19, 2, order="tp-pp-dp"), 8), (_shape(8, 1, 2 ** 21, 1), 72 // 9)]
    for p, gpn in shapes:
        t = time.process_time()
        got = step._placement.__wrapped__(p, gpn)
        assert time.process_time() - t < 0.5, (p, gpn)
        assert got["first"]["world"] == (p.world_size, gpn) and got["first"]["dp"][0] == p.dp
