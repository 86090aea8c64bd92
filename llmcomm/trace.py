"""The :class:`Trace` facade over the events table and its derived views: flows, communication matrix and
volumes.

One row of the events table is one communication call as one rank issued it (see ``EVENT_COLUMNS`` and
ARCHITECTURE.md). Every path into the project — prediction, recording, import — produces this table, so one
set of functions compares them.

``bytes`` follows nccl-tests: all_reduce/broadcast: the buffer; all_gather: the gathered output;
reduce_scatter: the input before scattering; all_to_all: what this rank sends in total (per-peer sizes in
``split_bytes``, aligned with ``group``); send/recv: the tensor.

``count`` says how many identical calls a row stands for: 1 in an expanded trace (recorded, imported, small
predictions); more in the aggregated form a large prediction uses. Every derived quantity multiplies by it, so
both forms give the same matrix and volumes.

The modules below it run one way: :mod:`llmcomm.events` (conversion, checks, vocabulary codes) →
:mod:`llmcomm.group_refs` (groups as references) → :mod:`llmcomm.flows` (the flow rules, with their table) →
:mod:`llmcomm.matrix` (the blocked sparse matrix) → :mod:`llmcomm.trace_io` (files, metadata, manifests, names)
→ this module. Their public names are importable from here as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from .errors import ConfigError
from .events import VALIDATE_ROWS as VALIDATE_ROWS
from .events import events_to_table as events_to_table
from .events import table_to_events as table_to_events
from .events import validate_columns as validate_columns
from .events import validate_events as validate_events
from .events import vocabulary_codes as vocabulary_codes
from .flows import FLOW_TAGS as FLOW_TAGS
from .flows import flow_event_arrays as flow_event_arrays
from .flows import flows_from_table as flows_from_table
from .flows import reduction_factor as reduction_factor
from .flows import split_arrays as split_arrays
from .group_refs import RefEvents
from .matrix import MatrixLevel, matrix_from_table
from .matrix import flows_to_matrix as flows_to_matrix
from .specs import ModelSpec, ParallelConfig, load_model
from .trace_io import META_KEY as META_KEY
from .trace_io import SCHEMA_VERSION as SCHEMA_VERSION
from .trace_io import SCHEMA_VERSION_KEY as SCHEMA_VERSION_KEY
from .trace_io import TraceFile as TraceFile
from .trace_io import curated_trace_path as curated_trace_path
from .trace_io import decode_meta as decode_meta
from .trace_io import encode_meta as encode_meta
from .trace_io import json_default as json_default
from .trace_io import manifest_path as manifest_path
from .trace_io import read_trace_file, trace_file_path, write_trace_file
from .trace_io import routing_path as routing_path
from .trace_io import trace_metadata as trace_metadata
from .trace_io import write_events_table as write_events_table
from .vocab import EVENT_COLUMNS, EVENT_DEFAULTS, OPS, PARALLELISM_TAGS, PHASES, AlgorithmName
from .vocab import EVENTS_SCHEMA as EVENTS_SCHEMA
from .vocab import ROUTING_KEY as _ROUTING_KEY
from .vocab import ROUTING_SCHEMA as ROUTING_SCHEMA

_VOCABULARIES: dict[str, tuple[str, ...]] = {"phase": PHASES, "parallelism": PARALLELISM_TAGS, "op": OPS}


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
            assert self._ref_events is not None  # exactly one of the two is set (__init__)
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
            events = pd.DataFrame({c: [] for c in EVENT_COLUMNS if c not in EVENT_DEFAULTS})
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

    # -- metadata ---------------------------------------------------------------------------------
    def model_spec(self) -> ModelSpec:
        """The model the trace ran, from its metadata: ``meta['model_spec']`` (a recorded run's spec dict),
        else ``meta['model']`` (a spec dict, as a prediction stores it, or a catalogue name). Raises
        :class:`ConfigError` naming the field when there is none or it does not describe a model."""
        spec = self.meta.get("model_spec")
        if isinstance(spec, Mapping):
            return ModelSpec.from_dict(spec, origin="the trace's meta['model_spec']")
        name = self.meta.get("model")
        if isinstance(name, Mapping):
            return ModelSpec.from_dict(name, origin="the trace's meta['model']")
        if isinstance(name, str):
            return load_model(name)
        raise ConfigError("the trace's metadata names no model (no 'model' or 'model_spec')")

    def parallel_config(self) -> ParallelConfig:
        """The parallel configuration the trace ran under, from ``meta['parallel']``. Raises
        :class:`ConfigError` naming the field when it is missing or breaks a rule of :class:`ParallelConfig`."""
        parallel = self.meta.get("parallel")
        if isinstance(parallel, ParallelConfig):
            return parallel
        if isinstance(parallel, Mapping):
            return ParallelConfig.from_dict(parallel, origin="the trace's meta['parallel']")
        raise ConfigError("the trace's metadata has no parallel configuration (no 'parallel')")

    # -- persistence ------------------------------------------------------------------------------
    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the events as zstd parquet with ``meta`` in the schema metadata; ``routing`` (if any) to
        ``<stem>.routing.parquet`` beside it. Each file goes to a temporary name first, then is renamed."""
        return write_trace_file(self.to_table(), path, self.meta, self.routing)

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
            if bad and vocab is not None:
                raise ConfigError(f"select: {col}={bad[0]!r} is not one of {', '.join(vocab)}")
            if refs is not None:
                mask &= pc.is_in(refs.table.column(col), value_set=pa.array(vals)).to_numpy(zero_copy_only=False)
            else:
                mask &= self.events[col].isin(vals).to_numpy()
        if refs is not None:
            return Trace(meta=self.meta, routing=self.routing, ref_events=refs.filter(mask))
        return Trace(self.events[mask].reset_index(drop=True), dict(self.meta), self.routing)

    def flows(self, algorithm: AlgorithmName = "ring", **filters: Any) -> pd.DataFrame:
        """Flows ``src, dst, bytes`` (float64, bytes × count) plus the event's tags; see the module doc."""
        t = self.select(**filters) if filters else self
        # a prediction: from the group references, no member lists
        return flows_from_table(t.ref_events if t.ref_events is not None else t.to_table(), algorithm)

    def matrix(self, algorithm: AlgorithmName = "direct", world_size: int | None = None, *, level: MatrixLevel = "gpu",
               gpus_per_node: int | None = None, nodes_per_rack: int | None = None,
               **filters: Any) -> sp.csr_matrix:
        """Sparse ``world × world`` matrix of bytes from ``src`` (row) to ``dst`` (column).

        ``algorithm="direct"`` gives the logical (who-talks-to-whom) traffic; ``"ring"`` the ring flows.
        Filters select events first (``parallelism=``, ``op=``, ``phase=``, ``iteration=``...).
        ``level="node"`` (``"rack"``, given ``nodes_per_rack``) sums GPUs into nodes (racks); built block by
        block of source ranks by :func:`llmcomm.matrix.matrix_from_table`. ``gpus_per_node`` defaults to
        ``meta['gpus_per_node']`` or 8."""
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
        if self._ref_events is not None:
            return self._ref_events.num_rows
        return len(self.events)

    def __repr__(self) -> str:
        return f"Trace({len(self)} events, source={self.meta.get('source', '?')!r}, world={self.world_size})"


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace written by :meth:`Trace.write` (or a partitioned dataset directory of such files).

    The file's schema must equal ``EVENTS_SCHEMA`` exactly; a manifest ``<stem>.manifest.json`` beside it
    is merged into ``meta``; ``<stem>.routing.parquet`` becomes ``routing`` (:func:`llmcomm.trace_io.read_trace_file`)."""
    f = read_trace_file(path)
    return Trace(table_to_events(f.table), f.meta, f.routing)


def open_trace(name: str | os.PathLike[str]) -> Trace:
    """The trace ``name`` stands for: a curated trace (``"gpt_tp4"``: ``data/traces/gpt_tp4.parquet``) or the
    path of a trace file (:func:`llmcomm.trace_io.trace_file_path`)."""
    return read_trace(trace_file_path(name))


def concat(traces: Sequence[Trace], meta: Mapping[str, Any] | None = None) -> Trace:
    """One trace of the events of several (e.g. one per rank), with their routing counts merged and sorted
    by ``iteration, microbatch, layer, src_rank, expert``. ``meta`` defaults to the first trace's."""
    df = pd.concat([t.events for t in traces], ignore_index=True) if traces else pd.DataFrame()
    routings = [t.routing for t in traces if t.routing is not None]
    routing = (pd.concat(routings, ignore_index=True).sort_values(list(_ROUTING_KEY), ignore_index=True) if routings
               else None)
    if meta is None:
        meta = dict(traces[0].meta) if traces else {}
    return Trace.from_events(df, meta, routing)
