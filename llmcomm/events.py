"""The events table itself: conversion between a DataFrame and an Arrow table in exactly ``EVENTS_SCHEMA``,
the checks every trace passes, and the codes of a vocabulary column.

The bottom of the trace chain (events → :mod:`llmcomm.group_refs` → :mod:`llmcomm.flows` → :mod:`llmcomm.matrix`
→ :mod:`llmcomm.trace_io` → :mod:`llmcomm.trace`): it knows the schema (:mod:`llmcomm.vocab`) and nothing
above it. The columns and their meaning are in ARCHITECTURE.md's events table.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .errors import TraceFormatError
from .vocab import (
    COLLECTIVES,
    EVENT_COLUMNS,
    EVENT_DEFAULTS,
    EVENTS_SCHEMA,
    OPS,
    PARALLELISM_TAGS,
    PHASES,
    POINT_TO_POINT,
    TIME_COLUMNS,
)

VALIDATE_ROWS = 50_000  # rows validated at once


# ------------------------------------------------------------------------------------- conversion
def _list_types_mapper(t: pa.DataType) -> pd.ArrowDtype | None:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pd.ArrowDtype(t)
    return None


def events_to_table(events: pd.DataFrame, origin: str = "<events>") -> pa.Table:
    """The events DataFrame as an Arrow table in exactly ``EVENTS_SCHEMA``; missing optional columns take
    their defaults. Raises :class:`TraceFormatError` naming the column and the rule."""
    df = events
    missing = [c for c in EVENT_COLUMNS if c not in df.columns and c not in EVENT_DEFAULTS]
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
            if EVENT_DEFAULTS.get(f.name) is not None and not pa.types.is_list(f.type) and col.isna().any():
                col = col.fillna(EVENT_DEFAULTS[f.name])
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
            default = EVENT_DEFAULTS[f.name]
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
