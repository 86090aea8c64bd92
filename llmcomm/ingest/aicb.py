"""AICB workload CSV files (aliyun/aicb) into events.

Columns: ``comm_type`` (``CommType.all_reduce``...), ``comm_group`` (``CommGroup.tp_group``...),
``comm_group_size``, ``msg_size`` (bytes, nccl-tests convention: all_gather the gathered output,
reduce_scatter the input), ``stage`` (``init.model_setup``, ``forward.MoE``, ``backward.MegatronRowLinear``,
``step``...), ``dst``, ``src``, ``additional``, ``_elapsed_time`` (ms, ``None`` in generated workloads),
``algbw``, ``busbw`` (GB/s), ``count``. A generated workload may start with a line ``[rank0 ~ rank127]``.

The file is one rank's view (every rank runs the same list). Rows:

* ``CommType.epoch_end`` ends an iteration: rows before the first one are setup (iteration 0, phase
  ``setup``); then iterations 1, 2, ...
* phase from ``stage``: ``init*`` setup, ``forward*`` forward, ``backward*`` backward, ``step*`` optimizer.
* micro-batch: counted within an iteration, a new one starting at each forward row that follows a backward
  row (exact for pp = 1; -1 for pp > 1, where 1F1B interleaves them).
* groups: AICB names the group type but not its ranks; ranks come from a :class:`ParallelConfig` (given, or
  inferred from the calls by :func:`infer_configuration`: group sizes, SP, the distributed optimizer and the
  micro-batches per iteration, each recorded with how in ``meta['inferred']``; an EP size the file does not
  state is reported as not inferable) through :class:`~llmcomm.layout.Layout`, for ``rank`` (default 0).
* parallelism: from the group name; with SP, the TP group's all-gathers and reduce-scatters are tagged ``sp``
  as the predictor tags them.
* times: only durations are measured (replayed back to back, compute mocked), so ``t_start_ns`` is the
  running sum of the durations before the row and ``t_end_ns - t_start_ns`` the measured duration.
* all_to_all: AICB replays an even split, so ``split_bytes`` is ``msg_size / n`` per peer.

Note: AICB's own ``busbw`` column uses the world size, not the group size, for its correction factor
(7/8 for a 2-rank group on 8 GPUs); :func:`bandwidth_rows` recomputes it from the group size.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

import pandas as pd

from ..errors import ConfigError, TraceFormatError
from ..layout import Layout
from ..specs import ParallelConfig
from .common import EventBuilder, GroupTagger, as_int, guarded, op_name, parallelism_from_name
from .readers import FunctionReader, ReadContext, TraceTable
from .sources import Source

COLUMNS = ("comm_type", "comm_group", "comm_group_size", "msg_size", "stage", "dst", "src", "additional",
           "_elapsed_time", "algbw", "busbw", "count")
LAYOUT_DIMS = {"tp": "tp", "dp": "dp", "pp": "pp", "ep": "ep", "cp": "cp"}


def looks_like(source: Source) -> bool:
    """A CSV whose first 400 bytes name the ``comm_type`` and ``msg_size`` columns."""
    head = source.data[:400].decode("utf-8", "replace")
    return "comm_type" in head and "msg_size" in head


def read_trace(source: Source, context: ReadContext) -> TraceTable:
    """The trace reader's entry point: :func:`parse` for the context's parallel configuration and rank
    (rank 0 when not given)."""
    return parse(source, context.parallel, context.rank or 0, context.gpus_per_node)


def read_bandwidth(source: Source, context: ReadContext) -> pd.DataFrame:
    """The bandwidth reader's entry point: :func:`bandwidth_rows` in the bandwidth table's columns (no
    element count, dtype, node count or device in the file; placement out-of-place)."""
    rows = bandwidth_rows(source)
    return rows.assign(count=None, dtype="", nodes=None, placement="out-of-place", time_s=rows["time_us"] * 1e-6,
                       device="", source=source.name.rsplit("/", 1)[-1])


def _rows(src: Source) -> list[dict[str, str]]:
    lines = src.text().splitlines()
    start = 0
    while start < len(lines) and not lines[start].startswith("comm_type"):
        start += 1
    if start == len(lines):
        raise TraceFormatError(f"{src.name}: field 'comm_type': no AICB header line found")
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    missing = [c for c in ("comm_type", "comm_group", "comm_group_size", "msg_size", "stage")
               if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceFormatError(f"{src.name}: field {missing[0]!r}: missing from the header")
    try:
        return list(reader)
    except csv.Error as e:
        raise TraceFormatError(f"{src.name}: malformed CSV: {e}") from None


def _opt_int(v: str | None, origin: str, field: str, line: int) -> int | None:
    if v is None or v.strip() in ("", "None", "nan"):
        return None
    return as_int(v.strip(), f"{origin} line {line}", field)


def _opt_float(v: str | None, origin: str, field: str, line: int) -> float | None:
    if v is None or v.strip() in ("", "None", "nan"):
        return None
    try:
        x = float(v)
    except ValueError:
        raise TraceFormatError(f"{origin} line {line}: field {field!r}: not a number: {v!r:.40}") from None
    if not math.isfinite(x) or x < 0:
        raise TraceFormatError(f"{origin} line {line}: field {field!r}: {x} is not a finite non-negative number")
    return x


def _phase(stage: str, iteration: int) -> str:
    """``setup`` before the first epoch end or for ``init*`` stages, else from the stage's prefix."""
    if stage.startswith("init") or iteration == 0:
        return "setup"
    if stage.startswith("backward"):
        return "backward"
    if stage.startswith("step"):
        return "optimizer"
    return "forward"


def _peer(row: dict[str, str], op: str, group: list[int], origin: str, line: int) -> int:
    """The partner of a send (``dst``) or recv (``src``), or a broadcast's root as a global rank; -1 for
    other ops and for a broadcast that names none."""
    if op not in ("send", "recv", "broadcast"):
        return -1
    stated = _opt_int(row.get("dst" if op == "send" else "src"), origin, "dst/src", line)
    if stated is None:
        if op != "broadcast":
            raise TraceFormatError(f"{origin} line {line}: field 'dst/src': missing for {op}")
        return -1
    return group[stated] if op == "broadcast" and stated < len(group) else stated


def _row_group(row: dict[str, str], groups: dict[str, list[int]], layout: Layout, rank: int, origin: str,
               line: int) -> list[int]:
    """The global ranks of the row's ``comm_group`` for ``rank`` on ``layout`` (cached per group kind in
    ``groups``), checked against the row's ``comm_group_size``."""
    kind = _group_kind(row.get("comm_group"))
    if kind is None:
        raise TraceFormatError(f"{origin} line {line}: field 'comm_group': missing for "
                               f"{(row.get('comm_type') or '').strip()}")
    if kind not in groups:
        parallel = layout.parallel
        dim = LAYOUT_DIMS.get(kind)
        size = (parallel.ep if dim == "ep" else getattr(parallel, dim)) if dim else 0
        groups[kind] = layout.group_of(rank, dim) if dim and size > 1 else [rank]
    group = groups[kind]
    stated = _opt_int(row.get("comm_group_size"), origin, "comm_group_size", line)
    if stated is not None and stated != len(group):
        raise TraceFormatError(f"{origin} line {line}: field 'comm_group_size': {stated} but the "
                               f"{kind} group of the parallel configuration has {len(group)} ranks")
    return group


def _group_kind(v: str | None) -> str | None:
    if v is None or v.strip() in ("", "None"):
        return None
    return parallelism_from_name(v) or "other"


def infer_parallel(rows: list[dict[str, str]], origin: str) -> tuple[ParallelConfig, list[str]]:
    """A ParallelConfig from the file's calls; the assumptions made are returned too (see
    :func:`infer_configuration`)."""
    par, info = infer_configuration(rows, origin)
    return par, info["assumptions"]


def _iteration_shape(rows: list[dict[str, str]]) -> tuple[set[int], bool, bool, int]:
    """Per training iteration (rows between ``epoch_end`` markers after the setup): the set of micro-batch
    counts (a micro-batch starts at a forward row after a backward row or the iteration's start), whether a
    forward TP all-gather / reduce-scatter occurs, and whether the optimizer step reduce-scatters and
    all-gathers over DP; plus the number of such forward TP rows."""
    counts: set[int] = set()
    sp_rows = 0
    rs = ag = False
    seen_end, m, last = False, 0, ""
    for r in rows:
        ctype = (r.get("comm_type") or "").strip()
        if ctype == "CommType.epoch_end":
            if seen_end and m:
                counts.add(m)
            seen_end, m, last = True, 0, ""
            continue
        if not seen_end:
            continue
        stage = (r.get("stage") or "").strip()
        op, kind = op_name(ctype), _group_kind(r.get("comm_group"))
        if stage.startswith("forward"):
            if last in ("", "backward"):
                m += 1
            last = "forward"
            if kind == "tp" and op in ("all_gather", "reduce_scatter") and "MoE" not in stage:
                sp_rows += 1
        elif stage.startswith("backward"):
            last = "backward"
        elif stage.startswith("step") and kind == "dp":
            rs |= op == "reduce_scatter"
            ag |= op == "all_gather"
    if seen_end and m:
        counts.add(m)
    return counts, sp_rows > 0, rs and ag, sp_rows


def infer_configuration(rows: list[dict[str, str]], origin: str) -> tuple[ParallelConfig, dict[str, Any]]:
    """A ParallelConfig from the calls the file holds, and how each field was inferred.

    * ``tp``, ``dp``, ``pp``, ``cp``: the ``comm_group_size`` the file states for that group;
    * ``sp``: forward all-gathers / reduce-scatters on the TP group outside the MoE block (Megatron's
      sequence-parallel regions; without SP the dense layers all-reduce);
    * ``distributed_optimizer``: a reduce-scatter and an all-gather on the DP group in the ``step`` stage
      (the distributed optimizer's gradient reduce-scatter and parameter all-gather; plain DDP all-reduces);
    * ``num_microbatches``: forward runs per iteration (a forward row after a backward row starts one),
      exact for ``pp = 1``; ``global_batch = micro_batch · dp · num_microbatches`` with ``micro_batch = 1``,
      which the file cannot state (its sizes are products ``b·s·h``);
    * ``ep``: taken from a stated ``ep_group`` size; when the file has EP rows without a size it is not
      inferable, ``meta['inferred']['ep']`` says so, ``ep = 1`` is used for the layout, and the EP rows carry
      only this rank as their group (pass ``parallel=`` to resolve them).

    Returns ``(parallel, info)`` with ``info = {"inferred": {field: how}, "assumptions": [...]}``."""
    sizes: dict[str, int] = {}
    kinds = set()
    for i, r in enumerate(rows):
        k = _group_kind(r.get("comm_group"))
        if k is None:
            continue
        kinds.add(k)
        s = _opt_int(r.get("comm_group_size"), origin, "comm_group_size", i + 2)
        if s is not None and k in LAYOUT_DIMS:
            if sizes.setdefault(k, s) != s:
                raise TraceFormatError(f"{origin} line {i + 2}: field 'comm_group_size': {k} group size {s} "
                                       f"contradicts {sizes[k]} stated earlier")
    inferred: dict[str, Any] = {k: f"comm_group_size of the {k} group rows" for k in sizes}
    assumptions: list[str] = []
    if "ep" in kinds and "ep" not in sizes:
        inferred["ep"] = None
        assumptions.append("the ep group size is not inferable: the file names ep_group rows but states no "
                           "size; ep = 1 is used for the layout and ep rows carry only this rank as their group")
    counts, sp, dist_opt, sp_rows = _iteration_shape(rows)
    tp = sizes.get("tp", 1)
    sp = sp and tp > 1
    inferred["sp"] = (f"{sp_rows} forward all-gather/reduce-scatter rows on the tp group outside MoE"
                      if sp else "no forward all-gather/reduce-scatter on the tp group outside MoE")
    inferred["distributed_optimizer"] = ("reduce_scatter and all_gather on the dp group in the step stage"
                                         if dist_opt else "no reduce_scatter + all_gather pair on the dp "
                                         "group in the step stage")
    dp, pp = sizes.get("dp", 1), sizes.get("pp", 1)
    m = 1
    if len(counts) == 1 and pp == 1:
        m = counts.pop()
        inferred["num_microbatches"] = f"{m} forward runs in each iteration"
        inferred["global_batch"] = f"micro_batch x dp x num_microbatches = 1 x {dp} x {m}"
        assumptions.append("micro_batch is not in the file (sizes are products b·s·h); taken as 1")
    else:
        why = "pp > 1 (1F1B interleaves forwards and backwards)" if pp > 1 else \
            f"forward runs per iteration differ ({sorted(counts)})" if counts else "no training iteration"
        inferred["num_microbatches"] = None
        assumptions.append(f"num_microbatches not inferred: {why}; global_batch taken as dp")
    try:
        par = ParallelConfig(tp=tp, dp=dp, pp=pp, ep=sizes.get("ep", 1), cp=sizes.get("cp", 1), sp=sp,
                             distributed_optimizer=dist_opt, global_batch=dp * m)
    except ConfigError as e:
        raise TraceFormatError(f"{origin}: group sizes do not form a parallel configuration: {e}") from None
    return par, {"inferred": inferred, "assumptions": assumptions}


@guarded("AICB")
def parse(src: Source, parallel: ParallelConfig | None = None, rank: int = 0,
          gpus_per_node: int = 8) -> TraceTable:
    """One AICB workload -> (events table of ``rank``, meta). See the module docstring."""
    origin = src.name
    rows = _rows(src)
    assumptions: list[str] = []
    inferred: dict[str, Any] = {}
    if parallel is None:
        parallel, info = infer_configuration(rows, origin)
        assumptions, inferred = info["assumptions"], info["inferred"]
    if not 0 <= rank < parallel.world_size:
        raise TraceFormatError(f"{origin}: rank {rank} is outside the world of {parallel.world_size}")
    layout = Layout(parallel, gpus_per_node)
    tagger = GroupTagger(parallel, gpus_per_node)
    groups: dict[str, list[int]] = {}
    builder = EventBuilder("aicb")
    iteration, micro, last_phase = 0, -1, ""
    clock_ns = 0
    timed = 0
    skipped: dict[str, int] = {}
    for i, row in enumerate(rows):
        line = i + 2
        ctype = (row.get("comm_type") or "").strip()
        if ctype == "CommType.epoch_end":
            iteration += 1
            micro, last_phase = -1, ""
            continue
        op = op_name(ctype)
        if op is None:
            skipped[ctype] = skipped.get(ctype, 0) + 1
            continue
        phase = _phase((row.get("stage") or "").strip(), iteration)
        if phase == "forward" and last_phase in ("", "backward"):
            micro += 1
        if phase in ("forward", "backward"):
            last_phase = phase
        group = _row_group(row, groups, layout, rank, origin, line)
        nbytes = _opt_int(row.get("msg_size"), origin, "msg_size", line)
        if nbytes is None:
            raise TraceFormatError(f"{origin} line {line}: field 'msg_size': missing")
        elapsed_ms = _opt_float(row.get("_elapsed_time"), origin, "_elapsed_time", line)
        t0 = t1 = None
        if elapsed_ms is not None:
            t0 = clock_ns
            t1 = clock_ns + round(elapsed_ms * 1e6)
            clock_ns = t1
            timed += 1
        peer = _peer(row, op, group, origin, line)
        split = [nbytes // len(group)] * len(group) if op == "all_to_all" and nbytes % len(group) == 0 else None
        parallelism = tagger.tag(row.get("comm_group"), group, op)
        if parallelism == "tp" and parallel.sp and op in ("all_gather", "reduce_scatter"):
            parallelism = "sp"  # the predictor's tag for sequence-parallel gathers and scatters on the TP group
        builder.add(rank=rank, op=op, group=group, nbytes=nbytes, parallelism=parallelism,
                    iteration=iteration,
                    microbatch=micro if phase in ("forward", "backward") and parallel.pp == 1 else -1,
                    phase=phase, peer=peer, split_bytes=split, t_start_ns=t0, t_end_ns=t1)
    meta = {"rank": rank, "parallel": parallel.to_dict(), "world_size": parallel.world_size,
            "assumptions": assumptions, "inferred": inferred, "epoch_ends": iteration, "timed_rows": timed,
            "skipped": skipped,
            "time_base": "back-to-back: start = running sum of measured durations" if timed else None}
    return TraceTable(builder.table(origin), meta)


@guarded("AICB")
def bandwidth_rows(src: Source) -> pd.DataFrame:
    """AICB's timed rows as a bandwidth table (see :func:`llmcomm.ingest.ingest_bandwidth`), with bus
    bandwidth recomputed from the group size (nccl-tests factors)."""
    from .nccl_tests import BUSBW_FACTOR

    rows = _rows(src)
    par, _ = infer_parallel(rows, src.name)
    out: list[dict[str, Any]] = []
    for i, r in enumerate(rows):
        op = op_name((r.get("comm_type") or "").strip())
        ms = _opt_float(r.get("_elapsed_time"), src.name, "_elapsed_time", i + 2)
        kind = _group_kind(r.get("comm_group"))
        if op is None or ms is None or ms == 0 or kind is None:
            continue
        n = {"tp": par.tp, "dp": par.dp, "pp": par.pp, "ep": par.ep, "cp": par.cp}.get(kind, 1)
        nbytes = _opt_int(r.get("msg_size"), src.name, "msg_size", i + 2) or 0
        algbw = nbytes / (ms * 1e6)
        out.append({"op": op, "bytes": nbytes, "ranks": n, "time_us": ms * 1e3, "algbw": algbw,
                    "busbw": algbw * BUSBW_FACTOR[op](n), "group": kind, "stage": r.get("stage")})
    return pd.DataFrame(out)


READERS = (FunctionReader("aicb", "trace", looks_like, read_trace),
           FunctionReader("aicb", "bandwidth", looks_like, read_bandwidth))
