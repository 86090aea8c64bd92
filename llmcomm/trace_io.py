"""Trace files: read, write, metadata, manifest and routing side files, and opening a trace by name.

A trace file is one zstd parquet file (or a partitioned directory of them) whose schema is exactly
``EVENTS_SCHEMA``; its metadata dict is JSON under ``META_KEY`` in the schema metadata, beside the schema
version. Beside ``NAME.parquet`` may lie ``NAME.manifest.json`` (merged into the metadata when read) and
``NAME.routing.parquet`` (an MoE run's routing table, ``ROUTING_SCHEMA``). Every write goes through
:mod:`llmcomm.atomic` (temporary name, then rename); :func:`write_events_table` is the one writer of trace
files. :class:`llmcomm.trace.Trace` wraps what :func:`read_trace_file` returns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import atomic_path
from .errors import TraceFormatError
from .events import validate_events
from .paths import data_dir
from .vocab import EVENTS_SCHEMA, ROUTING_SCHEMA

META_KEY = b"llmcomm.meta"
SCHEMA_VERSION_KEY = b"llmcomm.schema_version"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TraceFile:
    """What a trace file holds: the checked events table (``EVENTS_SCHEMA``), its metadata (manifest
    merged in) and the routing table (``None`` when there is none)."""

    table: pa.Table
    meta: dict[str, Any]
    routing: pd.DataFrame | None


def routing_path(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".parquet") + ".routing.parquet")


def manifest_path(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".parquet") + ".manifest.json")


def json_default(o: Any) -> Any:
    """JSON form of what trace metadata may hold beyond JSON's own types: specs (``to_dict``), numpy
    scalars, sets and tuples (as lists)."""
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (set, tuple)):
        return list(o)
    raise TypeError(f"cannot store {type(o).__name__} in trace metadata")


def encode_meta(meta: Mapping[str, Any]) -> bytes:
    """Trace metadata as the JSON bytes stored under ``META_KEY`` (keys sorted, so equal metadata gives
    equal bytes)."""
    return json.dumps(dict(meta), default=json_default, sort_keys=True).encode()


def decode_meta(schema_metadata: Mapping[bytes, bytes] | None) -> dict[str, Any]:
    """The metadata dict of a parquet schema's key/value metadata (empty when there is none)."""
    raw = (schema_metadata or {}).get(META_KEY)
    return json.loads(raw) if raw else {}


def trace_metadata(meta: Mapping[str, Any]) -> dict[bytes, bytes]:
    """The parquet schema metadata of a trace file: ``meta`` (:func:`encode_meta`) and the schema version."""
    return {META_KEY: encode_meta(meta), SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()}


def write_events_table(table: pa.Table, path: str | os.PathLike[str], meta: Mapping[str, Any]) -> Path:
    """Write an events table with its metadata as one zstd parquet trace file, atomically (temporary name,
    then rename). The one writer of trace files: :meth:`Trace.write` and the streaming ingest use it."""
    path = Path(path)
    _atomic_write_parquet(table.replace_schema_metadata(trace_metadata(meta)), path)
    return path


def _atomic_write_parquet(table: pa.Table, path: Path) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def _schemas_equal(a: pa.Schema, b: pa.Schema) -> bool:
    return a.remove_metadata().equals(b.remove_metadata())




def write_trace_file(table: pa.Table, path: str | os.PathLike[str], meta: Mapping[str, Any],
                     routing: pd.DataFrame | None = None) -> Path:
    """Write an events table with ``meta`` (:func:`write_events_table`) and ``routing`` (if any) to
    ``<stem>.routing.parquet`` beside it, creating the folder; each file atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_events_table(table, path, meta)
    if routing is not None:
        _atomic_write_parquet(pa.Table.from_pandas(routing, schema=ROUTING_SCHEMA, preserve_index=False),
                              routing_path(path))
    return path


def curated_trace_path(name: str) -> Path:
    """The file of the curated trace ``name`` (``data/traces/NAME.parquet``; it may not exist)."""
    return data_dir() / "traces" / f"{name}.parquet"


def trace_file_path(name: str | os.PathLike[str]) -> Path:
    """The trace file ``name`` stands for: a curated trace name (``data/traces/NAME.parquet``) or the path of
    an existing trace file or dataset directory. Raises :class:`TraceFormatError` when it is neither."""
    curated = curated_trace_path(str(name)) if isinstance(name, str) and "/" not in name else None
    if curated is not None and curated.is_file():
        return curated
    path = Path(name)
    if path.exists():
        return path
    raise TraceFormatError(f"trace {str(name)!r} is neither a curated trace name (data/traces) nor an existing path")


def read_trace_file(path: str | os.PathLike[str]) -> TraceFile:
    """Read a trace file written by :func:`write_trace_file` (or a partitioned dataset directory of such
    files): its checked events table, metadata and routing table.

    The file's schema must equal ``EVENTS_SCHEMA`` exactly; a manifest ``<stem>.manifest.json`` beside it
    is merged into ``meta``; ``<stem>.routing.parquet`` becomes ``routing``."""
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(f"{path}: no such trace file")
    try:
        if path.is_dir():
            import pyarrow.dataset as ds

            dataset = ds.dataset(path, format="parquet")
            if not _schemas_equal(dataset.schema, EVENTS_SCHEMA):
                raise TraceFormatError(f"{path}: schema differs from the events schema:\n{dataset.schema}")
            table = dataset.to_table()
            first = sorted(path.rglob("*.parquet"))
            meta = decode_meta(pq.read_schema(first[0]).metadata) if first else {}
        else:
            schema = pq.read_schema(path)
            if not _schemas_equal(schema, EVENTS_SCHEMA):
                diff = _schema_diff(schema, EVENTS_SCHEMA)
                raise TraceFormatError(f"{path}: schema differs from the events schema: {diff}")
            table = pq.read_table(path)
            meta = decode_meta(schema.metadata)
    except TraceFormatError:
        raise
    except (pa.ArrowInvalid, OSError) as e:
        raise TraceFormatError(f"{path}: not a readable parquet trace: {e}") from None
    validate_events(table, str(path))
    mpath = manifest_path(path)
    if mpath.is_file():
        with open(mpath, encoding="utf-8") as fh:
            try:
                meta.update(json.load(fh))
            except json.JSONDecodeError as e:
                raise TraceFormatError(f"{mpath}: manifest is not valid JSON: {e}") from None
    routing = None
    rpath = routing_path(path)
    if rpath.is_file():
        routing_table = pq.read_table(rpath)
        if not _schemas_equal(routing_table.schema, ROUTING_SCHEMA):
            diff = _schema_diff(routing_table.schema, ROUTING_SCHEMA)
            raise TraceFormatError(f"{rpath}: routing schema differs: {diff}")
        routing = routing_table.to_pandas()
    return TraceFile(table, meta, routing)



def _schema_diff(got: pa.Schema, want: pa.Schema) -> str:
    g = {f.name: f for f in got}
    w = {f.name: f for f in want}
    parts = []
    for name in w:
        if name not in g:
            parts.append(f"field {name!r} missing")
        elif not g[name].equals(w[name]):
            parts.append(f"field {name!r} is {g[name].type}{'' if g[name].nullable else ' not null'}, "
                         f"expected {w[name].type}{'' if w[name].nullable else ' not null'}")
    parts += [f"field {n!r} unexpected" for n in g if n not in w]
    if not parts and got.names != want.names:
        parts.append(f"column order {got.names} != {want.names}")
    return "; ".join(parts) or "differs"
