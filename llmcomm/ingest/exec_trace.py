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
from dataclasses import dataclass, field
from typing import Any

from ..errors import TraceFormatError
from . import common
from .readers import FunctionReader, ReadContext, TraceTable
from .sources import Source, json_list

RANK_IN_NAME = re.compile(r"(?:rank|worker)[_-]?(\d+)", re.IGNORECASE)
DEVICE = re.compile(r"^cuda:(\d+)$")


EXEC_TRACE_KEYS = (b'"nodes"', b'"schema"')


def is_execution_trace_document(doc: Any) -> bool:
    """A parsed JSON document with ``nodes`` and ``schema``."""
    return isinstance(doc, dict) and "nodes" in doc and "schema" in doc


def looks_like(source: Source) -> bool:
    """JSON whose first 64 KiB hold ``"nodes"`` and ``"schema"``, or whose parsed document has both."""
    if not source.is_json():
        return False
    return source.head_contains(*EXEC_TRACE_KEYS) or is_execution_trace_document(source.json_or_none())


def read(source: Source, context: ReadContext) -> TraceTable:
    """The reader protocol's entry point: :func:`parse` with the context's group tagger and rank."""
    return parse(source, context.tagger, context.rank)


def _attrs(node: dict, origin: str) -> dict[str, Any]:
    attrs = node.get("attrs", [])
    if not isinstance(attrs, list):
        raise TraceFormatError(f"{origin}: field 'attrs' of node {node.get('id')}: expected a list")
    out = {}
    for attr in attrs:
        if not isinstance(attr, dict) or "name" not in attr:
            raise TraceFormatError(f"{origin}: field 'attrs' of node {node.get('id')}: malformed attribute")
        out[attr["name"]] = attr.get("value")
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


@dataclass
class _NodeIndex:
    """What the reader needs of the node list: parents and names (for phases), step nodes (for
    iterations) and the ``record_param_comms`` nodes."""

    parent: dict[int, int] = field(default_factory=dict)
    name_of: dict[int, str] = field(default_factory=dict)
    steps: list[tuple[int, int]] = field(default_factory=list)  # (node id, N) of ProfilerStep#N, sorted
    comm_nodes: list[dict] = field(default_factory=list)
    step_ids: list[int] = field(default_factory=list)

    def iteration_of(self, node_id: int) -> int:
        """``N`` of the step node with the largest id not above ``node_id`` (the first N before any)."""
        if not self.steps:
            return 0
        i = bisect_right(self.step_ids, node_id) - 1
        return self.steps[max(i, 0)][1]

    def phase_of(self, node_id: int) -> str:
        """``optimizer`` below an ``Optimizer.step`` node, ``backward`` below an ``autograd::engine`` node,
        else ``forward`` (following ``ctrl_deps`` up to the root)."""
        seen = set()
        current = node_id
        while current in self.parent and current not in seen:
            seen.add(current)
            name = self.name_of.get(current, "")
            if name.startswith("Optimizer.step"):
                return "optimizer"
            if name.startswith("autograd::engine"):
                return "backward"
            parent_id = self.parent[current]
            if parent_id == current:
                break
            current = parent_id
        return "forward"


def _index_nodes(nodes: list, origin: str) -> _NodeIndex:
    index = _NodeIndex()
    for node in nodes:
        if not isinstance(node, dict):
            raise TraceFormatError(f"{origin}: field 'nodes[]': expected objects, got {type(node).__name__}")
        node_id = common.as_int(node.get("id"), origin, "id")
        name = node.get("name")
        if not isinstance(name, str):
            raise TraceFormatError(f"{origin}: field 'name' of node {node_id}: expected a string")
        index.parent[node_id] = common.as_int(node.get("ctrl_deps", node_id), origin, "ctrl_deps", None)
        index.name_of[node_id] = name
        if name.startswith("ProfilerStep#"):
            try:
                index.steps.append((node_id, int(name[13:])))
            except ValueError:
                raise TraceFormatError(f"{origin}: field 'name' of node {node_id}: bad step {name!r:.60}") from None
        elif name == "record_param_comms":
            index.comm_nodes.append(node)
    index.steps.sort()
    index.step_ids = [node_id for node_id, _ in index.steps]
    return index


def _communication_nodes(index: _NodeIndex, origin: str, schema: str, rank: int | None, rank_from: str
                         ) -> tuple[list[tuple[int, dict, str]], dict[str, int], int | None, str]:
    """The collective nodes as ``(node id, attributes, op)``, the skipped ones counted by name, and the rank
    (from the CUDA device of the first collective when neither argument nor file name gave it)."""
    skipped: dict[str, int] = {}
    pending = []
    for node in index.comm_nodes:
        node_id = int(node["id"])
        attrs = _attrs(node, origin)
        if "collective_name" not in attrs:
            raise TraceFormatError(f"{origin}: field 'collective_name' of node {node_id}: missing (execution trace "
                                   f"schema {schema} without communication attributes?)")
        collective = attrs["collective_name"]
        op = common.op_name(collective) if isinstance(collective, str) else None
        if op is None or op in ("send", "recv"):
            skipped[str(collective)] = skipped.get(str(collective), 0) + 1
            continue
        if rank is None:
            device = _device_index((node.get("inputs") or {}).get("values"))
            if device is not None:
                rank, rank_from = device, "device index"
        pending.append((node_id, attrs, op))
    return pending, skipped, rank, rank_from


def _add_call(builder: common.EventBuilder, index: _NodeIndex, node_id: int, attrs: dict[str, Any], op: str,
              rank: int, origin: str, tagger: common.GroupTagger | None) -> None:
    """One collective node as an event (bytes in the nccl-tests convention, group from its rank range)."""
    dtype, elem_size = common.dtype_info(attrs.get("dtype", ""), origin, "dtype")
    n_in = common.as_int(attrs.get("in_msg_nelems"), origin, "in_msg_nelems")
    n_out = common.as_int(attrs.get("out_msg_nelems", n_in), origin, "out_msg_nelems")
    group_size = common.as_int(attrs.get("pg_size"), origin, "pg_size", 1)
    if "global_rank_start" not in attrs:
        raise TraceFormatError(f"{origin}: field 'global_rank_start' of node {node_id}: missing; cannot rebuild "
                               "the process group")
    group = common.group_range(common.as_int(attrs["global_rank_start"], origin, "global_rank_start"),
                        common.as_int(attrs.get("global_rank_stride", 1), origin, "global_rank_stride", 1), group_size)
    if rank not in group:
        raise TraceFormatError(f"{origin}: field 'global_rank_start' of node {node_id}: rank {rank} is not in the "
                               f"group {group[:16]}")
    nbytes = (n_out if op == "all_gather" else n_in) * elem_size
    split = None
    if op == "all_to_all":
        in_splits = common.parse_rank_list(attrs.get("in_split_size", "[]"), origin, "in_split_size")
        total_rows = sum(in_splits)
        if in_splits and len(in_splits) == len(group) and total_rows and n_in % total_rows == 0:
            split = [rows * (n_in // total_rows) * elem_size for rows in in_splits]
        elif not in_splits and nbytes % len(group) == 0:
            split = [nbytes // len(group)] * len(group)
    parallelism = tagger.tag(attrs.get("pg_desc") or attrs.get("pg_name"), group, op) if tagger else "other"
    builder.add(rank=rank, op=op, group=group, nbytes=nbytes, parallelism=parallelism,
                iteration=index.iteration_of(node_id), phase=index.phase_of(node_id),
                dtype=dtype, split_bytes=split)


@common.guarded("execution trace")
def parse(src: Source, tagger: common.GroupTagger | None = None, rank: int | None = None) -> TraceTable:
    """One execution trace -> (events table, meta). See the module docstring."""
    origin = src.name
    doc, nodes = json_list(src, "nodes", is_execution_trace_document, "a PyTorch execution trace")
    schema = str(doc.get("schema"))
    index = _index_nodes(nodes, origin)
    rank_from = "argument"
    if rank is None:
        m = RANK_IN_NAME.search(origin.rsplit("/", 1)[-1])
        if m:
            rank, rank_from = int(m.group(1)), "file name"
    pending, skipped, rank, rank_from = _communication_nodes(index, origin, schema, rank, rank_from)
    if pending and rank is None:
        raise TraceFormatError(f"{origin}: field 'rank': the execution trace does not say which rank wrote it; "
                               "pass rank= or put rank<N> in the file name")
    builder = common.EventBuilder("exec_trace")
    for node_id, attrs, op in pending:
        assert rank is not None  # refused above when there are calls
        _add_call(builder, index, node_id, attrs, op, rank, origin, tagger)
    meta = {"rank": rank, "rank_from": rank_from if pending else None, "schema": schema, "skipped": skipped,
            "calls": len(builder)}
    return TraceTable(builder.table(origin), meta)


READER = FunctionReader("exec_trace", "trace", looks_like, read)
