"""From stage programs to the events table, vectorized over ranks.

Every rank of pipeline stage ``r`` runs the same program (:mod:`.program`); only its groups and peers differ.
For stage ``r`` with ``n`` ranks and ``T`` call templates the table gets ``n·T`` rows (rank-major, so each
rank's calls stay in issue order); a row's group is a reference (:mod:`llmcomm.group_refs`): its kind and the
row of :meth:`llmcomm.layout.Layout.group_lookup`'s table holding the rank, found by fancy indexing, never by a
Python loop over ranks. The member lists are written out only when someone reads the events.

Aggregated form (``aggregate=True``): templates that differ only in ``layer``/``microbatch`` (and, for
routed all-to-alls under uniform routing, nothing else) merge into one row with ``count`` = how many calls it
stands for and ``layer = microbatch = -1``; the row keeps the position of its first occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import pyarrow as pa

from ..group_refs import PAIR, GroupRefs, RefEvents
from ..layout import Layout
from ..vocab import CALL_GROUP_KINDS, EVENTS_SCHEMA, OPS, PAIR_GROUP_KINDS, PARALLELISM_TAGS, PHASES, ROUTES
from .calls import Call


def aggregate_calls(calls: Sequence[Call]) -> tuple[list[Call], list[int]]:
    """Merge calls equal up to ``layer``/``microbatch``; returns (calls in first-seen order, counts)."""
    first: dict[tuple, int] = {}
    out: list[Call] = []
    counts: list[int] = []
    for c in calls:
        key = (c.phase, c.parallelism, c.op, c.group, c.bytes, c.dtype, c.peer, c.route)
        i = first.get(key)
        if i is None:
            first[key] = len(out)
            out.append(Call(c.phase, c.parallelism, c.op, c.group, c.bytes, c.dtype, -1, -1, c.peer, c.route))
            counts.append(1)
        else:
            counts[i] += 1
    return out, counts


def stage_table(lay: Layout, stage: int, calls: Sequence[Call], counts: Sequence[int], iteration: int,
                peer_tokens: np.ndarray | None, hidden_bytes: int, probs_bytes: int = 0
                ) -> dict[str, np.ndarray | pa.Array]:
    """Columns (numpy / pyarrow) for every rank of ``stage`` × every call template.

    ``peer_tokens[layer, microbatch, src_rank, ep_position]`` (routing, optional) sizes the routed
    all-to-alls: ``tokens · hidden_bytes`` to each peer (``probs_bytes`` per token for the routing
    probabilities' all-to-alls); without it their ``bytes`` split evenly."""
    coords = lay.coords
    ranks = coords["rank"].to_numpy()[coords["pp"].to_numpy() == stage]
    n = len(ranks)
    template = _encode_calls(calls, counts)
    rank = np.repeat(ranks, len(calls))
    col = {k: np.tile(v, n) for k, v in template.items()}
    peer = _peers(lay, stage, rank, col)
    group_kind, group_index = _group_refs(lay, rank, col)
    nbytes, split = _all_to_all_splits(lay, rank, col, peer_tokens, hidden_bytes, probs_bytes)
    dt_codes, dt_idx = np.unique(np.array([c.dtype for c in calls], dtype=object), return_inverse=True)
    return {
        "rank": rank.astype(np.int32), "iteration": np.full(len(rank), iteration, dtype=np.int32),
        "microbatch": col["mb"], "layer": col["layer"],
        "phase": pa.DictionaryArray.from_arrays(col["phase"], pa.array(PHASES)),
        "parallelism": pa.DictionaryArray.from_arrays(col["par"], pa.array(PARALLELISM_TAGS)),
        "op": pa.DictionaryArray.from_arrays(col["op"], pa.array(OPS)),
        "group_kind": group_kind, "group_index": group_index, "peer": peer.astype(np.int32), "bytes": nbytes,
        "dtype": pa.DictionaryArray.from_arrays(np.tile(dt_idx.astype(np.int32), n), pa.array(list(dt_codes))),
        "split_bytes": split, "count": col["count"],
    }


def _encode_calls(calls: Sequence[Call], counts: Sequence[int]) -> dict[str, np.ndarray]:
    """The call templates as numpy columns; names are coded as their index in the vocabulary tuples."""
    return {
        "phase": np.array([PHASES.index(c.phase) for c in calls], dtype=np.int8),
        "par": np.array([PARALLELISM_TAGS.index(c.parallelism) for c in calls], dtype=np.int8),
        "op": np.array([OPS.index(c.op) for c in calls], dtype=np.int8),
        "kind": np.array([CALL_GROUP_KINDS.index(c.group) for c in calls], dtype=np.int8),
        "bytes": np.array([c.bytes for c in calls], dtype=np.int64),
        "layer": np.array([c.layer for c in calls], dtype=np.int32),
        "mb": np.array([c.microbatch for c in calls], dtype=np.int32),
        "peer": np.array([c.peer for c in calls], dtype=np.int64),
        "route": np.array([ROUTES.index(c.route) for c in calls], dtype=np.int8),
        "count": np.asarray(counts, dtype=np.int64),
    }


def _kind_is(col: dict[str, np.ndarray], kind: str) -> np.ndarray:
    return col["kind"] == CALL_GROUP_KINDS.index(kind)


def _peers(lay: Layout, stage: int, rank: np.ndarray, col: dict[str, np.ndarray]) -> np.ndarray:
    """Global peer of each send/recv row: the stage (``p2p``) or CP position (``cp_p2p``) at offset
    ``col["peer"]`` (±1, wrapping) in the rank's PP / CP group; a broadcast's root when its Call names one;
    -1 for every other row."""
    peer = np.full(len(rank), -1, dtype=np.int64)
    is_p2p = _kind_is(col, "p2p")
    if is_p2p.any() and lay.parallel.pp > 1:
        rows = lay.group_rows("pp", rank[is_p2p])
        peer[is_p2p] = rows[np.arange(len(rows)), (stage + col["peer"][is_p2p]) % lay.parallel.pp]
    is_cp = _kind_is(col, "cp_p2p")
    if is_cp.any():
        rows = lay.group_rows("cp", rank[is_cp])
        position = lay.coords["cp"].to_numpy()[rank[is_cp]]
        peer[is_cp] = rows[np.arange(len(rows)), (position + col["peer"][is_cp]) % lay.parallel.cp]
    # a broadcast whose Call names a root position (``peer != 0``, e.g. -1: the group's last member) gets that
    # member's global rank; ``peer == 0`` keeps -1, the group's first member (trace.py's convention)
    is_root = (col["op"] == OPS.index("broadcast")) & (col["peer"] != 0)
    for code in np.unique(col["kind"][is_root]):
        sel = is_root & (col["kind"] == code)
        rows = lay.group_rows(CALL_GROUP_KINDS[code], rank[sel])
        peer[sel] = rows[np.arange(len(rows)), col["peer"][sel] % rows.shape[1]]
    return peer


def _group_refs(lay: Layout, rank: np.ndarray, col: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's group as a reference (:mod:`llmcomm.group_refs`): its kind's code in ``CALL_GROUP_KINDS``
    (``PAIR`` for the ``[rank, peer]`` kinds) and the row of that kind's group table holding the rank."""
    kind = col["kind"].copy()
    index = np.zeros(len(rank), dtype=np.int32)
    for code in np.unique(col["kind"]):
        rows = col["kind"] == code
        name = CALL_GROUP_KINDS[code]
        if name in PAIR_GROUP_KINDS:
            kind[rows] = PAIR
        else:
            index[rows] = lay.group_lookup(name)[1][rank[rows]]
    return kind, index


def _all_to_all_splits(lay: Layout, rank: np.ndarray, col: dict[str, np.ndarray], peer_tokens: np.ndarray | None,
                       hidden_bytes: int, probs_bytes: int) -> tuple[np.ndarray, pa.Array]:
    """``bytes`` and ``split_bytes`` of every row: an all-to-all's splits are even (uniform routing, token
    counts) or, for a routed dispatch / combine with ``peer_tokens``, the tokens sent to / received from each
    EP peer times ``hidden_bytes`` (``probs_bytes`` for the probabilities' all-to-alls); its ``bytes`` is
    their sum. Other rows keep their bytes and no splits."""
    nbytes = col["bytes"].copy()
    a2a = np.nonzero(col["op"] == OPS.index("all_to_all"))[0]
    if not len(a2a):
        return nbytes, pa.nulls(len(rank), pa.list_(pa.int64()))
    ep = lay.size("ep")
    split_values = np.repeat((col["bytes"][a2a] // ep)[:, None], ep, axis=1)
    on_cp = col["kind"][a2a] == CALL_GROUP_KINDS.index("cp")  # CP all-to-alls (cp_comm_type a2a): cp even splits
    dispatch_like = [ROUTES.index("dispatch"), ROUTES.index("probs_dispatch")]
    probs = [ROUTES.index("probs_dispatch"), ROUTES.index("probs_combine")]
    routed = np.isin(col["route"][a2a], [*dispatch_like, ROUTES.index("combine"), ROUTES.index("probs_combine")])
    if peer_tokens is not None and routed.any():
        rows = a2a[routed]
        src, layer, mb = rank[rows], col["layer"][rows], col["mb"][rows]
        dispatch = np.isin(col["route"][rows], dispatch_like)
        per_token = np.where(np.isin(col["route"][rows], probs), probs_bytes, hidden_bytes)
        members = lay.group_rows("ep", src)
        position = lay.coords["ep"].to_numpy()[src]
        sent = peer_tokens[layer, mb, src, :]  # dispatch: what src sends to each EP position
        received = peer_tokens[layer[:, None], mb[:, None], members, position[:, None]]  # combine: what each sent src
        split_values[routed] = np.where(dispatch[:, None], sent, received) * per_token[:, None]
    nbytes[a2a] = split_values.sum(axis=1)
    split_offsets = np.zeros(len(rank) + 1, dtype=np.int64)
    split_lens = np.zeros(len(rank), dtype=np.int64)
    split_lens[a2a] = ep
    if on_cp.any():
        cp = lay.size("cp")
        split_lens[a2a[on_cp]] = cp
        nbytes[a2a[on_cp]] = col["bytes"][a2a[on_cp]] // cp * cp
        lens = np.where(on_cp, cp, ep)
        flat = np.repeat(col["bytes"][a2a] // lens, lens)
        flat[np.repeat(~on_cp, lens)] = split_values[~on_cp].ravel()  # EP rows keep their (routed) splits
        split_values = flat
    np.cumsum(split_lens, out=split_offsets[1:])
    no_split = np.ones(len(rank), dtype=bool)
    no_split[a2a] = False
    split = pa.LargeListArray.from_arrays(pa.array(split_offsets), pa.array(split_values.ravel()),
                                          mask=pa.array(no_split)).cast(pa.list_(pa.int64()))
    return nbytes, split


def to_ref_events(lay: Layout, parts: Sequence[dict[str, np.ndarray | pa.Array]]) -> RefEvents:
    """Stage columns as one table in ``EVENTS_SCHEMA`` minus ``group`` (one chunk per stage), its groups as
    references into ``lay``'s group tables, one table per kind of ``CALL_GROUP_KINDS`` (kinds no row uses get
    an empty table)."""
    n = sum(len(p["rank"]) for p in parts)
    arrays, fields = [], []
    for f in EVENTS_SCHEMA:
        if f.name == "group":
            continue
        if pa.types.is_string(f.type):  # kept dictionary-encoded (int32 codes) until to_table()
            f = pa.field(f.name, pa.dictionary(pa.int32(), pa.string()), nullable=f.nullable)
        fields.append(f)
        if f.name in ("t_start_ns", "t_end_ns"):
            arrays.append(pa.nulls(n, f.type))
        elif f.name == "source":
            arrays.append(pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), pa.array(["predicted"])))
        elif pa.types.is_dictionary(f.type):
            columns = [cast(pa.DictionaryArray, p[f.name]) for p in parts]
            arrays.append(pa.chunked_array([pa.DictionaryArray.from_arrays(c.indices.cast(pa.int32()), c.dictionary)
                                            for c in columns], f.type))
        else:
            arrays.append(pa.chunked_array([pa.array(p[f.name]).cast(f.type) for p in parts], f.type))
    kind = np.concatenate([p["group_kind"] for p in parts]) if parts else np.zeros(0, np.int8)
    index = np.concatenate([p["group_index"] for p in parts]) if parts else np.zeros(0, np.int32)
    used = set(np.unique(kind[kind != PAIR]).tolist())
    tables = tuple(lay.group_lookup(name)[0].astype(np.int32) if code in used else np.zeros((0, 1), np.int32)
                   for code, name in enumerate(CALL_GROUP_KINDS))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    return RefEvents(table, GroupRefs(kind, index, tables, lay.world_size))
