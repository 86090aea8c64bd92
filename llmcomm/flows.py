"""Flows: the bytes each rank puts on the wire towards each other rank, for a chosen algorithm.

Each event yields the flows *leaving its own rank*, so summing over all ranks' events counts each byte once:

=============== ============================================ =============================================
op              ``ring`` (to the successor in group order)   ``direct`` (to every other member)
=============== ============================================ =============================================
all_reduce      2(n-1)/n · S                                 2/n · S to each (reduce-scatter + all-gather)
all_gather      (n-1)/n · S                                  1/n · S to each
reduce_scatter  (n-1)/n · S                                  1/n · S to each
broadcast       S, except the root's predecessor             S from the root to each (root = ``peer``,
                (pipelined ring from the root = ``peer``)    else ``group[0]``)
all_to_all      ``split_bytes[j]`` to ``group[j]``           same
send            S to ``peer``                                same
recv            nothing (the sender's event carries it)      same
=============== ============================================ =============================================

with ``S = bytes · count`` and ``n`` the group size. The rules are written once (:func:`_flows`), over an
accessor of each row's group: :class:`_ListGroups` reads an events table's ``group`` list column,
:class:`_RefGroups` the references of :class:`llmcomm.group_refs.RefEvents` (a prediction), where a ring
successor is ``tables[kind][index, (position + 1) mod n]``, one gather per row, so a ring matrix costs O(rows)
however large the groups. Flows come out in one order — sends, all-to-alls, reductions, broadcasts; within
each, row order then member order — with the same float expressions, so both forms of a trace give equal flow
tables and matrices, bit for bit (tested).
"""

from __future__ import annotations

from functools import cached_property
from typing import Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .errors import TraceFormatError
from .events import vocabulary_codes
from .group_refs import RefEvents
from .vocab import ALGORITHMS, EVENTS_SCHEMA, OPS, AlgorithmName

FLOW_TAGS = ("iteration", "microbatch", "layer", "phase", "parallelism", "op")

_SEND, _A2A, _BCAST = OPS.index("send"), OPS.index("all_to_all"), OPS.index("broadcast")


def reduction_factor(op: np.ndarray) -> np.ndarray:
    """Multiples of ``(n-1)/n · S`` (ring) or ``S/n`` per peer (direct): all_reduce 2 (reduce-scatter then
    all-gather), all_gather and reduce_scatter 1, anything else 0."""
    factor = np.zeros(len(op))
    factor[op == "all_reduce"] = 2.0
    factor[(op == "all_gather") | (op == "reduce_scatter")] = 1.0
    return factor


# per op code, with a trailing 0 that code -1 (an op outside the vocabulary) picks
_FACTOR_BY_CODE = np.append(reduction_factor(np.array(OPS, dtype=object)), 0.0)


def split_arrays(splits: pa.ListArray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(has_split, lens, offsets, values)`` of a ``split_bytes`` column: per row whether it holds splits,
    how many (0 when null) and where they start in ``values`` (all rows' splits as float64)."""
    has_split = splits.is_valid().to_numpy(zero_copy_only=False)
    lens = pc.fill_null(splits.value_lengths(), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = splits.offsets.to_numpy().astype(np.int64)[:-1]
    values = splits.values.to_numpy(zero_copy_only=False).astype(np.float64) if len(splits.values) else np.zeros(0)
    return has_split, lens, offsets, values


# ------------------------------------------------------------------------------- group accessors
class _Groups(Protocol):
    """What the rules read of each row's group (``rows`` are ascending row numbers)."""

    lens: np.ndarray  # members per row, int64

    def member(self, rows: np.ndarray, j: np.ndarray) -> np.ndarray:
        """The ``j``-th member of each row's group."""
        ...

    def position(self, rows: np.ndarray, who: np.ndarray) -> np.ndarray:
        """Position of rank ``who`` in each row's group, -1 when absent."""
        ...

    def members_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, members)`` of the rows' groups one after the other (``len(rows) + 1`` offsets)."""
        ...

    def own_position(self, rank: np.ndarray) -> np.ndarray:
        """Per row, the position of its issuing rank ``rank`` in its group (-1: absent)."""
        ...


class _ListGroups:
    """Groups read from an events table's ``group`` list column (the small adapter for list columns)."""

    def __init__(self, table: pa.Table) -> None:
        if table.num_rows:
            groups = table.column("group").combine_chunks()
            self.lens = groups.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
            self.offsets = groups.offsets.to_numpy().astype(np.int64)[:-1]
            self.members = groups.values.to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            self.lens = self.offsets = self.members = np.zeros(0, np.int64)

    def member(self, rows: np.ndarray, j: np.ndarray) -> np.ndarray:
        return self.members[self.offsets[rows] + j]

    def position(self, rows: np.ndarray, who: np.ndarray) -> np.ndarray:
        pos = np.full(len(rows), -1, dtype=np.int64)
        lens = self.lens[rows]
        for k in range(int(lens.max()) if len(rows) else 0):
            inside = k < lens
            hit = inside & (self.members[np.where(inside, self.offsets[rows] + k, 0)] == who) & (pos < 0)
            pos[hit] = k
        return pos

    def members_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lens = self.lens[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lens)
        return offsets, self.members[np.repeat(self.offsets[rows], lens) + within]

    def own_position(self, rank: np.ndarray) -> np.ndarray:
        event_of_member = np.repeat(np.arange(len(self.lens)), self.lens)  # O(members), one pass
        position = np.arange(len(self.members)) - np.repeat(self.offsets, self.lens)
        is_self = self.members == rank[event_of_member]
        out = np.full(len(self.lens), -1, dtype=np.int64)
        out[event_of_member[is_self]] = position[is_self]
        return out


class _RefGroups:
    """Groups read from the references of a :class:`RefEvents` (no member lists)."""

    def __init__(self, ev: RefEvents, rank: np.ndarray, peer: np.ndarray) -> None:
        self.refs, self.rank, self.peer = ev.refs, rank, peer
        self.lens = ev.refs.sizes()

    def member(self, rows: np.ndarray, j: np.ndarray) -> np.ndarray:
        return self.refs.take(rows).member(self.rank[rows], self.peer[rows], j)

    def position(self, rows: np.ndarray, who: np.ndarray) -> np.ndarray:
        return self.refs.take(rows).position(self.rank[rows], self.peer[rows], who)

    def members_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.refs.take(rows).flat_members(self.rank[rows], self.peer[rows])

    def own_position(self, rank: np.ndarray) -> np.ndarray:
        return self.refs.position(self.rank, self.peer, rank)


def _ints(events: pa.Table | RefEvents, name: str) -> np.ndarray:
    col = events.column(name)
    if col.num_chunks == 0:
        return np.zeros(0, dtype=np.int64)
    return col.to_numpy().astype(np.int64, copy=False)


# ------------------------------------------------------------------------------------- the rules
class _Rows:
    """The per-row arrays the rules read: op codes, rank, peer, count, size (bytes × count), group size and
    the issuing rank's position, over either group accessor."""

    def __init__(self, events: pa.Table | RefEvents) -> None:
        self.events = events
        self.op = vocabulary_codes(events.column("op"), OPS)  # -1: outside the vocabulary, emits nothing
        self.rank = _ints(events, "rank")
        self.peer = _ints(events, "peer")
        self.count = _ints(events, "count")
        self.size = _ints(events, "bytes").astype(np.float64) * self.count
        self.groups: _Groups = (_RefGroups(events, self.rank, self.peer) if isinstance(events, RefEvents)
                                else _ListGroups(events))
        self.lens = self.groups.lens

    @cached_property
    def my_position(self) -> np.ndarray:
        """Per row, the issuing rank's position in its group (-1: absent); only the ring rules read it."""
        return self.groups.own_position(self.rank)

    def successor(self, rows: np.ndarray) -> np.ndarray:
        """The ring successor of each row's rank in its group."""
        return self.groups.member(rows, (self.my_position[rows] + 1) % self.lens[rows])

    def others(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(row, member, position)`` of every member but the issuing rank of each row of ``rows``, row
        by row in member order."""
        offsets, members = self.groups.members_of(rows)
        lens = np.diff(offsets)
        row = np.repeat(rows, lens)
        position = np.arange(len(members)) - np.repeat(offsets[:-1], lens)
        keep = members != self.rank[row]
        return row[keep], members[keep].astype(np.int64), position[keep]


def _flows(events: pa.Table | RefEvents, algorithm: AlgorithmName) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(src, dst, bytes, row)``: every flow of ``events`` under ``algorithm`` and the row it comes from (the
    rules of the module doc, in its order)."""
    if algorithm not in ALGORITHMS:
        raise TraceFormatError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}")
    r = _Rows(events)
    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    nbytes: list[np.ndarray] = []
    of_row: list[np.ndarray] = []

    def emit(rows: np.ndarray, to: np.ndarray, b: np.ndarray) -> None:
        src.append(r.rank[rows])
        dst.append(to)
        nbytes.append(b)
        of_row.append(rows)

    send = np.nonzero(r.op == _SEND)[0]  # point to point: the sender's event carries the flow
    emit(send, r.peer[send], r.size[send])
    a2a = np.nonzero(r.op == _A2A)[0]
    if len(a2a):
        emit(*_all_to_all(events, r, a2a))
    factor = _FACTOR_BY_CODE[r.op]
    bcast, root = _broadcast_roots(r)
    if algorithm == "ring":
        # reductions: factor·(n-1)/n·S to the successor
        rows = np.nonzero((factor > 0) & (r.lens > 1))[0]
        lens = r.lens[rows]
        emit(rows, r.successor(rows), factor[rows] * (lens - 1) / lens * r.size[rows])
        # broadcast: a pipelined ring from the root in which every member but the root's predecessor forwards S
        many = r.lens[bcast] > 1
        bcast, root = bcast[many], root[many]
        root_pos = r.groups.position(bcast, root)
        rows = bcast[(r.my_position[bcast] + 1) % r.lens[bcast] != root_pos]
        emit(rows, r.successor(rows), r.size[rows])
    else:
        # reductions: factor·S/n to every other member; broadcast: S from the root to every other member
        reductions, roots, per_peer = _direct_fanout(r)
        for rows in (reductions, roots):
            row, member, _ = r.others(rows)
            emit(row, member, per_peer[row])
    return (np.concatenate(src).astype(np.int64, copy=False), np.concatenate(dst).astype(np.int64, copy=False),
            np.concatenate(nbytes).astype(np.float64, copy=False), np.concatenate(of_row).astype(np.int64, copy=False))


def _broadcast_roots(r: _Rows) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, root)`` of the broadcasts with a group: the root is ``peer``, else the group's first member."""
    bcast = np.nonzero((r.op == _BCAST) & (r.lens > 0))[0]
    root = np.where(r.peer[bcast] >= 0, r.peer[bcast], r.groups.member(bcast, np.zeros(len(bcast), np.int64)))
    return bcast, root


def _direct_fanout(r: _Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Under ``direct``, the rows that send one amount to every other member of their group: ``(reduction rows,
    broadcast-root rows, per_peer)`` with ``per_peer`` (every row) ``factor·S/n`` for a reduction and ``S`` for a
    broadcast root, the one expression each of their flows carries."""
    factor = _FACTOR_BY_CODE[r.op]
    bcast, root = _broadcast_roots(r)
    roots = bcast[r.rank[bcast] == root]
    per_peer = factor / np.maximum(r.lens, 1).astype(np.float64) * r.size
    per_peer[roots] = r.size[roots]
    return np.nonzero(factor > 0)[0], roots, per_peer


def _all_to_all(events: pa.Table | RefEvents, r: _Rows, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """all_to_all (both algorithms): ``split_bytes[j] · count`` to member ``j``; without splits (or with the
    wrong number), an even split of ``bytes``."""
    splits = split_arrays(events.column("split_bytes").take(pa.array(rows)).combine_chunks())
    row, member, position = r.others(rows)
    local = np.searchsorted(rows, row)  # rows are ascending: each flow's index among the all-to-all rows
    return row, member, _a2a_amount(r, splits, local, row, position)


def _a2a_amount(r: _Rows, splits: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], local: np.ndarray,
                row: np.ndarray, position: np.ndarray) -> np.ndarray:
    """Bytes from ``row``'s rank to its group's member at ``position`` (``local``: the row's index in ``splits``,
    :func:`split_arrays` of the all-to-all rows)."""
    has_split, split_lens, split_offsets, split_values = splits
    with_split = has_split[local] & (split_lens[local] == r.lens[row])
    split = (split_values[np.where(with_split, split_offsets[local] + position, 0)] * r.count[row]
             if len(split_values) else 0.0)
    return np.where(with_split, split, r.size[row] / np.maximum(r.lens[row], 1).astype(np.float64))


# --------------------------------------------------------------------------------------- public
def flow_arrays(events: pa.Table | RefEvents, algorithm: AlgorithmName = "ring") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(src, dst, bytes)`` of every flow of ``events`` (an events table or a :class:`RefEvents`) under
    ``algorithm`` (``ring`` or ``direct``), without the tag columns."""
    src, dst, nbytes, _ = _flows(events, algorithm)
    return src, dst, nbytes


class DirectAmounts:
    """The ``direct`` rules' bytes per row, for a builder that sums them per group instead of per flow
    (:mod:`llmcomm.matrix_tiles`): each amount is the float64 the same row's flows carry in :func:`flow_arrays`,
    bit for bit."""

    def __init__(self, events: pa.Table | RefEvents) -> None:
        self.events = events
        self._r = _Rows(events)
        self.all_to_all = self._r.op == _A2A  # per row

    def fanout(self) -> tuple[np.ndarray, np.ndarray]:
        """``(fans, per_peer)``: per row whether it sends one amount to every other member of its group (a
        reduction, a broadcast's root), and that amount."""
        reductions, roots, per_peer = _direct_fanout(self._r)
        fans = np.zeros(len(self._r.op), dtype=bool)
        fans[reductions] = True
        fans[roots] = True
        return fans, per_peer

    def all_to_all_amounts(self, rows: np.ndarray, size: int) -> np.ndarray:
        """``(len(rows), size)``: bytes from each all-to-all row of ``rows`` (ascending, groups of ``size``) to the
        member at each position of its group (its own position included: the rules send it nothing)."""
        splits = split_arrays(self.events.column("split_bytes").combine_chunks())  # every row's: no take
        row = np.repeat(rows, size)
        return _a2a_amount(self._r, splits, row, row, np.tile(np.arange(size), len(rows))).reshape(len(rows), size)


def flow_event_arrays(events: pa.Table | RefEvents, algorithm: AlgorithmName = "ring"
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(src, dst, bytes, row)``: the flows of :func:`flows_from_table` (same order) with the row of ``events``
    each comes from, so a flow can carry its event's columns (its start time, for a flow list)."""
    return _flows(events, algorithm)


def flows_from_table(events: pa.Table | RefEvents, algorithm: AlgorithmName = "ring", tags: bool = True) -> pd.DataFrame:
    """Vectorized flow decomposition of an events table or a :class:`RefEvents` (see the module docstring
    for the rules): ``src, dst`` (int64), ``bytes`` (float64) plus, unless ``tags=False``, each flow's event
    tags (``FLOW_TAGS``)."""
    src, dst, nbytes, rows = _flows(events, algorithm)
    out: dict[str, np.ndarray | pd.Series] = {"src": src, "dst": dst, "bytes": nbytes}
    if tags:
        take = pa.array(rows, type=pa.int64())
        for tag in FLOW_TAGS:  # Arrow take + to_pandas: ~100x faster than a numpy gather for strings;
            # dictionary-encoded columns (a prediction's) decode after the take: only the flows' rows
            out[tag] = events.column(tag).take(take).cast(EVENTS_SCHEMA.field(tag).type).to_pandas()
    return pd.DataFrame(out, copy=False)  # fresh arrays: no consolidation copy
