"""Events whose groups are references into the layout's group tables instead of member lists.

A predicted events table names each call's group in full (the ``group`` column of ``EVENTS_SCHEMA``). At
131,072 GPUs that column holds 180 M ranks for 1.2 M rows (every rank's gradient all-reduce lists its DP group
of 1,024), and building, checking and decomposing it is most of a prediction's time and memory. Yet every
predicted group is one row of a layout group table (:meth:`llmcomm.layout.Layout.groups`: an
``(n_groups, size)`` array per kind) or the pair ``[rank, peer]`` of a point-to-point call. So a row needs only

    ``kind`` (index into ``tables``; ``PAIR`` for ``[rank, peer]``) and ``index`` (the row of that table),

and a group's ``j``-th member is ``tables[kind][index, j]``; the issuing rank's own position is
``position_in_row[kind][rank]``. :class:`GroupRefs` holds these columns; :class:`RefEvents` is an events table
without its ``group`` column plus its :class:`GroupRefs`. :meth:`RefEvents.to_table` writes the member lists
out (the format is unchanged: files, DataFrames and every reader see full lists); until then, the matrix
builder (:mod:`llmcomm.matrix`, :mod:`llmcomm.flows`) and the validation work from the references.

The tables must partition the ranks they hold (each rank in at most one row of a table, once): then a rank
is in the group a row refers to exactly when ``tables[kind][index, position_in_row[kind][rank]] == rank``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .errors import TraceFormatError
from .events import validate_columns
from .vocab import EVENTS_SCHEMA

PAIR = -1  # kind code of the pair [rank, peer]
MAX_LIST_MEMBERS = 2**31 - 1  # values a list<int32> column (32-bit offsets) can hold


@dataclass(frozen=True)
class GroupRefs:
    """Per event row: the ``kind`` (index into ``tables``, or ``PAIR``) and ``index`` (row of that table) of
    its group. ``tables`` are ``(n_groups, size)`` arrays of global ranks below ``world_size``."""

    kind: np.ndarray  # int8
    index: np.ndarray  # int32 (or any integer type)
    tables: tuple[np.ndarray, ...]
    world_size: int
    _positions: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.kind)

    def take(self, rows: np.ndarray) -> GroupRefs:
        """The references of ``rows`` (the tables and their position lookups are shared, not copied)."""
        return GroupRefs(self.kind[rows], self.index[rows], self.tables, self.world_size, self._positions)

    def slice(self, start: int, stop: int) -> GroupRefs:
        """The references of rows ``[start, stop)`` (views, no copy)."""
        return GroupRefs(self.kind[start:stop], self.index[start:stop], self.tables, self.world_size,
                         self._positions)

    def position_in_row(self, kind: int) -> np.ndarray:
        """For every rank, its column in the row of ``tables[kind]`` that holds it (0 when none does)."""
        pos = self._positions.get(kind)
        if pos is None:
            t = self.tables[kind]
            pos = np.zeros(self.world_size, dtype=np.int64)
            pos[t.ravel()] = np.tile(np.arange(t.shape[1]), t.shape[0])
            self._positions[kind] = pos
        return pos

    def kinds(self) -> list[tuple[int, np.ndarray]]:
        """``(kind, rows of that kind)`` for every kind present, ``PAIR`` included."""
        present = np.unique(self.kind)
        if len(present) == 1:
            return [(int(present[0]), np.arange(len(self.kind)))]
        return [(int(k), np.nonzero(self.kind == k)[0]) for k in present]

    def sizes(self) -> np.ndarray:
        """Members per row (2 for a pair)."""
        table_sizes = np.array([t.shape[1] for t in self.tables] + [2], dtype=np.int64)
        return table_sizes[self.kind]  # PAIR = -1 picks the trailing 2

    def member(self, rank: np.ndarray, peer: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Each row's ``j``-th group member (``j < size``): ``tables[kind][index, j]``; for a pair, ``rank``
        at 0 and ``peer`` at 1."""
        out = np.empty(len(self.kind), dtype=np.int64)
        for k, rows in self.kinds():
            if k == PAIR:
                out[rows] = np.where(j[rows] == 0, rank[rows], peer[rows])
            else:
                out[rows] = self.tables[k][self.index[rows], j[rows]]
        return out

    def position(self, rank: np.ndarray, peer: np.ndarray, who: np.ndarray) -> np.ndarray:
        """Position of rank ``who`` in each row's group, -1 when it is not a member (a pair: 0 for
        ``rank``, else 1 for ``peer``)."""
        out = np.full(len(self.kind), -1, dtype=np.int64)
        for k, rows in self.kinds():
            w = who[rows]
            if k == PAIR:
                out[rows] = np.where(w == rank[rows], 0, np.where(w == peer[rows], 1, -1))
                continue
            valid = (w >= 0) & (w < self.world_size)
            col = self.position_in_row(k)[np.where(valid, w, 0)]
            hit = valid & (self.tables[k][self.index[rows], col] == w)
            out[rows] = np.where(hit, col, -1)
        return out

    def flat_members(self, rank: np.ndarray, peer: np.ndarray,
                     limit: int = MAX_LIST_MEMBERS) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, members)``: all rows' members one group after the other (row order, member order),
        as a list column stores them; row ``i``'s members are ``members[offsets[i]:offsets[i + 1]]``. Refuses
        (before allocating) more than ``limit`` members in all."""
        sizes = self.sizes()
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        if offsets[-1] > limit:
            raise TraceFormatError(
                f"writing the groups out would take {int(offsets[-1]):,} ranks ({offsets[-1] * 4 / 2**30:.1f} GiB), "
                f"more than an events table's list column holds ({limit:,}); len, select, volumes, flows and "
                f"matrix work without them (select a part of the trace first to read its events)")
        members = np.empty(int(offsets[-1]), dtype=np.int32)
        for k, rows in self.kinds():
            if k == PAIR:
                members[offsets[rows]] = rank[rows]
                members[offsets[rows] + 1] = peer[rows]
                continue
            table = self.tables[k]
            start = offsets[rows]
            step = max(1, (1 << 24) // max(table.shape[1], 1))  # bounded temporaries: ~16 M members at once
            for a in range(0, len(rows), step):
                s = start[a:a + step]
                members[s[:, None] + np.arange(table.shape[1])] = table[self.index[rows[a:a + step]]]
        return offsets, members

    def list_array(self, rank: np.ndarray, peer: np.ndarray) -> pa.Array:
        """The ``group`` column these references stand for (``list<int32>``)."""
        offsets, members = self.flat_members(rank, peer)
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(members))

    def check(self, rank: np.ndarray, peer: np.ndarray, origin: str, row0: int = 0) -> None:
        """Each row's issuing rank is a member of its group exactly once (a pair needs ``peer`` ≠ ``rank``,
        ``peer`` ≥ 0); references stay inside their tables. Raises :class:`TraceFormatError` naming the row."""
        def bad(rule: str, mask: np.ndarray) -> None:
            raise TraceFormatError(f"{origin}: field 'group' row {int(np.nonzero(mask)[0][0]) + row0}: {rule}")

        n_tables = len(self.tables)
        if ((self.kind < PAIR) | (self.kind >= n_tables)).any():
            bad(f"group kind must be {PAIR} (pair) or below {n_tables}", (self.kind < PAIR) | (self.kind >= n_tables))
        for k, rows in self.kinds():
            if k == PAIR:
                wrong = np.zeros(len(self.kind), dtype=bool)
                wrong[rows] = (peer[rows] < 0) | (peer[rows] == rank[rows])
                if wrong.any():
                    bad("a [rank, peer] group needs a peer >= 0 other than the rank", wrong)
                continue
            outside = np.zeros(len(self.kind), dtype=bool)
            outside[rows] = (self.index[rows] < 0) | (self.index[rows] >= self.tables[k].shape[0])
            if outside.any():
                bad(f"group index outside the {self.tables[k].shape[0]} groups of its kind", outside)
        missing = self.position(rank, peer, rank) < 0
        if missing.any():
            bad("the issuing rank must appear exactly once in its group", missing)


@dataclass(frozen=True)
class RefEvents:
    """An events table without its ``group`` column (``table``: the other columns of ``EVENTS_SCHEMA``, in
    order; string columns may be dictionary-encoded) and the :class:`GroupRefs` that stand for it."""

    table: pa.Table
    refs: GroupRefs

    def __post_init__(self) -> None:
        if "group" in self.table.column_names:
            raise TraceFormatError("RefEvents.table must not hold a 'group' column (the references stand for it)")
        if self.table.num_rows != len(self.refs):
            raise TraceFormatError(f"RefEvents: {self.table.num_rows} rows but {len(self.refs)} group references")

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def column(self, name: str) -> pa.ChunkedArray:
        """A column of the table (not ``group``: see :meth:`to_table`)."""
        return self.table.column(name)

    def ints(self, name: str) -> np.ndarray:
        """An integer column as int64."""
        col = self.table.column(name)
        if col.num_chunks == 0:
            return np.zeros(0, dtype=np.int64)
        return col.to_numpy().astype(np.int64, copy=False)

    def take(self, rows: np.ndarray) -> RefEvents:
        rows = np.asarray(rows, dtype=np.int64)
        return RefEvents(self.table.take(pa.array(rows)), self.refs.take(rows))

    def slice(self, offset: int = 0, length: int | None = None) -> RefEvents:
        """``length`` rows from ``offset`` (to the end when ``None``), zero-copy; the signature of
        :meth:`pyarrow.Table.slice`, so code may slice either."""
        table = self.table.slice(offset, length)
        return RefEvents(table, self.refs.slice(offset, offset + table.num_rows))

    def filter(self, mask: np.ndarray) -> RefEvents:
        return self.take(np.nonzero(mask)[0])

    def to_table(self) -> pa.Table:
        """The full events table (``EVENTS_SCHEMA``, member lists written out)."""
        group = self.refs.list_array(self.ints("rank"), self.ints("peer"))
        t = self.table.combine_chunks() if self.table.num_rows else self.table
        arrays = [group if f.name == "group" else t.column(f.name).cast(f.type) for f in EVENTS_SCHEMA]
        return pa.Table.from_arrays(arrays, schema=EVENTS_SCHEMA)

    def decoded(self, names: list[str]) -> pa.Table:
        """Columns ``names`` of the table with dictionary-encoded ones decoded (``EVENTS_SCHEMA`` types)."""
        return pa.Table.from_arrays([self.table.column(c).cast(EVENTS_SCHEMA.field(c).type) for c in names],
                                    names=names)

    def check(self, origin: str) -> None:
        """:meth:`GroupRefs.check` on the references, then :func:`llmcomm.events.validate_columns` on the table
        (all_to_all splits one per member included)."""
        self.refs.check(self.ints("rank"), self.ints("peer"), origin)
        validate_columns(self.table, origin, group_sizes=self.refs.sizes())
