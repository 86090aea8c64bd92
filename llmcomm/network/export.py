"""Export a trace for network simulators: AICB's workload CSV (which SimAI replays) and a plain flow list.

**AICB** (aliyun/aicb, ``workload/physical/model_workload/*.csv``; read back by :mod:`llmcomm.ingest.aicb`):
one rank's calls in issue order, one row each: ``comm_type`` (``CommType.all_reduce``...), ``comm_group``
(``CommGroup.tp_group`` / ``dp_group`` / ``pp_group`` / ``ep_group`` / ``cp_group``), ``comm_group_size``,
``msg_size`` (bytes, nccl-tests' convention, the events table's ``bytes``), ``stage`` (``init.<parallelism>``,
``forward.<parallelism>``, ``backward.<parallelism>``, ``step.<parallelism>``), ``dst`` / ``src`` (a send's
destination / a recv's source, global ranks; a broadcast's root as its position in the group), ``additional``,
``_elapsed_time`` (ms; ``None`` unless the trace is timed), ``algbw``, ``busbw`` (``None``), ``count`` (1). The
file starts with AICB's ``[rank0 ~ rankN]`` line; the setup calls come first, then ``CommType.epoch_end`` closes
the setup and another closes the iteration, as AICB writes them. AICB names a group only by its kind, so a call
can be written only when its group *is* that kind's group of the rank in Megatron's layout (for send/recv: the
peer lies in the rank's PP group); the others (the model-parallel and world scalars, the embedding group, the
expert-data-parallel gradient reduction) are returned as ``dropped`` with the reason. Reading the file back with
``ingest_trace(path, parallel)`` and comparing it with the written calls (``compare``) is exact (tested).

**Flow list** (:func:`flow_list`), one row per flow a rank puts on the wire, for ns-3 / ASTRA-sim-style
tools that replay point-to-point transfers:

============== =========== ==============================================================================
column         type        meaning
============== =========== ==============================================================================
src, dst       int64       GPU slots (the ranks placed on the topology; the ranks themselves without one)
src_rank,      int64       the ranks
dst_rank
bytes          float64     bytes this flow carries (ring or direct decomposition, :mod:`llmcomm.trace`)
start_ns       float64     when the call starts: the event's ``t_start_ns`` (recorded traces), or a
                           predicted start from a timeline (:mod:`llmcomm.overhead.timeline`); NaN if
                           neither
event          int64       the row of the trace's events table the flow comes from
iteration,     int32       the event's tags
microbatch,
layer
phase,         string      the event's tags
parallelism,
op
============== =========== ==============================================================================
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..atomic import atomic_path
from ..errors import ConfigError
from ..layout import Layout
from ..specs import ParallelConfig
from ..vocab import AlgorithmName
from .placement import Placement, place
from .topology import Topology, load_topology

if TYPE_CHECKING:
    from ..trace import Trace

AICB_COLUMNS = ("comm_type", "comm_group", "comm_group_size", "msg_size", "stage", "dst", "src", "additional",
                "_elapsed_time", "algbw", "busbw", "count")
AICB_KINDS = ("tp", "cp", "ep", "dp", "pp")  # the groups AICB can name, tried in this order
_STAGE = {"setup": "init", "forward": "forward", "backward": "backward", "optimizer": "step"}


def _parallel(trace: Trace, parallel: ParallelConfig | None) -> ParallelConfig:
    if parallel is not None:
        return parallel
    p = trace.meta.get("parallel")
    if not isinstance(p, dict):
        raise ConfigError("to_aicb: the trace's meta has no parallel configuration; pass parallel=")
    return ParallelConfig.from_dict(p, "trace meta 'parallel'")


def to_aicb(trace: Trace, rank: int = 0, parallel: ParallelConfig | None = None,
            gpus_per_node: int | None = None) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """``(csv_text, written, dropped)``: ``rank``'s calls as an AICB workload (see the module doc); ``written``
    the events written (in file order), ``dropped`` those AICB cannot name with a ``reason`` column. The trace
    must hold one iteration in expanded form (``predict_traffic(..., aggregate=False)``)."""
    par = _parallel(trace, parallel)
    lay = Layout(par, gpus_per_node or int(trace.meta.get("gpus_per_node") or 8))
    if not 0 <= rank < par.world_size:
        raise ConfigError(f"to_aicb: rank={rank} is outside the world of {par.world_size}")
    ev = trace.select(rank=rank).expand().events
    iters = sorted(set(ev.loc[ev["phase"] != "setup", "iteration"].astype(int)))
    if len(iters) > 1:
        raise ConfigError(f"to_aicb: the trace holds iterations {iters}; select one (an AICB file is one step)")
    ordered = {k: lay.group_of(rank, k) for k in AICB_KINDS if lay.size(k) > 1}
    groups = {k: set(v) for k, v in ordered.items()}
    kinds, reasons = [], []
    for op, g, peer in zip(ev["op"], ev["group"], ev["peer"], strict=True):
        members = set(int(x) for x in g)
        kind = None
        if op in ("send", "recv"):
            kind = "pp" if "pp" in groups and int(peer) in groups["pp"] else None
        else:
            kind = next((k for k, s in groups.items() if s == members), None)
            if kind is None and members == {rank}:
                kind = "tp"  # a one-rank group: AICB writes it on the size-1 group of any kind
        kinds.append(kind)
        reasons.append(None if kind else f"group of {len(members)} ranks is not this rank's "
                       f"{'/'.join(groups) or 'any'} group")
    ev = ev.assign(_kind=kinds, _reason=reasons)
    dropped = ev[ev["_kind"].isna()].drop(columns=["_kind"]).rename(columns={"_reason": "reason"})
    keep = ev[ev["_kind"].notna()]
    setup, work = keep[keep["phase"] == "setup"], keep[keep["phase"] != "setup"]
    lines = [f"[rank0 ~ rank{par.world_size - 1}]", ",".join(AICB_COLUMNS)]

    def row(r: pd.Series) -> str:
        group = ordered.get(r["_kind"], [rank])
        size = len(group)
        dst = src = "None"
        if r["op"] == "send":
            dst = str(int(r["peer"]))
        elif r["op"] == "recv":
            src = str(int(r["peer"]))
        elif r["op"] == "broadcast" and int(r["peer"]) >= 0:
            src = str(group.index(int(r["peer"])))
        t0, t1 = r.get("t_start_ns"), r.get("t_end_ns")
        ms = "None" if pd.isna(t0) or pd.isna(t1) else repr((float(t1) - float(t0)) / 1e6)
        return ",".join([f"CommType.{r['op']}", f"CommGroup.{r['_kind']}_group", str(size), str(int(r["bytes"])),
                         f"{_STAGE[r['phase']]}.{r['parallelism']}", dst, src, "", ms, "None", "None", "1"])

    lines += [row(r) for _, r in setup.iterrows()]
    epoch = "CommType.epoch_end,None,None,0,,None,None,,None,None,None,1"
    lines.append(epoch)
    lines += [row(r) for _, r in work.iterrows()]
    lines.append(epoch)
    written = keep.drop(columns=["_kind", "_reason"]).reset_index(drop=True)
    return "\n".join(lines) + "\n", written, dropped.reset_index(drop=True)


def write_aicb(trace: Trace, path: str | os.PathLike[str], rank: int = 0,
               parallel: ParallelConfig | None = None) -> pd.DataFrame:
    """Write :func:`to_aicb`'s CSV to ``path`` atomically; return the dropped calls."""
    text, _, dropped = to_aicb(trace, rank, parallel)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    return dropped


def flow_list(trace: Trace, *, topology: Topology | str | None = None, placement: Placement = "contiguous",
              seed: int = 0, algorithm: AlgorithmName = "ring", start_ns: np.ndarray | pd.Series | None = None) -> pd.DataFrame:
    """The flow list of the module doc. ``start_ns`` (one value per event row, e.g. a predicted timeline's
    starts) overrides the events' own ``t_start_ns``."""
    from ..flows import flow_event_arrays

    refs = trace.ref_events
    if refs is not None:
        src, dst, byt, event = flow_event_arrays(refs, algorithm)
        cols = refs.decoded(["iteration", "microbatch", "layer", "phase", "parallelism", "op"]).to_pandas()
        t_start = refs.table.column("t_start_ns").to_numpy(zero_copy_only=False) \
            if "t_start_ns" in refs.table.column_names else np.full(refs.num_rows, np.nan)
    else:
        table = trace.to_table()
        src, dst, byt, event = flow_event_arrays(table, algorithm)
        cols = trace.events[["iteration", "microbatch", "layer", "phase", "parallelism", "op"]]
        t_start = trace.events["t_start_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    if start_ns is not None:
        t_start = np.asarray(start_ns, dtype=np.float64)
        if len(t_start) != len(cols):
            raise ConfigError(f"flow_list: start_ns has {len(t_start)} values; the trace has {len(cols)} events")
    slots = np.arange(trace.world_size, dtype=np.int64)
    if topology is not None:
        topo = load_topology(topology).for_world(trace.world_size)
        slots = place(trace.world_size, topo, placement, seed=seed)
    out = pd.DataFrame({"src": slots[src], "dst": slots[dst], "src_rank": src, "dst_rank": dst, "bytes": byt,
                        "start_ns": np.asarray(t_start, dtype=np.float64)[event], "event": event})
    for c in cols.columns:
        out[c] = cols[c].to_numpy()[event]
    return out


def write_flow_list(trace: Trace, path: str | os.PathLike[str], **kwargs: object) -> Path:
    """Write :func:`flow_list` as parquet or CSV (by suffix), atomically."""
    path = Path(path)
    df = flow_list(trace, **kwargs)  # type: ignore[arg-type]
    with atomic_path(path) as tmp:
        if path.suffix == ".csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)
    return path
