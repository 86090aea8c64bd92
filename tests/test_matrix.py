"""The blocked matrix builder (llmcomm.matrix) equals the one-shot flows -> matrix path exactly, and its
node / rack levels equal the GPU matrix summed over nodes / racks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from conftest import TINY, TINY_MOE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmcomm import ParallelConfig
from llmcomm.errors import ConfigError, TraceFormatError
from llmcomm.matrix import blocks, matrix_from_table
from llmcomm.predict import predict_traffic
from llmcomm.trace import Trace, flows_from_table, flows_to_matrix

MOE = TINY_MOE
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(table, world: int, algorithm: str) -> sp.csr_matrix:
    """The one-shot path: every flow with its tags, then one COO -> CSR."""
    return flows_to_matrix(flows_from_table(table, algorithm), world)


def same(a: sp.csr_matrix, b: sp.csr_matrix) -> bool:
    a.sort_indices()
    b.sort_indices()
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            and np.array_equal(a.data, b.data))


def coarsen(m: sp.csr_matrix, unit: int) -> np.ndarray:
    k = -(-m.shape[0] // unit)
    p = sp.csr_matrix((np.ones(m.shape[0]), (np.arange(m.shape[0]), np.arange(m.shape[0]) // unit)),
                      shape=(m.shape[0], k))
    return (p.T @ m @ p).toarray()


@st.composite
def random_events(draw):
    """Collectives of every op (broadcast with and without a root, all_to_all with and without splits),
    send/recv pairs, counts > 1, rows in random order."""
    world = draw(st.integers(2, 24))
    rows = []
    for _ in range(draw(st.integers(1, 8))):
        members = draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=min(world, 9), unique=True))
        op = draw(st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]))
        size = draw(st.integers(0, 10**9))
        count = draw(st.integers(1, 5))
        root = draw(st.sampled_from([-1, *members])) if op == "broadcast" else -1
        splits = None
        if op == "all_to_all" and draw(st.booleans()):
            splits = [draw(st.integers(0, 10**6)) for _ in members]
        for r in members:
            rows.append({"rank": r, "phase": "forward", "parallelism": "tp", "op": op, "group": members,
                         "peer": root, "bytes": sum(splits) if splits else size, "count": count,
                         "split_bytes": splits, "source": "test"})
    for _ in range(draw(st.integers(0, 6))):
        a, b = draw(st.lists(st.integers(0, world - 1), min_size=2, max_size=2, unique=True))
        s = draw(st.integers(0, 10**7))
        rows.append({"rank": a, "phase": "forward", "parallelism": "pp", "op": "send", "group": [a, b],
                     "peer": b, "bytes": s, "source": "test"})
        rows.append({"rank": b, "phase": "forward", "parallelism": "pp", "op": "recv", "group": [a, b],
                     "peer": a, "bytes": s, "source": "test"})
    perm = draw(st.permutations(range(len(rows))))
    return world, Trace.from_events(pd.DataFrame([rows[i] for i in perm]))


@given(random_events(), st.sampled_from(["ring", "direct"]), st.integers(1, 50))
@SETTINGS
def test_blocked_equals_one_shot_on_random_events(wt, algorithm, block_flows):
    world, t = wt
    table = t.to_table()
    want = reference(table, world, algorithm)
    got = matrix_from_table(table, world, algorithm, block_flows=block_flows)
    assert same(got, want)
    assert same(t.matrix(algorithm, world_size=world), want)


@st.composite
def configs(draw):
    moe = draw(st.booleans())
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4]))
    ep = draw(st.sampled_from([1, 2, 4])) if moe else 1
    if moe and ep > dp:
        ep = dp
    m = draw(st.sampled_from([1, 2, 4]))
    p = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, sp=tp > 1, seq_len=32, global_batch=m * dp,
                       distributed_optimizer=draw(st.booleans()),
                       order=draw(st.sampled_from(["tp-cp-ep-dp-pp", "tp-pp-dp"])))
    return (MOE if moe else TINY), p, draw(st.booleans())


@given(configs(), st.sampled_from(["ring", "direct"]), st.integers(1, 400))
@SETTINGS
def test_blocked_equals_one_shot_on_predictions(cfg, algorithm, block_flows):
    model, p, aggregate = cfg
    t = predict_traffic(model, p, aggregate=aggregate)
    table = t.to_table()
    n = p.world_size
    want = reference(table, n, algorithm)
    assert same(matrix_from_table(table, n, algorithm, block_flows=block_flows), want)
    # node and rack levels: the GPU matrix summed over nodes / racks (float sums in another order)
    for gpn, npr in ((2, 1), (4, 2), (3, 2)):
        node = matrix_from_table(table, n, algorithm, level="node", gpus_per_node=gpn, block_flows=block_flows)
        assert np.allclose(node.toarray(), coarsen(want, gpn), rtol=1e-12, atol=0)
        rack = matrix_from_table(table, n, algorithm, level="rack", gpus_per_node=gpn, nodes_per_rack=npr)
        assert np.allclose(rack.toarray(), coarsen(want, gpn * npr), rtol=1e-12, atol=0)
    assert np.isclose(t.matrix(algorithm, level="node").sum(), want.sum(), rtol=1e-12)


def test_node_level_of_a_known_matrix():
    # 4 GPUs, 2 per node: an all_reduce over all four (direct: 2/n·S to each other member)
    rows = [{"rank": r, "phase": "forward", "parallelism": "dp", "op": "all_reduce", "group": [0, 1, 2, 3],
             "bytes": 400, "source": "t"} for r in range(4)]
    t = Trace.from_records(rows)
    node = t.matrix("direct", level="node", gpus_per_node=2).toarray()
    # each GPU sends 200 to each of 3 others: within a node 1 peer (200), to the other node 2 peers (400)
    assert np.array_equal(node, np.array([[400.0, 800.0], [800.0, 400.0]]))
    assert t.matrix("direct", level="rack", gpus_per_node=2, nodes_per_rack=2).toarray().tolist() == [[2400.0]]


def test_blocks_are_aligned_and_cover():
    rank = np.repeat(np.arange(64), 3)
    out = blocks(rank, np.ones(len(rank)), 64, unit=8, block_flows=50)
    assert out[0][0] == 0 and out[-1][1] == 64
    assert all(a % 8 == 0 and b == c for (a, b), (c, _) in zip(out, out[1:], strict=False))
    assert max(b - a for a, b in out) == 16  # 16 ranks × 3 flows = 48 <= 50


def test_bad_level_and_ranks():
    t = Trace.from_records([{"rank": 5, "phase": "forward", "parallelism": "pp", "op": "send", "group": [5, 1],
                             "peer": 1, "bytes": 1, "source": "t"}])
    with pytest.raises(ConfigError, match="level"):
        t.matrix(level="switch")
    with pytest.raises(ConfigError, match="nodes_per_rack"):
        t.matrix(level="rack")
    with pytest.raises(TraceFormatError, match="world_size"):
        t.matrix(world_size=4)
    with pytest.raises(TraceFormatError, match="algorithm"):
        t.matrix("tree")


@pytest.mark.parametrize("world, max_cells", [(64, 512), (64, 16), (96, 10)])
def test_binned_flows_draw_what_the_flow_table_draws(world, max_cells):
    from llmcomm.matrix import binned_flows
    from llmcomm.plots import _binned

    p = ParallelConfig(tp=4, pp=2, dp=world // 8, seq_len=32, global_batch=world // 8)
    t = predict_traffic(TINY, p)
    want, k = _binned(t.flows("direct"), "dst", "src", "bytes", world, max_cells)
    got, k2 = _binned(binned_flows(t, "direct", max_cells), "dst", "src", "bytes", world, max_cells)
    assert k == k2 and want.shape == got.shape
    assert np.allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-12, atol=0)
    assert np.array_equal(np.isnan(got), np.isnan(want))


def test_a_world_spanning_direct_matrix_beyond_the_bound_is_refused_up_front() -> None:
    """Megatron's rerun check all-reduces an int32 over the world: at 131,072 GPUs the direct matrix would expand
    ~17 G flows; it is refused with the number before any is built (it ran out of memory before)."""
    import time

    import llmcomm as lc
    from llmcomm.predict import predict_traffic

    m = lc.load_model("gpt3-175b")
    p = lc.ParallelConfig(tp=8, pp=16, dp=1024, micro_batch=1, global_batch=12 * 1024, seq_len=2048)
    t = predict_traffic(m, p)
    t0 = time.perf_counter()
    with pytest.raises(lc.ConfigError, match=r"would expand up to [\d,]+ flows, above the 500,000,000"):
        t.matrix("direct")
    assert time.perf_counter() - t0 < 30
    assert t.matrix("ring").shape == (131072, 131072)  # the ring matrix stays small
