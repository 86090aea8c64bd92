"""nccl-tests output (``all_reduce_perf`` & co.) into a bandwidth table.

Accepted: the raw stdout, with or without MPI prefixes (``[1,0]<stdout>:``, removed wherever they occur:
Echo's 128-GPU log has one spliced into the middle of a host name), in any nccl-tests version
(columns read from the header: ``size count type redop root time algbw busbw #wrong|error`` twice, first
out-of-place then in-place). The number of ranks is the count of ``#  Rank N ... on HOST`` lines and the
nodes the distinct hosts. The collective is the ``op=`` argument, else named in the file name
(``all_reduce_perf``...), else inferred from the ratio busbw/algbw of the file's largest message: nccl-tests
scales algbw by ``2(n-1)/n`` for all_reduce and ``(n-1)/n`` for all_gather, reduce_scatter and all_to_all
(1 for broadcast).

One output row per (size, placement): ``op, bytes, count, dtype, ranks, nodes, placement, time_us, time_s,
algbw, busbw, device, source`` (GB/s = 1e9 bytes/s, as nccl-tests prints them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from ..errors import TraceFormatError
from .common import guarded, op_name
from .readers import FunctionReader, ReadContext
from .sources import Source

MPI_PREFIX = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+).*?\bon\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s*(.*)$")
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}
FILE_OPS = (("all_reduce", "all_reduce"), ("allreduce", "all_reduce"), ("all_gather", "all_gather"),
            ("allgather", "all_gather"), ("reduce_scatter", "reduce_scatter"), ("reducescatter", "reduce_scatter"),
            ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"), ("broadcast", "broadcast"),
            ("sendrecv", "send"))
BANDWIDTH_COLUMNS = ("op", "bytes", "count", "dtype", "ranks", "nodes", "placement", "time_us", "time_s",
                     "algbw", "busbw", "device", "source")


_HEADER = re.compile(r"^#\s*(nThread\s|\s*size\s+count\s+type\s)", re.MULTILINE)


def looks_like(source: Source) -> bool:
    """nccl-tests output: a ``# nThread ...`` line or the ``#  size  count  type ...`` table header (after any
    MPI prefix). Prose that merely mentions the tool is not taken for its output."""
    head = source.data[:8192].decode("utf-8", "replace")
    return bool(_HEADER.search("\n".join(MPI_PREFIX.sub("", line) for line in head.splitlines())))


def read(source: Source, context: ReadContext) -> pd.DataFrame:
    """The reader protocol's entry point: :func:`parse` with the context's collective (``op``), if any."""
    return parse(source, canonical_op(context.op))


def _op_from_name(name: str) -> str | None:
    base = name.rsplit("/", 1)[-1].lower()
    for key, op in FILE_OPS:
        if key in base:
            return op
    return None


@dataclass
class _Log:
    """What a log says before its numbers: hosts by rank, the device, the column header, the data rows."""

    hosts: dict[int, str] = field(default_factory=dict)
    device: str = ""
    header: list[str] | None = None
    rows: list[list[str]] = field(default_factory=list)


def _scan(source: Source) -> _Log:
    """Split the log's lines (MPI prefixes removed) into rank lines, the header and the data rows."""
    log = _Log()
    for line in source.text().splitlines():
        text = MPI_PREFIX.sub("", line).rstrip().strip()
        if not text:
            continue
        if text.startswith("#"):
            m = RANK_LINE.match(text)
            if m:
                log.hosts[int(m.group(1))] = m.group(2)
                log.device = log.device or m.group(4).strip()
                continue
            tokens = text.lstrip("#").split()
            if "size" in tokens and "time" in tokens and "busbw" in tokens:
                log.header = tokens
            continue
        if log.header is None:
            continue
        tokens = text.split()
        if tokens and tokens[0].isdigit():
            log.rows.append(tokens)
    if log.header is None:
        raise TraceFormatError(f"{source.name}: field 'header': no nccl-tests column header (size ... busbw) found")
    if not log.rows:
        raise TraceFormatError(f"{source.name}: field 'rows': the header is there but no measurement rows follow")
    return log


def _row_key(tokens: list[str], header: list[str], origin: str) -> tuple[int, int, str, str]:
    """``(size, count, dtype, the row as text for messages)`` of one data row."""
    row = " ".join(tokens)[:80]
    if len(tokens) < len(header):
        raise TraceFormatError(f"{origin}: field 'row': {len(tokens)} columns where the header has "
                               f"{len(header)}: {row!r}")
    try:
        size, count = int(tokens[header.index("size")]), int(tokens[header.index("count")])
    except ValueError:
        raise TraceFormatError(f"{origin}: field 'size': not an integer in {row!r}") from None
    dtype = tokens[header.index("type")] if "type" in header else ""
    return size, count, dtype, row


@guarded("nccl-tests")
def parse(src: Source, op: str | None = None) -> pd.DataFrame:
    """One nccl-tests log -> bandwidth table (see the module docstring)."""
    origin = src.name
    log = _scan(src)
    header = log.header
    assert header is not None  # _scan raises without one
    time_columns = [i for i, t in enumerate(header) if t == "time"]
    if not time_columns:
        raise TraceFormatError(f"{origin}: field 'time': missing from the header")
    placements = list(zip(("out-of-place", "in-place"), time_columns, strict=False))
    ranks = len(log.hosts) or None
    nodes = len(set(log.hosts.values())) or None
    if op is None:
        op = _op_from_name(origin)
    out = []
    for tokens in log.rows:
        size, count, dtype, row = _row_key(tokens, header, origin)
        for placement, column in placements:
            try:
                t_us, algbw, busbw = float(tokens[column]), float(tokens[column + 1]), float(tokens[column + 2])
            except (ValueError, IndexError):
                raise TraceFormatError(f"{origin}: field 'time/algbw/busbw': not numbers in {row!r}") from None
            if not all(math.isfinite(x) and x >= 0 for x in (t_us, algbw, busbw)):
                raise TraceFormatError(f"{origin}: field 'time': negative or non-finite value in {tokens[:4]}")
            out.append({"op": op, "bytes": size, "count": count, "dtype": dtype, "ranks": ranks, "nodes": nodes,
                        "placement": placement, "time_us": t_us, "time_s": t_us * 1e-6, "algbw": algbw,
                        "busbw": busbw, "device": log.device, "source": origin.rsplit("/", 1)[-1]})
    df = pd.DataFrame(out, columns=list(BANDWIDTH_COLUMNS))
    if op is None:
        df["op"] = _infer_op(df, ranks, origin)
    return df


def _infer_op(df: pd.DataFrame, ranks: int | None, origin: str) -> str:
    """The collective whose busbw/algbw factor matches the rows with the largest algbw."""
    if not ranks or ranks < 2:
        return "all_reduce"  # one rank: every factor is 0; nccl-tests' default binary
    top = df.nlargest(3, "algbw")
    ratio = float((top["busbw"] / top["algbw"]).median()) if (top["algbw"] > 0).all() else math.nan
    best = min(("all_reduce", "all_gather", "broadcast"), key=lambda o: abs(BUSBW_FACTOR[o](ranks) - ratio))
    if not math.isfinite(ratio) or abs(BUSBW_FACTOR[best](ranks) - ratio) > 0.05 * max(ratio, 1e-9):
        raise TraceFormatError(f"{origin}: field 'op': cannot tell the collective (busbw/algbw = {ratio:.3f} "
                               f"for {ranks} ranks); pass op=")
    if best == "all_gather":
        raise TraceFormatError(f"{origin}: field 'op': busbw/algbw = (n-1)/n fits all_gather, reduce_scatter "
                               "and all_to_all alike; pass op=")
    return best


def canonical_op(op: str | None) -> str | None:
    return None if op is None else (op_name(op) or op)


READER = FunctionReader("nccl_tests", "bandwidth", looks_like, read)
