"""Groups as references (llmcomm.group_refs, llmcomm.flows): a prediction held as references gives the
same events, matrices, selections and volumes as the same prediction with its member lists written out, and
bad references are refused naming the field and the row."""

from __future__ import annotations

import dataclasses

import conftest
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmcomm import ParallelConfig
from llmcomm.errors import ConfigError, TraceFormatError
from llmcomm.group_refs import PAIR, GroupRefs, RefEvents
from llmcomm.matrix import matrix_from_table
from llmcomm.predict import predict_traffic
from llmcomm.trace import (
    Trace,
    flows_from_table,
    flows_to_matrix,
    read_trace,
    table_to_events,
    validate_events,
)

TINY = dataclasses.replace(conftest.TINY, num_layers=8, seq_length=64, tied_embeddings=False)
MOE = dataclasses.replace(conftest.TINY_MOE, moe_layer_freq=1, num_shared_experts=0)  # every layer MoE
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same(a, b) -> bool:
    a.sort_indices()
    b.sort_indices()
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            and np.array_equal(a.data, b.data))


def routing(world: int, m: int, seed: int) -> np.ndarray:
    """Random token counts per (layer, micro-batch, rank, expert) for MOE."""
    return np.random.default_rng(seed).integers(0, 40, size=(MOE.num_layers, m, world, MOE.num_experts))


@st.composite
def predictions(draw):
    """Dense and MoE predictions over every parallelism the predictor has (cp, vpp, the distributed
    optimizer, both frameworks, routed all-to-alls), aggregated or not."""
    moe = draw(st.booleans())
    tp, pp, dp = (draw(st.sampled_from(v)) for v in ([1, 2], [1, 2, 4], [1, 2, 4]))
    m = draw(st.sampled_from([1, 2, 4]))
    if moe:
        ep = draw(st.sampled_from([e for e in (1, 2, 4) if e <= dp]))
        p = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, sp=tp > 1, seq_len=32, global_batch=m * dp,
                           distributed_optimizer=draw(st.booleans()))
        routed = ep > 1 and draw(st.booleans())
        r = routing(p.world_size, m, draw(st.integers(0, 99))) if routed else None
        return predict_traffic(MOE, p, routing=r, aggregate=None if routed else draw(st.booleans()))
    if draw(st.booleans()):  # what the collector's torch workloads run
        p = ParallelConfig(tp=tp, pp=pp, dp=dp, sp=tp > 1, seq_len=64, global_batch=m * dp)
        return predict_traffic(TINY, p, framework="torch", aggregate=draw(st.booleans()))
    cp = draw(st.sampled_from([1, 2]))
    vpp = 2 if pp > 1 and draw(st.booleans()) else 1
    p = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, vpp=vpp, sp=tp > 1, seq_len=64, global_batch=m * dp * pp,
                       distributed_optimizer=draw(st.booleans()), overlap_grad_reduce=draw(st.booleans()),
                       schedule="interleaved" if vpp > 1 else "1f1b")
    return predict_traffic(TINY, p, aggregate=draw(st.booleans()))


@given(predictions(), st.sampled_from(["ring", "direct"]), st.integers(1, 300))
@SETTINGS
def test_references_give_the_list_path_matrix_bit_for_bit(t, algorithm, block_flows):
    assert t.ref_events is not None
    table = t.to_table()
    n = t.world_size
    want = flows_to_matrix(flows_from_table(table, algorithm), n)
    assert same(matrix_from_table(t.ref_events, n, algorithm, block_flows=block_flows), want)
    assert same(matrix_from_table(table, n, algorithm, block_flows=block_flows), want)
    node = matrix_from_table(t.ref_events, n, algorithm, level="node", gpus_per_node=2, block_flows=block_flows)
    assert same(node, matrix_from_table(table, n, algorithm, level="node", gpus_per_node=2))


@given(predictions(), st.sampled_from(["ring", "direct"]))
@SETTINGS
def test_flows_from_references_equal_the_list_path_row_for_row(t, algorithm):
    want = flows_from_table(t.to_table(), algorithm)
    got = t.flows(algorithm)
    assert t.ref_events is not None  # no member lists were written out
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    sel = t.flows(algorithm, parallelism=["tp", "dp", "ep"])
    pd.testing.assert_frame_equal(sel, flows_from_table(t.select(parallelism=["tp", "dp", "ep"]).to_table(),
                                                        algorithm), check_exact=True)


@given(predictions())
@SETTINGS
def test_written_out_references_are_a_valid_events_table(t):
    table = t.ref_events.to_table()
    validate_events(table, "written out")
    offsets = table.column("group").combine_chunks().offsets.to_numpy()
    assert np.array_equal(np.diff(offsets), t.ref_events.refs.sizes())


def test_reading_events_writes_the_lists_out_once():
    t = predict_traffic(TINY, ParallelConfig(tp=2, pp=2, dp=2, global_batch=4, seq_len=64))
    refs = t.ref_events
    want = table_to_events(refs.to_table())
    assert len(t) == refs.num_rows
    df = t.events
    assert t.ref_events is None  # from now on the DataFrame is the trace (a user may change it)
    assert df.equals(want)
    assert t.events is df
    t.events = df.iloc[:10].reset_index(drop=True)
    assert len(t) == 10


def test_views_from_references_equal_views_from_the_events(tmp_path):
    p = ParallelConfig(tp=2, pp=2, dp=4, ep=2, sp=True, seq_len=32, global_batch=8, distributed_optimizer=True)
    by_refs = predict_traffic(MOE, p)
    by_list = predict_traffic(MOE, p)
    _ = by_list.events  # written out
    assert by_refs.ref_events is not None and by_list.ref_events is None
    for by in (("parallelism",), ("parallelism", "op", "phase"), ("dtype",)):
        a, b = by_refs.volumes(by), by_list.volumes(by)
        assert a.equals(b), by
    assert by_refs.volumes(sent_only=True).equals(by_list.volumes(sent_only=True))
    sel_a = by_refs.select(parallelism=["ep", "dp"], phase="backward")
    sel_b = by_list.select(parallelism=["ep", "dp"], phase="backward")
    assert sel_a.ref_events is not None
    assert sel_a.to_table().equals(sel_b.to_table())
    assert same(by_refs.matrix("direct", op="all_to_all"), by_list.matrix("direct", op="all_to_all"))
    assert by_refs.ref_events is not None  # none of the above wrote the lists out
    path = by_refs.write(tmp_path / "t.parquet")
    assert read_trace(path).to_table().equals(by_list.to_table())
    with pytest.raises(ConfigError, match="select: no column 'nope'"):
        by_refs.select(nope=1)
    with pytest.raises(ConfigError, match="is not one of"):
        by_refs.select(op="all_reduce_typo")


def test_trace_needs_exactly_one_form():
    with pytest.raises(ConfigError, match="exactly one"):
        Trace()


def refs_table(rank, peer, ops) -> pa.Table:
    n = len(rank)
    return pa.table({"rank": pa.array(rank, pa.int32()), "peer": pa.array(peer, pa.int32()),
                     "op": pa.array(ops), "phase": pa.array(["forward"] * n), "parallelism": pa.array(["tp"] * n),
                     "bytes": pa.array([8] * n, pa.int64()), "count": pa.array([1] * n, pa.int64()),
                     "split_bytes": pa.nulls(n, pa.list_(pa.int64()))})


TABLES = (np.array([[0, 1], [2, 3]], np.int32),)


@pytest.mark.parametrize("rank, peer, kind, index, ops, rule", [
    ([0, 1, 2], [-1, -1, -1], [0, 0, 0], [0, 0, 0], ["all_reduce"] * 3, "row 2: the issuing rank must appear"),
    ([0, 3], [-1, -1], [0, 0], [0, 2], ["all_reduce"] * 2, "row 1: group index outside the 2 groups"),
    ([0, 1], [1, 1], [PAIR, PAIR], [0, 0], ["send", "recv"], "row 1: a \\[rank, peer\\] group needs a peer"),
    ([0], [-1], [3], [0], ["all_reduce"], "row 0: group kind must be"),
])
def test_bad_references_are_refused_naming_the_row(rank, peer, kind, index, ops, rule):
    ev = RefEvents(refs_table(rank, peer, ops), GroupRefs(np.array(kind, np.int8), np.array(index), TABLES, 4))
    with pytest.raises(TraceFormatError, match=f"<refs>: field 'group' {rule}"):
        ev.check("<refs>")


def test_unknown_vocabulary_in_a_dictionary_column_is_refused():
    t = refs_table([0, 1], [-1, -1], ["all_reduce", "all_reduce"])
    op = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array(["all_reduce", "allreduce"]))
    t = t.set_column(t.schema.get_field_index("op"), "op", op)
    ev = RefEvents(t, GroupRefs(np.zeros(2, np.int8), np.zeros(2, np.int32), TABLES, 4))
    with pytest.raises(TraceFormatError, match="field 'op' row 1: 'allreduce' is not one of"):
        ev.check("<refs>")


def test_ref_events_refuse_a_group_column_or_a_length_mismatch():
    t = refs_table([0, 1], [-1, -1], ["all_reduce"] * 2)
    with pytest.raises(TraceFormatError, match="2 rows but 1 group references"):
        RefEvents(t, GroupRefs(np.zeros(1, np.int8), np.zeros(1, np.int32), TABLES, 4))
    with pytest.raises(TraceFormatError, match="must not hold a 'group' column"):
        RefEvents(t.append_column("group", pa.array([[0, 1], [0, 1]])),
                  GroupRefs(np.zeros(2, np.int8), np.zeros(2, np.int32), TABLES, 4))


def test_writing_out_more_members_than_a_list_column_holds_is_refused_before_allocating():
    refs = GroupRefs(np.zeros(3, np.int8), np.zeros(3, np.int32), (np.arange(4, dtype=np.int32)[None, :],), 4)
    with pytest.raises(TraceFormatError, match="12 ranks .* more than an events table's list column holds \\(5\\)"):
        refs.flat_members(np.arange(3), np.full(3, -1), limit=5)
    # GPT-3 on 131,072 GPUs with the distributed optimizer: every rank's gradient-norm all-reduce spans the world
    # (17 G ranks as lists); the views work from the references, reading the events is refused with the way out
    p = ParallelConfig(tp=8, pp=16, dp=1024, global_batch=12288, seq_len=2048, distributed_optimizer=True)
    t = predict_traffic("gpt3-175b", p)
    assert t.volumes()["calls"].sum() > 0
    with pytest.raises(TraceFormatError, match="writing the groups out would take .* GiB"):
        _ = t.events
    assert t.ref_events is not None  # still usable
    assert len(t.select(parallelism="pp").events) > 0  # a part without the world-wide groups can be read
