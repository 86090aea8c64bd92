"""PyTorch profiler (Kineto) JSON traces, one file per rank, into events.

What is read from a trace (Chrome trace format, ``traceEvents`` of complete ``"ph": "X"`` events):

* **rank, world**: ``distributedInfo.rank`` / ``world_size`` (required: a multi-rank job needs them).
* **calls**: newer PyTorch (≥ 2.1) writes ``record_param_comms`` CPU ops whose ``args`` carry
  ``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Group size``,
  ``Process Group Ranks`` (a string ``"[0, 1]"``), ``Process Group Name``/``Process Group Description``,
  ``Global rank start``/``stride`` and ``In split size``/``Out split size``. Older traces (e.g. PARAM's
  DLRM files) have none of that; there the ``nccl:<op>`` annotation nested in the call gives the op, and its
  ``Input Dims``/``Input type`` the element count and dtype; the group is the default group of
  ``world_size`` ranks and all-to-all split sizes are unknown (``split_bytes`` null).
* **bytes** (nccl-tests convention): all_reduce/broadcast/all_to_all/reduce_scatter/send: the input;
  all_gather/recv: the output; all-to-all ``split_bytes`` from ``In split size`` (an empty list means an
  even split).
* **device time**: a call's NCCL kernel (``ncclKernel_*``/``ncclDevKernel_*``, category ``kernel``) is
  found by the CUDA launch (``cuda_runtime``/``cuda_driver``) that shares its ``correlation`` id and lies
  inside the call's CPU span on the same thread. ``t_start_ns``/``t_end_ns`` are the kernel's start and end
  (``ts`` in µs, plus ``baseTimeNanoseconds`` when present); null when no kernel was matched. Several kernels
  of one call (coalesced) span from the first start to the last end.
* **iteration**: ``N`` of the ``ProfilerStep#N`` span holding the call (before the first span: the first N).
* **phase**: ``optimizer`` inside an ``Optimizer.step`` span; ``backward`` inside an
  ``autograd::engine::evaluate_function`` span or a ``bwd``/``backward`` annotation on the same thread, or
  on a thread other than the ones that hold ``ProfilerStep`` spans (the autograd thread); else ``forward``.
* **received bytes** of old-style all-to-alls (no split sizes): the output tensor of the enclosing
  ``c10d::alltoall_base_`` op, kept in ``meta['a2a_recv_bytes']`` (call order) for
  :func:`llmcomm.analysis.a2a_matrix_estimate`.

Speed: files in the profiler's own layout (one event per ``"\n  {" ... "\n  }"`` block) take a fast path that
finds the events above with one regex scan and parses only those blocks plus the document without its
events (which still validates the outer structure: a truncated file is an error). Other layouts get a full
JSON parse; both give the same table (tested on the real traces). orjson is used when installed.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import TraceFormatError
from .common import (
    EventBuilder,
    GroupTagger,
    as_int,
    dtype_info,
    group_range,
    guarded,
    op_name,
    parse_rank_list,
)
from .sources import Source, loads_json

# Kineto writes one event per block: "[\n  {\n    "ph": ..., "cat": ..., "name": ...\n  },\n  {..."
_ARRAY_START = b'"traceEvents": [\n  {'
_ARRAY_END = b"}\n  ]"
_BLOCK_OPEN = b"\n  {"
_BLOCK_CLOSE = b"\n  }"
_WANTED = re.compile(
    rb'"name": "(?:record_param_comms|nccl:|ProfilerStep#|Optimizer\.step|autograd::engine::evaluate_function'
    rb'|c10d::alltoall)'
    rb'|"cat": "kernel", "name": "nccl|"cat": "cuda_(?:runtime|driver)", "name": "cu(?:da)?LaunchKernel'
    rb'|"cat": "user_annotation"')

NCCL_KERNEL = re.compile(r"^nccl(Dev)?Kernel", re.IGNORECASE)
BWD_ANNOTATION = re.compile(r"backward|bwd", re.IGNORECASE)


def looks_like(doc: Any) -> bool:
    return isinstance(doc, dict) and "traceEvents" in doc


class _Spans:
    """Time spans (start, end) that answer "is time t inside any span" for sorted queries in O(log n)."""

    def __init__(self) -> None:
        self.s: list[float] = []
        self.e: list[float] = []
        self._ready: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, s: float, e: float) -> None:
        self.s.append(s)
        self.e.append(e)

    def contains(self, t: float) -> bool:
        if not self.s:
            return False
        if self._ready is None:
            order = np.argsort(self.s, kind="stable")
            starts = np.asarray(self.s)[order]
            self._ready = (starts, np.maximum.accumulate(np.asarray(self.e)[order]))
        starts, maxend = self._ready
        i = int(np.searchsorted(starts, t, side="right")) - 1
        return i >= 0 and maxend[i] >= t


def _num(v: Any, origin: str, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TraceFormatError(f"{origin}: field {field!r}: expected a number, got {v!r:.60}")
    return float(v)


def _dims_numel(dims: Any, origin: str) -> int:
    """Element count of the first input of an ``nccl:*`` annotation (``Input Dims``: ``[[6144]]``; a tensor
    list ``[[a], [b]]`` counts every tensor)."""
    if not isinstance(dims, list) or not dims:
        raise TraceFormatError(f"{origin}: field 'Input Dims': expected a list of shapes")
    shapes = dims if all(isinstance(d, list) for d in dims) else [dims]
    total = 0
    for shp in shapes:
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shp):
            raise TraceFormatError(f"{origin}: field 'Input Dims': not a shape: {shp!r:.60}")
        total += int(np.prod(shp, dtype=np.int64)) if shp else 0
    return total


@guarded("Kineto")
def parse(src: Source, parallel_tagger: GroupTagger | None = None, rank: int | None = None,
          fast: bool = True) -> tuple[pa.Table, dict]:
    """One Kineto trace -> (events table of its rank, meta). See the module docstring for the rules.

    ``fast``: when the file has the profiler's own layout, parse only the events that matter (see
    :func:`_split_kineto_layout`); ``fast=False`` always parses the whole document (same result)."""
    origin = src.name
    split = _split_kineto_layout(src) if fast else None
    if split is not None:
        doc, events = split
    else:
        doc = loads_json(src)
        if not looks_like(doc):
            raise TraceFormatError(f"{origin}: field 'traceEvents': missing; not a PyTorch profiler trace")
        events = doc["traceEvents"]
    if not isinstance(events, list):
        raise TraceFormatError(f"{origin}: field 'traceEvents': expected a list, got {type(events).__name__}")
    dist = doc.get("distributedInfo")
    if dist is not None and not isinstance(dist, dict):
        raise TraceFormatError(f"{origin}: field 'distributedInfo': expected an object")
    dist = dist or {}
    if "rank" in dist:
        rank = as_int(dist["rank"], origin, "distributedInfo.rank")
    elif rank is None:
        raise TraceFormatError(f"{origin}: field 'distributedInfo.rank': missing; cannot tell which rank wrote "
                               "this trace (pass rank= for a single file)")
    world = as_int(dist["world_size"], origin, "distributedInfo.world_size", 1) if "world_size" in dist else None
    if world is not None and rank >= world:
        raise TraceFormatError(f"{origin}: field 'distributedInfo.rank': {rank} >= world_size {world}")
    base_ns = doc.get("baseTimeNanoseconds", 0)
    base_ns = as_int(base_ns, origin, "baseTimeNanoseconds") if base_ns else 0
    pg_by_name: dict[str, dict] = {}
    pgs = dist.get("pg_config") or []
    for pg in pgs if isinstance(pgs, list) else []:
        if isinstance(pg, dict) and "pg_name" in pg:
            pg_by_name[str(pg["pg_name"])] = pg

    rpcs: list[dict] = []
    annots: list[dict] = []
    steps: list[tuple[float, int]] = []
    step_tids: set = set()
    opt_spans: dict[Any, _Spans] = {}
    bwd_spans: dict[Any, _Spans] = {}
    kernels: dict[Any, tuple[float, float]] = {}
    launches: list[tuple[Any, float, Any]] = []
    a2a_ops: list[dict] = []
    for e in events:
        if not isinstance(e, dict):
            raise TraceFormatError(f"{origin}: field 'traceEvents[]': expected objects, got {type(e).__name__}")
        if e.get("ph") != "X":
            continue
        name = e.get("name")
        if not isinstance(name, str):
            continue
        cat = e.get("cat")
        if cat == "kernel":
            if NCCL_KERNEL.match(name):
                corr = (e.get("args") or {}).get("correlation")
                _num(e.get("ts"), origin, "ts")
                _num(e.get("dur", 0), origin, "dur")
                kernels[corr] = (e["ts"], e.get("dur", 0))
        elif cat in ("cuda_runtime", "cuda_driver"):
            args = e.get("args")
            if isinstance(args, dict) and "correlation" in args:
                launches.append((e.get("tid"), _num(e.get("ts"), origin, "ts"), args["correlation"]))
        elif name == "record_param_comms":
            rpcs.append(e)
        elif name.startswith("nccl:"):
            if cat != "gpu_user_annotation":
                annots.append(e)
        elif name.startswith("c10d::alltoall"):
            a2a_ops.append(e)
        elif name.startswith("ProfilerStep#"):
            try:
                n = int(name[13:])
            except ValueError:
                raise TraceFormatError(f"{origin}: field 'name': bad step span {name!r:.60}") from None
            steps.append((_num(e.get("ts"), origin, "ts"), n))
            step_tids.add(e.get("tid"))
        elif name.startswith("Optimizer.step"):
            ts = _num(e.get("ts"), origin, "ts")
            opt_spans.setdefault(e.get("tid"), _Spans()).add(ts, ts + _num(e.get("dur", 0), origin, "dur"))
        elif name.startswith("autograd::engine::evaluate_function") or (
                cat == "user_annotation" and BWD_ANNOTATION.search(name)):
            ts = _num(e.get("ts"), origin, "ts")
            bwd_spans.setdefault(e.get("tid"), _Spans()).add(ts, ts + _num(e.get("dur", 0), origin, "dur"))

    new_style = [e for e in rpcs if isinstance(e.get("args"), dict) and "Collective name" in e["args"]]
    calls: list[dict] = []
    skipped: dict[str, int] = {}
    if new_style:
        for e in new_style:
            c = _call_from_rpc(e, origin, rank, world, pg_by_name)
            if c is None:
                nm = str(e["args"].get("Collective name"))
                skipped[nm] = skipped.get(nm, 0) + 1
            else:
                calls.append(c)
        metadata = "record_param_comms"
    else:
        for e in annots:
            c = _call_from_annotation(e, origin, rank, world)
            if c is None:
                skipped[e["name"]] = skipped.get(e["name"], 0) + 1
            else:
                calls.append(c)
        metadata = "nccl annotations"
        if kernels and not calls:
            raise TraceFormatError(f"{origin}: field 'record_param_comms': missing metadata — the trace has NCCL "
                                   "kernels but neither record_param_comms 'Collective name' nor nccl:* annotations")

    recv = _a2a_received(calls, a2a_ops, origin) if not new_style else []
    _match_kernels(calls, kernels, launches, base_ns)
    steps.sort()
    step_ts = [s for s, _ in steps]
    b = EventBuilder("kineto")
    for c in sorted(calls, key=lambda c: c["ts"]):
        t = c["ts"]
        if steps:
            i = bisect_right(step_ts, t) - 1
            iteration = steps[max(i, 0)][1]
        else:
            iteration = 0
        tid = c["tid"]
        if tid in opt_spans and opt_spans[tid].contains(t):
            phase = "optimizer"
        elif (tid in bwd_spans and bwd_spans[tid].contains(t)) or (step_tids and tid not in step_tids):
            phase = "backward"
        else:
            phase = "forward"
        op = c["op"]
        par = parallel_tagger.tag(c["desc"], c["group"], op) if parallel_tagger else "other"
        b.add(rank=rank, op=op, group=c["group"], nbytes=c["bytes"], parallelism=par, iteration=iteration,
              phase=phase, peer=c["peer"], dtype=c["dtype"], split_bytes=c["split"], t_start_ns=c.get("t0"),
              t_end_ns=c.get("t1"))
    meta = {"rank": rank, "world_size": world, "metadata": metadata, "skipped": skipped,
            "nccl_version": dist.get("nccl_version"), "kernels_matched": sum(1 for c in calls if "t0" in c),
            "calls": len(calls)}
    if recv:
        meta["a2a_recv_bytes"] = recv
    return b.table(origin), meta


def _group_of(args: dict, origin: str, rank: int, world: int | None, pg_by_name: dict[str, dict]) -> list[int]:
    if "Process Group Ranks" in args:
        try:
            g = parse_rank_list(args["Process Group Ranks"], origin, "Process Group Ranks")
        except TraceFormatError:
            g = []  # very large groups are written truncated; fall back to start/stride/size
        if g:
            if "Group size" in args and len(g) != as_int(args["Group size"], origin, "Group size", 1):
                raise TraceFormatError(f"{origin}: field 'Process Group Ranks': {len(g)} ranks, but 'Group size' "
                                       f"says {args['Group size']}")
            return g
    if "Global rank start" in args and "Group size" in args:
        return group_range(as_int(args["Global rank start"], origin, "Global rank start"),
                           as_int(args.get("Global rank stride", 1), origin, "Global rank stride", 1),
                           as_int(args["Group size"], origin, "Group size", 1))
    pg = pg_by_name.get(str(args.get("Process Group Name")))
    if pg and isinstance(pg.get("ranks"), list) and pg["ranks"]:
        return parse_rank_list(pg["ranks"], origin, "distributedInfo.pg_config.ranks")
    size = as_int(args["Group size"], origin, "Group size", 1) if "Group size" in args else world
    if size is not None and world is not None and size == world:
        return list(range(world))
    raise TraceFormatError(f"{origin}: field 'Process Group Ranks': missing, and the group cannot be rebuilt "
                           "from 'Global rank start'/'Group size' or distributedInfo.pg_config")


def _call_from_rpc(e: dict, origin: str, rank: int, world: int | None, pg_by_name: dict) -> dict | None:
    a = e["args"]
    name = a.get("Collective name")
    if not isinstance(name, str):
        raise TraceFormatError(f"{origin}: field 'Collective name': expected a string, got {name!r:.60}")
    op = op_name(name)
    if op is None:  # wait, barrier, coalescing markers, gather/scatter: not in the events table
        return None
    dtype, size = dtype_info(a.get("dtype", ""), origin, "dtype")
    n_in = as_int(a.get("In msg nelems"), origin, "In msg nelems")
    n_out = as_int(a.get("Out msg nelems", n_in), origin, "Out msg nelems")
    group = _group_of(a, origin, rank, world, pg_by_name)
    if rank not in group:
        raise TraceFormatError(f"{origin}: field 'Process Group Ranks': rank {rank} is not in its group {group[:16]}")
    nbytes = (n_out if op in ("all_gather", "recv") else n_in) * size
    split = None
    peer = -1
    if op == "all_to_all":
        ins = parse_rank_list(a.get("In split size", "[]"), origin, "In split size")
        if ins:
            if len(ins) != len(group):
                raise TraceFormatError(f"{origin}: field 'In split size': {len(ins)} entries for a group of "
                                       f"{len(group)}")
            # split sizes count rows of dim 0; a row holds n_in / sum(splits) elements
            tot = sum(ins)
            if tot and n_in % tot:
                raise TraceFormatError(f"{origin}: field 'In split size': splits sum to {tot}, which does not "
                                       f"divide In msg nelems={n_in}")
            row = n_in // tot if tot else 0
            split = [x * row * size for x in ins]
        elif nbytes % len(group) == 0:
            split = [nbytes // len(group)] * len(group)
    elif op in ("send", "recv"):
        for k in ("Peer rank", "peer", "dst" if op == "send" else "src"):
            if k in a:
                peer = as_int(a[k], origin, k)
                break
        else:
            others = [g for g in group if g != rank]
            if len(others) != 1:
                return None  # a point-to-point record without its peer: not representable
            peer = others[0]
    ts = _num(e.get("ts"), origin, "ts")
    return {"op": op, "bytes": nbytes, "dtype": dtype, "group": group, "split": split, "peer": peer,
            "desc": a.get("Process Group Description") or a.get("Process Group Name"), "tid": e.get("tid"),
            "ts": ts, "end": ts + _num(e.get("dur", 0), origin, "dur")}


def _call_from_annotation(e: dict, origin: str, rank: int, world: int | None) -> dict | None:
    op = op_name(e["name"])
    if op is None or op in ("send", "recv"):
        return None
    a = e.get("args")
    if not isinstance(a, dict):
        raise TraceFormatError(f"{origin}: field 'args' of {e['name']}: missing")
    if "Input Dims" not in a or "Input type" not in a:
        raise TraceFormatError(f"{origin}: field 'Input Dims': missing on {e['name']}; the trace was recorded "
                               "without record_shapes and has no record_param_comms metadata")
    types = a["Input type"]
    if not isinstance(types, list) or not types:
        raise TraceFormatError(f"{origin}: field 'Input type': expected a list of type names")
    dtype, size = dtype_info(types[0], origin, "Input type")
    numel = _dims_numel(a["Input Dims"], origin)
    if world is None:
        raise TraceFormatError(f"{origin}: field 'distributedInfo.world_size': missing; needed for the group of "
                               f"{e['name']} (the trace has no process-group metadata)")
    group = list(range(world))
    ts = _num(e.get("ts"), origin, "ts")
    return {"op": op, "bytes": numel * size, "numel": numel, "dtype": dtype, "group": group, "split": None,
            "peer": -1,
            "desc": None, "tid": e.get("tid"), "ts": ts, "end": ts + _num(e.get("dur", 0), origin, "dur")}


def _match_kernels(calls: list[dict], kernels: dict, launches: list[tuple[Any, float, Any]], base_ns: int) -> None:
    """Attach each NCCL kernel to the call whose CPU span holds the kernel's launch (same thread)."""
    if not kernels or not calls:
        return
    by_tid: dict[Any, list[dict]] = {}
    for c in calls:
        by_tid.setdefault(c["tid"], []).append(c)
    starts = {}
    for tid, cs in by_tid.items():
        cs.sort(key=lambda c: c["ts"])
        starts[tid] = [c["ts"] for c in cs]
    for tid, ts, corr in launches:
        k = kernels.get(corr)
        if k is None or tid not in by_tid:
            continue
        i = bisect_right(starts[tid], ts) - 1
        if i < 0:
            continue
        c = by_tid[tid][i]
        if ts > c["end"]:
            continue
        t0 = base_ns + _us_to_ns(k[0])
        t1 = t0 + _us_to_ns(k[1])
        c["t0"] = min(c.get("t0", t0), t0)
        c["t1"] = max(c.get("t1", t1), t1)


def _us_to_ns(v: float | int) -> int:
    """Microseconds (an int, or a float with sub-µs digits) to integer nanoseconds without losing the
    integer part to float rounding (1.7e15 µs · 1000 is past 2**53)."""
    if isinstance(v, int):
        return v * 1000
    whole = int(v)
    return whole * 1000 + round((v - whole) * 1000)


def _a2a_received(calls: list[dict], a2a_ops: list[dict], origin: str) -> list[int | None]:
    """For traces without split sizes: the bytes each all_to_all *received*, in call order, from the output
    tensor (first input, ``Input Dims[0]``) of the enclosing ``c10d::alltoall_base_`` op; ``None`` where
    there is none. With the bytes sent, these are the row and column sums of the all-to-all matrix."""
    out: list[int | None] = []
    for c in sorted((c for c in calls if c["op"] == "all_to_all"), key=lambda c: c["ts"]):
        got = None
        for e in a2a_ops:
            ts = e.get("ts")
            if e.get("tid") == c["tid"] and isinstance(ts, (int, float)) and ts <= c["ts"] <= ts + e.get("dur", 0):
                dims = (e.get("args") or {}).get("Input Dims")
                if isinstance(dims, list) and dims and isinstance(dims[0], list):
                    got = _dims_numel([dims[0]], origin) * (c["bytes"] // max(_dims_numel_safe(c), 1))
                break
        out.append(got)
    return out


def _dims_numel_safe(c: dict) -> int:
    return c.get("numel", 0)


def _split_kineto_layout(src: Source) -> tuple[dict, list[dict]] | None:
    """Fast path for files in the profiler's own layout: locate the events that can matter (communication
    records and annotations, NCCL kernels, kernel launches, step / optimizer / backward spans) with one regex
    scan, parse just their blocks, and parse the document without its events (metadata, and a check of
    the outer structure, so a truncated file is still an error). Memory stays near the file's size instead
    of a Python object per event. ``None`` (use the full parse) when the layout is not recognized or
    orjson is not installed."""
    try:
        import orjson
    except ImportError:
        return None

    data = src.data
    start = data.find(_ARRAY_START)
    if start < 0:
        return None
    first = start + len(_ARRAY_START) - 1  # the first event's "{"
    last_open = data.rfind(_BLOCK_OPEN)
    end = data.find(_ARRAY_END, max(last_open, first))
    if end < 0:
        return None  # truncated, or another layout: the full parse decides
    try:
        header = orjson.loads(data[:start] + b'"traceEvents": []' + data[end + len(_ARRAY_END):])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(header, dict):
        return None
    events = []
    loads = orjson.loads
    prev = -1
    find, rfind = data.find, data.rfind
    for m in _WANTED.finditer(data, first, end + 1):
        p = m.start()
        if p < prev:
            continue  # a second marker inside the block just taken
        b0 = rfind(_BLOCK_OPEN, first - 3, p)
        b0 = first if b0 < 0 else b0 + 3
        b1 = find(_BLOCK_CLOSE, p, end + 1)
        b1 = end + 1 if b1 < 0 else b1 + 4
        prev = b1
        try:
            events.append(loads(data[b0:b1]))
        except orjson.JSONDecodeError as e:
            raise TraceFormatError(f"{src.name}: not valid JSON near byte {b0}: {e}") from None
    return header, events
