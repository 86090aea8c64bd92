"""The reader protocol and the registry that format detection and dispatch loop over.

A *reader* turns one :class:`~llmcomm.ingest.sources.Source` (a file's name and bytes) of one format into a
table. Every reader has the same four members:

* ``name`` — the format's name, recorded in the trace metadata (``meta['format']``) and the bandwidth
  table's ``format`` column;
* ``kind`` — ``"trace"`` (the result is a :class:`TraceTable`: an events table in
  :data:`~llmcomm.trace.EVENTS_SCHEMA` and a metadata dict) or ``"bandwidth"`` (a DataFrame with
  :data:`~llmcomm.ingest.nccl_tests.BANDWIDTH_COLUMNS`);
* ``looks_like(source) -> bool`` — whether the content is of this format (cheap; never raises for
  content of another format);
* ``read(source, context) -> table`` — the table; malformed content raises
  :class:`~llmcomm.errors.TraceFormatError` naming the file, the field and the rule.

``context`` (:class:`ReadContext`) is what the caller knows beyond the file: the job's
:class:`~llmcomm.specs.ParallelConfig` (to tag unnamed process groups by their ranks, or to place one
rank's view), the rank of a file that does not say it, GPUs per node, and the collective of a bandwidth log
that does not name it. Every reader receives the same context and uses what applies to it.

Detection asks the registered readers in order; the first whose ``looks_like`` is true names the format.
:func:`register_reader` adds a reader for a new format without editing the package — any object with the
four members will do (a class, a module), e.g.
``register_reader(FunctionReader("myformat", "trace", looks_like, read))``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from ..errors import ConfigError, TraceFormatError
from .sources import Source

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from ..specs import ParallelConfig
    from .common import GroupTagger

KINDS = ("trace", "bandwidth")


class TraceTable(NamedTuple):
    """What a trace reader returns: the events of the file's rank and what the file said about itself
    (``rank``, ``world_size``, ...; ingest adds ``format``, ``file`` and ``bytes_read``)."""

    events: pa.Table
    meta: dict[str, Any]


@dataclass(frozen=True)
class ReadContext:
    """What the caller knows beyond the file, the same for every reader (see the module docstring)."""

    parallel: ParallelConfig | None = None
    rank: int | None = None
    gpus_per_node: int = 8
    op: str | None = None

    @functools.cached_property
    def tagger(self) -> GroupTagger:
        """The process-group tagger of :attr:`parallel` (names only when it is None), built once."""
        from .common import GroupTagger

        return GroupTagger(self.parallel, self.gpus_per_node)


@runtime_checkable
class Reader(Protocol):
    """The reader protocol (see the module docstring)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    def looks_like(self, source: Source) -> bool: ...

    def read(self, source: Source, context: ReadContext) -> TraceTable | pd.DataFrame: ...


@dataclass(frozen=True)
class FunctionReader:
    """A reader made of two functions (the form the built-in readers take)."""

    name: str
    kind: str
    looks_like: Callable[[Source], bool]
    read: Callable[[Source, ReadContext], Any]


_REGISTRY: list[Reader] = []


def register_reader(reader: Reader, *, before: str | None = None) -> Reader:
    """Add ``reader`` to the registry, last (or just before the first reader named ``before``, so that it is
    asked first). A reader with the same ``name`` and ``kind`` is replaced. Returns ``reader``."""
    missing = [m for m in ("name", "kind", "looks_like", "read") if not hasattr(reader, m)]
    if missing:
        raise ConfigError(f"register_reader: {reader!r} lacks {', '.join(missing)} (a reader has name, kind, "
                          "looks_like(source) and read(source, context))")
    if reader.kind not in KINDS:
        raise ConfigError(f"register_reader: reader {reader.name!r}: kind {reader.kind!r} is not one of {KINDS}")
    unregister_reader(reader.name, reader.kind)
    names = [r.name for r in _REGISTRY]
    if before is None:
        _REGISTRY.append(reader)
    elif before in names:
        _REGISTRY.insert(names.index(before), reader)
    else:
        raise ConfigError(f"register_reader: before={before!r} names no registered reader ({', '.join(names)})")
    return reader


def unregister_reader(name: str, kind: str | None = None) -> None:
    """Remove the readers called ``name`` (of ``kind`` only, when given)."""
    _REGISTRY[:] = [r for r in _REGISTRY if not (r.name == name and (kind is None or r.kind == kind))]


def registered_readers(kind: str | None = None) -> tuple[Reader, ...]:
    """The registered readers in the order detection asks them (of ``kind`` only, when given)."""
    return tuple(r for r in _REGISTRY if kind is None or r.kind == kind)


def detect_format(source: Source) -> str:
    """The ``name`` of the first registered reader whose ``looks_like`` accepts ``source``."""
    if not source.data.strip():
        raise TraceFormatError(f"{source.name}: empty file")
    for reader in _REGISTRY:
        if reader.looks_like(source):
            return reader.name
    if source.is_json():
        source.json()  # invalid JSON says so, naming the file
        raise TraceFormatError(f"{source.name}: unknown format: JSON, but no reader recognizes it "
                               f"(readers: {', '.join(sorted({r.name for r in _REGISTRY}))})")
    raise TraceFormatError(f"{source.name}: unknown format (not Kineto/execution-trace JSON, AICB CSV, "
                           "nccl-tests output, a vTrain table, or another registered format)")


def reader_for(source: Source, kind: str) -> Reader:
    """The reader of ``kind`` for ``source``'s format; a :class:`TraceFormatError` when the format is known
    but is of the other kind (a bandwidth log given as a trace)."""
    fmt = detect_format(source)
    for reader in _REGISTRY:
        if reader.name == fmt and reader.kind == kind:
            return reader
    if kind == "trace":
        raise TraceFormatError(f"{source.name}: a {fmt} bandwidth measurement, not a trace; read it with "
                               "llmcomm ingest --bandwidth (Python: ingest_bandwidth)")
    raise TraceFormatError(f"{source.name}: a {fmt} trace, not a bandwidth measurement; read it with "
                           "llmcomm ingest without --bandwidth (Python: ingest_trace)")
