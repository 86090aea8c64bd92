"""The direct GPU matrix of referenced groups, tiled from each group kind's pattern instead of expanded per flow.

Under ``direct`` a reduction (or a broadcast's root) sends one amount, ``per_peer``
(:class:`llmcomm.flows.DirectAmounts`), to every other member of its group. When the group is a row of a layout
table (:class:`llmcomm.group_refs.GroupRefs`), every row of one rank and one kind ``k`` reaches the same peers,
so that kind's part of the matrix is

    ``M_k[r, j] = W_k[r]`` for ``j`` in the rank's row of ``tables[k]``, ``j ≠ r``, with ``W_k[r] = Σ per_peer``

over the rank's rows of that kind: one ``bincount``, whatever the number of calls. A kind whose every group lies
inside a group of a larger kind (``tp`` and ``pp`` inside the model-parallel group ``tp × pp``; the expert groups
inside Megatron's ``tp-ep-pp`` group) adds onto that kind's tile, so a block of source ranks is built from a few
*root* tiles: per rank its root table row, sorted (already CSR column order), filled by broadcasting. All-to-alls
send an amount per member (``split_bytes``): summed per rank and member position they are added inside a root's
tile the same way. The tiles and the remaining flows (sends, ``[rank, peer]`` pairs, all-to-alls no root holds;
:func:`llmcomm.flows.flow_arrays`) are merged by scipy's sorted CSR addition: nothing sorts or expands the hundreds
of millions of per-call flows.

Exactness. The general builder (:mod:`llmcomm.matrix`) adds each cell's flows in an order set by scipy's index
sort; this one adds them in another. Both give the same float64 when every addition is exact, which holds when
every flow carries a multiple of ``2^-e`` and every cell's total stays below ``2^52 · 2^-e`` (every partial sum is
then an integer multiple of ``2^-e`` below ``2^53 · 2^-e``, the bound's own rounding covered by the factor 2), a
cell's total bounded by the sum of its source rank's per-kind amounts. Predictions meet it (power-of-two group
sizes, integer bytes: GPT-3 175B on 131,072 GPUs needs ``e = 6``); when a trace does not
(a group of 3 splitting an odd byte count) :attr:`Tiles.ok` is false and the general path builds the matrix, so
the result is the general builder's bit for bit either way (``tests/test_matrix_tiles.py``). Cells are summed as
integers ``m · 256 + c`` (``m`` the cell's bytes times ``2^e``, ``c`` its number of terms, at most 33), so a flow
of zero bytes still makes the explicit zero entry the general builder stores.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

from .flows import DirectAmounts, flow_arrays
from .group_refs import RefEvents

_COUNT_BITS = 8  # low bits of a cell's integer code: how many terms it sums (one per kind, one for the rest)
BLOCK_CELLS = 1 << 19  # tile cells built at once: ~4 MB of codes, cache-sized (larger blocks ran slower)
_EXACT = 2.0**52  # cell totals times 2^e stay below this (2^53 with a factor 2 for the bound's own rounding)


def fraction_bits(values: np.ndarray) -> int:
    """The smallest ``e >= 0`` with every value an integer multiple of ``2^-e`` (finite values >= 0)."""
    v = values[values > 0]
    if not len(v):
        return 0
    mant, exp = np.frexp(v)  # v = mant · 2^exp, 0.5 <= mant < 1: mant · 2^53 is an integer below 2^53
    m = (mant * 2.0**53).astype(np.int64)
    low = np.frexp((m & -m).astype(np.float64))[1] - 1  # trailing zero bits of m
    return int(max(0, int((53 - exp - low).max())))


@dataclass
class _Kind:
    """One table kind's fan-out rows summed per rank."""

    code: int
    table: np.ndarray  # (groups, size) global ranks
    row_of: np.ndarray  # per rank: its row of the table, -1 when the table does not hold it
    weight: np.ndarray  # per rank: W_k, the summed per_peer of its rows of this kind (all-to-alls: to all members)
    terms: np.ndarray  # per rank: how many rows (0: the rank sends nothing over this kind)
    cells: np.ndarray | None = None  # all-to-alls: (world, size) bytes to the member at each position of the row


@dataclass
class _Root:
    """A root tile: its kind, the table's rows sorted, each rank's column in its sorted row, the kinds on it."""

    kind: _Kind
    sorted_rows: np.ndarray
    sorted_pos: np.ndarray
    subs: list[_Kind]
    # the remaining flows' summed cells that lie in the root's rows: source rank, column in its sorted row, code,
    # sorted by source (``starts[r]``: the first of rank r's)
    flows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    starts: np.ndarray | None = None


def _row_of(table: np.ndarray, world: int) -> np.ndarray:
    out = np.full(world, -1, dtype=np.int64)
    out[table.ravel()] = np.repeat(np.arange(table.shape[0]), table.shape[1])
    return out


def _inside(small: _Kind, big: _Kind) -> bool:
    """Whether every group of ``small`` lies inside one group of ``big``."""
    rows = big.row_of[small.table]
    return bool((rows >= 0).all() and (rows == rows[:, :1]).all())


class Tiles:
    """What the tiled builder needs of a :class:`RefEvents` for the direct GPU matrix (see the module doc).
    ``ok`` says whether every sum is exact; then :meth:`blocks` gives the matrix's CSR rows, block by block of
    source ranks."""

    def __init__(self, events: RefEvents, world_size: int, block_cells: int = BLOCK_CELLS) -> None:
        self.world, self.block_cells = world_size, block_cells
        refs = events.refs
        rank = events.ints("rank")
        rules = DirectAmounts(events)
        fans, per_peer = rules.fanout()
        tiled = np.zeros(len(rank), dtype=bool)
        uniform: list[_Kind] = []
        spread: list[tuple[_Kind, np.ndarray]] = []  # all-to-alls: an amount per member, tiled inside a root
        for code in np.unique(refs.kind).tolist():
            if code < 0 or refs.tables[code].shape[1] < 2:
                continue
            table = refs.tables[code].astype(np.int64)
            row_of = _row_of(table, world_size)
            of_kind = refs.kind == code
            of_kind[of_kind] = row_of[rank[of_kind]] == refs.index[of_kind]  # the rank's own row (else: the rest)
            rows = np.nonzero(of_kind & fans)[0]
            if len(rows):
                uniform.append(_Kind(code, table, row_of, np.bincount(rank[rows], weights=per_peer[rows],
                                                                      minlength=world_size),
                                     np.bincount(rank[rows], minlength=world_size)))
                tiled[rows] = True
            rows = np.nonzero(of_kind & rules.all_to_all)[0]
            if len(rows):
                size = table.shape[1]
                sent = rules.all_to_all_amounts(rows, size)
                key = (rank[rows][:, None] * size + np.arange(size)).ravel()
                cells = np.bincount(key, weights=sent.ravel(), minlength=world_size * size)
                spread.append((_Kind(code, table, row_of, cells.reshape(world_size, size).sum(axis=1),
                                     np.bincount(rank[rows], minlength=world_size),
                                     cells.reshape(world_size, size)), rows))
        self.roots = self._roots(uniform)
        amounts = [per_peer[tiled]]
        for k, rows in spread:  # inside a root (never one itself): the rest otherwise
            home = next((r for r in self.roots if _inside(k, r.kind)), None)
            if home is not None:
                home.subs.append(k)
                uniform.append(k)
                tiled[rows] = True
                assert k.cells is not None
                amounts.append(k.cells.ravel())
        assert len(uniform) < 2**_COUNT_BITS - 1  # at most two per group kind (vocab.CALL_GROUP_KINDS)
        flat = np.concatenate(amounts)
        rest = np.nonzero(~tiled)[0]  # rows whose flows come from flow_arrays: sends, pairs, other groups
        cols = ["rank", "op", "peer", "bytes", "count", "split_bytes"]  # what the rules read
        part = RefEvents(events.table.select(cols).take(pa.array(rest)), refs.take(rest))
        src, dst, byt = flow_arrays(part, "direct") if len(rest) else (np.zeros(0, np.int64),) * 3
        byt = np.asarray(byt, dtype=np.float64)
        self.ok = bool(np.isfinite(flat).all() and (flat >= 0).all() and np.isfinite(byt).all()
                       and (byt >= 0).all() and not (len(dst) and (dst.min() < 0 or dst.max() >= world_size)))
        if not self.ok:  # the general path adds them (or names the rank out of range)
            return
        self.bits = max(fraction_bits(flat), fraction_bits(byt))
        bound = np.bincount(src, weights=byt, minlength=world_size).astype(np.float64)  # per rank: bounds a cell
        for k in uniform:
            bound += k.weight
        self.ok = bool(world_size == 0 or float(bound.max()) * 2.0**self.bits < _EXACT)
        if not self.ok:
            return
        self.scale = 2.0**self.bits
        rest_m = sp.coo_matrix((byt, (src, dst)), shape=(world_size, world_size)).tocsr().tocoo()  # exact sums
        row, col = rest_m.row.astype(np.int64), rest_m.col.astype(np.int64)
        code = self._code(rest_m.data * self.scale, 1)
        left = np.ones(len(code), dtype=bool)
        for root in self.roots:  # cells inside a root's rows join its tile (pp's sends inside tp × pp, say)
            r_of = root.kind.row_of
            inside = left & (r_of[row] >= 0) & (r_of[row] == r_of[col])
            if inside.any():
                root.flows = (row[inside], root.sorted_pos[col[inside]], code[inside])
                root.starts = np.searchsorted(row[inside], np.arange(world_size + 1))
                left &= ~inside
        self.rest = sp.csr_matrix((code[left], (row[left], col[left])), shape=(world_size, world_size))

    def _roots(self, kinds: list[_Kind]) -> list[_Root]:
        roots: list[_Root] = []
        for k in sorted(kinds, key=lambda k: (-k.table.shape[1], k.code)):
            home = next((r for r in roots if _inside(k, r.kind)), None)
            if home is not None:
                home.subs.append(k)
                continue
            s = np.sort(k.table, axis=1).astype(np.int32 if self.world < 2**31 else np.int64)
            pos = np.zeros(self.world, dtype=np.int64)
            pos[s.ravel()] = np.tile(np.arange(s.shape[1]), s.shape[0])
            roots.append(_Root(k, s, pos, []))
        return roots

    def nnz_bound(self) -> int:
        """An upper bound of the matrix's nonzeros: per rank its root rows but itself, and its other flows."""
        return int(self.rest.nnz + sum(int((r.kind.row_of >= 0).sum()) * (r.kind.table.shape[1] - 1)
                                       for r in self.roots))

    def blocks(self) -> Iterator[sp.csr_matrix]:
        """The matrix's rows (data as codes), block by block of about ``block_cells`` tile cells."""
        per_rank = sum(r.kind.table.shape[1] for r in self.roots) + self.rest.nnz / max(self.world, 1)
        step = max(1, int(self.block_cells // max(per_rank, 1)))
        for lo in range(0, self.world, step):
            yield self.block(lo, min(lo + step, self.world))

    def block(self, lo: int, hi: int) -> sp.csr_matrix:
        """CSR rows of source ranks ``[lo, hi)``, data as integer codes (:meth:`decode` gives the bytes)."""
        parts = [self._tile(root, lo, hi) for root in self.roots]
        if self.rest.nnz:
            parts.append(self.rest[lo:hi])
        if not parts:
            return sp.csr_matrix((hi - lo, self.world), dtype=np.int64)
        if len(parts) == 1:  # no addition to drop the empty cells: drop them here
            one = parts[0]
            used = one.data != 0
            kept = np.concatenate([[0], np.cumsum(used)])
            indptr = kept[one.indptr].astype(one.indptr.dtype)
            return sp.csr_matrix((one.data[used], one.indices[used], indptr), shape=one.shape)
        out = parts[0]
        for part in parts[1:]:
            out = out + part
        return out

    def decode(self, codes: np.ndarray, out: np.ndarray) -> None:
        """Bytes (float64, into ``out``) of a block's codes (overwritten): ``(code >> 8) · 2^-e``, exact."""
        np.right_shift(codes, _COUNT_BITS, out=codes)
        np.multiply(codes, 2.0**-self.bits, out=out)

    @staticmethod
    def _code(scaled: np.ndarray, terms: int) -> np.ndarray:
        """A cell's integer code: its bytes times ``2^e`` (exact), shifted, plus its number of terms."""
        return (scaled.astype(np.int64) << _COUNT_BITS) + terms

    def _tile(self, root: _Root, lo: int, hi: int) -> sp.csr_matrix:
        """The block's part of a root's kinds: per rank its whole sorted row of the root table. Cells no kind
        reaches, the rank's own among them, hold code 0: the CSR addition that merges the tiles drops them (the
        diagonal never carries a flow)."""
        k = root.kind
        ranks = np.arange(lo, hi)
        held = k.row_of[ranks] >= 0
        if not held.all():
            ranks = ranks[held]
        size = k.table.shape[1]
        at = np.full(hi - lo, -1, dtype=np.int64)
        at[ranks - lo] = np.arange(len(ranks))
        own = k.terms[ranks] > 0
        if own.all():
            codes = np.repeat(self._code(k.weight[ranks] * self.scale, 1), size).reshape(len(ranks), size)
        else:
            codes = np.zeros((len(ranks), size), dtype=np.int64)
            codes[own] = self._code(k.weight[ranks[own]] * self.scale, 1)[:, None]
        flat = codes.reshape(-1)
        for sub in root.subs:
            who = ranks[sub.terms[ranks] > 0]
            if not len(who):
                continue
            cell = at[who - lo][:, None] * size + root.sorted_pos[sub.table[sub.row_of[who]]]
            value = (self._code(sub.cells[who] * self.scale, 1) if sub.cells is not None else
                     np.broadcast_to(self._code(sub.weight[who] * self.scale, 1)[:, None], cell.shape))
            flat[cell.ravel()] += value.ravel()  # one kind reaches each cell once: no repeated index
        if root.flows is not None and root.starts is not None:
            a, b = root.starts[lo], root.starts[hi]
            src, pos, code = (x[a:b] for x in root.flows)
            flat[at[src - lo] * size + pos] += code  # one entry per cell (summed): no repeated index
        codes[np.arange(len(ranks)), root.sorted_pos[ranks]] = 0  # the rank itself (its kinds' own cells too)
        counts = np.zeros(hi - lo, dtype=np.int64)
        counts[ranks - lo] = size
        indptr = np.zeros(hi - lo + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        idx = root.sorted_rows.dtype if indptr[-1] < 2**31 else np.int64
        return sp.csr_matrix((flat, root.sorted_rows[k.row_of[ranks]].reshape(-1).astype(idx, copy=False),
                              indptr.astype(idx)), shape=(hi - lo, self.world))
