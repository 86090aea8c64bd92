"""The binned matrix image (:mod:`llmcomm.matrix_view`) equals llmcomm's exact matrix summed into the same
blocks, for dense, pipelined, sequence-parallel and MoE predictions, both algorithms, blocks that do and do not
divide the world, and for a trace whose groups are member lists."""

from __future__ import annotations

import numpy as np
import pytest

import llmcomm as lc
from llmcomm.errors import ConfigError
from llmcomm.matrix import matrix_from_table
from llmcomm.matrix_view import _binary_places, binned_matrices, binned_matrix, count_exact, view_grid
from llmcomm.predict import predict_traffic
from llmcomm.specs import ParallelConfig
from llmcomm.trace import Trace

JOBS = [
    ("gpt3-6.7b", {"tp": 4, "pp": 2, "dp": 4, "global_batch": 32}),
    ("gpt3-1.3b", {"tp": 2, "pp": 2, "dp": 4, "vpp": 2, "sp": True, "global_batch": 32}),
    ("tiny-moe", {"tp": 2, "pp": 1, "dp": 4, "ep": 4, "sp": True, "global_batch": 16}),
    ("mixtral-8x7b", {"tp": 2, "pp": 2, "dp": 8, "ep": 4, "sp": True, "global_batch": 64}),
    ("gpt3-6.7b", {"tp": 2, "pp": 2, "dp": 2, "cp": 2, "global_batch": 16}),
]


def _trace(name: str, kw: dict) -> Trace:
    parallel = ParallelConfig(**kw)
    cluster = lc.load_cluster("a100-80g-hdr200").for_world(parallel.world_size)
    return predict_traffic(lc.load_model(name), parallel, cluster=cluster)


def _exact_binned(trace: Trace, algorithm: str, unit: int, world: int) -> np.ndarray:
    events = trace.ref_events if trace.ref_events is not None else trace.to_table()
    m = matrix_from_table(events, world, algorithm).tocoo()  # the exact GPU matrix
    cells = -(-world // unit)
    out = np.zeros((cells, cells))
    np.add.at(out, (m.row // unit, m.col // unit), m.data)
    return out


@pytest.mark.parametrize(("name", "kw"), JOBS)
def test_binned_image_is_the_exact_matrix_summed_into_blocks(name: str, kw: dict) -> None:
    trace = _trace(name, kw)
    assert trace.ref_events is not None  # the group-structure path
    world = trace.world_size
    for unit in (1, 3, 8):
        images = binned_matrices(trace, ("direct", "ring"), unit)
        for (p, alg), image in images.items():
            exact = _exact_binned(trace.select(parallelism=p), alg, unit, world)
            np.testing.assert_allclose(image, exact, rtol=1e-12, atol=0, err_msg=f"{name} {p} {alg} unit {unit}")
            assert ((image == 0) == (exact == 0)).all(), f"{name} {p} {alg} unit {unit}: zero pattern"
        for alg in ("direct", "ring"):
            np.testing.assert_allclose(binned_matrix(trace, alg, unit), _exact_binned(trace, alg, unit, world),
                                       rtol=1e-12, atol=0)


def test_all_to_all_splits_and_member_lists() -> None:
    trace = _trace("tiny-moe", {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "global_batch": 16})
    ep = trace.select(parallelism="ep")
    assert ep.ref_events.column("split_bytes").null_count < len(ep)  # per-peer splits are read
    listed = Trace(ep.events, ep.meta)  # the same events as member lists: the exact builder's path
    assert listed.ref_events is None
    for alg in ("direct", "ring"):
        np.testing.assert_allclose(binned_matrix(listed, alg, 3), binned_matrix(ep, alg, 3), rtol=1e-12, atol=0)


def test_view_grid_and_bounds() -> None:
    assert view_grid(32, 8) == view_grid(32, 8, 256)
    g = view_grid(4096, 8, 256)
    assert (g.level, g.unit, g.cells) == ("gpu", 16, 256)
    g = view_grid(8192, 8, 256, 4096)
    assert g.level == "node" and g.unit % 8 == 0 and g.cells <= 256
    with pytest.raises(ConfigError, match="unit >= "):
        binned_matrix(_trace("gpt3-6.7b", JOBS[0][1]), "direct", 1, world_size=10_000)
    with pytest.raises(ConfigError, match="algorithm="):
        binned_matrix(_trace("gpt3-6.7b", JOBS[0][1]), "tree", 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "kw"), JOBS)
def test_count_exact_aggregated_images_are_the_expanded_ones_bit_for_bit(name: str, kw: dict) -> None:
    """llmcomm.matrix_view.count_exact: where it holds, the images of the aggregated prediction (one row per
    distinct call with its count) are byte for byte those of the expanded one, the explorer's shortcut."""
    parallel = ParallelConfig(**kw)
    cluster = lc.load_cluster("a100-80g-hdr200").for_world(parallel.world_size)
    model = lc.load_model(name)
    agg = predict_traffic(model, parallel, cluster=cluster, aggregate=True)
    full = predict_traffic(model, parallel, cluster=cluster, aggregate=False)
    assert len(agg) < len(full) and count_exact(agg)
    for unit in (1, 3):
        a, f = binned_matrices(agg, ("direct", "ring"), unit), binned_matrices(full, ("direct", "ring"), unit)
        assert list(a) == list(f)
        for k in a:
            assert a[k].tobytes() == f[k].tobytes(), (name, k, unit)


def test_count_exact_refuses_amounts_a_float_does_not_add_exactly() -> None:
    """A data-parallel group of 3: 2/3 of a gradient is no binary fraction, so the sums depend on their order
    and the aggregated images are not claimed equal; a trace of member lists is not checked."""
    parallel = ParallelConfig(tp=1, pp=1, dp=3, global_batch=6)
    agg = predict_traffic(lc.load_model("gpt3-125m"), parallel, aggregate=True)
    assert not count_exact(agg)
    assert not count_exact(Trace(agg.events, agg.meta))
    assert _binary_places(np.array([3.0, 0.5, 7.96875])) == 5 and _binary_places(np.array([1 / 3])) is None
