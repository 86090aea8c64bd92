"""PyTorch execution traces (Chakra host-trace schema 1.x) into events.

An execution trace lists operator ``nodes`` with ``ctrl_deps`` (the parent node id) and ``attrs``. Each
``record_param_comms`` node carries, in schema 1.1.0, the attributes ``collective_name``, ``dtype``,
``in_msg_nelems``, ``out_msg_nelems``, ``in_split_size``, ``out_split_size``, ``global_rank_start``,
``global_rank_stride``, ``pg_name``, ``pg_desc`` and ``pg_size``; bytes follow the same nccl-tests
convention as the Kineto reader.

The trace does not record the rank that wrote it. It is taken, in order, from the ``rank=`` argument, a
``rank<N>`` / ``worker<N>`` in the file name, or the CUDA device index of the communicated tensors
(``"cuda:1"`` -> rank 1), which equals the global rank on a single node; ``meta['rank_from']`` says which.
Iteration: the ``ProfilerStep#N`` node with the largest id not above the node's id (node ids grow in
execution order; backward nodes run on the autograd thread, outside the step node). Phase: ``optimizer``
below an ``Optimizer.step`` node, ``backward`` below an ``autograd::engine`` node, else ``forward``.
The trace holds no durations, so ``t_start_ns``/``t_end_ns`` are null.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from typing import Any

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

RANK_IN_NAME = re.compile(r"(?:rank|worker)[_-]?(\d+)", re.IGNORECASE)
DEVICE = re.compile(r"^cuda:(\d+)$")


def looks_like(doc: Any) -> bool:
    return isinstance(doc, dict) and "nodes" in doc and "schema" in doc


def _attrs(node: dict, origin: str) -> dict[str, Any]:
    attrs = node.get("attrs", [])
    if not isinstance(attrs, list):
        raise TraceFormatError(f"{origin}: field 'attrs' of node {node.get('id')}: expected a list")
    out = {}
    for a in attrs:
        if not isinstance(a, dict) or "name" not in a:
            raise TraceFormatError(f"{origin}: field 'attrs' of node {node.get('id')}: malformed attribute")
        out[a["name"]] = a.get("value")
    return out


def _device_index(values: Any) -> int | None:
    """The first ``cuda:N`` found in a node's tensor descriptors."""
    stack = [values]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            m = DEVICE.match(v)
            if m:
                return int(m.group(1))
        elif isinstance(v, list):
            stack.extend(reversed(v))
    return None


@guarded("execution trace")
def parse(src: Source, tagger: GroupTagger | None = None, rank: int | None = None) -> tuple[pa.Table, dict]:
    """One execution trace -> (events table, meta). See the module docstring."""
    origin = src.name
    doc = loads_json(src)
    if not looks_like(doc):
        raise TraceFormatError(f"{origin}: field 'nodes': missing; not a PyTorch execution trace")
    nodes = doc["nodes"]
    if not isinstance(nodes, list):
        raise TraceFormatError(f"{origin}: field 'nodes': expected a list, got {type(nodes).__name__}")
    schema = str(doc.get("schema"))
    parent: dict[int, int] = {}
    name_of: dict[int, str] = {}
    steps: list[tuple[int, int]] = []
    comm_nodes = []
    for n in nodes:
        if not isinstance(n, dict):
            raise TraceFormatError(f"{origin}: field 'nodes[]': expected objects, got {type(n).__name__}")
        nid = as_int(n.get("id"), origin, "id")
        name = n.get("name")
        if not isinstance(name, str):
            raise TraceFormatError(f"{origin}: field 'name' of node {nid}: expected a string")
        parent[nid] = as_int(n.get("ctrl_deps", nid), origin, "ctrl_deps", None)
        name_of[nid] = name
        if name.startswith("ProfilerStep#"):
            try:
                steps.append((nid, int(name[13:])))
            except ValueError:
                raise TraceFormatError(f"{origin}: field 'name' of node {nid}: bad step {name!r:.60}") from None
        elif name == "record_param_comms":
            comm_nodes.append(n)
    steps.sort()
    step_ids = [s for s, _ in steps]

    rank_from = "argument"
    if rank is None:
        m = RANK_IN_NAME.search(origin.rsplit("/", 1)[-1])
        if m:
            rank, rank_from = int(m.group(1)), "file name"
    b = EventBuilder("exec_trace")
    skipped: dict[str, int] = {}
    pending = []
    for n in comm_nodes:
        nid = int(n["id"])
        a = _attrs(n, origin)
        if "collective_name" not in a:
            raise TraceFormatError(f"{origin}: field 'collective_name' of node {nid}: missing (execution trace "
                                   f"schema {schema} without communication attributes?)")
        cname = a["collective_name"]
        op = op_name(cname) if isinstance(cname, str) else None
        if op is None or op in ("send", "recv"):
            skipped[str(cname)] = skipped.get(str(cname), 0) + 1
            continue
        if rank is None:
            dev = _device_index((n.get("inputs") or {}).get("values"))
            if dev is not None:
                rank, rank_from = dev, "device index"
        pending.append((nid, n, a, op))
    if pending and rank is None:
        raise TraceFormatError(f"{origin}: field 'rank': the execution trace does not say which rank wrote it; "
                               "pass rank= or put rank<N> in the file name")
    for nid, _n, a, op in pending:
        dtype, size = dtype_info(a.get("dtype", ""), origin, "dtype")
        n_in = as_int(a.get("in_msg_nelems"), origin, "in_msg_nelems")
        n_out = as_int(a.get("out_msg_nelems", n_in), origin, "out_msg_nelems")
        pg_size = as_int(a.get("pg_size"), origin, "pg_size", 1)
        if "global_rank_start" in a:
            group = group_range(as_int(a["global_rank_start"], origin, "global_rank_start"),
                                as_int(a.get("global_rank_stride", 1), origin, "global_rank_stride", 1), pg_size)
        else:
            raise TraceFormatError(f"{origin}: field 'global_rank_start' of node {nid}: missing; cannot rebuild "
                                   "the process group")
        if rank not in group:
            raise TraceFormatError(f"{origin}: field 'global_rank_start' of node {nid}: rank {rank} is not in the "
                                   f"group {group[:16]}")
        nbytes = (n_out if op == "all_gather" else n_in) * size
        split = None
        if op == "all_to_all":
            ins = parse_rank_list(a.get("in_split_size", "[]"), origin, "in_split_size")
            tot = sum(ins)
            if ins and len(ins) == len(group) and tot and n_in % tot == 0:
                split = [x * (n_in // tot) * size for x in ins]
            elif not ins and nbytes % len(group) == 0:
                split = [nbytes // len(group)] * len(group)
        i = bisect_right(step_ids, nid) - 1
        iteration = steps[max(i, 0)][1] if steps else 0
        phase = _phase(nid, parent, name_of)
        par = tagger.tag(a.get("pg_desc") or a.get("pg_name"), group, op) if tagger else "other"
        b.add(rank=rank, op=op, group=group, nbytes=nbytes, parallelism=par, iteration=iteration, phase=phase,
              dtype=dtype, split_bytes=split)
    meta = {"rank": rank, "rank_from": rank_from if pending else None, "schema": schema, "skipped": skipped,
            "calls": len(b)}
    return b.table(origin), meta


def _phase(nid: int, parent: dict[int, int], name_of: dict[int, str]) -> str:
    seen = set()
    cur = nid
    while cur in parent and cur not in seen:
        seen.add(cur)
        nm = name_of.get(cur, "")
        if nm.startswith("Optimizer.step"):
            return "optimizer"
        if nm.startswith("autograd::engine"):
            return "backward"
        nxt = parent[cur]
        if nxt == cur:
            break
        cur = nxt
    return "forward"
