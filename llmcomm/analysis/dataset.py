"""Analyses over a partitioned dataset (one parquet file per rank, as :func:`llmcomm.ingest.ingest_to_dataset`
writes), out of core: one rank file at a time per worker, serially or on Dask
(:func:`llmcomm.ingest.parallel.map_tasks`), with the same results as the in-memory path on
``read_trace(dataset)``:

* :func:`dataset_volumes` — ``Trace.volumes``: per-file sums of ``bytes × count`` and calls, summed again;
* :func:`dataset_matrix` — ``Trace.matrix``: every event yields only the flows leaving its own rank, so a
  file's events give exactly the rows of its ranks; the per-file CSR rows are stacked, never the flows.
  At ``level="gpu"`` the result equals the in-memory matrix bit for bit (each row sums the same flows in
  the same order); at node / rack level rows of one node come from several files and are summed in file
  order, equal up to floating-point rounding;
* :func:`dataset_rank_summary` — :func:`rank_summary` per rank (calls, bytes, iterations, time span, busy
  time);
* :func:`dataset_repeatability` — :func:`llmcomm.analysis.repeatability.repeatability` (per rank by definition).

Memory in this process: the answer plus one file's partial result per task; each worker holds one file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq
import scipy.sparse as sp

from ..errors import TraceFormatError
from ..ingest.parallel import map_tasks
from ..matrix import MatrixLevel
from ..trace import decode_meta, read_trace
from ..vocab import EVENTS_SCHEMA, AlgorithmName
from .repeatability import SEQUENCE_COLUMNS, repeatability

PathLike = str | os.PathLike[str]


def rank_files(dataset: PathLike) -> list[Path]:
    """The dataset's parquet files in name order (``*.routing.parquet`` excluded)."""
    d = Path(dataset)
    if not d.is_dir():
        raise TraceFormatError(f"{d}: not a dataset folder")
    files = sorted(p for p in d.rglob("*.parquet") if not p.name.endswith(".routing.parquet"))
    if not files:
        raise TraceFormatError(f"{d}: dataset holds no parquet files")
    return files


def dataset_world_size(dataset: PathLike) -> int:
    """``world_size`` recorded in the files' metadata, else one more than the highest rank in any file's
    ``rank``, ``peer`` or ``group`` (only those three columns are read)."""
    hi = -1
    for f in rank_files(dataset):
        schema = pq.read_schema(f)
        w = decode_meta(schema.metadata).get("world_size")
        if w:
            return int(w)
        if not schema.remove_metadata().equals(EVENTS_SCHEMA):
            read_trace(f)  # not an events file: raises the reader's TraceFormatError, which says why
        hi = max(hi, _highest_rank(f))
    return hi + 1


def _highest_rank(path: Path) -> int:
    """The highest rank in a file's ``rank``, ``peer`` and ``group`` columns (-1 when it has no rows), as
    :attr:`Trace.world_size` counts them."""
    table = pq.read_table(path, columns=["rank", "peer", "group"])
    if table.num_rows == 0:
        return -1
    members = pc.list_flatten(table["group"])
    return max(pc.max(table["rank"]).as_py(), pc.max(table["peer"]).as_py(),
               pc.max(members).as_py() if len(members) else -1)


def _file_volumes(path: str, by: tuple[str, ...], sent_only: bool) -> pd.DataFrame:
    return read_trace(path).volumes(by, sent_only=sent_only)


def dataset_volumes(dataset: PathLike, by: Sequence[str] = ("parallelism",), sent_only: bool = False, *,
                    workers: int | None = None, scheduler: str | None = None) -> pd.DataFrame:
    """``read_trace(dataset).volumes(by, sent_only=...)`` one file at a time."""
    by = tuple(by)
    parts = map_tasks(partial(_file_volumes, by=by, sent_only=sent_only), [str(f) for f in rank_files(dataset)],
                      workers=workers, scheduler=scheduler)
    df = pd.concat(parts, ignore_index=True)
    if not by:
        return pd.DataFrame({"bytes": [int(df["bytes"].sum())], "calls": [int(df["calls"].sum())]})
    out = df.groupby(list(by), sort=True, observed=True)[["bytes", "calls"]].sum().reset_index()
    return out.astype({"bytes": np.int64, "calls": np.int64})


def _file_matrix(path: str, algorithm: AlgorithmName, world_size: int, level: MatrixLevel, gpus_per_node: int,
                 nodes_per_rack: int | None, filters: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = read_trace(path)
    m = t.matrix(algorithm, world_size, level=level, gpus_per_node=gpus_per_node, nodes_per_rack=nodes_per_rack,
                 **filters).tocoo()
    return m.row.astype(np.int64), m.col.astype(np.int64), m.data


def dataset_matrix(dataset: PathLike, algorithm: AlgorithmName = "direct", world_size: int | None = None, *,
                   level: MatrixLevel = "gpu", gpus_per_node: int = 8, nodes_per_rack: int | None = None,
                   workers: int | None = None, scheduler: str | None = None, **filters: Any) -> sp.csr_matrix:
    """``read_trace(dataset).matrix(algorithm, ...)`` built one rank file at a time (see the module doc)."""
    from ..matrix import level_unit

    n = world_size or dataset_world_size(dataset)
    unit = level_unit(level, gpus_per_node, nodes_per_rack)
    k = -(-n // unit)
    fn = partial(_file_matrix, algorithm=algorithm, world_size=n, level=level, gpus_per_node=gpus_per_node,
                 nodes_per_rack=nodes_per_rack, filters=filters)
    acc = _MatrixSum(k)
    map_tasks(fn, [str(f) for f in rank_files(dataset)], workers=workers, scheduler=scheduler, on_result=acc.add)
    return acc.result()


class _MatrixSum:
    """Sums per-file COO parts into a ``k × k`` CSR as they arrive: parts wait in a pile until it holds
    as many nonzeros as the running sum, then the pile is added in. Memory stays a small multiple of the
    answer plus one file's part. At GPU level the files' rows are disjoint, so no two values are ever
    added and the result is exact."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.total = sp.csr_matrix((k, k))
        self.pile: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.pile_nnz = 0

    def add(self, part: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        idx = np.int32 if self.k < 2**31 else np.int64
        self.pile.append((part[0].astype(idx), part[1].astype(idx), part[2]))
        self.pile_nnz += len(part[2])
        if self.pile_nnz >= max(self.total.nnz, 1_000_000):
            self._flush()

    def _flush(self) -> None:
        if not self.pile:
            return
        rows, cols, data = (np.concatenate(x) for x in zip(*self.pile, strict=True))
        self.pile, self.pile_nnz = [], 0
        block = sp.coo_matrix((data, (rows, cols)), shape=(self.k, self.k)).tocsr()
        del rows, cols, data
        self.total = block if self.total.nnz == 0 else self.total + block

    def result(self) -> sp.csr_matrix:
        self._flush()
        return self.total.tocsr()


def rank_summary(events: pd.DataFrame) -> pd.DataFrame:
    """Per rank: ``events`` (rows), ``calls`` (Σ count), ``bytes`` (Σ bytes × count, recv included),
    ``sent_bytes`` (recv left out), ``iterations`` (distinct), ``t_first_ns``/``t_last_ns`` (first start,
    last end; null when untimed) and ``busy_ns`` (Σ t_end − t_start over timed calls)."""
    e = events
    cnt = e["count"].to_numpy(np.int64)
    b = e["bytes"].to_numpy(np.int64) * cnt
    dur = (e["t_end_ns"] - e["t_start_ns"]).astype("Int64")
    df = pd.DataFrame({"rank": e["rank"].to_numpy(np.int64), "calls": cnt, "bytes": b,
                       "sent_bytes": np.where(e["op"].to_numpy() == "recv", 0, b),
                       "iteration": e["iteration"].to_numpy(np.int64), "t_start_ns": e["t_start_ns"],
                       "t_end_ns": e["t_end_ns"], "busy_ns": dur})
    g = df.groupby("rank", sort=True)
    out = pd.DataFrame({"events": g.size(), "calls": g["calls"].sum(), "bytes": g["bytes"].sum(),
                        "sent_bytes": g["sent_bytes"].sum(), "iterations": g["iteration"].nunique(),
                        "t_first_ns": g["t_start_ns"].min(), "t_last_ns": g["t_end_ns"].max(),
                        "busy_ns": g["busy_ns"].sum(min_count=1)})
    return out.reset_index()


def _file_rank_summary(path: str) -> pd.DataFrame:
    return rank_summary(read_trace(path).events)


def dataset_rank_summary(dataset: PathLike, *, workers: int | None = None,
                         scheduler: str | None = None) -> pd.DataFrame:
    """:func:`rank_summary` of the whole dataset, one file at a time (a rank split over several files is
    refused: its per-file summaries would not add up to the rank's)."""
    parts = map_tasks(_file_rank_summary, [str(f) for f in rank_files(dataset)], workers=workers,
                      scheduler=scheduler)
    df = pd.concat(parts, ignore_index=True)
    dup = df["rank"].duplicated()
    if dup.any():
        raise TraceFormatError(f"{dataset}: field 'rank': rank {int(df['rank'][dup].iloc[0])} appears in "
                               "several files")
    return df.sort_values("rank", kind="stable").reset_index(drop=True)


def _file_repeatability(path: str, reference_iteration: int, columns: tuple[str, ...]) -> pd.DataFrame:
    return repeatability(read_trace(path).events, reference_iteration, columns)


def dataset_repeatability(dataset: PathLike, reference_iteration: int = 1, columns: Sequence[str] | None = None,
                          *, workers: int | None = None, scheduler: str | None = None) -> pd.DataFrame:
    """:func:`llmcomm.analysis.repeatability.repeatability` of the whole dataset, one rank file at a time."""
    fn = partial(_file_repeatability, reference_iteration=reference_iteration,
                 columns=tuple(SEQUENCE_COLUMNS if columns is None else columns))
    parts = [p for p in map_tasks(fn, [str(f) for f in rank_files(dataset)], workers=workers, scheduler=scheduler)
             if len(p)]
    if not parts:
        return pd.DataFrame(columns=["rank", "iteration", "calls", "identical", "position_match"])
    return pd.concat(parts, ignore_index=True).sort_values(["rank", "iteration"], kind="stable",
                                                           ignore_index=True)
