"""The tiled direct matrix (llmcomm.matrix_tiles) equals the general blocked builder (llmcomm.matrix, which sums
every flow) byte for byte: indptr, indices and data, dtypes included; where its sums might not be exact it leaves
the matrix to the general path."""

from __future__ import annotations

import dataclasses

import conftest
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmcomm as lc
from llmcomm import ParallelConfig
from llmcomm.group_refs import GroupRefs, RefEvents
from llmcomm.matrix import matrix_from_table
from llmcomm.matrix_tiles import Tiles, fraction_bits
from llmcomm.predict import predict_traffic
from llmcomm.trace import Trace

TINY = dataclasses.replace(conftest.TINY, num_layers=8, seq_length=64, tied_embeddings=False)
MOE = dataclasses.replace(conftest.TINY_MOE, moe_layer_freq=1, num_shared_experts=0)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def identical(a: sp.csr_matrix, b: sp.csr_matrix) -> bool:
    """Byte-identical CSR arrays (no sorting first: both builders give sorted rows)."""
    return (a.shape == b.shape and a.indptr.dtype == b.indptr.dtype and a.indices.dtype == b.indices.dtype
            and a.data.dtype == b.data.dtype and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices) and a.data.tobytes() == b.data.tobytes())


def check(t: Trace) -> bool:
    """Tiled == general on ``t``'s references; returns whether the tiled path was taken."""
    ev, n = t.ref_events, t.world_size
    assert ev is not None
    got = matrix_from_table(ev, n, "direct")
    want = matrix_from_table(ev, n, "direct", tiled=False)
    assert identical(got, want)
    assert identical(got, matrix_from_table(ev, n, "direct", tiled=False, block_flows=37))
    return Tiles(ev, n).ok


def routing(world: int, m: int, seed: int) -> np.ndarray:
    """Random token counts (zeros included: all-to-all flows of zero bytes) per layer, micro-batch, rank, expert."""
    return np.random.default_rng(seed).integers(0, 6, size=(MOE.num_layers, m, world, MOE.num_experts))


@st.composite
def predictions(draw):
    """Dense and MoE predictions over tp, pp (1F1B and interleaved), dp (powers of two and not), cp, ep, etp, the
    distributed optimizer, the rerun check's world all-reduce, Megatron's and another rank order."""
    moe = draw(st.booleans())
    tp, pp = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 3, 4]))
    m = draw(st.sampled_from([1, 2]))
    common = dict(distributed_optimizer=draw(st.booleans()),
                  rerun_mode=draw(st.sampled_from(["validate_results", "disabled"])),
                  order=draw(st.sampled_from(["tp-cp-ep-dp-pp", "tp-pp-dp", "pp-dp-tp"])))
    if moe:
        ep = draw(st.sampled_from([e for e in (1, 2, 4) if dp % e == 0]))
        etp = draw(st.sampled_from([None, 1])) if tp > 1 else None
        if etp is not None and pp > 1 and not common["order"].endswith("pp"):
            common["order"] = "tp-cp-ep-dp-pp"  # Megatron: a folded expert grid needs the pp-last order (rule expert-order)
        p = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, etp=etp, sp=tp > 1, seq_len=32, global_batch=m * dp,
                           **common)
        r = routing(p.world_size, m, draw(st.integers(0, 99))) if ep > 1 and draw(st.booleans()) else None
        return predict_traffic(MOE, p, routing=r, aggregate=None if r is not None else draw(st.booleans()))
    cp = draw(st.sampled_from([1, 2]))
    vpp = 2 if pp > 1 and draw(st.booleans()) else 1
    p = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, vpp=vpp, sp=tp > 1, seq_len=64, global_batch=m * dp * pp,
                       schedule="interleaved" if vpp > 1 else "1f1b", **common)
    return predict_traffic(TINY, p, aggregate=draw(st.booleans()))


@given(predictions())
@SETTINGS
def test_tiled_equals_general_on_predictions(t):
    check(t)


# mid-size configurations of catalogue models (64-512 GPUs): every one takes the tiled path
MID = [
    ("gpt3-175b", dict(tp=8, pp=4, dp=8, global_batch=64, seq_len=2048, rerun_mode="disabled")),  # dense
    ("gpt3-175b", dict(tp=8, pp=4, dp=4, global_batch=32, seq_len=2048)),  # the rerun check's world group
    ("gpt3-175b", dict(tp=4, pp=8, vpp=2, dp=4, global_batch=64, seq_len=2048, schedule="interleaved",
                       distributed_optimizer=True)),
    ("llama3-70b", dict(tp=4, cp=2, pp=4, dp=4, global_batch=16, seq_len=8192)),  # context parallel
    ("llama3-70b", dict(tp=8, pp=4, dp=4, global_batch=16, seq_len=4096, order="tp-pp-dp")),  # another order
    ("mixtral-8x7b", dict(tp=2, pp=4, dp=16, ep=8, sp=True, global_batch=64, seq_len=4096)),  # MoE
    ("mixtral-8x7b", dict(tp=4, pp=2, dp=8, ep=4, etp=1, sp=True, global_batch=32, seq_len=4096,
                          distributed_optimizer=True, rerun_mode="disabled")),  # expert TP != TP
]


@pytest.mark.parametrize("model, kw", MID, ids=[f"{m}-{i}" for i, (m, _) in enumerate(MID)])
def test_tiled_equals_general_on_mid_size_configurations(model, kw):
    assert check(predict_traffic(lc.load_model(model), ParallelConfig(**kw)))


def references(rows: list[dict], table: np.ndarray, world: int) -> RefEvents:
    """Events of ``rows`` with each group given as its row of ``table`` (the form a prediction holds)."""
    ev = Trace.from_records(rows).to_table()
    index = np.array([next(i for i, g in enumerate(table) if list(g) == r["group"]) for r in rows], np.int32)
    refs = GroupRefs(np.zeros(len(rows), np.int8), index, (table.astype(np.int32),), world)
    return RefEvents(ev.drop_columns(["group"]), refs)


def test_sums_that_might_round_are_left_to_the_general_path():
    """A group of three all-reducing an odd byte count: 2S/3 per peer is no multiple of a power of two, so the
    order of the additions could matter; the general path builds the matrix."""
    table = np.array([[0, 1, 2], [3, 4, 5]])
    rows = [{"rank": r, "phase": "forward", "parallelism": "dp", "op": "all_reduce", "group": list(table[r // 3]),
             "bytes": b, "count": c, "source": "t"} for b, c in ((1001, 3), (7, 1), (10**9 + 1, 2)) for r in range(6)]
    ev = references(rows, table, 6)
    assert not Tiles(ev, 6).ok
    want = matrix_from_table(Trace.from_records(rows).to_table(), 6, "direct")
    assert identical(matrix_from_table(ev, 6, "direct"), want)
    even = references([{**r, "bytes": 3 * 2**20} for r in rows], table, 6)  # 2S/3 = 2^21: exact
    assert Tiles(even, 6).ok


def test_zero_byte_flows_keep_their_explicit_entries():
    t = predict_traffic(MOE, ParallelConfig(tp=1, pp=1, dp=4, ep=4, seq_len=32, global_batch=4),
                        routing=np.zeros((MOE.num_layers, 1, 4, MOE.num_experts), dtype=np.int64))
    got = t.matrix("direct", op="all_to_all")
    assert got.nnz == 12 and (got.data == 0).all()  # every pair of the EP group, zero bytes: stored zeros
    assert check(t)  # the all-to-alls tiled inside the DP group's tile: their zeros stay stored
    assert check(t.select(op="all_to_all"))  # alone: no tile holds them, the remaining flows do


@pytest.mark.parametrize("values, bits", [([3.0, 8.0], 0), ([0.25, 1.5], 2), ([2.0**-30 * 5], 30), ([0.0], 0),
                                          ([1e300, 2.0**-20], 20)])
def test_fraction_bits(values, bits):
    assert fraction_bits(np.array(values)) == bits
