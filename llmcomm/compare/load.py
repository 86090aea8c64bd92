"""A trace to compare, by what a user has: a curated trace's name, a file of the external-data manifest, or a
path to any trace llmcomm reads."""

from __future__ import annotations

from pathlib import Path

from .. import data
from ..errors import ConfigError
from ..ingest import ingest_trace
from ..trace import Trace, curated_trace_path, read_trace


def load_measured(source: str) -> Trace:
    """A trace to compare, by what a user has: a curated trace's name (``"gpt_tp2pp2dp2"``), a file of the
    external-data manifest (``"aicb/A100_example.csv"``), or a path to any trace file or folder llmcomm reads
    (``.parquet`` written by llmcomm, a dataset folder written by ``llmcomm ingest`` — read as
    :func:`llmcomm.read_trace` reads it — or a format :func:`llmcomm.ingest_trace` detects)."""
    curated = curated_trace_path(source)
    if curated.is_file():
        return _named(read_trace(curated), source)

    if source in data.entries():
        return _named(ingest_trace(data.path(source)), source)
    p = Path(source)
    if p.is_dir() and next(p.rglob("*.parquet"), None) is not None:  # a dataset folder (llmcomm ingest --out DIR)
        return _named(read_trace(p), p.name)
    if not p.exists():
        raise ConfigError(f"trace {source!r} is neither a curated trace name (data/traces), a file of the "
                          "external-data manifest (data/external.yaml) nor an existing path")
    if p.suffix == ".parquet" and p.is_file():
        return _named(read_trace(p), p.name)
    return _named(ingest_trace(p), p.name)


def _named(trace: Trace, name: str) -> Trace:
    trace.meta.setdefault("trace_name", name)
    return trace
