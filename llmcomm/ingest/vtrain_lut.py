"""vTrain's all-reduce look-up tables (``AR_GPU<n>_1M_1024M_LUT``) into a bandwidth table.

Each file is a CSV (UTF-8, possibly with a byte-order mark) with the header
``size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)``: nccl-tests' all-reduce sweep inside one
node, first out-of-place then in-place. The number of GPUs is the ``GPU<n>`` of the file name; the GPU model
the name of the folder (``a100``, ``v100``). ``algbw = bytes / time`` (bytes/ns = GB/s), as nccl-tests
defines it; ``busbw`` is the file's own column.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from ..errors import TraceFormatError
from .common import guarded
from .nccl_tests import BANDWIDTH_COLUMNS
from .readers import FunctionReader, ReadContext
from .sources import Source

HEADER = ["size(B)", "count", "type", "time(ns)", "busbw(GB/s)", "time(ns)", "busbw(GB/s)"]
GPUS_IN_NAME = re.compile(r"GPU(\d+)", re.IGNORECASE)


def looks_like(source: Source) -> bool:
    """A CSV starting with vTrain's header ``size(B),count,type,time(ns)...``."""
    return source.data[:64].decode("utf-8-sig", "replace").startswith("size(B),count,type,time(ns)")


def read(source: Source, context: ReadContext) -> pd.DataFrame:
    """The reader protocol's entry point (the context holds nothing this format needs)."""
    return parse(source)


@guarded("vTrain LUT")
def parse(src: Source, ranks: int | None = None) -> pd.DataFrame:
    """One LUT file -> bandwidth table (columns as :data:`BANDWIDTH_COLUMNS`)."""
    origin = src.name
    lines = [line.strip() for line in src.text().splitlines() if line.strip()]
    if not lines:
        raise TraceFormatError(f"{origin}: empty file")
    if [h.strip() for h in lines[0].split(",")] != HEADER:
        raise TraceFormatError(f"{origin}: field 'header': expected {','.join(HEADER)!r}, got {lines[0][:80]!r}")
    parts = origin.replace("\\", "/").split("/")
    if ranks is None:
        m = GPUS_IN_NAME.search(parts[-1])
        if not m:
            raise TraceFormatError(f"{origin}: field 'ranks': no GPU<n> in the file name; pass ranks=")
        ranks = int(m.group(1))
    device = parts[-2] if len(parts) > 1 else ""
    out = []
    for i, ln in enumerate(lines[1:], start=2):
        toks = ln.split(",")
        if len(toks) != len(HEADER):
            raise TraceFormatError(f"{origin} line {i}: field 'row': {len(toks)} columns, expected {len(HEADER)}")
        try:
            size, count = int(toks[0]), int(toks[1])
            vals = [float(x) for x in toks[3:]]
        except ValueError:
            raise TraceFormatError(f"{origin} line {i}: field 'size/time/busbw': not a number in {ln[:80]!r}") from None
        if size < 0 or not all(math.isfinite(v) and v > 0 for v in vals[::2]):
            raise TraceFormatError(f"{origin} line {i}: field 'time(ns)': must be a positive number")
        for placement, (t_ns, busbw) in zip(("out-of-place", "in-place"), (vals[0:2], vals[2:4]), strict=True):
            out.append({"op": "all_reduce", "bytes": size, "count": count, "dtype": toks[2], "ranks": ranks,
                        "nodes": 1, "placement": placement, "time_us": t_ns / 1e3, "time_s": t_ns / 1e9,
                        "algbw": size / t_ns, "busbw": busbw, "device": device, "source": "/".join(parts[-2:])})
    return pd.DataFrame(out, columns=list(BANDWIDTH_COLUMNS))


READER = FunctionReader("vtrain_lut", "bandwidth", looks_like, read)
