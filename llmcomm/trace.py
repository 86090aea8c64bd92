"""The events table, :class:`Trace`, and its derived views: flows, communication matrix and volumes.

One row of the events table is one communication call as one rank issued it (see ``EVENT_COLUMNS``).
Every path into the project — prediction, recording, import — produces this table, so one set of
functions compares them.

``bytes`` follows nccl-tests: all_reduce/broadcast: the buffer; all_gather: the gathered output;
reduce_scatter: the input before scattering; all_to_all: what this rank sends in total (per-peer sizes in
``split_bytes``, aligned with ``group``); send/recv: the tensor.

``count`` (see ARCHITECTURE.md's events table) says how many identical calls a row stands for: 1 in an
expanded trace (recorded, imported, small predictions); more in the aggregated form a large prediction
uses. Every derived quantity multiplies by it, so both forms give the same matrix and volumes.

Flows: the bytes each rank puts on the wire towards each other rank, for a chosen algorithm. Each event
yields the flows *leaving its own rank*, so summing over all ranks' events counts each byte once:

=============== ============================================ =============================================
op              ``ring`` (to the successor in group order)   ``direct`` (to every other member)
=============== ============================================ =============================================
all_reduce      2(n-1)/n · S                                 2/n · S to each (reduce-scatter + all-gather)
all_gather      (n-1)/n · S                                  1/n · S to each
reduce_scatter  (n-1)/n · S                                  1/n · S to each
broadcast       S, except the root's predecessor             S from the root to each (root = ``peer``,
                (pipelined ring from the root = ``peer``)    else ``group[0]``)
all_to_all      ``split_bytes[j]`` to ``group[j]``           same
send            S to ``peer``                                same
recv            nothing (the sender's event carries it)      same
=============== ============================================ =============================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import scipy.sparse as sp

from .atomic import atomic_path
from .errors import ConfigError, TraceFormatError
from .group_refs import RefEvents
from .vocab import (
    ALGORITHMS,
    COLLECTIVES,
    EVENT_COLUMNS,
    EVENT_DEFAULTS,
    EVENTS_SCHEMA,
    OPS,
    PARALLELISM_TAGS,
    PHASES,
    POINT_TO_POINT,
    ROUTING_SCHEMA,
    TIME_COLUMNS,
)
from .vocab import ROUTING_KEY as _ROUTING_KEY

_VOCABULARIES: dict[str, tuple[str, ...]] = {"phase": PHASES, "parallelism": PARALLELISM_TAGS, "op": OPS}
META_KEY = b"llmcomm.meta"
SCHEMA_VERSION_KEY = b"llmcomm.schema_version"
SCHEMA_VERSION = 1
DEFAULTS = EVENT_DEFAULTS  # the public name this module has always had

VALIDATE_ROWS = 50_000  # rows validated at once
FLOW_TAGS = ("iteration", "microbatch", "layer", "phase", "parallelism", "op")


# ------------------------------------------------------------------------------------- conversion
def _list_types_mapper(t: pa.DataType) -> pd.ArrowDtype | None:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pd.ArrowDtype(t)
    return None


def events_to_table(events: pd.DataFrame, origin: str = "<events>") -> pa.Table:
    """The events DataFrame as an Arrow table in exactly ``EVENTS_SCHEMA``; missing optional columns take
    their defaults. Raises :class:`TraceFormatError` naming the column and the rule."""
    df = events
    missing = [c for c in EVENT_COLUMNS if c not in df.columns and c not in DEFAULTS]
    if missing:
        raise TraceFormatError(f"{origin}: events lack required column(s) {missing}")
    extra = [c for c in df.columns if c not in EVENT_COLUMNS]
    if extra:
        raise TraceFormatError(f"{origin}: events have unknown column(s) {extra}; allowed: {list(EVENT_COLUMNS)}")
    n = len(df)
    arrays = []
    for f in EVENTS_SCHEMA:
        if f.name in df.columns:
            col = df[f.name]
            if DEFAULTS.get(f.name) is not None and not pa.types.is_list(f.type) and col.isna().any():
                col = col.fillna(DEFAULTS[f.name])
            try:
                if isinstance(col.dtype, pd.ArrowDtype):
                    arr = pa.array(col.array).cast(f.type)
                elif pa.types.is_list(f.type):
                    arr = pa.array([None if (v is None or (isinstance(v, float) and np.isnan(v))) else v
                                    for v in col.tolist()], type=f.type)
                elif pa.types.is_string(f.type):
                    arr = pa.array(col.astype(str).tolist() if col.dtype != object else col.tolist(), type=f.type)
                elif col.isna().any():
                    if not f.nullable:
                        raise TraceFormatError(f"{origin}: column {f.name!r} has missing values; it must not")
                    arr = pa.array(col.astype("Int64"), type=f.type)
                else:
                    vals = col.to_numpy()
                    if vals.dtype.kind == "f" and not np.all(np.mod(vals, 1) == 0):
                        raise TraceFormatError(f"{origin}: column {f.name!r} must hold integers")
                    arr = pa.array(vals.astype(np.int64)).cast(f.type)
            except TraceFormatError:
                raise
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
                raise TraceFormatError(f"{origin}: column {f.name!r} cannot be read as {f.type}: {e}") from None
        else:
            default = DEFAULTS[f.name]
            arr = pa.nulls(n, type=f.type) if default is None else pa.array(np.full(n, default), type=f.type) \
                if not isinstance(default, str) else pa.array([default] * n, type=f.type)
        if not f.nullable and arr.null_count:
            raise TraceFormatError(f"{origin}: column {f.name!r} has {arr.null_count} null value(s); it must not")
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=EVENTS_SCHEMA)


def table_to_events(table: pa.Table) -> pd.DataFrame:
    """Arrow table -> events DataFrame (list columns as ``pd.ArrowDtype``, nullable times as ``Int64``)."""
    df = table.to_pandas(types_mapper=_list_types_mapper)
    for c in TIME_COLUMNS:
        df[c] = df[c].astype("Int64")
    return df


def validate_events(table: pa.Table, origin: str = "<events>", _row0: int = 0) -> None:
    """Semantic checks on an events table: :func:`validate_columns` (known ops/phases/parallelisms,
    non-negative bytes, counts >= 1, a peer for send/recv, a group for every collective, split sizes matching
    the group for all_to_all) and the issuing rank in its own group, once. A large table is checked in slices
    of ``VALIDATE_ROWS`` rows (bounded temporaries); errors name the row in the table."""
    if table.num_rows > VALIDATE_ROWS:
        for lo in range(0, table.num_rows, VALIDATE_ROWS):
            validate_events(table.slice(lo, VALIDATE_ROWS), origin, _row0=_row0 + lo)
        return
    rank = table.column("rank").to_numpy()
    groups = table.column("group").combine_chunks()
    lens = groups.value_lengths().to_numpy(zero_copy_only=False)
    validate_columns(table, origin, lens, _row0)
    flat = groups.values.to_numpy(zero_copy_only=False)
    ev_of_flat = np.repeat(np.arange(len(rank)), lens)
    hit = flat == rank[ev_of_flat]
    has_self = np.bincount(ev_of_flat[hit], minlength=len(rank))
    has_self = np.where(lens > 0, has_self, 1)
    if (has_self != 1).any():
        _bad_row(origin, "group", "the issuing rank must appear exactly once in its group", has_self != 1, _row0)


def _bad_row(origin: str, col: str, rule: str, mask: np.ndarray, row0: int = 0) -> None:
    i = int(np.nonzero(mask)[0][0]) + row0
    raise TraceFormatError(f"{origin}: field {col!r} row {i}: {rule}")


def vocabulary_codes(column: pa.Array | pa.ChunkedArray, vocabulary: Sequence[str]) -> np.ndarray:
    """Each value's index in ``vocabulary`` (int64; -1 for a value outside it or null), for a string column
    or a dictionary-encoded one (then only its dictionary is looked up)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    value_set = pa.array(list(vocabulary), pa.string())
    parts = []
    for c in chunks:
        if pa.types.is_dictionary(c.type):
            lookup = pc.fill_null(pc.index_in(c.dictionary, value_set=value_set), -1).to_numpy().astype(np.int64)
            codes = lookup[pc.fill_null(c.indices, 0).to_numpy().astype(np.int64)] if len(lookup) else \
                np.full(len(c), -1, np.int64)
            if c.null_count:
                codes[~c.is_valid().to_numpy(zero_copy_only=False)] = -1
        else:
            codes = pc.fill_null(pc.index_in(c, value_set=value_set), -1).to_numpy().astype(np.int64)
        parts.append(codes)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def validate_columns(table: pa.Table, origin: str, group_sizes: np.ndarray, _row0: int = 0) -> None:
    """The checks of :func:`validate_events` that need no group members, only each row's group size
    (``group_sizes``): vocabulary, bytes, count, peer, a group for collectives, all_to_all split sizes.
    Vectorized with Arrow compute over the whole table."""
    def bad(col: str, rule: str, mask: np.ndarray) -> None:
        _bad_row(origin, col, rule, mask, _row0)

    codes = {}
    for col, allowed in (("op", OPS), ("phase", PHASES), ("parallelism", PARALLELISM_TAGS)):
        codes[col] = vocabulary_codes(table.column(col), allowed)
        m = codes[col] < 0
        if m.any():
            bad(col, f"{table.column(col)[int(np.nonzero(m)[0][0])].as_py()!r} is not one of {list(allowed)}", m)
    b = table.column("bytes").to_numpy()
    if (b < 0).any():
        bad("bytes", "must be >= 0", b < 0)
    count = table.column("count").to_numpy()
    if (count < 1).any():
        bad("count", "must be >= 1", count < 1)
    op_codes = codes["op"]
    peer = table.column("peer").to_numpy()
    p2p = np.isin(op_codes, [OPS.index(o) for o in POINT_TO_POINT])
    if (p2p & (peer < 0)).any():
        bad("peer", "send/recv need a peer >= 0", p2p & (peer < 0))
    lens = np.asarray(group_sizes)
    coll = np.isin(op_codes, [OPS.index(o) for o in COLLECTIVES])
    if (coll & (lens == 0)).any():
        bad("group", "a collective needs its group's ranks", coll & (lens == 0))
    a2a = op_codes == OPS.index("all_to_all")
    if a2a.any():
        splits = table.column("split_bytes")
        splits = splits.combine_chunks() if isinstance(splits, pa.ChunkedArray) else splits
        split_lens = pc.fill_null(splits.value_lengths(), 0).to_numpy(zero_copy_only=False)
        valid = splits.is_valid().to_numpy(zero_copy_only=False)
        m = a2a & valid & (split_lens != lens)
        if m.any():
            bad("split_bytes", "an all_to_all's split sizes must have one entry per group member", m)


# ------------------------------------------------------------------------------------------ Trace
class Trace:
    """A communication trace: ``events`` (the events table), ``meta`` (model, parallel config, source,
    command, versions...), and for MoE runs ``routing`` (``iteration, microbatch, layer, src_rank, expert,
    tokens``).

    A prediction may hold its events as :class:`llmcomm.group_refs.RefEvents` (groups as references into
    the layout's group tables, see that module) until ``events`` is first read: ``len``, ``select``,
    ``flows``, ``matrix``, ``volumes``, ``to_table`` and ``write`` work from the references; reading ``events`` writes
    the member lists out once into the DataFrame, which from then on is the trace."""

    def __init__(self, events: pd.DataFrame | None = None, meta: Mapping[str, Any] | None = None,
                 routing: pd.DataFrame | None = None, *, ref_events: RefEvents | None = None) -> None:
        if (events is None) == (ref_events is None):
            raise ConfigError("Trace needs exactly one of events (a DataFrame) and ref_events")
        self._events = events
        self._ref_events = ref_events
        self.meta: dict[str, Any] = dict(meta) if meta is not None else {}
        self.routing = routing

    @property
    def events(self) -> pd.DataFrame:
        """The events table as a DataFrame (written out from the group references on first use)."""
        if self._events is None:
            self._events = table_to_events(self._ref_events.to_table())
            self._ref_events = None
        return self._events

    @events.setter
    def events(self, value: pd.DataFrame) -> None:
        self._events, self._ref_events = value, None

    @property
    def ref_events(self) -> RefEvents | None:
        """The events with groups as references, while ``events`` has not been read; else ``None``."""
        return self._ref_events

    # -- construction -----------------------------------------------------------------------------
    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], meta: Mapping[str, Any] | None = None,
                     routing: pd.DataFrame | None = None) -> Trace:
        df = pd.DataFrame.from_records(list(records))
        return cls.from_events(df, meta, routing)

    @classmethod
    def from_events(cls, events: pd.DataFrame, meta: Mapping[str, Any] | None = None,
                    routing: pd.DataFrame | None = None, origin: str = "<events>") -> Trace:
        """Normalize any DataFrame with the event columns (defaults filled) into a checked Trace."""
        if len(events.columns) == 0:
            events = pd.DataFrame({c: [] for c in EVENT_COLUMNS if c not in DEFAULTS})
        table = events_to_table(events, origin)
        validate_events(table, origin)
        return cls(table_to_events(table), dict(meta or {}), routing)

    def to_table(self) -> pa.Table:
        """The events as an Arrow table in ``EVENTS_SCHEMA``."""
        if self._ref_events is not None:
            return self._ref_events.to_table()
        return events_to_table(self.events)

    @property
    def world_size(self) -> int:
        """``meta['world_size']`` if recorded, else one more than the highest rank seen."""
        if "world_size" in self.meta:
            return int(self.meta["world_size"])
        if len(self) == 0:
            return 0
        g = pa.array(self.events["group"].array).flatten().to_numpy(zero_copy_only=False)
        hi = max(int(self.events["rank"].max()), int(self.events["peer"].max()), int(g.max()) if len(g) else -1)
        return hi + 1

    # -- persistence ------------------------------------------------------------------------------
    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the events as zstd parquet with ``meta`` in the schema metadata; ``routing`` (if any) to
        ``<stem>.routing.parquet`` beside it. Each file goes to a temporary name first, then is renamed."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_events_table(self.to_table(), path, self.meta)
        rpath = routing_path(path)
        if self.routing is not None:
            _atomic_write_parquet(pa.Table.from_pandas(self.routing, schema=ROUTING_SCHEMA,
                                                       preserve_index=False), rpath)
        return path

    # -- views ------------------------------------------------------------------------------------
    def select(self, **filters: Any) -> Trace:
        """A Trace with only the events whose columns match: ``t.select(parallelism="tp", phase=["forward"])``."""
        refs = self._ref_events
        columns = list(refs.table.column_names) + ["group"] if refs is not None else list(self.events.columns)
        if refs is not None and "group" in {c for c, v in filters.items() if v is not None}:
            refs, columns = None, list(self.events.columns)  # matching on member lists needs them written out
        mask = np.ones(len(self), dtype=bool)
        for col, val in filters.items():
            if val is None:
                continue
            if col not in columns:
                raise ConfigError(f"select: no column {col!r}; columns: {', '.join(columns)}")
            vals = [val] if isinstance(val, (str, int, np.integer)) else list(val)
            vocab = _VOCABULARIES.get(col)
            bad = [v for v in vals if vocab is not None and v not in vocab]
            if bad:
                raise ConfigError(f"select: {col}={bad[0]!r} is not one of {', '.join(vocab)}")
            if refs is not None:
                mask &= pc.is_in(refs.table.column(col), value_set=pa.array(vals)).to_numpy(zero_copy_only=False)
            else:
                mask &= self.events[col].isin(vals).to_numpy()
        if refs is not None:
            return Trace(meta=self.meta, routing=self.routing, ref_events=refs.filter(mask))
        return Trace(self.events[mask].reset_index(drop=True), dict(self.meta), self.routing)

    def flows(self, algorithm: str = "ring", **filters: Any) -> pd.DataFrame:
        """Flows ``src, dst, bytes`` (float64, bytes × count) plus the event's tags; see the module doc."""
        t = self.select(**filters) if filters else self
        if t.ref_events is not None:  # a prediction: from the group references, no member lists
            from .ref_flows import ref_flows_frame

            return ref_flows_frame(t.ref_events, algorithm)
        return flows_from_table(t.to_table(), algorithm)

    def matrix(self, algorithm: str = "direct", world_size: int | None = None, *, level: str = "gpu",
               gpus_per_node: int | None = None, nodes_per_rack: int | None = None,
               **filters: Any) -> sp.csr_matrix:
        """Sparse ``world × world`` matrix of bytes from ``src`` (row) to ``dst`` (column).

        ``algorithm="direct"`` gives the logical (who-talks-to-whom) traffic; ``"ring"`` the ring flows.
        Filters select events first (``parallelism=``, ``op=``, ``phase=``, ``iteration=``...).
        ``level="node"`` (``"rack"``, given ``nodes_per_rack``) sums GPUs into nodes (racks); built block by
        block of source ranks by :func:`llmcomm.matrix.matrix_from_table`. ``gpus_per_node`` defaults to
        ``meta['gpus_per_node']`` or 8."""
        from .matrix import matrix_from_table

        n = world_size or self.world_size
        t = self.select(**filters) if filters else self
        g = gpus_per_node or int(self.meta.get("gpus_per_node") or 8)
        events = t.ref_events if t.ref_events is not None else t.to_table()
        return matrix_from_table(events, n, algorithm, level=level, gpus_per_node=g, nodes_per_rack=nodes_per_rack)

    def volumes(self, by: Sequence[str] = ("parallelism",), bytes_col: str = "bytes",
                sent_only: bool = False) -> pd.DataFrame:
        """Total event bytes (× count) and call counts grouped by ``by`` columns (nccl-tests sizes).

        Both ends of a point-to-point transfer issue an event; ``sent_only=True`` leaves out the ``recv``
        events so that each transferred byte is counted once."""
        by = [by] if isinstance(by, str) else list(by)
        if self._ref_events is not None and "group" not in (*by, bytes_col):  # the columns asked for, no groups
            names = [c for c in dict.fromkeys([*by, bytes_col, "count", "op"]) if c in self._ref_events.table.column_names]
            df = self._ref_events.decoded(names).to_pandas()
        else:
            df = self.events
        if sent_only:
            df = df[df["op"] != "recv"]
        missing = [c for c in (*by, bytes_col) if c not in df.columns]
        if missing:
            raise ConfigError(f"volumes: no column {missing[0]!r} to group or sum; columns: {', '.join(df.columns)}")
        totals = pd.DataFrame({**{c: df[c] for c in by},
                               "bytes": df[bytes_col].to_numpy(np.int64) * df["count"].to_numpy(np.int64),
                               "calls": df["count"].to_numpy(np.int64)})
        if not by:
            return pd.DataFrame({"bytes": [int(totals["bytes"].sum())], "calls": [int(totals["calls"].sum())]})
        return totals.groupby(by, sort=True, observed=True)[["bytes", "calls"]].sum().reset_index()

    def expand(self) -> Trace:
        """The expanded form: every row with ``count = k`` repeated k times with ``count = 1``."""
        c = self.events["count"].to_numpy()
        if (c == 1).all():
            return self
        df = self.events.loc[self.events.index.repeat(c)].reset_index(drop=True)
        df["count"] = 1
        return Trace(df, dict(self.meta), self.routing)

    def __len__(self) -> int:
        return self._ref_events.num_rows if self._ref_events is not None else len(self._events)

    def __repr__(self) -> str:
        return f"Trace({len(self)} events, source={self.meta.get('source', '?')!r}, world={self.world_size})"


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


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace written by :meth:`Trace.write` (or a partitioned dataset directory of such files).

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
    return Trace(table_to_events(table), meta, routing)


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


# ------------------------------------------------------------------------------------------ flows
def flows_from_table(table: pa.Table, algorithm: str = "ring", tags: bool = True) -> pd.DataFrame:
    """Vectorized flow decomposition of an events table (see the module docstring for the rules);
    ``tags=False`` leaves out the event's tag columns (``src, dst, bytes`` only)."""
    return _flow_parts(table, algorithm).frame(table, tags)


def flow_event_arrays(table: pa.Table, algorithm: str = "ring") -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                         np.ndarray]:
    """``(src, dst, bytes, event)``: the flows of :func:`flows_from_table` (same order) with the row of the
    table each comes from, so a flow can carry its event's columns (its start time, for a flow list)."""
    parts = _flow_parts(table, algorithm)
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt, copy=False) if xs else np.zeros(0, dt))  # noqa: E731
    return (cat(parts.src, np.int64), cat(parts.dst, np.int64), cat(parts.bytes, np.float64),
            cat(parts.events, np.int64))


def _flow_parts(table: pa.Table, algorithm: str) -> _FlowParts:
    if algorithm not in ALGORITHMS:
        raise TraceFormatError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}")
    ev = _EventGroups.of(table)
    flows = _FlowParts(ev.rank)
    send = np.nonzero(ev.op == "send")[0]  # point to point: the sender's event carries the flow
    flows.emit(send, ev.peer[send], ev.size[send])
    _all_to_all_flows(table, ev, flows)
    if algorithm == "ring":
        _ring_flows(ev, flows)
    else:
        _direct_flows(ev, flows)
    return flows


@dataclass(frozen=True)
class _EventGroups:
    """Every event's group, flattened: ``members`` holds all groups one after the other; member ``i``
    belongs to event ``event_of_member[i]`` at ``position[i]`` of its group (which starts at
    ``offsets[event]`` and has ``lens[event]`` members)."""

    op: np.ndarray
    rank: np.ndarray
    peer: np.ndarray
    size: np.ndarray  # bytes × count, float64
    lens: np.ndarray
    offsets: np.ndarray
    members: np.ndarray
    event_of_member: np.ndarray
    position: np.ndarray
    is_self: np.ndarray  # the member is the issuing rank
    my_position: np.ndarray  # per event: the issuing rank's position in its group (-1: absent)

    @classmethod
    def of(cls, table: pa.Table) -> _EventGroups:
        n_events = table.num_rows
        rank = table.column("rank").to_numpy().astype(np.int64)
        if n_events:
            groups = table.column("group").combine_chunks()
            lens = groups.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
            offsets = groups.offsets.to_numpy().astype(np.int64)[:-1]
            members = groups.values.to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            lens = offsets = members = np.zeros(0, np.int64)
        event_of_member = np.repeat(np.arange(n_events), lens)
        position = np.arange(len(members)) - np.repeat(offsets, lens)
        is_self = members == rank[event_of_member]
        my_position = np.full(n_events, -1, dtype=np.int64)
        my_position[event_of_member[is_self]] = position[is_self]
        return cls(
            op=table.column("op").to_numpy(zero_copy_only=False), rank=rank,
            peer=table.column("peer").to_numpy().astype(np.int64),
            size=table.column("bytes").to_numpy().astype(np.float64) * table.column("count").to_numpy(),
            lens=lens, offsets=offsets, members=members, event_of_member=event_of_member, position=position,
            is_self=is_self, my_position=my_position,
        )

    @property
    def group_size(self) -> np.ndarray:
        """Members per event as float64, at least 1 (a divisor)."""
        return np.maximum(self.lens, 1).astype(np.float64)

    def successor(self, events: np.ndarray) -> np.ndarray:
        """The next member after the issuing rank in each event's group (wrapping): its ring successor."""
        return self.members[self.offsets[events] + (self.my_position[events] + 1) % self.lens[events]]


class _FlowParts:
    """Flows collected piecewise: ``emit(events, dst, bytes)`` adds one flow per event from its rank."""

    def __init__(self, rank: np.ndarray) -> None:
        self.rank = rank
        self.src: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []
        self.bytes: list[np.ndarray] = []
        self.events: list[np.ndarray] = []

    def emit(self, events: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> None:
        self.src.append(self.rank[events])
        self.dst.append(dst)
        self.bytes.append(nbytes)
        self.events.append(events)

    def frame(self, table: pa.Table, tags: bool = True) -> pd.DataFrame:
        """``src, dst, bytes`` plus (``tags``) each flow's event tags (``FLOW_TAGS``)."""
        out = {
            "src": np.concatenate(self.src).astype(np.int64, copy=False) if self.src else np.zeros(0, np.int64),
            "dst": np.concatenate(self.dst).astype(np.int64, copy=False) if self.dst else np.zeros(0, np.int64),
            "bytes": np.concatenate(self.bytes).astype(np.float64, copy=False) if self.bytes else np.zeros(0),
        }
        if tags:
            take = pa.array(np.concatenate(self.events) if self.events else np.zeros(0, np.int64), type=pa.int64())
            for tag in FLOW_TAGS:  # Arrow take + to_pandas: same dtypes as a numpy gather, ~100x faster for strings
                out[tag] = table.column(tag).take(take).to_pandas()
        return pd.DataFrame(out, copy=False)  # fresh arrays: no consolidation copy


def _all_to_all_flows(table: pa.Table, ev: _EventGroups, flows: _FlowParts) -> None:
    """all_to_all (both algorithms): ``split_bytes[j] · count`` to ``group[j]``; without splits, an even
    split of ``bytes``."""
    a2a = ev.op == "all_to_all"
    if not a2a.any():
        return
    has_split, split_lens, split_offsets, split_values = split_arrays(table.column("split_bytes").combine_chunks())
    count = table.column("count").to_numpy()
    sel = a2a[ev.event_of_member] & ~ev.is_self
    events = ev.event_of_member[sel]
    with_split = has_split[events] & (split_lens[events] == ev.lens[events])
    split = (split_values[np.where(with_split, split_offsets[events] + ev.position[sel], 0)] * count[events]
             if len(split_values) else 0.0)
    per_peer = np.where(with_split, split, ev.size[events] / ev.group_size[events])
    flows.emit(events, ev.members[sel], per_peer)


def split_arrays(splits: pa.ListArray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(has_split, lens, offsets, values)`` of a ``split_bytes`` column: per row whether it holds splits,
    how many (0 when null) and where they start in ``values`` (all rows' splits as float64)."""
    has_split = splits.is_valid().to_numpy(zero_copy_only=False)
    lens = pc.fill_null(splits.value_lengths(), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = splits.offsets.to_numpy().astype(np.int64)[:-1]
    values = splits.values.to_numpy(zero_copy_only=False).astype(np.float64) if len(splits.values) else np.zeros(0)
    return has_split, lens, offsets, values


def reduction_factor(op: np.ndarray) -> np.ndarray:
    """Multiples of ``(n-1)/n · S`` (ring) or ``S/n`` per peer (direct): all_reduce 2 (reduce-scatter then
    all-gather), all_gather and reduce_scatter 1, anything else 0."""
    factor = np.zeros(len(op))
    factor[op == "all_reduce"] = 2.0
    factor[(op == "all_gather") | (op == "reduce_scatter")] = 1.0
    return factor


def _ring_flows(ev: _EventGroups, flows: _FlowParts) -> None:
    """Ring algorithm: reductions send ``factor·(n-1)/n·S`` to the successor; a broadcast is a pipelined
    ring from the root in which every member but the root's predecessor forwards ``S``."""
    factor = reduction_factor(ev.op)
    events = np.nonzero((factor > 0) & (ev.lens > 1))[0]
    lens = ev.lens[events]
    flows.emit(events, ev.successor(events), factor[events] * (lens - 1) / lens * ev.size[events])
    bcast = np.nonzero((ev.op == "broadcast") & (ev.lens > 1))[0]
    if len(bcast):
        root = np.where(ev.peer[bcast] >= 0, ev.peer[bcast], ev.members[ev.offsets[bcast]])
        root_pos = _position_of(ev.members, ev.offsets, ev.lens, bcast, root)
        events = bcast[(ev.my_position[bcast] + 1) % ev.lens[bcast] != root_pos]
        flows.emit(events, ev.successor(events), ev.size[events])


def _direct_flows(ev: _EventGroups, flows: _FlowParts) -> None:
    """Direct algorithm: reductions send ``factor·S/n`` to every other member; a broadcast's root (``peer``,
    else ``group[0]``) sends ``S`` to every other member."""
    factor = reduction_factor(ev.op)
    sel = (factor[ev.event_of_member] > 0) & ~ev.is_self
    events = ev.event_of_member[sel]
    flows.emit(events, ev.members[sel], factor[events] / ev.group_size[events] * ev.size[events])
    bcast = ev.op == "broadcast"
    if not bcast.any():
        return
    first = np.full(len(ev.op), -2, dtype=np.int64)
    first[ev.lens > 0] = ev.members[ev.offsets[ev.lens > 0]]
    root = np.where(ev.peer >= 0, ev.peer, first)
    sel = bcast[ev.event_of_member] & ~ev.is_self & (ev.rank[ev.event_of_member] == root[ev.event_of_member])
    events = ev.event_of_member[sel]
    flows.emit(events, ev.members[sel], ev.size[events])


def _position_of(flat: np.ndarray, offsets: np.ndarray, lens: np.ndarray, evs: np.ndarray,
                 who: np.ndarray) -> np.ndarray:
    """Position of rank ``who[i]`` inside the group of event ``evs[i]`` (-1 when absent)."""
    pos = np.full(len(evs), -1, dtype=np.int64)
    for k in range(int(lens[evs].max()) if len(evs) else 0):
        inside = k < lens[evs]
        hit = inside & (flat[np.where(inside, offsets[evs] + k, 0)] == who) & (pos < 0)
        pos[hit] = k
    return pos


def flows_to_matrix(flows: pd.DataFrame, world_size: int) -> sp.csr_matrix:
    """Sum flows into a sparse ``world × world`` CSR matrix (duplicates added)."""
    if len(flows) and (flows["src"].max() >= world_size or flows["dst"].max() >= world_size):
        raise TraceFormatError(f"flows reach rank {max(flows['src'].max(), flows['dst'].max())} "
                               f">= world_size={world_size}")
    m = sp.coo_matrix((flows["bytes"].to_numpy(np.float64),
                       (flows["src"].to_numpy(np.int64), flows["dst"].to_numpy(np.int64))),
                      shape=(world_size, world_size))
    return m.tocsr()


ROUTING_KEY = list(_ROUTING_KEY)


def concat(traces: Sequence[Trace], meta: Mapping[str, Any] | None = None) -> Trace:
    """One trace of the events of several (e.g. one per rank), with their routing counts merged and sorted
    by ``iteration, microbatch, layer, src_rank, expert``. ``meta`` defaults to the first trace's."""
    df = pd.concat([t.events for t in traces], ignore_index=True) if traces else pd.DataFrame()
    routings = [t.routing for t in traces if t.routing is not None]
    routing = (pd.concat(routings, ignore_index=True).sort_values(ROUTING_KEY, ignore_index=True) if routings
               else None)
    if meta is None:
        meta = dict(traces[0].meta) if traces else {}
    return Trace.from_events(df, meta, routing)
