"""XLA's measured H100 performance tables as tidy DataFrames: GEMM throughput and collective throughput.

Both files are protobuf text format inside a C++ raw string (``constexpr char kDefault...[] = R"pb( ... )pb";``)
in XLA's ``xla/service/gpu/model/``; XLA parses them with ``tsl::protobuf::TextFormat``
(``collective_interpolator.cc``, ``ReadDefaultProfiles``). Here a small tokenizer and recursive parser read the
subset the tables use (messages ``name { ... }``, scalar fields ``name: value`` with integers, floats,
identifiers and quoted strings; ``#`` comments). Nothing is evaluated; input size is bounded
(:data:`MAX_BYTES`) and nesting depth is bounded (:data:`MAX_DEPTH`). A malformed file raises
:class:`~llmcomm.errors.TraceFormatError` naming the file, the line and the rule.

``matmul_table``: one row per (gpu, b, m, n, k, dtype key) with ``flops`` (FLOP/s as XLA measured it: the
``flops`` map of an entry, key e.g. ``"bf16xbf16->bf16"``), and ``time_s = 2·b·m·n·k / flops``.

``collective_table``: one row per entry with ``gpu, op`` (``all_reduce``, ``all_gather``, ``reduce_scatter``),
``element_type``, ``elements`` (the instruction's shape), ``group_size`` (``num_devices_per_group``),
``num_groups``, ``throughput`` (``network_throughput_bytes_per_sec``), ``bytes`` in the nccl-tests convention of
the events table and ``time_s = bytes / throughput``. XLA times a collective as ``bytes_transferred /
throughput`` (``CollectiveInterpolator::EstimatedRuntime``) with ``bytes_transferred`` from
``GpuHloCostAnalysis``: all-reduce the buffer (``HandleAllReduce``: the output size), all-gather the gathered
output (``HandleAllGather``: the output shape), reduce-scatter the operand, i.e. the input before scattering
(``HandleReduceScatter``), which is ``group_size ×`` the table's (output) shape — the nccl-tests sizes exactly.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import TraceFormatError

MAX_BYTES = 16 << 20  # the shipped tables are ~80-90 kB; anything this large is not one of them
MAX_DEPTH = 32
ELEMENT_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "S32": 4, "S8": 1, "U8": 1, "F8E4M3FN": 1, "F8E5M2": 1}
OPCODES = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
           "all-reduce-start": "all_reduce", "all-gather-start": "all_gather"}

_TOKEN = re.compile(r'\s+|#[^\n]*|(?P<str>"(?:[^"\\\n]|\\.)*")|(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)'
                    r'|(?P<id>[A-Za-z_][A-Za-z0-9_.\-]*)|(?P<sym>[{}:<>\[\],;])')


def _raw(path: Path) -> tuple[str, int]:
    """The protobuf text of a header and the line its first character is on."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise TraceFormatError(f"{path}: {size} bytes is more than an XLA perf table holds "
                                   f"(limit {MAX_BYTES}); refusing to parse it")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"{path}: cannot read as UTF-8 text: {e}") from None
    start = text.find('R"pb(')
    if start < 0:
        raise TraceFormatError(f"{path}: no raw protobuf string 'R\"pb(' found (rule: an XLA perf table header "
                               "holds its table as constexpr char k...[] = R\"pb( ... )pb\")")
    end = text.find(')pb"', start)
    if end < 0:
        raise TraceFormatError(f"{path}: line {text.count(chr(10), 0, start) + 1}: the raw string opened here is "
                               "never closed by ')pb\"'")
    body = start + len('R"pb(')
    return text[body:end], text.count("\n", 0, body) + 1


def _tokens(text: str, path: Path, line0: int) -> list[tuple[str, str, int]]:
    out = []
    pos, line = 0, line0
    while pos < len(text):
        mt = _TOKEN.match(text, pos)
        if mt is None:
            raise TraceFormatError(f"{path}: line {line}: unexpected character {text[pos]!r} (rule: protobuf text "
                                   "format: fields 'name: value' and messages 'name {{ ... }}')")
        kind = mt.lastgroup
        if kind is not None:
            out.append((kind, mt.group(kind), line))
        line += mt.group(0).count("\n")
        pos = mt.end()
    return out


def parse_pbtext(text: str, path: str | os.PathLike[str] = "<text>", line0: int = 1) -> dict[str, list[Any]]:
    """Protobuf text as nested dicts: every field maps to the list of its values (repeated or not); a message
    value is such a dict, a scalar an ``int``, ``float`` or ``str``. Raises :class:`TraceFormatError` with the
    file and line of the first token that breaks the grammar."""
    p = Path(path)
    toks = _tokens(text, p, line0)
    i = 0

    def err(msg: str) -> TraceFormatError:
        line = toks[i][2] if i < len(toks) else (toks[-1][2] if toks else line0)
        return TraceFormatError(f"{p}: line {line}: {msg}")

    def scalar(kind: str, val: str) -> Any:
        if kind == "str":
            return val[1:-1].encode("utf-8").decode("unicode_escape")
        if kind == "num":
            return int(val) if re.fullmatch(r"[-+]?\d+", val) else float(val)
        return val  # enum identifiers, true/false

    def message(depth: int, closing: str | None) -> dict[str, list[Any]]:
        nonlocal i
        if depth > MAX_DEPTH:
            raise err(f"messages nested deeper than {MAX_DEPTH}")
        out: dict[str, list[Any]] = {}
        while i < len(toks):
            kind, val, _ = toks[i]
            if kind == "sym" and val in "}>" and closing is not None:
                if val != closing:
                    raise err(f"{val!r} closes a message opened with the other bracket")
                i += 1
                return out
            if kind != "id":
                raise err(f"expected a field name, got {val!r}")
            name = val
            i += 1
            if i >= len(toks):
                raise err(f"field {name!r} has no value")
            kind, val, _ = toks[i]
            if kind == "sym" and val == ":":
                i += 1
                if i >= len(toks):
                    raise err(f"field {name!r} has no value after ':'")
                kind, val, _ = toks[i]
            if kind == "sym" and val in "{<":
                i += 1
                out.setdefault(name, []).append(message(depth + 1, "}" if val == "{" else ">"))
            elif kind in ("str", "num", "id"):
                i += 1
                out.setdefault(name, []).append(scalar(kind, val))
            else:
                raise err(f"field {name!r}: expected a value or '{{', got {val!r}")
            if i < len(toks) and toks[i][0] == "sym" and toks[i][1] in ",;":
                i += 1
        if closing is not None:
            raise err(f"message not closed: missing {closing!r} before the end of the table")
        return out

    return message(0, None)


def read_table(path: str | os.PathLike[str]) -> dict[str, list[Any]]:
    """The parsed protobuf text of an XLA perf-table header."""
    p = Path(path)
    text, line0 = _raw(p)
    return parse_pbtext(text, p, line0)


def _one(msg: dict[str, list[Any]], field: str, path: Path, where: str, types: tuple[type, ...] = (int,)) -> Any:
    vals = msg.get(field)
    if not vals or len(vals) != 1 or not isinstance(vals[0], types):
        raise TraceFormatError(f"{path}: {where}: field {field!r} must occur once as "
                               f"{'/'.join(t.__name__ for t in types)}; got {vals!r}")
    return vals[0]


def _gpu_entries(doc: dict[str, list[Any]], path: Path) -> list[tuple[str, dict[str, list[Any]]]]:
    out = []
    for j, e in enumerate(doc.get("entries") or []):
        if not isinstance(e, dict):
            raise TraceFormatError(f"{path}: top-level entry {j} is not a message")
        key = _one(e, "key", path, f"top-level entry {j}", (str,))
        out.append((key, _one(e, "value", path, f"top-level entry {j} ({key})", (dict,))))
    if not out:
        raise TraceFormatError(f"{path}: no 'entries {{ key: \"sm_..\" value {{ ... }} }}' found")
    return out


def matmul_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """XLA's measured GEMM throughput (``matmul_interpolator_data.h``) as one row per (gpu, b, m, n, k,
    dtype key): ``gpu, b, m, n, k, dtype_key, flops, time_s``."""
    p = Path(path)
    rows = []
    for gpu, val in _gpu_entries(read_table(p), p):
        for j, e in enumerate(val.get("entries") or []):
            where = f"{gpu} entry {j}"
            shape = {f: _one(e, f, p, where) for f in ("b", "m", "n", "k")}
            if min(shape.values()) < 1:
                raise TraceFormatError(f"{p}: {where}: b, m, n, k must be >= 1; got {shape}")
            fl = e.get("flops") or []
            if not fl:
                raise TraceFormatError(f"{p}: {where}: no 'flops {{ key: .. value: .. }}' map")
            for q in fl:
                key = _one(q, "key", p, where + " flops", (str,))
                v = _one(q, "value", p, where + f" flops {key}", (int, float))
                if not v > 0:
                    raise TraceFormatError(f"{p}: {where}: flops {key} value={v!r} must be > 0")
                rows.append({"gpu": gpu, **shape, "dtype_key": key, "flops": float(v)})
    df = pd.DataFrame(rows)
    if df.empty:
        raise TraceFormatError(f"{p}: no GEMM entries")
    dup = df.duplicated(["gpu", "b", "m", "n", "k", "dtype_key"])
    if dup.any():
        r = df[dup].iloc[0]
        raise TraceFormatError(f"{p}: shape b={r.b} m={r.m} n={r.n} k={r.k} {r.dtype_key} measured twice")
    df["time_s"] = 2.0 * df["b"] * df["m"] * df["n"] * df["k"] / df["flops"]
    return df


def collective_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """XLA's measured collective throughput (``collective_interpolator_data*.h``): ``gpu, op, element_type,
    elements, group_size, num_groups, throughput, bytes, time_s`` (module docstring: ``bytes`` as nccl-tests)."""
    p = Path(path)
    rows = []
    for gpu, val in _gpu_entries(read_table(p), p):
        for j, e in enumerate(val.get("entries") or []):
            where = f"{gpu} entry {j}"
            ins = _one(e, "instruction", p, where, (dict,))
            opcode = _one(ins, "opcode", p, where, (str,))
            if opcode not in OPCODES:
                raise TraceFormatError(f"{p}: {where}: opcode {opcode!r} is not one of {sorted(OPCODES)}")
            shape = _one(ins, "shape", p, where, (dict,))
            et = _one(shape, "element_type", p, where + " shape", (str,))
            if et not in ELEMENT_BYTES:
                raise TraceFormatError(f"{p}: {where}: element_type {et!r} is not one of {sorted(ELEMENT_BYTES)}")
            dims = shape.get("dimensions") or []
            if len(dims) != 1 or not isinstance(dims[0], int) or dims[0] < 1:
                raise TraceFormatError(f"{p}: {where}: shape must have one positive dimension; got {dims!r}")
            devs = _one(ins, "collective_device_list", p, where, (dict,))
            iota = _one(devs, "iota_replica_group_list", p, where, (dict,))
            n = _one(iota, "num_devices_per_group", p, where)
            groups = _one(iota, "num_replica_groups", p, where)
            thr = _one(e, "network_throughput_bytes_per_sec", p, where, (int, float))
            if n < 1 or groups < 1 or not thr > 0:
                raise TraceFormatError(f"{p}: {where}: num_devices_per_group={n}, num_replica_groups={groups} "
                                       f"and network_throughput_bytes_per_sec={thr} must be positive")
            op = OPCODES[opcode]
            shape_bytes = dims[0] * ELEMENT_BYTES[et]
            nbytes = shape_bytes * n if op == "reduce_scatter" else shape_bytes
            rows.append({"gpu": gpu, "op": op, "element_type": et, "elements": dims[0], "group_size": n,
                         "num_groups": groups, "throughput": float(thr), "bytes": int(nbytes),
                         "time_s": nbytes / float(thr)})
    df = pd.DataFrame(rows)
    if df.empty:
        raise TraceFormatError(f"{p}: no collective entries")
    return df
