"""Import real-world traces and measurements.

* :func:`ingest_trace` reads PyTorch profiler (Kineto) traces, PyTorch execution traces and AICB workloads
  (files, gzip files, folders, tar archives; format detected from the content) into one :class:`Trace`.
* :func:`ingest_to_dataset` does the same for many rank files while holding about one file in memory,
  writing a partitioned parquet dataset (one file per rank) that :func:`llmcomm.read_trace` reads.
* :func:`ingest_bandwidth` reads nccl-tests logs, vTrain all-reduce tables and AICB timings into a bandwidth
  table.

Each format is one reader (:mod:`llmcomm.ingest.readers`: ``looks_like(source)``, ``read(source, context)``)
in a registry; detection and dispatch loop over it, and :func:`register_reader` adds a format from outside
the package. Every malformed input raises :class:`~llmcomm.errors.TraceFormatError` naming the file and the
field.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from ..atomic import atomic_dir
from ..errors import ConfigError, TraceFormatError
from ..specs import ParallelConfig
from ..trace import (
    EVENTS_SCHEMA,
    Trace,
    table_to_events,
    validate_events,
    write_events_table,
)
from . import aicb, exec_trace, kineto, nccl_tests, vtrain_lut
from .nccl_tests import BANDWIDTH_COLUMNS
from .readers import (
    FunctionReader,
    ReadContext,
    Reader,
    TraceTable,
    detect_format,
    reader_for,
    register_reader,
    registered_readers,
    unregister_reader,
)
from .sources import Source, iter_sources

# the built-in formats (``registered_readers()`` lists them); detection asks in this order: the text
# formats with fixed headers first, then JSON
for _reader in (vtrain_lut.READER, *aicb.READERS, nccl_tests.READER, kineto.READER, exec_trace.READER):
    register_reader(_reader)
del _reader
PathsLike = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
ParallelLike = ParallelConfig | Mapping[str, int] | None

__all__ = ["FunctionReader", "ReadContext", "Reader", "Source", "TraceTable", "detect_format", "ingest_bandwidth",
           "ingest_to_dataset", "ingest_trace", "iter_rank_tables", "register_reader", "registered_readers",
           "unregister_reader"]


def _paths(paths: PathsLike) -> list[str | os.PathLike[str]]:
    if isinstance(paths, (str, os.PathLike)):
        return [paths]
    return list(paths)


def _names(paths: PathsLike) -> str:
    """The inputs as a message names them: ``a.json, b.json`` (not a Python list)."""
    names = [str(p) for p in _paths(paths)]
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "") or "(no paths)"


def iter_rank_tables(paths: PathsLike, parallel: ParallelLike = None, rank: int | None = None,
                     gpus_per_node: int = 8, *, progress: bool = False,
                     ) -> Iterator[tuple[Source, str, pa.Table, dict[str, Any]]]:
    """Each input file parsed into its events table by the reader of its format, one at a time:
    ``(source, format, table, meta)``.

    ``parallel``: a ParallelConfig, a mapping of some dimensions (completed per file from what the file
    states) or None; see :mod:`llmcomm.ingest.dims`. Two files claiming the same rank raise
    :class:`TraceFormatError` naming both; a file without communication calls gives a warning with the
    count of what it holds. ``progress``: a progress bar (files read) on stderr."""
    from . import dims

    given = dims.normalize(parallel)
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ConfigError(f"rank={rank!r} must be a non-negative integer")
    sources: Iterable[Source] = iter_sources(_paths(paths))
    if progress:
        from tqdm import tqdm

        sources = tqdm(sources, desc="ingest", unit=" file", leave=False)
    try:
        yield from _read_sources(sources, given, rank, gpus_per_node)
    finally:
        if progress:
            sources.close()  # type: ignore[attr-defined]


def _read_sources(sources: Iterable[Source], given: ParallelConfig | dict[str, int] | None, rank: int | None,
                  gpus_per_node: int) -> Iterator[tuple[Source, str, pa.Table, dict[str, Any]]]:
    from . import dims

    contexts: dict[Any, ReadContext] = {}  # one per configuration (its group tagger is built once)
    file_of_rank: dict[int, str] = {}
    for src in sources:
        reader = reader_for(src, "trace")
        cfg = dims.resolve(given, src, reader.name)
        key = cfg  # a frozen ParallelConfig (or None): one context per configuration
        if key not in contexts:  # without a config: groups tagged from names only
            contexts[key] = ReadContext(cfg, rank, gpus_per_node)
        table, meta = _checked_trace_table(reader, src, reader.read(src, contexts[key]))
        if cfg is not None:
            meta["parallel"] = cfg.to_dict()
        claimed = meta.get("rank")
        if claimed is not None:
            if claimed in file_of_rank:
                raise TraceFormatError(f"{src.name}: field 'rank': rank {claimed} is already claimed by "
                                       f"{file_of_rank[claimed]}")
            file_of_rank[claimed] = src.name
        if table.num_rows == 0:
            skipped = meta.get("skipped") or {}
            also = (f"; skipped as not communication: {sum(skipped.values()):,} records "
                    f"({', '.join(sorted(skipped)[:5])})") if isinstance(skipped, dict) and skipped else ""
            warnings.warn(f"{src.name}: 0 communication calls (collectives or send/recv) in this {reader.name} "
                          f"file{also}", stacklevel=3)
        meta["format"] = reader.name
        meta["file"] = src.name
        meta["bytes_read"] = src.size
        yield src, reader.name, table, meta


def _checked_trace_table(reader: Reader, src: Source, result: Any) -> TraceTable:
    """A trace reader's result, checked to be an events table in :data:`EVENTS_SCHEMA` and a metadata dict
    (a reader from outside the package gets a clear error instead of a failure further on)."""
    try:
        table, meta = result
    except (TypeError, ValueError):
        raise TraceFormatError(f"{src.name}: reader {reader.name!r} returned {type(result).__name__}, not a "
                               "TraceTable(events, meta)") from None
    if not isinstance(table, pa.Table) or not table.schema.equals(EVENTS_SCHEMA):
        raise TraceFormatError(f"{src.name}: reader {reader.name!r} returned events that are not an Arrow table "
                               "in EVENTS_SCHEMA (build it with llmcomm.trace.events_to_table)")
    if not isinstance(meta, dict):
        raise TraceFormatError(f"{src.name}: reader {reader.name!r} returned meta of type {type(meta).__name__}, "
                               "not a dict")
    return TraceTable(table, meta)


def _checked_bandwidth_table(reader: Reader, src: Source, frame: Any) -> pd.DataFrame:
    """A bandwidth reader's result, checked to be a DataFrame with every bandwidth column."""
    missing = ([] if isinstance(frame, pd.DataFrame) else ["(not a DataFrame)"]) or \
        [c for c in BANDWIDTH_COLUMNS if c not in frame.columns]
    if missing:
        raise TraceFormatError(f"{src.name}: reader {reader.name!r} returned a bandwidth table without "
                               f"{', '.join(missing)}")
    return frame


def _summary_meta(metas: list[dict[str, Any]]) -> dict[str, Any]:
    worlds = [m["world_size"] for m in metas if m.get("world_size")]
    meta: dict[str, Any] = {
        "source": "ingest",
        "formats": sorted({m["format"] for m in metas}),
        "files": [m["file"] for m in metas] if len(metas) <= 64 else len(metas),
        "ranks": sorted(m["rank"] for m in metas if m.get("rank") is not None),
    }
    if worlds:
        meta["world_size"] = max(worlds)
    if any("parallel" in m for m in metas):  # as resolved per file (llmcomm.ingest.dims)
        meta["parallel"] = next(m["parallel"] for m in metas if "parallel" in m)
    notes = sorted({a for m in metas for a in m.get("assumptions", [])})
    if notes:
        meta["assumptions"] = notes
    if len(metas) <= 64:
        meta["per_file"] = [{k: v for k, v in m.items() if k not in ("parallel",)} for m in metas]
    return meta


def ingest_trace(paths: PathsLike, parallel: ParallelLike = None, *, rank: int | None = None,
                 gpus_per_node: int = 8, progress: bool = False) -> Trace:
    """Read trace files (Kineto, execution trace, AICB; plain, gzip, folders or tar archives) into one Trace.

    ``parallel`` (a ParallelConfig or a mapping of some dimensions, see :mod:`llmcomm.ingest.dims`) lets
    unnamed process groups be tagged with their parallelism by their ranks (see :mod:`llmcomm.ingest.common`);
    ``rank`` names the rank of a single file that does not say it; ``progress`` shows a progress bar."""
    tables, metas = [], []
    for _src, _fmt, table, meta in iter_rank_tables(paths, parallel, rank, gpus_per_node, progress=progress):
        tables.append(table)
        metas.append(meta)
    if not tables:
        raise TraceFormatError(f"{_names(paths)}: no input files")
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    origin = ", ".join(str(p) for p in _paths(paths))[:200]
    validate_events(table, origin)
    return Trace(table_to_events(table), _summary_meta(metas))


def write_rank_file(path: Path, fmt: str, table: pa.Table, meta: dict[str, Any]) -> None:
    """One rank's events as a file of a dataset folder, written by :func:`llmcomm.trace.write_events_table`
    with metadata saying where it came from (format, file, rank, world size, parallel configuration)."""
    validate_events(table, meta["file"])
    doc = {"source": "ingest", "format": fmt, "file": meta["file"], "rank": meta.get("rank"),
           "world_size": meta.get("world_size")}
    if "parallel" in meta:
        doc["parallel"] = meta["parallel"]
    write_events_table(table, path, doc)


def ingest_to_dataset(paths: PathsLike, out: str | os.PathLike[str], parallel: ParallelLike = None,
                      *, rank: int | None = None, gpus_per_node: int = 8, overwrite: bool = False,
                      progress: bool = False) -> Path:
    """Stream many rank files into a partitioned parquet dataset at ``out`` (one ``rank-NNNNN.parquet`` per
    input file), holding about one file in memory. Files go to a temporary folder beside ``out`` that is
    renamed into place only when every input was read, so a failure leaves nothing under ``out``."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise TraceFormatError(f"{out}: already exists (pass overwrite=True to replace it)")
    with atomic_dir(out, overwrite=overwrite) as tmp:
        files = 0
        for _src, fmt, table, meta in iter_rank_tables(paths, parallel, rank, gpus_per_node, progress=progress):
            file_rank = meta.get("rank")
            name = f"rank-{file_rank:05d}.parquet" if file_rank is not None else f"part-{files:05d}.parquet"
            write_rank_file(tmp / name, fmt, table, meta)
            files += 1
        if files == 0:
            raise TraceFormatError(f"{_names(paths)}: no input files")
    return out


def ingest_bandwidth(paths: PathsLike, op: str | None = None) -> pd.DataFrame:
    """Bandwidth measurements (nccl-tests logs, vTrain all-reduce tables, AICB timed workloads) as one table:
    ``op, bytes, count, dtype, ranks, nodes, placement, time_us, time_s, algbw, busbw, device, source``
    (bandwidths in GB/s; ``nodes`` null where the file does not say). ``op`` names the collective of
    nccl-tests logs that do not."""
    context = ReadContext(op=op)
    frames = []
    for src in iter_sources(_paths(paths)):
        reader = reader_for(src, "bandwidth")
        frame = _checked_bandwidth_table(reader, src, reader.read(src, context))
        frame["format"] = reader.name
        frames.append(frame)
    if not frames:
        raise TraceFormatError(f"{_names(paths)}: no input files")
    out = pd.concat(frames, ignore_index=True)
    for c in ("ranks", "nodes", "count"):
        out[c] = pd.array(out[c], dtype="Int64")
    return out

