"""link_loads' fast paths give what the plain ones give, byte for byte: every parallelism's ring matrix from one
stacked decomposition (llmcomm.matrix.stacked_matrix) equals trace.matrix(parallelism=p) one by one, and the
per-link sums binned directly equal the sums over np.unique's inverse."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import llmcomm as lc
from llmcomm import ParallelConfig
from llmcomm.errors import ConfigError
from llmcomm.matrix import matrix_from_table, stacked_matrix
from llmcomm.network import load_topology, pair_flows
from llmcomm.network.loads import _ascending, _sum
from llmcomm.predict import predict_traffic
from llmcomm.vocab import PARALLELISM_TAGS

CASES = [
    ("gpt3-175b", dict(tp=8, pp=4, dp=8, global_batch=64, seq_len=2048)),
    ("mixtral-8x7b", dict(tp=2, pp=4, dp=16, ep=8, sp=True, global_batch=64, seq_len=4096)),
    ("llama3-70b", dict(tp=4, cp=2, pp=4, vpp=2, dp=4, global_batch=32, seq_len=8192, schedule="interleaved",
                        order="tp-pp-dp")),
]


def identical(a: sp.csr_matrix, b: sp.csr_matrix) -> bool:
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            and a.data.tobytes() == b.data.tobytes())


@pytest.mark.parametrize("model, kw", CASES, ids=[m for m, _ in CASES])
def test_stacked_ring_matrices_equal_one_matrix_per_parallelism(model, kw):
    t = predict_traffic(lc.load_model(model), ParallelConfig(**kw))
    n = t.world_size
    ev = t.ref_events
    tags = np.array([PARALLELISM_TAGS.index(v) for v in ev.column("parallelism").to_pylist()])
    names = sorted(set(ev.column("parallelism").to_pylist()))
    key = np.array([names.index(PARALLELISM_TAGS[c]) for c in tags])
    for algorithm in ("ring", "direct"):
        stack = stacked_matrix(ev, n, algorithm, key, len(names))
        for q, p in enumerate(names):
            want = matrix_from_table(t.select(parallelism=p).ref_events, n, algorithm, tiled=False)
            assert identical(stack[q * n:(q + 1) * n], want), (algorithm, p)
    pf, slots = pair_flows(t, load_topology("llama3-24k").for_world(n))
    got = 0
    for q, p in enumerate(pf.parallelisms):
        m = t.matrix("ring", parallelism=p).tocoo()
        sel = pf.parallelism == q
        assert np.array_equal(pf.src[sel], slots[m.row]) and np.array_equal(pf.dst[sel], slots[m.col])
        assert (pf.bytes[sel]).tobytes() == (m.data / 1).tobytes()
        got += m.nnz
    assert got == len(pf)


def test_stacked_matrix_is_bounded():
    t = predict_traffic(lc.load_model("gpt3-175b"), ParallelConfig(tp=8, pp=16, dp=1024, global_batch=1024 * 12,
                                                                    seq_len=2048, rerun_mode="disabled"))
    with pytest.raises(ConfigError, match="stacked_matrix expands"):
        stacked_matrix(t.ref_events, t.world_size, "direct", np.zeros(len(t), np.int64), 1)


@pytest.mark.parametrize("top", [10, 5_000, 10**9])
def test_binned_sums_equal_sums_over_unique(top):
    rng = np.random.default_rng(top)
    keys = rng.integers(0, top, 20_000)
    w = rng.random(20_000) * 1e9
    uniq, inv = np.unique(keys, return_inverse=True)
    got = _sum(keys, w, 0.5)
    assert np.array_equal(got[0], uniq)
    assert got[1].tobytes() == (np.bincount(inv, weights=w) * 0.5).tobytes()
    assert np.array_equal(got[2], np.bincount(inv))


def test_ascending():
    import pandas as pd

    df = pd.DataFrame({"a": [0, 0, 1, 1], "b": [3, 5, 0, 1]})
    assert _ascending(df, ["a", "b"])
    assert not _ascending(df.iloc[[1, 0, 2, 3]], ["a", "b"])
    assert not _ascending(df.iloc[[0, 1, 3, 2]], ["a", "b"])
