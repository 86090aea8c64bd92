"""Import real-world traces and measurements.

* :func:`ingest_trace` reads PyTorch profiler (Kineto) traces, PyTorch execution traces and AICB workloads
  (files, gzip files, folders, tar archives; format detected from the content) into one :class:`Trace`.
* :func:`ingest_to_dataset` does the same for many rank files while holding about one file in memory,
  writing a partitioned parquet dataset (one file per rank) that :func:`llmcomm.read_trace` reads.
* :func:`ingest_bandwidth` reads nccl-tests logs, vTrain all-reduce tables and AICB timings into a bandwidth
  table.

Every malformed input raises :class:`~llmcomm.errors.TraceFormatError` naming the file and the field.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from ..atomic import temp_dir_beside
from ..errors import ConfigError, TraceFormatError
from ..specs import ParallelConfig
from ..trace import META_KEY, SCHEMA_VERSION, Trace, table_to_events, validate_events
from .sources import Source, iter_sources

TRACE_FORMATS = ("kineto", "exec_trace", "aicb")
BANDWIDTH_FORMATS = ("nccl_tests", "vtrain_lut", "aicb")
PathsLike = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
ParallelLike = ParallelConfig | Mapping[str, int] | None

__all__ = ["detect_format", "ingest_bandwidth", "ingest_to_dataset", "ingest_trace", "iter_rank_tables"]


def _paths(paths: PathsLike) -> list[str | os.PathLike[str]]:
    if isinstance(paths, (str, os.PathLike)):
        return [paths]
    return list(paths)


def _names(paths: PathsLike) -> str:
    """The inputs as a message names them: ``a.json, b.json`` (not a Python list)."""
    names = [str(p) for p in _paths(paths)]
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "") or "(no paths)"


def detect_format(src: Source) -> str:
    """``kineto``, ``exec_trace``, ``aicb``, ``nccl_tests`` or ``vtrain_lut``, from the file's content."""
    from . import aicb, nccl_tests, vtrain_lut

    if not src.data.strip():
        raise TraceFormatError(f"{src.name}: empty file")
    if vtrain_lut.looks_like(src):
        return "vtrain_lut"
    if aicb.looks_like(src):
        return "aicb"
    if nccl_tests.looks_like(src):
        return "nccl_tests"
    head = src.data[:65536]
    if head.lstrip()[:1] in (b"{", b"["):
        if b'"traceEvents"' in head or b'"distributedInfo"' in head or b'"deviceProperties"' in head:
            return "kineto"
        if b'"nodes"' in head and b'"schema"' in head:
            return "exec_trace"
        from . import exec_trace, kineto
        from .sources import loads_json

        doc = loads_json(src)
        if kineto.looks_like(doc):
            return "kineto"
        if exec_trace.looks_like(doc):
            return "exec_trace"
        raise TraceFormatError(f"{src.name}: field 'traceEvents'/'nodes': JSON, but neither a profiler trace "
                               "nor an execution trace")
    raise TraceFormatError(f"{src.name}: unknown format (not Kineto/execution-trace JSON, AICB CSV, "
                           "nccl-tests output or a vTrain table)")


def iter_rank_tables(paths: PathsLike, parallel: ParallelLike = None, rank: int | None = None,
                     gpus_per_node: int = 8, *, progress: bool = False,
                     ) -> Iterator[tuple[Source, str, pa.Table, dict[str, Any]]]:
    """Each input file parsed into its events table, one at a time: ``(source, format, table, meta)``.

    ``parallel``: a ParallelConfig, a mapping of some dimensions (completed per file from what the file
    states) or None; see :mod:`llmcomm.ingest.dims`. Two files claiming the same rank raise
    :class:`TraceFormatError` naming both; a file without communication calls gives a warning with the
    count of what it holds. ``progress``: a progress bar (files read) on stderr."""
    from . import dims

    given = dims.normalize(parallel)
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ConfigError(f"rank={rank!r} must be a non-negative integer")
    sources = iter_sources(_paths(paths))
    if progress:
        from tqdm import tqdm

        sources = tqdm(sources, desc="ingest", unit=" file", leave=False)
    try:
        yield from _parse_sources(sources, given, rank, gpus_per_node)
    finally:
        if progress:
            sources.close()


def _parse_sources(sources: Iterable[Source], given: ParallelConfig | dict[str, int] | None, rank: int | None,
                   gpus_per_node: int) -> Iterator[tuple[Source, str, pa.Table, dict[str, Any]]]:
    from . import aicb, dims, exec_trace, kineto
    from .common import GroupTagger

    taggers: dict[Any, GroupTagger] = {}
    seen: dict[int, str] = {}
    for src in sources:
        fmt = detect_format(src)
        if fmt not in TRACE_FORMATS:
            raise TraceFormatError(f"{src.name}: a {fmt} bandwidth measurement, not a trace; "
                                   "read it with ingest_bandwidth (llmcomm ingest --bandwidth)")
        cfg = dims.resolve(given, src, fmt)
        key = None if cfg is None else tuple(sorted(cfg.to_dict().items()))
        if key not in taggers:  # without a config: tags from group names only
            taggers[key] = GroupTagger(cfg, gpus_per_node)
        if fmt == "kineto":
            table, meta = kineto.parse(src, taggers[key], rank)
        elif fmt == "exec_trace":
            table, meta = exec_trace.parse(src, taggers[key], rank)
        else:
            table, meta = aicb.parse(src, cfg, rank or 0, gpus_per_node)
        if cfg is not None:
            meta["parallel"] = cfg.to_dict()
        r = meta.get("rank")
        if r is not None:
            if r in seen:
                raise TraceFormatError(f"{src.name}: field 'rank': rank {r} is already claimed by {seen[r]}")
            seen[r] = src.name
        if table.num_rows == 0:
            skipped = meta.get("skipped") or {}
            also = (f"; skipped as not communication: {sum(skipped.values()):,} records "
                    f"({', '.join(sorted(skipped)[:5])})") if isinstance(skipped, dict) and skipped else ""
            warnings.warn(f"{src.name}: 0 communication calls (collectives or send/recv) in this {fmt} file{also}",
                          stacklevel=2)
        meta["format"] = fmt
        meta["file"] = src.name
        meta["bytes_read"] = src.size
        yield src, fmt, table, meta


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


def ingest_to_dataset(paths: PathsLike, out: str | os.PathLike[str], parallel: ParallelLike = None,
                      *, rank: int | None = None, gpus_per_node: int = 8, overwrite: bool = False,
                      progress: bool = False) -> Path:
    """Stream many rank files into a partitioned parquet dataset at ``out`` (one ``rank-NNNNN.parquet`` per
    input file), holding about one file in memory. Files go to a temporary folder beside ``out`` that is
    renamed into place only when every input was read, so a failure leaves nothing under ``out``."""
    import pyarrow.parquet as pq

    from ..trace import _json_default

    out = Path(out)
    if out.exists() and not overwrite:
        raise TraceFormatError(f"{out}: already exists (pass overwrite=True to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(out)  # a folder's default mode (0755 under umask 022), not mkdtemp's 0700
    try:
        n = 0
        for _src, fmt, table, meta in iter_rank_tables(paths, parallel, rank, gpus_per_node, progress=progress):
            validate_events(table, meta["file"])
            doc = {"source": "ingest", "format": fmt, "file": meta["file"], "rank": meta.get("rank"),
                   "world_size": meta.get("world_size")}
            if "parallel" in meta:
                doc["parallel"] = meta["parallel"]
            md = {META_KEY: json.dumps(doc, default=_json_default, sort_keys=True).encode(),
                  b"llmcomm.schema_version": str(SCHEMA_VERSION).encode()}
            r = meta.get("rank")
            name = f"rank-{r:05d}.parquet" if r is not None else f"part-{n:05d}.parquet"
            pq.write_table(table.replace_schema_metadata(md), tmp / name, compression="zstd")
            n += 1
        if n == 0:
            raise TraceFormatError(f"{_names(paths)}: no input files")
        if out.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, trash / "old")
            os.replace(tmp, out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def ingest_bandwidth(paths: PathsLike, op: str | None = None) -> pd.DataFrame:
    """Bandwidth measurements (nccl-tests logs, vTrain all-reduce tables, AICB timed workloads) as one table:
    ``op, bytes, count, dtype, ranks, nodes, placement, time_us, time_s, algbw, busbw, device, source``
    (bandwidths in GB/s; ``nodes`` null where the file does not say)."""
    from . import aicb, nccl_tests, vtrain_lut

    frames = []
    for src in iter_sources(_paths(paths)):
        fmt = detect_format(src)
        if fmt == "nccl_tests":
            df = nccl_tests.parse(src, nccl_tests.canonical_op(op))
        elif fmt == "vtrain_lut":
            df = vtrain_lut.parse(src)
        elif fmt == "aicb":
            df = aicb.bandwidth_rows(src)
            df = df.assign(count=None, dtype="", nodes=None, placement="out-of-place", time_s=df["time_us"] * 1e-6,
                           device="", source=src.name.rsplit("/", 1)[-1])
        else:
            raise TraceFormatError(f"{src.name}: a {fmt} trace, not a bandwidth measurement; read it with "
                                   "ingest_trace")
        df["format"] = fmt
        frames.append(df)
    if not frames:
        raise TraceFormatError(f"{_names(paths)}: no input files")
    out = pd.concat(frames, ignore_index=True)
    for c in ("ranks", "nodes", "count"):
        out[c] = pd.array(out[c], dtype="Int64")
    return out

