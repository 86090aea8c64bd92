"""From stage programs to the events table, vectorized over ranks.

Every rank of pipeline stage ``r`` runs the same program (:mod:`.program`); only its groups and peers differ.
For stage ``r`` with ``n`` ranks and ``T`` call templates the table gets ``n·T`` rows (rank-major, so each
rank's calls stay in issue order); group members come from :meth:`llmcomm.layout.Layout.group_rows` by fancy
indexing, never by a Python loop over ranks.

Aggregated form (``aggregate=True``): templates that differ only in ``layer``/``microbatch`` (and, for
routed all-to-alls under uniform routing, nothing else) merge into one row with ``count`` = how many calls it
stands for and ``layer = microbatch = -1``; the row keeps the position of its first occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

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
    group = _group_lists(lay, rank, peer, col, len(calls))
    nbytes, split = _all_to_all_splits(lay, rank, col, peer_tokens, hidden_bytes, probs_bytes)
    dt_codes, dt_idx = np.unique(np.array([c.dtype for c in calls], dtype=object), return_inverse=True)
    return {
        "rank": rank.astype(np.int32), "iteration": np.full(len(rank), iteration, dtype=np.int32),
        "microbatch": col["mb"], "layer": col["layer"],
        "phase": pa.DictionaryArray.from_arrays(col["phase"], pa.array(PHASES)),
        "parallelism": pa.DictionaryArray.from_arrays(col["par"], pa.array(PARALLELISM_TAGS)),
        "op": pa.DictionaryArray.from_arrays(col["op"], pa.array(OPS)),
        "group": group, "peer": peer.astype(np.int32), "bytes": nbytes,
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
    ``col["peer"]`` (±1, wrapping) in the rank's PP / CP group; -1 for every other row."""
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
    return peer


def _group_lists(lay: Layout, rank: np.ndarray, peer: np.ndarray, col: dict[str, np.ndarray],
                 templates: int) -> pa.Array:
    """The ``group`` column: each row's group members (``[rank, peer]`` for the pair kinds).

    Rows are rank-major with the same ``templates`` calls per rank, so one rank's members of all its calls
    fill one row of an ``(n ranks, width)`` block, column range by column range: no per-member index."""
    n = len(rank) // templates if templates else 0
    ranks = rank[::templates] if templates else rank[:0]
    kinds = col["kind"][:templates]
    members_of = {code: lay.group_rows(CALL_GROUP_KINDS[code], ranks) for code in np.unique(kinds)
                  if CALL_GROUP_KINDS[code] not in PAIR_GROUP_KINDS}
    sizes = np.array([2 if CALL_GROUP_KINDS[code] in PAIR_GROUP_KINDS else members_of[code].shape[1]
                      for code in kinds], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    width = int(start[-1])
    values = np.empty((n, width), dtype=np.int32)
    peers = peer.reshape(n, templates) if templates else peer.reshape(0, 0)
    for j, code in enumerate(kinds):
        a = int(start[j])
        if CALL_GROUP_KINDS[code] in PAIR_GROUP_KINDS:
            values[:, a] = ranks
            values[:, a + 1] = peers[:, j]
        else:
            values[:, a:a + sizes[j]] = members_of[code]
    offsets = np.append((np.arange(n, dtype=np.int64)[:, None] * width + start[None, :-1]).ravel(), n * width)
    if n * width < 2**31:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values.ravel()))
    return pa.LargeListArray.from_arrays(offsets, values.ravel()).cast(pa.list_(pa.int32()))


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
    np.cumsum(split_lens, out=split_offsets[1:])
    no_split = np.ones(len(rank), dtype=bool)
    no_split[a2a] = False
    split = pa.LargeListArray.from_arrays(pa.array(split_offsets), pa.array(split_values.ravel()),
                                          mask=pa.array(no_split)).cast(pa.list_(pa.int64()))
    return nbytes, split


def to_table(parts: Sequence[dict[str, np.ndarray | pa.Array]]) -> pa.Table:
    """Stage columns as one table in ``EVENTS_SCHEMA`` (one chunk per stage)."""
    arrays = []
    for f in EVENTS_SCHEMA:
        if f.name in ("t_start_ns", "t_end_ns"):
            n = sum(len(p["rank"]) for p in parts)
            arrays.append(pa.nulls(n, f.type))
            continue
        if f.name == "source":
            n = sum(len(p["rank"]) for p in parts)
            arrays.append(pa.DictionaryArray.from_arrays(np.zeros(n, np.int8), pa.array(["predicted"])))
            continue
        chunks = []
        for p in parts:
            a = p[f.name]
            a = a if isinstance(a, pa.Array) else pa.array(a)
            chunks.append(a.cast(f.type) if not isinstance(a, pa.DictionaryArray) else a.dictionary_decode())
        # one chunk per stage: no copy of the (large) group lists into one buffer
        arrays.append(pa.chunked_array(chunks, f.type) if chunks else pa.array([], f.type))
    for i, f in enumerate(EVENTS_SCHEMA):
        if isinstance(arrays[i], pa.DictionaryArray):
            arrays[i] = arrays[i].dictionary_decode()
        if arrays[i].type != f.type:
            arrays[i] = arrays[i].cast(f.type)
    return pa.Table.from_arrays(arrays, schema=EVENTS_SCHEMA)
