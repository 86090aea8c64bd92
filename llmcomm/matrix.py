"""The communication matrix built block by block of source ranks, at GPU, node or rack level.

Every event yields only the flows *leaving its own rank* (see :mod:`llmcomm.flows`), so the rows of the
matrix that belong to source ranks ``[lo, hi)`` depend only on those ranks' events. The builder therefore
cuts the events table into blocks of consecutive source ranks, decomposes one block at a time into bare
``(src, dst, bytes)`` flows (no tag columns), sums them into that block's rows of the CSR matrix and
stacks the blocks: peak memory is the answer plus one block's flows, never the whole flow table.

Levels: ``"gpu"`` (rank × rank), ``"node"`` (``M_node[a, b] = Σ M[i, j]`` over ``i // g = a, j // g = b``
with ``g`` GPUs per node) and ``"rack"`` (the same with ``g · r`` GPUs per rack, ``r`` nodes per rack). A
coarser level maps each flow's ends before summing, so the GPU matrix is never built. Traffic inside a node
(rack) lands on the diagonal.

Exactness: within a block the flows keep the relative order they have in the full flow table (the events
of the block are taken in table order, each rule emits in event order), so every row sees the same
sequence of duplicates and scipy sums them in the same order: the ``"gpu"`` matrix equals
``flows_to_matrix(flows_from_table(table), n)`` bit for bit.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, get_args

import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse as sp

from .bounds import check_matrix_flows
from .errors import ConfigError, TraceFormatError
from .events import vocabulary_codes
from .flows import flow_arrays, flow_event_arrays
from .group_refs import RefEvents
from .matrix_tiles import Tiles
from .vocab import ALGORITHMS, OPS, AlgorithmName

MatrixLevel = Literal["gpu", "node", "rack"]
LEVELS: tuple[str, ...] = get_args(MatrixLevel)
BLOCK_FLOWS = 4_000_000  # group members decomposed at once (~40 bytes each in the temporaries)


def level_unit(level: MatrixLevel, gpus_per_node: int = 8, nodes_per_rack: int | None = None) -> int:
    """GPUs per matrix index at ``level``: 1, ``gpus_per_node`` or ``gpus_per_node · nodes_per_rack``."""
    if level not in LEVELS:
        raise ConfigError(f"level={level!r} is not one of {list(LEVELS)}")
    if gpus_per_node < 1:
        raise ConfigError(f"gpus_per_node={gpus_per_node} must be >= 1")
    if level == "gpu":
        return 1
    if level == "node":
        return gpus_per_node
    if nodes_per_rack is None or nodes_per_rack < 1:
        raise ConfigError(f"level='rack' needs nodes_per_rack >= 1 (got {nodes_per_rack!r})")
    return gpus_per_node * nodes_per_rack


def flows_to_matrix(flows: pd.DataFrame, world_size: int) -> sp.csr_matrix:
    """Sum flows (``src, dst, bytes``) into a sparse ``world × world`` CSR matrix (duplicates added)."""
    if len(flows) and (flows["src"].max() >= world_size or flows["dst"].max() >= world_size):
        raise TraceFormatError(f"flows reach rank {max(flows['src'].max(), flows['dst'].max())} "
                               f">= world_size={world_size}")
    m = sp.coo_matrix((flows["bytes"].to_numpy(np.float64),
                       (flows["src"].to_numpy(np.int64), flows["dst"].to_numpy(np.int64))),
                      shape=(world_size, world_size))
    return m.tocsr()


def _work_per_event(table: pa.Table | RefEvents, algorithm: AlgorithmName) -> np.ndarray:
    """Work (and memory) an event costs the decomposition: its group size (the flat group members it
    expands to, an upper bound of its flows under either algorithm), at least 1. With referenced groups
    under the ring algorithm only all-to-alls expand; every other row costs one flow."""
    if isinstance(table, RefEvents):
        sizes = np.maximum(table.refs.sizes(), 1)
        if algorithm == "ring":
            a2a = vocabulary_codes(table.column("op"), OPS) == OPS.index("all_to_all")
            sizes = np.where(a2a, sizes, 1)
        return sizes
    if table.num_rows == 0:
        return np.zeros(0, np.int64)
    col = table.column("group")
    lens = np.concatenate([np.diff(c.offsets.to_numpy()) for c in col.chunks]) if col.num_chunks else \
        np.zeros(0, np.int64)
    return np.maximum(lens.astype(np.int64), 1)


def blocks(rank: np.ndarray, weight: np.ndarray, world_size: int, unit: int,
           block_flows: int = BLOCK_FLOWS) -> list[tuple[int, int]]:
    """Cut ``[0, world_size)`` into rank ranges ``[lo, hi)`` aligned to ``unit`` whose events weigh at most
    ``block_flows`` in all (a single unit may exceed it)."""
    n_units = -(-world_size // unit)
    per_unit = np.bincount(rank // unit, weights=weight, minlength=n_units)[:n_units]
    cum = np.concatenate([[0.0], np.cumsum(per_unit)])
    out, u = [], 0
    while u < n_units:
        v = int(np.searchsorted(cum, cum[u] + block_flows, side="right")) - 1
        v = min(max(v, u + 1), n_units)
        out.append((u * unit, min(v * unit, world_size)))
        u = v
    return out


def matrix_from_table(table: pa.Table | RefEvents, world_size: int, algorithm: AlgorithmName = "direct", *, level: MatrixLevel = "gpu",
                      gpus_per_node: int = 8, nodes_per_rack: int | None = None,
                      block_flows: int = BLOCK_FLOWS, tiled: bool = True) -> sp.csr_matrix:
    """Sparse CSR matrix of bytes from source (row) to destination (column) at ``level``, built one block
    of source ranks at a time (see the module doc). Shape ``(k, k)`` with ``k = ceil(world_size / unit)``.
    ``table`` may hold its groups as references (:class:`llmcomm.group_refs.RefEvents`, a prediction):
    the flows then come from the references (:func:`llmcomm.flows.flow_arrays`), equal to the list path's."""
    if algorithm not in ALGORITHMS:
        raise TraceFormatError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}")
    unit = level_unit(level, gpus_per_node, nodes_per_rack)
    k = -(-world_size // unit)
    rank = table.column("rank").to_numpy().astype(np.int64) if table.num_rows else np.zeros(0, np.int64)
    if len(rank) and (rank.min() < 0 or rank.max() >= world_size):
        raise TraceFormatError(f"events reach rank {int(rank.max())} >= world_size={world_size}")
    weight = _work_per_event(table, algorithm)
    check_matrix_flows(int(weight.sum()), algorithm=algorithm, world_size=world_size)
    sorted_ranks = bool(np.all(rank[1:] >= rank[:-1])) if len(rank) else True
    order = None if sorted_ranks else np.argsort(rank, kind="stable")
    srank = rank if order is None else rank[order]
    indptr_parts = [np.zeros(1, np.int64)]
    # sum(weight) bounds the flows and so the nonzeros: 32-bit indices when both it and k fit
    idx_dtype = np.int32 if weight.sum() < 2**31 and k < 2**31 else np.int64
    tiles = (Tiles(table, world_size) if tiled and isinstance(table, RefEvents) and algorithm == "direct"
             and unit == 1 else None)
    if tiles is not None and tiles.ok:
        parts = tiles.blocks()
        capacity = tiles.nnz_bound()  # allocated once (untouched pages cost nothing), never regrown
    else:
        capacity = 0
        parts = (_general_block(table, srank, order, algorithm, lo, hi, unit, k, world_size)
                 for lo, hi in blocks(rank, weight, world_size, unit, block_flows))
    indices, data = _Growing(idx_dtype, capacity), _Growing(np.float64, capacity)
    nnz = 0
    for blk in parts:
        indptr_parts.append(blk.indptr[1:].astype(np.int64) + nnz)
        indices.extend(blk.indices)
        if tiles is not None and tiles.ok:  # integer codes, decoded straight into the answer
            tiles.decode(blk.data, data.slot(blk.nnz))
        else:
            data.extend(blk.data)
        nnz += blk.nnz
        del blk
    indptr = np.concatenate(indptr_parts).astype(idx_dtype, copy=False)
    return sp.csr_matrix((data.array(), indices.array(), indptr), shape=(k, k), copy=False)


def stacked_matrix(table: pa.Table | RefEvents, world_size: int, algorithm: AlgorithmName, key: np.ndarray,
                   n_keys: int) -> sp.csr_matrix:
    """The GPU matrices of the events of each ``key`` (per row, ``0 <= key < n_keys``) stacked: row
    ``key · world + src``, shape ``(n_keys · world, world)``, from one decomposition of ``table``. Block ``q``
    equals ``matrix_from_table(rows with key q, world_size, algorithm, tiled=False)`` bit for bit: each row of
    the stack sees the flows of its source rank and key in the same order as that builder's (flows keep their
    rule-then-row order under any selection of rows), so scipy sums the same sequences. One shot, so bounded
    by :data:`BLOCK_FLOWS` times 8 expanded flows (callers use it for ring matrices, O(rows))."""
    if algorithm not in ALGORITHMS:
        raise TraceFormatError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}")
    rank = table.column("rank").to_numpy().astype(np.int64) if table.num_rows else np.zeros(0, np.int64)
    if len(rank) and (rank.min() < 0 or rank.max() >= world_size):
        raise TraceFormatError(f"events reach rank {int(rank.max())} >= world_size={world_size}")
    flows = int(_work_per_event(table, algorithm).sum())
    check_matrix_flows(flows, algorithm=algorithm, world_size=world_size)
    if flows > 8 * BLOCK_FLOWS:
        raise ConfigError(f"stacked_matrix expands {flows:,} flows at once, above {8 * BLOCK_FLOWS:,}: build one "
                          "matrix per key with matrix_from_table (blocked)")
    src, dst, byt, row = flow_event_arrays(table, algorithm)
    if len(dst) and (dst.max() >= world_size or dst.min() < 0):
        raise TraceFormatError(f"flows reach rank {int(dst.max())} >= world_size={world_size}")
    stack = np.asarray(key, dtype=np.int64)[row] * world_size + src
    return sp.coo_matrix((byt, (stack, dst)), shape=(n_keys * world_size, world_size)).tocsr()


def _general_block(table: pa.Table | RefEvents, srank: np.ndarray, order: np.ndarray | None, algorithm: AlgorithmName,
                   lo: int, hi: int, unit: int, k: int, world_size: int) -> sp.csr_matrix:
    """Rows of source ranks ``[lo, hi)`` by the general path: their events' flows (``srank``: the events' ranks in
    ``order``, ascending), then one COO -> CSR (duplicates summed)."""
    a, b = np.searchsorted(srank, [lo, hi])
    if order is None:
        part = table.slice(int(a), int(b - a))
    else:  # ascending event indices keep the table's order inside the block
        part = table.take(np.sort(order[a:b]))
    src, dst, byt = flow_arrays(part, algorithm)
    if len(dst) and (dst.max() >= world_size or dst.min() < 0):
        raise TraceFormatError(f"flows reach rank {int(dst.max())} >= world_size={world_size}")
    n_rows = (hi - lo + unit - 1) // unit
    if unit > 1:
        src, dst = src // unit, dst // unit
    return sp.coo_matrix((byt, (src - lo // unit, dst)), shape=(n_rows, k)).tocsr()


class _Growing:
    """A 1-d array grown in place (``ndarray.resize``: realloc, which moves large buffers by remapping
    pages rather than copying), so the blocks never exist twice, as a list + concatenate would."""

    def __init__(self, dtype: type, capacity: int = 0) -> None:
        self.buf: np.ndarray = np.zeros(capacity, dtype)
        self.n = 0

    def slot(self, k: int) -> np.ndarray:
        """The next ``k`` elements (a view), for the caller to fill."""
        m = self.n + k
        if m > len(self.buf):
            self.buf.resize(max(m, int(len(self.buf) * 1.25)), refcheck=False)
        view = self.buf[self.n:m]
        self.n = m
        return view

    def extend(self, values: np.ndarray) -> None:
        self.slot(len(values))[:] = values

    def array(self) -> np.ndarray:
        self.buf.resize(self.n, refcheck=False)
        return self.buf


class _MatrixSource(Protocol):
    """What :func:`binned_flows` needs of a trace (:class:`llmcomm.trace.Trace` has it)."""

    @property
    def world_size(self) -> int: ...

    def matrix(self, algorithm: AlgorithmName = ..., world_size: int | None = ..., **kwargs: Any) -> sp.csr_matrix: ...


def binned_flows(trace: _MatrixSource, algorithm: AlgorithmName = "direct", max_cells: int = 512) -> pd.DataFrame:
    """Flows summed over blocks of ``k = ceil(world / max_cells)`` consecutive ranks, as tidy
    ``src, dst, bytes`` with ``src``/``dst`` the first rank of each block: what :func:`llmcomm.plots.comm_matrix`
    draws (it bins by the same ``k``), built by the blocked builder at that level, so a 131,072-GPU job is drawn
    from a 256 × 256 sum, never from its flow table."""
    n = trace.world_size
    k = max(1, -(-n // max_cells))
    m = trace.matrix(algorithm, level="node", gpus_per_node=k).tocoo() if k > 1 else trace.matrix(algorithm).tocoo()
    return pd.DataFrame({"src": m.row.astype(np.int64) * k, "dst": m.col.astype(np.int64) * k, "bytes": m.data})
