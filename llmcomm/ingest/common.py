"""Vocabulary shared by the readers: collective names, dtypes, and which parallelism a process group serves.

Parallelism of a group, in order of trust:

1. its description or name says it (Megatron ``TENSOR_MODEL_PARALLEL_GROUP``, torchtitan mesh names
   ``tp``/``dp_shard``/``ep``, AICB ``CommGroup.tp_group``...), see :func:`parallelism_from_name`;
2. else, given a :class:`ParallelConfig`, the group's ranks equal one of ``Layout.groups(p)``
   (an all_to_all that matches both an EP and a DP group is EP; otherwise TP, CP, PP, DP, EP in that order);
3. else ``"other"``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from ..errors import TraceFormatError
from ..specs import ParallelConfig
from ..vocab import (
    DTYPES,  # alias -> (short name, bytes per element)
    EVENTS_SCHEMA,
)

# collective names as PyTorch (record_param_comms, nccl:* annotations), AICB and Chakra write them
OP_NAMES: dict[str, str] = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allreduce_base": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "allgather_base": "all_gather", "all_gather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_allv": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast", "send": "send", "recv": "recv", "isend": "send", "irecv": "recv",
}
# names that are bookkeeping, not data movement (or not expressible in the events table)
NON_COMM = {"wait", "barrier", "init", "coalesced", "gather", "scatter", "reduce", "allgather_object",
            "computation", "epoch_end", "", "none"}


def op_name(name: str) -> str | None:
    """The events-table op of a collective name, or ``None`` for non-communication records."""
    key = name.strip().lower().removeprefix("nccl:").removeprefix("c10d::").removeprefix("commtype.").rstrip("_")
    return OP_NAMES.get(key)


def dtype_info(name: str, origin: str, field: str = "dtype") -> tuple[str, int]:
    """``(short name, bytes per element)`` of a PyTorch dtype name."""
    if not isinstance(name, str):
        raise TraceFormatError(f"{origin}: field {field!r}: expected a dtype name, got {type(name).__name__}")
    key = name.strip().lower().removeprefix("torch.")
    if key.startswith("tensor(") and key.endswith(")"):
        key = key[7:-1]
    if key not in DTYPES:
        raise TraceFormatError(f"{origin}: field {field!r}: unknown dtype {name!r}")
    return DTYPES[key]


_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"expert[_ ]?data|(^|_)edp($|_)|expt_dp", "dp"),
    (r"expert|(^|_)ep($|_)|moe", "ep"),
    (r"tensor|(^|_)tp($|_)|(^|_)mp_tp", "tp"),
    (r"pipe|(^|_)pp($|_)", "pp"),
    (r"data|(^|_)dp($|_)|dp_shard|dp_replicate|fsdp|hsdp|(^|_)ddp($|_)", "dp"),
    (r"context|(^|_)cp($|_)", "cp"),
    (r"sequence|(^|_)sp($|_)", "sp"),
)


def parallelism_from_name(desc: str | None) -> str | None:
    """The parallelism a process-group description names (``"TENSOR_MODEL_PARALLEL_GROUP"`` -> ``"tp"``,
    ``"mesh_dp_shard"`` -> ``"dp"``, ``"CommGroup.ep_group"`` -> ``"ep"``), or ``None`` when it names none
    (``"default_pg"``, ``"0"``, ``"undefined"``)."""
    if not desc or not isinstance(desc, str):
        return None
    s = re.sub(r"[^a-z0-9]+", "_", desc.lower()).strip("_")
    s = s.removeprefix("commgroup_").removesuffix("_group").removesuffix("_pg")
    for pat, tag in _NAME_RULES:
        if re.search(pat, s):
            return tag
    return None


class GroupTagger:
    """Tags process groups with a parallelism (see the module docstring); caches per group."""

    ORDER = ("tp", "cp", "pp", "dp", "ep")

    def __init__(self, parallel: ParallelConfig | None = None, gpus_per_node: int = 8) -> None:
        self.parallel = parallel
        self._by_ranks: dict[tuple[int, ...], list[str]] = {}
        self._cache: dict[tuple[str | None, tuple[int, ...], bool], str] = {}
        if parallel is not None:
            from ..layout import Layout

            lay = Layout(parallel, gpus_per_node)
            for p in self.ORDER + ("edp",):
                if lay.size(p) <= 1:
                    continue
                for row in lay.groups(p):
                    self._by_ranks.setdefault(tuple(sorted(int(x) for x in row)), []).append(
                        "dp" if p == "edp" else p)

    def tag(self, desc: str | None, ranks: Sequence[int], op: str) -> str:
        key = (desc, tuple(ranks), op == "all_to_all")
        hit = self._cache.get(key)
        if hit is None:
            hit = parallelism_from_name(desc) or self._from_ranks(key[1], key[2])
            self._cache[key] = hit
        return hit

    def _from_ranks(self, ranks: tuple[int, ...], a2a: bool) -> str:
        candidates = self._by_ranks.get(tuple(sorted(ranks)))
        if not candidates:
            return "other"
        if a2a and "ep" in candidates:
            return "ep"
        for parallelism in self.ORDER:
            if parallelism in candidates:
                return parallelism
        return candidates[0]


def parse_rank_list(value: Any, origin: str, field: str) -> list[int]:
    """A rank list given as a list or as the string ``"[0, 1, 2]"`` (never evaluated)."""
    if isinstance(value, str):
        s = value.strip()
        if not (s.startswith("[") and s.endswith("]")):
            raise TraceFormatError(f"{origin}: field {field!r}: expected a list like '[0, 1]', got {value[:60]!r}")
        body = s[1:-1].strip()
        try:
            return [int(x) for x in body.split(",")] if body else []
        except ValueError:
            raise TraceFormatError(f"{origin}: field {field!r}: not a list of integers: {value[:60]!r}") from None
    if isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return [int(x) for x in value]
    raise TraceFormatError(f"{origin}: field {field!r}: expected a list of integers, got {type(value).__name__}")


def as_int(value: Any, origin: str, field: str, minimum: int | None = 0) -> int:
    """An integer field (JSON int, or an integral float / numeric string); errors name file and field."""
    if isinstance(value, bool):
        raise TraceFormatError(f"{origin}: field {field!r}: expected an integer, got a boolean")
    if isinstance(value, int):
        v = value
    elif isinstance(value, float) and value.is_integer():
        v = int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        v = int(value)
    else:
        raise TraceFormatError(f"{origin}: field {field!r}: expected an integer, got {value!r:.60}")
    if minimum is not None and v < minimum:
        raise TraceFormatError(f"{origin}: field {field!r}: {v} is below {minimum}")
    if v > 2**62:
        raise TraceFormatError(f"{origin}: field {field!r}: {v} is out of range")
    return v


class EventBuilder:
    """Accumulates events column by column and turns them into an Arrow table in ``EVENTS_SCHEMA``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.cols: dict[str, list[Any]] = {f.name: [] for f in EVENTS_SCHEMA}

    def add(self, *, rank: int, op: str, group: list[int], nbytes: int, parallelism: str, iteration: int = 0,
            microbatch: int = -1, layer: int = -1, phase: str = "forward", peer: int = -1, dtype: str = "",
            split_bytes: list[int] | None = None, t_start_ns: int | None = None, t_end_ns: int | None = None,
            count: int = 1) -> None:
        columns = self.cols
        columns["rank"].append(rank)
        columns["iteration"].append(iteration)
        columns["microbatch"].append(microbatch)
        columns["layer"].append(layer)
        columns["phase"].append(phase)
        columns["parallelism"].append(parallelism)
        columns["op"].append(op)
        columns["group"].append(group)
        columns["peer"].append(peer)
        columns["bytes"].append(nbytes)
        columns["dtype"].append(dtype)
        columns["split_bytes"].append(split_bytes)
        columns["t_start_ns"].append(t_start_ns)
        columns["t_end_ns"].append(t_end_ns)
        columns["source"].append(self.source)
        columns["count"].append(count)

    def __len__(self) -> int:
        return len(self.cols["rank"])

    def table(self, origin: str) -> pa.Table:
        try:
            arrays = [pa.array(self.cols[f.name], type=f.type) for f in EVENTS_SCHEMA]
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            raise TraceFormatError(f"{origin}: values do not fit the events schema: {e}") from None
        return pa.Table.from_arrays(arrays, schema=EVENTS_SCHEMA)


def group_range(start: int, stride: int, size: int) -> list[int]:
    return [int(x) for x in np.arange(size, dtype=np.int64) * stride + start]


F = TypeVar("F", bound=Callable[..., Any])


def guarded(fmt: str) -> Callable[[F], F]:
    """Last line of defence for a reader ``parse(src, ...)``: a Python error that escaped the readers' own
    checks (a field of an unexpected type deep in a file) becomes a :class:`TraceFormatError` naming the
    file, so callers only ever see the library's error types."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(src: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(src, *args, **kwargs)
            except TraceFormatError:
                raise
            except (TypeError, KeyError, ValueError, AttributeError, IndexError, OverflowError,
                    RecursionError, ZeroDivisionError) as e:
                raise TraceFormatError(f"{getattr(src, 'name', src)}: malformed {fmt} file: "
                                       f"{type(e).__name__}: {e}") from None

        return inner  # type: ignore[return-value]

    return wrap
