"""A communication matrix summed into square blocks of ranks, computed as an image straight from the group
structure of a prediction: what a matrix figure draws, without building the flow list.

The exact matrix (:func:`llmcomm.matrix.matrix_from_table`) expands every event into its flows. Under the
direct (logical) algorithm a reduction over a group of ``n`` ranks sends ``w = f · S / n`` (``f`` = 2 for an
all-reduce, 1 for an all-gather or a reduce-scatter, ``S = bytes · count``; :func:`llmcomm.flows.reduction_factor`)
from its issuing rank to *each* other member, and an all-to-all without per-peer splits ``S / n`` to each: a
data-parallel group of 4,096 ranks makes 16.7 M flows for one all-reduce issued by every member. Summed into
blocks of ``u`` consecutive ranks, those flows depend on the group only through how many of its members each
block holds. With ``C[g, b]`` = members of group ``g`` in block ``b`` (one row per row of the layout group table
the events refer to, :class:`llmcomm.group_refs.GroupRefs`) and ``A[a, g] = Σ w`` over the events of group ``g``
issued by a rank of block ``a``:

    ``M_u[a, b] = (A · C)[a, b]`` for ``a ≠ b``,
    ``M_u[a, a] = Σ_e w_e · (C[g_e, a] − 1)`` over the events ``e`` issued in block ``a`` (the issuing rank sends
    to every member of its own block but itself),

a sparse product of ``blocks × groups`` by ``groups × blocks`` whose cost is the number of events plus the
members of the groups (at most the world size per table), not the number of flows. The diagonal is summed
per event from ``C[g, a] − 1``, so a block whose only member is the issuing rank gets exactly 0, as the exact
matrix does. Every other event (sends, broadcasts, all-to-alls with per-peer splits, pairs, and every event
under the ring algorithm, which makes one flow per event) goes through the exact flow rules
(:func:`llmcomm.flows.flow_arrays`) and is summed into the same blocks. A trace whose groups are member lists
(recorded or imported) is binned from :meth:`llmcomm.Trace.matrix` at ``level="node"`` with ``u`` ranks per
"node", which is exact too. The result equals the exact ``world × world`` matrix summed into the blocks, up to
the order of floating-point additions (tested against :func:`llmcomm.matrix.matrix_from_table`).

:func:`view_grid` chooses the blocks a figure draws: single GPUs up to ``max_cells`` ranks, equal blocks of
ranks up to ``gpu_level_max`` GPUs, blocks of whole nodes above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from .bounds import check_matrix_flows
from .errors import ConfigError
from .events import vocabulary_codes
from .flows import flow_arrays, flow_event_arrays, reduction_factor, split_arrays
from .group_refs import PAIR, RefEvents
from .trace import Trace
from .vocab import ALGORITHMS, OPS, AlgorithmName

MAX_CELLS = 4096  # blocks per side an image may have (a dense float64 image of 128 MiB)
_FACTOR = np.append(reduction_factor(np.array(OPS, dtype=object)), 0.0)  # per op code; code -1 picks 0
_A2A = OPS.index("all_to_all")
_FLOW_COLUMNS = ("op", "rank", "peer", "count", "bytes", "split_bytes")  # what llmcomm.flows reads


@dataclass(frozen=True)
class Grid:
    """The blocks of a matrix figure: ``level`` ("gpu": blocks of ranks; "node": blocks of whole nodes),
    ``unit`` ranks per block, ``cells`` blocks per side (``ceil(world / unit)``)."""

    level: str
    unit: int
    cells: int


def view_grid(world_size: int, gpus_per_node: int, max_cells: int = 256, gpu_level_max: int = 4096) -> Grid:
    """At most ``max_cells`` blocks per side: ``unit = ceil(world / max_cells)`` ranks per block up to
    ``gpu_level_max`` GPUs; above it, blocks of ``ceil(nodes / max_cells)`` whole nodes."""
    if world_size < 1 or gpus_per_node < 1 or max_cells < 1:
        raise ConfigError(f"view_grid: world_size={world_size}, gpus_per_node={gpus_per_node} and "
                          f"max_cells={max_cells} must be >= 1")
    if world_size <= gpu_level_max:
        unit = -(-world_size // max_cells)
        return Grid("gpu", unit, -(-world_size // unit))
    nodes = -(-world_size // gpus_per_node)
    unit = -(-nodes // max_cells) * gpus_per_node
    return Grid("node", unit, -(-world_size // unit))


def _check(world_size: int, unit: int, algorithm: str) -> int:
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}")
    if unit < 1:
        raise ConfigError(f"unit={unit} ranks per block must be >= 1")
    cells = -(-world_size // unit)
    if cells > MAX_CELLS:
        raise ConfigError(f"a binned matrix of {cells:,} blocks per side ({world_size:,} ranks in blocks of {unit}) "
                          f"is above the {MAX_CELLS:,} an image holds: choose unit >= "
                          f"{math.ceil(world_size / MAX_CELLS)}")
    return cells


def binned_matrix(trace: Trace, algorithm: AlgorithmName = "direct", unit: int = 1,
                  world_size: int | None = None) -> np.ndarray:
    """Dense ``(cells, cells)`` float64 image of the bytes from sender block (row) to receiver block (column),
    blocks of ``unit`` consecutive ranks (``cells = ceil(world / unit)``); see the module doc for the method."""
    n = world_size or trace.world_size
    cells = _check(n, unit, algorithm)
    ev = trace.ref_events
    if ev is None:  # member lists: the exact blocked builder at a "node" of `unit` ranks
        m = trace.matrix(algorithm, n, level="node", gpus_per_node=unit) if unit > 1 else trace.matrix(algorithm, n)
        return np.asarray(m.toarray(), dtype=np.float64)
    rows = _Rows(ev)
    return rows.image(np.arange(ev.num_rows), algorithm, unit, cells)


def binned_matrices(trace: Trace, algorithms: Sequence[AlgorithmName] = ("direct",), unit: int = 1,
                    by: str = "parallelism", world_size: int | None = None
                    ) -> dict[tuple[str, AlgorithmName], np.ndarray]:
    """:func:`binned_matrix` per value of column ``by`` (in order of first appearance) and per algorithm, the
    events' arrays read once: ``{(value, algorithm): image}``."""
    n = world_size or trace.world_size
    cells = max(_check(n, unit, a) for a in algorithms) if algorithms else _check(n, unit, "direct")
    ev = trace.ref_events
    if ev is None:
        values = list(dict.fromkeys(trace.events[by].astype(str)))
        return {(v, a): binned_matrix(trace.select(**{by: v}), a, unit, n) for v in values for a in algorithms}
    rows = _Rows(ev)
    col = ev.column(by)
    values = [str(v) for v in pc.unique(col).to_pylist() if v is not None]
    codes = vocabulary_codes(col, values)
    return {(v, a): rows.image(np.nonzero(codes == i)[0], a, unit, cells) for i, v in enumerate(values)
            for a in algorithms}


def count_exact(trace: Trace, algorithms: Sequence[AlgorithmName] = ALGORITHMS, by: str = "parallelism") -> bool:
    """Whether :func:`binned_matrices` of ``trace`` (rows with a ``count``, e.g. an aggregated prediction) under
    ``algorithms`` and per value of ``by`` is, bit for bit, that of the same events with every row repeated
    ``count`` times as rows of one call (the expanded prediction), whatever the blocks and the order of the rows.

    True when, per image, what a row sends is ``count`` times what one of its calls sends (each uniform weight
    ``f·bytes/n`` or ``bytes/n``, each flow of the exact rules; the splits are whole bytes), every amount one
    call sends is a multiple of ``2⁻ᵏ`` (``k`` binary places: 0 for whole bytes, 5 for a 4-byte all-reduce's
    ``2·4/256``) and ``2·Σ bytes·count · 2ᵏ < 2⁵³``. Then every partial sum either computation makes is a
    multiple of ``2⁻ᵏ`` below ``2·Σ bytes·count`` (what all flows of the image carry at most), held exactly by
    a float64, so every addition is exact, in any order and grouping. A trace whose groups are member lists
    gives False (not checked)."""
    ev = trace.ref_events
    if ev is None:
        return False
    rows = _Rows(ev)
    col = ev.column(by)
    values = [str(v) for v in pc.unique(col).to_pylist() if v is not None]
    codes = vocabulary_codes(col, values)
    return all(rows.count_exact(np.nonzero(codes == i)[0], a) for i in range(len(values)) for a in algorithms)


_EXACT = 2.0**53  # float64 holds every multiple of 2^-k below 2^(53-k) exactly


def _binary_places(x: np.ndarray) -> int | None:
    """The fewest binary places ``k`` with every ``x · 2ᵏ`` whole (multiplying by a power of two is exact);
    None for a value that has more than 52 (or is not finite)."""
    x = np.unique(x)
    if not np.all(np.isfinite(x)):
        return None
    for k in range(53):
        scaled = x * 2.0**k
        if np.all(np.floor(scaled) == scaled):
            return k
    return None


class _Rows:
    """The per-event arrays the images read, decoded once per trace (op codes, rank, ``S = bytes · count``,
    group size, kind and index of the group reference, per-peer splits of the all-to-alls)."""

    def __init__(self, ev: RefEvents) -> None:
        self.refs = ev.refs
        self.slim = RefEvents(ev.table.select(list(_FLOW_COLUMNS)), ev.refs)  # what the exact flow rules read
        self.op = vocabulary_codes(ev.column("op"), OPS)
        self.rank = ev.ints("rank")
        self.count = ev.ints("count")
        self.bytes = ev.ints("bytes").astype(np.float64)
        self.size = self.bytes * self.count
        self.n = ev.refs.sizes()
        self.kind = np.asarray(ev.refs.kind, dtype=np.int64)
        self.index = np.asarray(ev.refs.index, dtype=np.int64)
        self.a2a = (self.op == _A2A) & (self.kind != PAIR)
        self.split_lens = np.zeros(len(self.op), dtype=np.int64)
        self.split_offsets = np.zeros(len(self.op), dtype=np.int64)
        self.split_values = np.zeros(0)
        if self.a2a.any():
            has, lens, offsets, values = split_arrays(ev.column("split_bytes").combine_chunks())
            self.split_lens = np.where(has, lens, 0)
            self.split_offsets, self.split_values = offsets, values
        self.with_split = self.a2a & (self.split_lens == self.n)

    @property
    def single(self) -> RefEvents:
        """:attr:`slim` with every ``count`` 1: one call of each row."""
        table = self.slim.table
        i = table.column_names.index("count")
        ones = pa.array(np.ones(table.num_rows, dtype=np.int64)).cast(table.schema.field(i).type)
        return RefEvents(table.set_column(i, table.schema.field(i), ones), self.refs)

    def uniform(self, rows: np.ndarray, algorithm: str, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(weight, uniform)`` of events ``rows``: whether each sends one amount to every other member of its
        group (a direct reduction, ``f·S/n``; an all-to-all without usable splits, ``S/n``) and that amount,
        with ``S`` = ``size`` of the row (``bytes · count``, or ``bytes`` for one call)."""
        op, kind, n = self.op[rows], self.kind[rows], self.n[rows]
        weight = np.zeros(len(rows))
        uniform = np.zeros(len(rows), dtype=bool)
        if algorithm == "direct":  # reductions: f·S/n to each other member
            red = (_FACTOR[op] > 0) & (kind != PAIR)
            uniform |= red
            weight[red] = _FACTOR[op[red]] / n[red] * size[rows[red]]
        even = self.a2a[rows] & ~self.with_split[rows]  # both algorithms: S/n to each other member
        uniform |= even
        weight[even] = size[rows[even]] / n[even]
        return weight, uniform

    def count_exact(self, rows: np.ndarray, algorithm: str) -> bool:
        """Whether the image of events ``rows`` equals, bit for bit, the image of the same events with each row
        repeated ``count`` times as rows of ``count = 1`` (see :func:`count_exact`)."""
        weight, uniform = self.uniform(rows, algorithm, self.size)
        one, _ = self.uniform(rows, algorithm, self.bytes)
        if not np.array_equal(weight[uniform], one[uniform] * self.count[rows[uniform]]):
            return False
        amounts = [one[uniform]]
        split = rows[self.with_split[rows]]
        if len(split):
            start, lens = self.split_offsets[split], self.split_lens[split]
            amounts.append(self.split_values[np.repeat(start, lens) + np.arange(int(lens.sum()))
                                             - np.repeat(np.cumsum(lens) - lens, lens)])
        rest = rows[~(uniform | self.with_split[rows])]
        if len(rest):
            _, _, nbytes, of = flow_event_arrays(self.slim.take(rest), algorithm)  # type: ignore[arg-type]
            _, _, per_call, _ = flow_event_arrays(self.single.take(rest), algorithm)  # type: ignore[arg-type]
            if not np.array_equal(nbytes, per_call * self.count[rest][of]):
                return False
            amounts.append(per_call)
        k = _binary_places(np.concatenate(amounts))
        return k is not None and 2.0 * float(np.sum(self.size[rows])) * 2.0**k < _EXACT

    def image(self, rows: np.ndarray, algorithm: str, unit: int, cells: int) -> np.ndarray:
        """The image of events ``rows`` (ascending)."""
        image = np.zeros(cells * cells, dtype=np.float64)
        kind, n = self.kind[rows], self.n[rows]
        weight, uniform = self.uniform(rows, algorithm, self.size)
        split = self.with_split[rows]
        for k in np.unique(kind[uniform]):
            sel = rows[uniform & (kind == k)]
            _add_groups(image, self.refs.tables[int(k)], self.index[sel], self.rank[sel] // unit,
                        weight[uniform & (kind == k)], unit, cells)
        if split.any():  # bounded like the exact builder: one flow per member of each split all-to-all
            check_matrix_flows(int(n[split].sum()), algorithm=algorithm, world_size=self.refs.world_size)
        for k in np.unique(kind[split]):
            self._add_splits(image, rows[split & (kind == k)], int(k), unit, cells)
        rest = rows[~(uniform | split)]
        if len(rest):  # the exact flow rules, summed into the blocks
            src, dst, nbytes = flow_arrays(self.slim.take(rest), algorithm)  # type: ignore[arg-type]  # checked
            image += np.bincount((src // unit) * cells + dst // unit, weights=nbytes, minlength=cells * cells)
        return image.reshape(cells, cells)

    def _add_splits(self, image: np.ndarray, rows: np.ndarray, kind: int, unit: int, cells: int) -> None:
        """All-to-alls with one split per member: ``split_bytes[j] · count`` to member ``j`` but itself. The splits
        are first summed per (issuing rank, group) — one sparse product over the rows — so the members are
        looked up once per rank and group, not once per event."""
        table = self.refs.tables[kind]
        groups, members = table.shape
        start = self.split_offsets[rows]
        if len(rows) and np.all(np.diff(start) == members):  # the rows' splits lie one after the other: a view
            splits = self.split_values[start[0]:start[0] + len(rows) * members].reshape(len(rows), members)
        else:
            splits = self.split_values[start[:, None] + np.arange(members)]  # (rows, n)
        key, inv = np.unique(self.rank[rows] * groups + self.index[rows], return_inverse=True)
        per_key = sp.csr_matrix((self.count[rows].astype(np.float64), (inv.ravel(), np.arange(len(rows)))),
                                shape=(len(key), len(rows))) @ splits  # Σ count · split per (rank, group)
        src = np.broadcast_to((key // groups)[:, None], (len(key), members))
        dst = table[key % groups].astype(np.int64)
        keep = dst != src
        image += np.bincount((src[keep] // unit) * cells + dst[keep] // unit, weights=per_key[keep],
                             minlength=cells * cells)


def _add_groups(image: np.ndarray, table: np.ndarray, index: np.ndarray, block: np.ndarray, w: np.ndarray,
                unit: int, cells: int) -> None:
    """Add ``w`` from each event's block to every other member of its group (row ``index`` of ``table``),
    summed into blocks: ``A · C`` off the diagonal, ``Σ w · (C[g, a] − 1)`` on it (module doc)."""
    groups, members = table.shape
    c = sp.csr_matrix((np.ones(groups * members), (np.repeat(np.arange(groups), members),
                                                    table.ravel().astype(np.int64) // unit)), shape=(groups, cells))
    c.sum_duplicates()
    a = sp.csr_matrix((w, (block, index)), shape=(cells, groups))
    prod = (a @ c).tocoo()
    off = prod.row != prod.col
    image += np.bincount(prod.row[off] * cells + prod.col[off], weights=prod.data[off], minlength=cells * cells)
    own = np.asarray(c[index, block]).ravel() - 1.0  # members of the event's group in its own block, but itself
    image += np.bincount(block * cells + block, weights=w * own, minlength=cells * cells)
