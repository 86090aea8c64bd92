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
  :func:`llmcomm.analysis.alltoall.a2a_matrix_estimate`.

Speed: files in the profiler's own layout (one event per ``"\n  {" ... "\n  }"`` block) take a fast path that
finds the events above with one regex scan and parses only those blocks plus the document without its
events (which still validates the outer structure: a truncated file is an error). Other layouts get a full
JSON parse; both give the same table (tested on the real traces). orjson is used when installed.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field
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
from .readers import FunctionReader, ReadContext, TraceTable
from .sources import Source, json_list

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


KINETO_KEYS = (b'"traceEvents"', b'"distributedInfo"', b'"deviceProperties"')


def is_profiler_document(doc: Any) -> bool:
    """A parsed JSON document with ``traceEvents``."""
    return isinstance(doc, dict) and "traceEvents" in doc


def looks_like(source: Source) -> bool:
    """JSON whose first 64 KiB name a profiler key (``traceEvents``, ``distributedInfo``,
    ``deviceProperties``), or, failing that, whose parsed document has ``traceEvents``."""
    if not source.is_json():
        return False
    if any(source.head_contains(key) for key in KINETO_KEYS):
        return True
    return is_profiler_document(source.json_or_none())


def read(source: Source, context: ReadContext) -> TraceTable:
    """The reader protocol's entry point: :func:`parse` with the context's group tagger and rank."""
    return parse(source, context.tagger, context.rank)


class _Spans:
    """Time spans (start, end) that answer "is time t inside any span" for sorted queries in O(log n)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, start: float, end: float) -> None:
        self.starts.append(start)
        self.ends.append(end)

    def contains(self, t: float) -> bool:
        if not self.starts:
            return False
        if self._sorted is None:
            order = np.argsort(self.starts, kind="stable")
            starts = np.asarray(self.starts)[order]
            self._sorted = (starts, np.maximum.accumulate(np.asarray(self.ends)[order]))
        starts, latest_end = self._sorted
        i = int(np.searchsorted(starts, t, side="right")) - 1
        return i >= 0 and latest_end[i] >= t


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
    for shape in shapes:
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape):
            raise TraceFormatError(f"{origin}: field 'Input Dims': not a shape: {shape!r:.60}")
        total += int(np.prod(shape, dtype=np.int64)) if shape else 0
    return total


@dataclass
class _Scan:
    """The events of one trace that the reader uses, sorted by role (one pass over ``traceEvents``)."""

    origin: str
    comm_records: list[dict] = field(default_factory=list)  # record_param_comms CPU ops
    nccl_annotations: list[dict] = field(default_factory=list)  # nccl:<op> CPU annotations
    steps: list[tuple[float, int]] = field(default_factory=list)  # (ts, N) of each ProfilerStep#N
    step_threads: set = field(default_factory=set)
    optimizer_spans: dict[Any, _Spans] = field(default_factory=dict)  # per thread
    backward_spans: dict[Any, _Spans] = field(default_factory=dict)  # per thread
    kernels: dict[Any, tuple[Any, Any]] = field(default_factory=dict)  # correlation -> (ts, dur), µs as written
    launches: list[tuple[Any, float, Any]] = field(default_factory=list)  # (tid, ts, correlation)
    alltoall_ops: list[dict] = field(default_factory=list)  # c10d::alltoall* CPU ops
    _step_starts: list[float] = field(default_factory=list)

    def add(self, event: Any) -> None:
        """File ``event`` under its role (or nowhere); malformed fields of a used event are errors."""
        origin = self.origin
        if not isinstance(event, dict):
            raise TraceFormatError(f"{origin}: field 'traceEvents[]': expected objects, got {type(event).__name__}")
        if event.get("ph") != "X":
            return
        name = event.get("name")
        if not isinstance(name, str):
            return
        category = event.get("cat")
        if category == "kernel":
            if NCCL_KERNEL.match(name):
                correlation = (event.get("args") or {}).get("correlation")
                _num(event.get("ts"), origin, "ts")
                _num(event.get("dur", 0), origin, "dur")
                self.kernels[correlation] = (event["ts"], event.get("dur", 0))
        elif category in ("cuda_runtime", "cuda_driver"):
            args = event.get("args")
            if isinstance(args, dict) and "correlation" in args:
                self.launches.append((event.get("tid"), _num(event.get("ts"), origin, "ts"), args["correlation"]))
        elif name == "record_param_comms":
            self.comm_records.append(event)
        elif name.startswith("nccl:"):
            if category != "gpu_user_annotation":
                self.nccl_annotations.append(event)
        elif name.startswith("c10d::alltoall"):
            self.alltoall_ops.append(event)
        elif name.startswith("ProfilerStep#"):
            try:
                step = int(name[13:])
            except ValueError:
                raise TraceFormatError(f"{origin}: field 'name': bad step span {name!r:.60}") from None
            self.steps.append((_num(event.get("ts"), origin, "ts"), step))
            self.step_threads.add(event.get("tid"))
        elif name.startswith("Optimizer.step"):
            self._add_span(self.optimizer_spans, event)
        elif name.startswith("autograd::engine::evaluate_function") or (
                category == "user_annotation" and BWD_ANNOTATION.search(name)):
            self._add_span(self.backward_spans, event)

    def _add_span(self, spans: dict[Any, _Spans], event: dict) -> None:
        ts = _num(event.get("ts"), self.origin, "ts")
        spans.setdefault(event.get("tid"), _Spans()).add(ts, ts + _num(event.get("dur", 0), self.origin, "dur"))

    def iteration_at(self, ts: float) -> int:
        """``N`` of the last ``ProfilerStep#N`` starting at or before ``ts`` (the first N before any; 0
        without steps). Call after :meth:`sort_steps`."""
        if not self.steps:
            return 0
        i = bisect_right(self._step_starts, ts) - 1
        return self.steps[max(i, 0)][1]

    def sort_steps(self) -> None:
        self.steps.sort()
        self._step_starts = [ts for ts, _ in self.steps]

    def phase_of(self, tid: Any, ts: float) -> str:
        """``optimizer``, ``backward`` or ``forward`` for a call on thread ``tid`` at ``ts`` (module docstring)."""
        if tid in self.optimizer_spans and self.optimizer_spans[tid].contains(ts):
            return "optimizer"
        if ((tid in self.backward_spans and self.backward_spans[tid].contains(ts))
                or (self.step_threads and tid not in self.step_threads)):
            return "backward"
        return "forward"


def _load(src: Source, fast: bool) -> tuple[dict, list]:
    """The document (possibly without its events) and the events to read: through the fast path when
    ``fast`` and the layout allows, else a full parse."""
    split = _split_kineto_layout(src) if fast else None
    if split is not None:
        return split
    return json_list(src, "traceEvents", is_profiler_document, "a PyTorch profiler trace")


def _distributed_info(doc: dict, origin: str, rank: int | None) -> tuple[dict, int, int | None]:
    """``(distributedInfo, rank, world_size)``; the file's rank wins over the ``rank`` hint."""
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
    return dist, rank, world


def _process_groups_by_name(dist: dict) -> dict[str, dict]:
    """``distributedInfo.pg_config`` entries by ``pg_name``."""
    configs = dist.get("pg_config") or []
    return {str(pg["pg_name"]): pg for pg in (configs if isinstance(configs, list) else [])
            if isinstance(pg, dict) and "pg_name" in pg}


def _calls(scan: _Scan, rank: int, world: int | None, groups_by_name: dict[str, dict]
           ) -> tuple[list[dict], dict[str, int], str]:
    """The communication calls, from ``record_param_comms`` metadata when the trace has it, else from the
    ``nccl:*`` annotations: ``(calls, skipped record counts by name, which metadata was used)``."""
    origin = scan.origin
    described = [e for e in scan.comm_records if isinstance(e.get("args"), dict) and "Collective name" in e["args"]]
    calls: list[dict] = []
    skipped: dict[str, int] = {}
    if described:
        for event in described:
            call = _call_from_rpc(event, origin, rank, world, groups_by_name)
            if call is None:
                name = str(event["args"].get("Collective name"))
                skipped[name] = skipped.get(name, 0) + 1
            else:
                calls.append(call)
        return calls, skipped, "record_param_comms"
    for event in scan.nccl_annotations:
        call = _call_from_annotation(event, origin, rank, world)
        if call is None:
            skipped[event["name"]] = skipped.get(event["name"], 0) + 1
        else:
            calls.append(call)
    if scan.kernels and not calls:
        raise TraceFormatError(f"{origin}: field 'record_param_comms': missing metadata — the trace has NCCL "
                               "kernels but neither record_param_comms 'Collective name' nor nccl:* annotations")
    return calls, skipped, "nccl annotations"


def _events_table(calls: list[dict], scan: _Scan, rank: int, tagger: GroupTagger | None) -> pa.Table:
    """One event per call, in start order, with its iteration, phase and tagged parallelism."""
    scan.sort_steps()
    builder = EventBuilder("kineto")
    for call in sorted(calls, key=lambda c: c["ts"]):
        op = call["op"]
        builder.add(rank=rank, op=op, group=call["group"], nbytes=call["bytes"],
                    parallelism=tagger.tag(call["desc"], call["group"], op) if tagger else "other",
                    iteration=scan.iteration_at(call["ts"]), phase=scan.phase_of(call["tid"], call["ts"]),
                    peer=call["peer"], dtype=call["dtype"], split_bytes=call["split"], t_start_ns=call.get("t0"),
                    t_end_ns=call.get("t1"))
    return builder.table(scan.origin)


@guarded("Kineto")
def parse(src: Source, parallel_tagger: GroupTagger | None = None, rank: int | None = None,
          fast: bool = True) -> TraceTable:
    """One Kineto trace -> (events table of its rank, meta). See the module docstring for the rules.

    ``fast``: when the file has the profiler's own layout, parse only the events that matter (see
    :func:`_split_kineto_layout`); ``fast=False`` always parses the whole document (same result)."""
    origin = src.name
    doc, events = _load(src, fast)
    dist, rank, world = _distributed_info(doc, origin, rank)
    base_ns = doc.get("baseTimeNanoseconds", 0)
    base_ns = as_int(base_ns, origin, "baseTimeNanoseconds") if base_ns else 0
    groups_by_name = _process_groups_by_name(dist)
    scan = _Scan(origin)
    for event in events:
        scan.add(event)
    calls, skipped, metadata = _calls(scan, rank, world, groups_by_name)
    received = _a2a_received(calls, scan.alltoall_ops, origin) if metadata == "nccl annotations" else []
    _match_kernels(calls, scan.kernels, scan.launches, base_ns)
    table = _events_table(calls, scan, rank, parallel_tagger)
    meta = {"rank": rank, "world_size": world, "metadata": metadata, "skipped": skipped,
            "nccl_version": dist.get("nccl_version"), "kernels_matched": sum(1 for c in calls if "t0" in c),
            "calls": len(calls)}
    if received:
        meta["a2a_recv_bytes"] = received
    return TraceTable(table, meta)

def _group_of(args: dict, origin: str, rank: int, world: int | None,
              groups_by_name: dict[str, dict]) -> list[int]:
    """The global ranks of a call's process group: its ``Process Group Ranks``, else rebuilt from
    ``Global rank start``/``stride``/``Group size``, else ``distributedInfo.pg_config``, else the world."""
    if "Process Group Ranks" in args:
        try:
            ranks = parse_rank_list(args["Process Group Ranks"], origin, "Process Group Ranks")
        except TraceFormatError:
            ranks = []  # very large groups are written truncated; fall back to start/stride/size
        if ranks:
            if "Group size" in args and len(ranks) != as_int(args["Group size"], origin, "Group size", 1):
                raise TraceFormatError(f"{origin}: field 'Process Group Ranks': {len(ranks)} ranks, but 'Group "
                                       f"size' says {args['Group size']}")
            return ranks
    if "Global rank start" in args and "Group size" in args:
        return group_range(as_int(args["Global rank start"], origin, "Global rank start"),
                           as_int(args.get("Global rank stride", 1), origin, "Global rank stride", 1),
                           as_int(args["Group size"], origin, "Group size", 1))
    config = groups_by_name.get(str(args.get("Process Group Name")))
    if config and isinstance(config.get("ranks"), list) and config["ranks"]:
        return parse_rank_list(config["ranks"], origin, "distributedInfo.pg_config.ranks")
    size = as_int(args["Group size"], origin, "Group size", 1) if "Group size" in args else world
    if size is not None and world is not None and size == world:
        return list(range(world))
    raise TraceFormatError(f"{origin}: field 'Process Group Ranks': missing, and the group cannot be rebuilt "
                           "from 'Global rank start'/'Group size' or distributedInfo.pg_config")


def _alltoall_split(args: dict, origin: str, group: list[int], n_in: int, elem_size: int,
                    nbytes: int) -> list[int] | None:
    """Bytes sent to each peer of an all_to_all: from ``In split size`` (rows of dim 0; a row holds
    ``n_in / Σ splits`` elements), an even split when the list is empty, None when it cannot be known."""
    in_splits = parse_rank_list(args.get("In split size", "[]"), origin, "In split size")
    if not in_splits:
        return [nbytes // len(group)] * len(group) if nbytes % len(group) == 0 else None
    if len(in_splits) != len(group):
        raise TraceFormatError(f"{origin}: field 'In split size': {len(in_splits)} entries for a group of "
                               f"{len(group)}")
    total_rows = sum(in_splits)
    if total_rows and n_in % total_rows:
        raise TraceFormatError(f"{origin}: field 'In split size': splits sum to {total_rows}, which does not "
                               f"divide In msg nelems={n_in}")
    elements_per_row = n_in // total_rows if total_rows else 0
    return [rows * elements_per_row * elem_size for rows in in_splits]


def _peer_of(args: dict, origin: str, op: str, rank: int, group: list[int]) -> int | None:
    """The partner of a send/recv: a ``Peer rank``/``peer``/``dst``/``src`` field, else the other rank of a
    two-rank group; None when neither says."""
    for key in ("Peer rank", "peer", "dst" if op == "send" else "src"):
        if key in args:
            return as_int(args[key], origin, key)
    others = [g for g in group if g != rank]
    return others[0] if len(others) == 1 else None


def _call_from_rpc(event: dict, origin: str, rank: int, world: int | None, groups_by_name: dict) -> dict | None:
    """A call from a ``record_param_comms`` op with its metadata; None for records that move no data."""
    args = event["args"]
    name = args.get("Collective name")
    if not isinstance(name, str):
        raise TraceFormatError(f"{origin}: field 'Collective name': expected a string, got {name!r:.60}")
    op = op_name(name)
    if op is None:  # wait, barrier, coalescing markers, gather/scatter: not in the events table
        return None
    dtype, elem_size = dtype_info(args.get("dtype", ""), origin, "dtype")
    n_in = as_int(args.get("In msg nelems"), origin, "In msg nelems")
    n_out = as_int(args.get("Out msg nelems", n_in), origin, "Out msg nelems")
    group = _group_of(args, origin, rank, world, groups_by_name)
    if rank not in group:
        raise TraceFormatError(f"{origin}: field 'Process Group Ranks': rank {rank} is not in its group {group[:16]}")
    nbytes = (n_out if op in ("all_gather", "recv") else n_in) * elem_size
    split = None
    peer = -1
    if op == "all_to_all":
        split = _alltoall_split(args, origin, group, n_in, elem_size, nbytes)
    elif op in ("send", "recv"):
        found = _peer_of(args, origin, op, rank, group)
        if found is None:
            return None  # a point-to-point record without its peer: not representable
        peer = found
    ts = _num(event.get("ts"), origin, "ts")
    return {"op": op, "bytes": nbytes, "dtype": dtype, "group": group, "split": split, "peer": peer,
            "desc": args.get("Process Group Description") or args.get("Process Group Name"),
            "tid": event.get("tid"), "ts": ts, "end": ts + _num(event.get("dur", 0), origin, "dur")}


def _call_from_annotation(event: dict, origin: str, rank: int, world: int | None) -> dict | None:
    """A call from an ``nccl:<op>`` annotation of an older trace (group: the world; no split sizes)."""
    op = op_name(event["name"])
    if op is None or op in ("send", "recv"):
        return None
    args = event.get("args")
    if not isinstance(args, dict):
        raise TraceFormatError(f"{origin}: field 'args' of {event['name']}: missing")
    if "Input Dims" not in args or "Input type" not in args:
        raise TraceFormatError(f"{origin}: field 'Input Dims': missing on {event['name']}; the trace was recorded "
                               "without record_shapes and has no record_param_comms metadata")
    types = args["Input type"]
    if not isinstance(types, list) or not types:
        raise TraceFormatError(f"{origin}: field 'Input type': expected a list of type names")
    dtype, elem_size = dtype_info(types[0], origin, "Input type")
    numel = _dims_numel(args["Input Dims"], origin)
    if world is None:
        raise TraceFormatError(f"{origin}: field 'distributedInfo.world_size': missing; needed for the group of "
                               f"{event['name']} (the trace has no process-group metadata)")
    ts = _num(event.get("ts"), origin, "ts")
    return {"op": op, "bytes": numel * elem_size, "numel": numel, "dtype": dtype, "group": list(range(world)),
            "split": None, "peer": -1, "desc": None, "tid": event.get("tid"), "ts": ts,
            "end": ts + _num(event.get("dur", 0), origin, "dur")}


def _match_kernels(calls: list[dict], kernels: dict, launches: list[tuple[Any, float, Any]], base_ns: int) -> None:
    """Attach each NCCL kernel to the call whose CPU span holds the kernel's launch (same thread): the
    call's ``t0``/``t1`` become the first kernel start and the last kernel end (ns)."""
    if not kernels or not calls:
        return
    calls_by_thread: dict[Any, list[dict]] = {}
    for call in calls:
        calls_by_thread.setdefault(call["tid"], []).append(call)
    starts_by_thread = {}
    for tid, thread_calls in calls_by_thread.items():
        thread_calls.sort(key=lambda c: c["ts"])
        starts_by_thread[tid] = [c["ts"] for c in thread_calls]
    for tid, launch_ts, correlation in launches:
        kernel = kernels.get(correlation)
        if kernel is None or tid not in calls_by_thread:
            continue
        i = bisect_right(starts_by_thread[tid], launch_ts) - 1
        if i < 0:
            continue
        call = calls_by_thread[tid][i]
        if launch_ts > call["end"]:
            continue
        kernel_start, kernel_duration = kernel
        t0 = base_ns + _us_to_ns(kernel_start)
        t1 = t0 + _us_to_ns(kernel_duration)
        call["t0"] = min(call.get("t0", t0), t0)
        call["t1"] = max(call.get("t1", t1), t1)


def _us_to_ns(v: float | int) -> int:
    """Microseconds (an int, or a float with sub-µs digits) to integer nanoseconds without losing the
    integer part to float rounding (1.7e15 µs · 1000 is past 2**53)."""
    if isinstance(v, int):
        return v * 1000
    whole = int(v)
    return whole * 1000 + round((v - whole) * 1000)


def _a2a_received(calls: list[dict], alltoall_ops: list[dict], origin: str) -> list[int | None]:
    """For traces without split sizes: the bytes each all_to_all *received*, in call order, from the output
    tensor (first input, ``Input Dims[0]``) of the enclosing ``c10d::alltoall_base_`` op; ``None`` where
    there is none. With the bytes sent, these are the row and column sums of the all-to-all matrix."""
    received: list[int | None] = []
    for call in sorted((c for c in calls if c["op"] == "all_to_all"), key=lambda c: c["ts"]):
        nbytes = None
        for op in alltoall_ops:
            ts = op.get("ts")
            if op.get("tid") == call["tid"] and isinstance(ts, (int, float)) and ts <= call["ts"] <= ts + op.get("dur", 0):
                dims = (op.get("args") or {}).get("Input Dims")
                if isinstance(dims, list) and dims and isinstance(dims[0], list):
                    elem_size = call["bytes"] // max(call.get("numel", 0), 1)
                    nbytes = _dims_numel([dims[0]], origin) * elem_size
                break
        received.append(nbytes)
    return received


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


READER = FunctionReader("kineto", "trace", looks_like, read)
