"""From stage programs to the events table, vectorized over ranks.

Every rank of pipeline stage ``r`` runs the same program (:mod:`.program`); only its groups and peers differ.
For stage ``r`` with ``n`` ranks and ``T`` call templates the table gets ``n·T`` rows (rank-major, so each
rank's calls stay in issue order); group members come from :meth:`llmcomm.layout.Layout.groups` by fancy
indexing, never by a Python loop over ranks.

Aggregated form (``aggregate=True``): templates that differ only in ``layer``/``microbatch`` (and, for
routed all-to-alls under uniform routing, nothing else) merge into one row with ``count`` = how many calls it
stands for and ``layer = microbatch = -1``; the row keeps the position of its first occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ..layout import Layout, row_index
from ..trace import EVENTS_SCHEMA
from ..trace import OPS as _OPS
from ..trace import PARALLELISM_TAGS as _PARS
from ..trace import PHASES as _PHASES
from .calls import Call

_KINDS = ("tp", "dp", "edp", "ep", "emb", "p2p", "cp_p2p", "dpcp", "mp", "tpcp", "etp", "tpep", "world", "pp")
_ROUTES = ("", "dispatch", "combine", "counts", "probs_dispatch", "probs_combine")


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


class _Groups:
    """Group matrices and per-rank group rows of a layout, built once."""

    def __init__(self, lay: Layout) -> None:
        self.lay = lay
        self._g: dict[str, np.ndarray] = {}
        self._i: dict[str, np.ndarray] = {}

    def matrix(self, kind: str) -> np.ndarray:
        if kind not in self._g:
            if kind == "emb":
                ppg = self.lay.groups("pp")
                g = ppg[:, [0, -1]] if ppg.shape[1] > 1 else ppg
            else:
                g = self.lay.groups(kind)
            # ranks outside every group (middle stages for "emb") point at row 0; they never use it
            self._g[kind], self._i[kind] = g, row_index(g, self.lay.world_size)
        return self._g[kind]

    def rows(self, kind: str, ranks: np.ndarray) -> np.ndarray:
        """The group (as a row of ranks) of each rank in ``ranks``."""
        g = self.matrix(kind)
        return g[self._i[kind][ranks]]


def stage_table(lay: Layout, groups: _Groups, stage: int, calls: Sequence[Call], counts: Sequence[int],
                iteration: int, peer_tokens: np.ndarray | None, uniform_split: int, hidden_bytes: int,
                probs_bytes: int = 0) -> dict[str, np.ndarray | pa.Array]:
    """Columns (numpy / pyarrow) for every rank of ``stage`` × every call template. Routed all-to-alls send
    ``hidden_bytes`` per token (``probs_bytes`` for the routing probabilities' all-to-alls)."""
    ppg = groups.matrix("pp") if lay.parallel.pp > 1 else None
    coords = lay.coords
    ranks = coords["rank"].to_numpy()[coords["pp"].to_numpy() == stage]
    n, t = len(ranks), len(calls)
    p = lay.parallel.pp
    tmpl = {
        "phase": np.array([_PHASES.index(c.phase) for c in calls], dtype=np.int8),
        "par": np.array([_PARS.index(c.parallelism) for c in calls], dtype=np.int8),
        "op": np.array([_OPS.index(c.op) for c in calls], dtype=np.int8),
        "kind": np.array([_KINDS.index(c.group) for c in calls], dtype=np.int8),
        "bytes": np.array([c.bytes for c in calls], dtype=np.int64),
        "layer": np.array([c.layer for c in calls], dtype=np.int32),
        "mb": np.array([c.microbatch for c in calls], dtype=np.int32),
        "peer": np.array([c.peer for c in calls], dtype=np.int64),
        "route": np.array([_ROUTES.index(c.route) for c in calls], dtype=np.int8),
        "count": np.asarray(counts, dtype=np.int64),
    }
    dtypes = [c.dtype for c in calls]
    rank = np.repeat(ranks, t)
    col = {k: np.tile(v, n) for k, v in tmpl.items()}
    # peers of send/recv: the stage at offset ±1 (wrapping) in the rank's PP group
    peer = np.full(n * t, -1, dtype=np.int64)
    is_p2p = col["kind"] == _KINDS.index("p2p")
    if is_p2p.any() and ppg is not None:
        rows = groups.rows("pp", rank[is_p2p])
        peer[is_p2p] = rows[np.arange(len(rows)), (stage + col["peer"][is_p2p]) % p]
    is_cp = col["kind"] == _KINDS.index("cp_p2p")
    if is_cp.any():
        rows = groups.rows("cp", rank[is_cp])
        pos = lay.coords["cp"].to_numpy()[rank[is_cp]]
        peer[is_cp] = rows[np.arange(len(rows)), (pos + col["peer"][is_cp]) % lay.parallel.cp]
    # group lists: every rank has the same templates, so each rank's members fill one row of an (n, L) block
    sizes = {k: (2 if k in ("p2p", "cp_p2p") else groups.matrix(k).shape[1])
             for k in _KINDS if (tmpl["kind"] == _KINDS.index(k)).any()}
    tlens = np.array([sizes[_KINDS[k]] for k in tmpl["kind"]], dtype=np.int64)
    toff = np.concatenate([[0], np.cumsum(tlens)])
    width = int(toff[-1])
    values = np.empty((n, width), dtype=np.int32)
    peer_nt = peer.reshape(n, t)
    members = {k: groups.rows(k, ranks) for k in sizes if k not in ("p2p", "cp_p2p")}
    for j in range(t):
        k, a = _KINDS[tmpl["kind"][j]], int(toff[j])
        if k in ("p2p", "cp_p2p"):
            values[:, a] = ranks
            values[:, a + 1] = peer_nt[:, j]
        else:
            values[:, a:a + sizes[k]] = members[k]
    offsets = np.append((np.arange(n, dtype=np.int64)[:, None] * width + toff[None, :-1]).ravel(), n * width)
    if n * width < 2**31:
        group = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values.ravel()))
    else:
        group = pa.LargeListArray.from_arrays(offsets, values.ravel()).cast(pa.list_(pa.int32()))
    # all-to-all splits
    nbytes = col["bytes"].copy()
    a2a = np.nonzero(col["op"] == _OPS.index("all_to_all"))[0]
    split: pa.Array
    if len(a2a):
        ep = groups.matrix("ep").shape[1]
        sv = np.repeat((col["bytes"][a2a] // ep)[:, None], ep, axis=1)  # even split (uniform routing, counts)
        routes = [_ROUTES.index(x) for x in ("dispatch", "combine", "probs_dispatch", "probs_combine")]
        routed = np.isin(col["route"][a2a], routes)
        if peer_tokens is not None and routed.any():
            rows = a2a[routed]
            r, la, mb = rank[rows], col["layer"][rows], col["mb"][rows]
            disp = np.isin(col["route"][rows], [routes[0], routes[2]])
            per_token = np.where(col["route"][rows] >= routes[2], probs_bytes, hidden_bytes)
            members = groups.rows("ep", r)
            pos = lay.coords["ep"].to_numpy()[r]
            d_send = peer_tokens[la, mb, r, :]  # dispatch: what r sends to each position
            d_back = peer_tokens[la[:, None], mb[:, None], members, pos[:, None]]  # combine: what each sent r
            sv[routed] = np.where(disp[:, None], d_send, d_back) * per_token[:, None]
        nbytes[a2a] = sv.sum(axis=1)
        soff = np.zeros(n * t + 1, dtype=np.int64)
        slen = np.zeros(n * t, dtype=np.int64)
        slen[a2a] = ep
        np.cumsum(slen, out=soff[1:])
        mask = np.ones(n * t, dtype=bool)
        mask[a2a] = False
        split = pa.LargeListArray.from_arrays(pa.array(soff), pa.array(sv.ravel()),
                                              mask=pa.array(mask)).cast(pa.list_(pa.int64()))
    else:
        split = pa.nulls(n * t, pa.list_(pa.int64()))
    dt_codes, dt_idx = np.unique(np.array(dtypes, dtype=object), return_inverse=True)
    return {
        "rank": rank.astype(np.int32), "iteration": np.full(n * t, iteration, dtype=np.int32),
        "microbatch": col["mb"], "layer": col["layer"],
        "phase": pa.DictionaryArray.from_arrays(col["phase"], pa.array(_PHASES)),
        "parallelism": pa.DictionaryArray.from_arrays(col["par"], pa.array(_PARS)),
        "op": pa.DictionaryArray.from_arrays(col["op"], pa.array(_OPS)),
        "group": group, "peer": peer.astype(np.int32), "bytes": nbytes,
        "dtype": pa.DictionaryArray.from_arrays(np.tile(dt_idx.astype(np.int32), n), pa.array(list(dt_codes))),
        "split_bytes": split, "count": col["count"],
    }


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
