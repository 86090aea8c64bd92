"""The events table, Trace persistence, flows, matrix and volumes: exact cases and properties."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmcomm as lc
from llmcomm.trace import EVENTS_SCHEMA, Trace, read_trace


def collective(op: str, group: list[int], nbytes: int, **kw) -> list[dict]:
    return [dict(rank=r, phase="forward", parallelism=kw.get("parallelism", "tp"), op=op, group=group,
                 bytes=nbytes, dtype="bf16", source="test", **{k: v for k, v in kw.items() if k != "parallelism"})
            for r in group]


def p2p(src: int, dst: int, nbytes: int) -> list[dict]:
    base = dict(phase="forward", parallelism="pp", group=[], bytes=nbytes, dtype="bf16", source="test")
    return [dict(rank=src, op="send", peer=dst, **base), dict(rank=dst, op="recv", peer=src, **base)]


def test_ring_all_reduce_exact() -> None:
    S, g = 1200, [3, 5, 7, 9]
    f = Trace.from_records(collective("all_reduce", g, S)).flows("ring")
    assert len(f) == 4
    succ = {3: 5, 5: 7, 7: 9, 9: 3}
    for _, r in f.iterrows():
        assert succ[r.src] == r.dst
        assert r.bytes == pytest.approx(2 * 3 / 4 * S)


def test_direct_and_gather_scatter_exact() -> None:
    S, g = 800, [0, 1, 2, 3]
    t = Trace.from_records(collective("all_gather", g, S) + collective("reduce_scatter", g, S))
    m = t.matrix("direct", world_size=4).toarray()
    assert np.allclose(m[~np.eye(4, dtype=bool)], 2 * S / 4)
    ring = t.matrix("ring", world_size=4).toarray()
    assert ring[0, 1] == pytest.approx(2 * 3 / 4 * S) and ring[1, 0] == 0


def test_broadcast_ring_and_direct() -> None:
    S = 100
    t = Trace.from_records(collective("broadcast", [0, 1, 2], S, peer=1, parallelism="dp"))
    ring = t.matrix("ring", world_size=3).toarray()
    # pipelined from root 1: 1 -> 2 -> 0; nobody sends back into the root
    assert ring[1, 2] == S and ring[2, 0] == S and ring[0, 1] == 0
    direct = t.matrix("direct", world_size=3).toarray()
    assert direct[1, 0] == S and direct[1, 2] == S and direct.sum() == 2 * S


def test_all_to_all_flows_are_the_splits() -> None:
    rows = []
    splits = {0: [5, 10, 20], 1: [1, 0, 7], 2: [3, 4, 9]}
    for r, s in splits.items():
        rows.append(dict(rank=r, phase="forward", parallelism="ep", op="all_to_all", group=[0, 1, 2],
                         bytes=sum(s), split_bytes=s, dtype="bf16", source="test"))
    m = Trace.from_records(rows).matrix("ring", world_size=3).toarray()
    expect = np.array(list(splits.values()), dtype=float)
    np.fill_diagonal(expect, 0)
    assert np.array_equal(m, expect)


def test_send_recv_counted_once() -> None:
    t = Trace.from_records(p2p(0, 1, 64) + p2p(1, 0, 32))
    m = t.matrix(world_size=2).toarray()
    assert m[0, 1] == 64 and m[1, 0] == 32


def test_count_column_scales_everything() -> None:
    once = Trace.from_records(collective("all_reduce", [0, 1], 10) * 3)
    agg = Trace.from_records([dict(r, count=3) for r in collective("all_reduce", [0, 1], 10)])
    assert (once.matrix("ring", world_size=2) != agg.matrix("ring", world_size=2)).nnz == 0
    assert once.volumes().equals(agg.volumes())
    assert agg.expand().volumes().equals(once.volumes())


def test_roundtrip_exact_with_meta_and_routing(tmp_path) -> None:
    rows = collective("all_reduce", [0, 1], 10) + p2p(0, 1, 5)
    rows[0]["t_start_ns"], rows[0]["t_end_ns"] = 100, 250
    routing = pd.DataFrame({"iteration": [0], "microbatch": [0], "layer": [1], "src_rank": [0], "expert": [2],
                            "tokens": [17]})
    t = Trace.from_records(rows, meta={"source": "test", "parallel": lc.ParallelConfig(tp=2).to_dict()},
                           routing=routing)
    p = t.write(tmp_path / "a.parquet")
    back = read_trace(p)
    assert back.events.equals(t.events)
    assert back.meta == t.meta
    assert back.routing.astype("int64").equals(routing.astype("int64"))
    assert lc.ParallelConfig.from_dict(back.meta["parallel"]).tp == 2
    assert not [x for x in tmp_path.iterdir() if x.name.endswith(".tmp")]


def test_select_and_volumes() -> None:
    t = Trace.from_records(collective("all_reduce", [0, 1], 10) + p2p(0, 1, 5))
    assert len(t.select(parallelism="pp")) == 2
    v = t.volumes(["parallelism", "op"]).set_index(["parallelism", "op"])["bytes"]
    assert v[("tp", "all_reduce")] == 20 and v[("pp", "send")] == 5
    by_par = t.volumes(sent_only=True).set_index("parallelism")["bytes"]
    assert by_par["pp"] == 5  # the recv end of the same transfer is not counted again


@pytest.mark.parametrize("row, field", [
    (dict(op="allreduce"), "op"),
    (dict(phase="warmup"), "phase"),
    (dict(bytes=-1), "bytes"),
    (dict(group=[1, 2]), "group"),
    (dict(op="send", peer=-1), "peer"),
])
def test_bad_events_name_the_field(row, field) -> None:
    base = collective("all_reduce", [0, 1], 10)[0]
    base.update(row)
    with pytest.raises(lc.TraceFormatError, match=f"field '{field}'"):
        Trace.from_records([base])


def test_unknown_column_refused() -> None:
    with pytest.raises(lc.TraceFormatError, match="unknown column"):
        Trace.from_events(pd.DataFrame([dict(collective("all_reduce", [0, 1], 10)[0], colour="red")]))


# ---------------------------------------------------------------------------------------- properties
ops = st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"])


@st.composite
def random_traces(draw):
    world = draw(st.integers(2, 12))
    rows = []
    for _ in range(draw(st.integers(1, 6))):
        members = draw(st.lists(st.integers(0, world - 1), min_size=2, max_size=world, unique=True))
        rows += collective(draw(ops), members, draw(st.integers(0, 10**9)))
    for _ in range(draw(st.integers(0, 4))):
        a, b = draw(st.lists(st.integers(0, world - 1), min_size=2, max_size=2, unique=True))
        rows += p2p(a, b, draw(st.integers(0, 10**6)))
    return world, Trace.from_records(rows)


@settings(max_examples=60, deadline=None)
@given(random_traces(), st.sampled_from(["ring", "direct"]))
def test_conservation(wt, algorithm) -> None:
    """Every collective sends as much from each rank as it receives; p2p sends equal the matching recvs."""
    world, t = wt
    coll = t.select(op=["all_reduce", "all_gather", "reduce_scatter"])
    m = coll.matrix(algorithm, world_size=world)
    assert np.allclose(np.asarray(m.sum(axis=1)).ravel(), np.asarray(m.sum(axis=0)).ravel(), rtol=1e-9)
    ev = t.events
    sent = ev[ev.op == "send"].groupby(["rank", "peer"])["bytes"].sum()
    recv = ev[ev.op == "recv"].groupby(["peer", "rank"])["bytes"].sum()
    recv.index.names = ["rank", "peer"]
    assert sent.sort_index().equals(recv.sort_index())


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 64), st.integers(0, 2**40))
def test_ring_all_reduce_property(n, S) -> None:
    g = list(np.random.default_rng(n).permutation(200)[:n])
    f = Trace.from_records(collective("all_reduce", [int(x) for x in g], S)).flows("ring")
    assert len(f) == n
    assert np.allclose(f["bytes"], 2 * (n - 1) / n * S)
    pos = {r: i for i, r in enumerate(g)}
    assert all(pos[d] == (pos[s] + 1) % n for s, d in zip(f["src"], f["dst"], strict=True))


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.data())
def test_all_to_all_property(n, data) -> None:
    splits = [data.draw(st.lists(st.integers(0, 10**8), min_size=n, max_size=n)) for _ in range(n)]
    rows = [dict(rank=r, phase="backward", parallelism="ep", op="all_to_all", group=list(range(n)),
                 bytes=sum(s), split_bytes=s, dtype="bf16", source="test") for r, s in enumerate(splits)]
    m = Trace.from_records(rows).matrix(world_size=n).toarray()
    expect = np.array(splits, dtype=float)
    np.fill_diagonal(expect, 0)
    assert np.array_equal(m, expect)


MUTATIONS = st.sampled_from(["drop", "retype", "rename", "extra", "nullability", "reorder"])


@settings(max_examples=40, deadline=None)
@given(MUTATIONS, st.integers(0, len(EVENTS_SCHEMA) - 1))
def test_reader_refuses_any_other_schema(tmp_path_factory, mutation, i) -> None:
    t = Trace.from_records(collective("all_reduce", [0, 1], 10)).to_table()
    f = EVENTS_SCHEMA.field(i)
    if mutation == "drop":
        t = t.remove_column(i)
    elif mutation == "retype":
        new_type = pa.float64() if not pa.types.is_floating(f.type) else pa.int64()
        t = t.set_column(i, pa.field(f.name, new_type, f.nullable), pa.nulls(t.num_rows, new_type)
                         if f.nullable else pa.array(np.zeros(t.num_rows), new_type))
    elif mutation == "rename":
        t = t.rename_columns([n + "_x" if j == i else n for j, n in enumerate(t.column_names)])
    elif mutation == "extra":
        t = t.append_column("extra", pa.array(np.zeros(t.num_rows)))
    elif mutation == "nullability":
        if f.nullable:  # make a nullable column required: fill it first so the cast is legal
            t = t.set_column(i, f, pa.array(np.zeros(t.num_rows, dtype=np.int64)).cast(f.type)
                             if not pa.types.is_list(f.type) else pa.array([[1, 2]] * t.num_rows, f.type))
        t = t.cast(pa.schema([fld.with_nullable(not fld.nullable) if j == i else fld
                              for j, fld in enumerate(t.schema)]))
    else:
        names = t.column_names
        j = (i + 1) % len(names)
        names[i], names[j] = names[j], names[i]
        t = t.select(names)
    p = tmp_path_factory.mktemp("bad") / "bad.parquet"
    pq.write_table(t, p)
    with pytest.raises(lc.TraceFormatError, match=str(p.name)):
        read_trace(p)


def test_reader_refuses_non_parquet(tmp_path) -> None:
    p = tmp_path / "x.parquet"
    p.write_bytes(b"not parquet at all")
    with pytest.raises(lc.TraceFormatError, match="x.parquet"):
        read_trace(p)
    with pytest.raises(lc.TraceFormatError, match="no such trace"):
        read_trace(tmp_path / "missing.parquet")
