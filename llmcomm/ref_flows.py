"""Flows of events whose groups are references (:class:`llmcomm.group_refs.RefEvents`).

The rules are :mod:`llmcomm.trace`'s (its module doc has the table), applied without a member list per row:
a ring successor is ``tables[kind][index, (position + 1) mod n]``, one gather per row, so a ring matrix costs
O(rows) however large the groups; the direct algorithm and all-to-alls expand only the rows they need, a
block at a time. Flows come out in the order :func:`llmcomm.trace.flows_from_table` emits them (sends,
all-to-alls, reductions, broadcasts; within each, row order then member order) with the same float
expressions, so the matrices they sum to are equal bit for bit (tested).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from .errors import TraceFormatError
from .group_refs import RefEvents
from .trace import FLOW_TAGS, reduction_factor, split_arrays, vocabulary_codes
from .vocab import ALGORITHMS, EVENTS_SCHEMA, OPS

_FACTOR_BY_OP = reduction_factor(np.array(OPS, dtype=object))
_SEND, _A2A, _BCAST = OPS.index("send"), OPS.index("all_to_all"), OPS.index("broadcast")


class _Rows:
    """The per-row arrays the rules read: op codes, rank, peer, size (bytes × count), group size, own
    position."""

    def __init__(self, ev: RefEvents) -> None:
        self.ev = ev
        self.op = vocabulary_codes(ev.column("op"), OPS)  # validated: every op is known
        self.rank = ev.ints("rank")
        self.peer = ev.ints("peer")
        self.count = ev.ints("count")
        self.size = ev.ints("bytes").astype(np.float64) * self.count
        self.lens = ev.refs.sizes()
        self.my_position = ev.refs.position(self.rank, self.peer, self.rank)

    def successor(self, rows: np.ndarray) -> np.ndarray:
        """The ring successor of each row's rank in its group."""
        refs = self.ev.refs.take(rows)
        return refs.member(self.rank[rows], self.peer[rows], (self.my_position[rows] + 1) % self.lens[rows])

    def others(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(row, member, position)`` of every member but the issuing rank of each row of ``rows``, row
        by row in member order."""
        offsets, members = self.ev.refs.take(rows).flat_members(self.rank[rows], self.peer[rows])
        lens = np.diff(offsets)
        row = np.repeat(rows, lens)
        position = np.arange(len(members)) - np.repeat(offsets[:-1], lens)
        keep = members != self.rank[row]
        return row[keep], members[keep].astype(np.int64), position[keep]


def ref_flow_arrays(ev: RefEvents, algorithm: str = "ring") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(src, dst, bytes)`` of every flow of ``ev`` under ``algorithm`` (``ring`` or ``direct``)."""
    src, dst, nbytes, _ = _ref_flows(ev, algorithm)
    return src, dst, nbytes


def ref_flow_events(ev: RefEvents, algorithm: str = "ring") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(src, dst, bytes, row)``: :func:`ref_flow_arrays` with the row of ``ev`` each flow comes from."""
    return _ref_flows(ev, algorithm)


def ref_flows_frame(ev: RefEvents, algorithm: str = "ring", tags: bool = True) -> pd.DataFrame:
    """The flows as :func:`llmcomm.trace.flows_from_table` returns them for the written-out table (same
    rows, order, columns and dtypes): ``src, dst, bytes`` plus (``tags``) each flow's event tags."""
    src, dst, nbytes, rows = _ref_flows(ev, algorithm)
    out: dict[str, np.ndarray | pd.Series] = {"src": src, "dst": dst, "bytes": nbytes}
    if tags:
        take = pa.array(rows, type=pa.int64())
        for tag in FLOW_TAGS:  # dictionary-encoded columns decode after the take: only the flows' rows
            out[tag] = ev.column(tag).take(take).cast(EVENTS_SCHEMA.field(tag).type).to_pandas()
    return pd.DataFrame(out, copy=False)


def _ref_flows(ev: RefEvents, algorithm: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(src, dst, bytes, row)``: every flow and the row of ``ev`` it comes from, in the list path's order."""
    if algorithm not in ALGORITHMS:
        raise TraceFormatError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}")
    r = _Rows(ev)
    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    nbytes: list[np.ndarray] = []
    of_row: list[np.ndarray] = []

    def emit(rows: np.ndarray, to: np.ndarray, b: np.ndarray) -> None:
        src.append(r.rank[rows])
        dst.append(to)
        nbytes.append(b)
        of_row.append(rows)

    send = np.nonzero(r.op == _SEND)[0]
    emit(send, r.peer[send], r.size[send])
    a2a = np.nonzero(r.op == _A2A)[0]
    if len(a2a):
        emit(*_all_to_all(ev, r, a2a))
    factor = _FACTOR_BY_OP[r.op]
    bcast = np.nonzero((r.op == _BCAST) & (r.lens > 0))[0]
    root = np.where(r.peer[bcast] >= 0, r.peer[bcast],
                    r.ev.refs.take(bcast).member(r.rank[bcast], r.peer[bcast], np.zeros(len(bcast), np.int64)))
    if algorithm == "ring":
        rows = np.nonzero((factor > 0) & (r.lens > 1))[0]
        lens = r.lens[rows]
        emit(rows, r.successor(rows), factor[rows] * (lens - 1) / lens * r.size[rows])
        many = r.lens[bcast] > 1
        bcast, root = bcast[many], root[many]
        root_pos = ev.refs.take(bcast).position(r.rank[bcast], r.peer[bcast], root)
        rows = bcast[(r.my_position[bcast] + 1) % r.lens[bcast] != root_pos]
        emit(rows, r.successor(rows), r.size[rows])
    else:
        row, member, _ = r.others(np.nonzero(factor > 0)[0])
        emit(row, member, factor[row] / np.maximum(r.lens[row], 1).astype(np.float64) * r.size[row])
        row, member, _ = r.others(bcast[r.rank[bcast] == root])
        emit(row, member, r.size[row])
    return (np.concatenate(src).astype(np.int64, copy=False), np.concatenate(dst).astype(np.int64, copy=False),
            np.concatenate(nbytes).astype(np.float64, copy=False), np.concatenate(of_row).astype(np.int64, copy=False))


def _all_to_all(ev: RefEvents, r: _Rows, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """all_to_all: ``split_bytes[j] · count`` to member ``j``; without splits (or with the wrong number),
    an even split of ``bytes``."""
    has_split, split_lens, split_offsets, split_values = split_arrays(
        ev.table.column("split_bytes").take(pa.array(rows)).combine_chunks())
    row, member, position = r.others(rows)
    local = np.searchsorted(rows, row)  # rows are ascending: each flow's index among the all-to-all rows
    with_split = has_split[local] & (split_lens[local] == r.lens[row])
    split = (split_values[np.where(with_split, split_offsets[local] + position, 0)] * r.count[row]
             if len(split_values) else 0.0)
    return row, member, np.where(with_split, split, r.size[row] / np.maximum(r.lens[row], 1).astype(np.float64))
