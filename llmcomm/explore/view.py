"""What the explorer shows for one choice of model, cluster and parallel configuration, computed only by the
package's public functions (this module adds no formula of its own):

==================== ===============================================================================
panel                computed by
==================== ===============================================================================
rank layout          :meth:`llmcomm.layout.Layout.group_table` (Megatron's rank order), nodes of the cluster
matrices             :func:`llmcomm.predict.predict_traffic` → :meth:`llmcomm.Trace.matrix` per parallelism,
                     ``algorithm="direct"`` (logical: who talks to whom) and ``"ring"`` (what NCCL's ring
                     puts on the wire), summed into blocks by :func:`llmcomm.matrix_view.binned_matrices` (an image
                     from the group structure; equal to the exact matrix summed into the same blocks), from the
                     aggregated prediction where :func:`llmcomm.matrix_view.count_exact` proves its images bit
                     for bit the expanded prediction's (:func:`_traffic`)
bytes                :meth:`llmcomm.Trace.volumes` by parallelism (nccl-tests sizes, each send counted once)
call sequence        :meth:`llmcomm.predict.program.StagePlan.microbatch_calls` of the chosen rank's stage (the
                     plan the prediction built, cached by :func:`~llmcomm.predict.program.stage_plan`), one
                     micro-batch; its groups resolved by :meth:`llmcomm.layout.Layout.group_rows`
iteration time       :func:`llmcomm.overhead.iteration.iteration_time` → :class:`Breakdown`, with the 90 %
                     interval of :mod:`llmcomm.overhead.interval` in the panel
==================== ===============================================================================

A choice that breaks a rule raises the :class:`~llmcomm.errors.ConfigError` the package raises (the CLI's
message); the iteration time alone may be unavailable for a valid traffic configuration (a rule of the cost model
refuses it, e.g. the model state does not fit the GPU), and :attr:`View.time_error` says why.

Size: up to :data:`GPU_LEVEL_MAX` GPUs the matrices are drawn per GPU (in blocks of at most
:data:`MATRIX_CELLS` ranks per side); larger jobs are drawn per node (``level="node"`` of
:meth:`llmcomm.Trace.matrix`, in blocks of whole nodes), and the layout panel draws only the first
:data:`LAYOUT_NODES` nodes' GPUs with the per-parallelism summary of the whole job beside it. The threshold
is the issue's (per GPU up to 4,096 GPUs), not a cost: a drawn matrix has at most :data:`MATRIX_CELLS`² cells
whatever the job, and the aggregated prediction it is computed from grows with the ranks times the distinct
calls of a stage (about 50 k rows at 4,096 GPUs), so a per-GPU view of a 4,096-GPU job costs about what a
256-GPU one does (``benchmarks/bench_explore.py``); above it the blocks are whole nodes, so that no cell
mixes the GPUs of two nodes (a block of ceil(world / 256) ranks need not be a whole number of nodes).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, LLMCommError
from ..layout import Layout
from ..matrix_view import Grid, binned_matrices, count_exact, view_grid
from ..overhead.iteration import Breakdown, iteration_time
from ..predict import AUTO_AGGREGATE_ROWS, predict_traffic
from ..predict.calls import Context
from ..predict.program import stage_plan
from ..specs import Cluster, ModelSpec, ParallelConfig, load_cluster, load_model
from ..trace import Trace
from ..vocab import GROUP_PARALLELISMS, AlgorithmName

GPU_LEVEL_MAX = 4096  # above this many GPUs the matrices are drawn per node
MATRIX_CELLS = 256  # at most this many cells per side of a drawn matrix (ranks, or nodes, summed into blocks)
LAYOUT_NODES = 4  # the layout panel draws the GPUs of at most this many nodes
MAX_WORLD = 131_072  # the largest job the explorer computes (the predictor's tested scale)
JOB_CACHE = 8  # jobs whose prediction, matrices and time are kept (going back to one is free)
ALGORITHMS: tuple[AlgorithmName, ...] = ("direct", "ring")
ALGORITHM_LABEL = {"direct": "logical", "ring": "ring"}


@dataclass(frozen=True)
class Choice:
    """One set of the explorer's controls. ``model``: a catalogue name or a YAML path; ``cluster``: a catalogue
    name or a YAML path (sized to the job); ``rank`` and ``microbatch`` pick the call sequence shown."""

    model: str = "gpt3-6.7b"
    cluster: str = "a100-80g-hdr200"
    tp: int = 4
    pp: int = 2
    dp: int = 4
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    sp: bool = False
    micro_batch: int = 1
    global_batch: int = 32
    rank: int = 0
    microbatch: int = 0

    def parallel(self) -> ParallelConfig:
        """The :class:`ParallelConfig` of this choice (raises its :class:`ConfigError`)."""
        return ParallelConfig(tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep, vpp=self.vpp,
                              sp=self.sp, micro_batch=self.micro_batch, global_batch=self.global_batch)

    def label(self) -> str:
        dims = " ".join(f"{d}{getattr(self, d)}" for d in ("tp", "pp", "dp", "cp", "ep", "vpp")
                        if getattr(self, d) > 1 or d in ("tp", "pp", "dp"))
        name = Path(self.model).stem if self.model.endswith((".yaml", ".yml")) else self.model
        return f"{name} {dims}{' sp' if self.sp else ''}"

    def replace(self, **kw: Any) -> Choice:
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class View:
    """Everything the panels draw for one :class:`Choice` (tidy tables; see the module docstring)."""

    choice: Choice
    model: ModelSpec
    parallel: ParallelConfig
    cluster: Cluster
    layout: Layout
    traffic: Trace  # what the matrices and bytes are computed from (aggregated where that is exact, see _job)
    grid: Grid  # the matrices' blocks: level ("gpu" or "node"), unit (ranks per cell), cells per side
    group_table: pd.DataFrame  # the layout panel's ranks (the first LAYOUT_NODES nodes)
    group_summary: pd.DataFrame  # per parallelism: groups, size, nodes one group spans
    matrices: dict[str, np.ndarray]  # panel ("TP logical"...) -> bytes image (cells × cells, sender rows)
    volumes: pd.DataFrame  # parallelism, bytes, calls, share
    calls: pd.DataFrame  # the chosen rank's calls of one micro-batch, in issue order
    breakdown: Breakdown | None
    time_error: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    job: _Job | None = field(default=None, repr=False)

    @property
    def trace(self) -> Trace:
        """The prediction as :func:`llmcomm.predict.predict_traffic` returns it for this job (every call a row up
        to its ``AUTO_AGGREGATE_ROWS``), computed on first use and kept with the job."""
        return self.job.trace if self.job is not None else self.traffic

    @property
    def level(self) -> str:
        return self.grid.level

    @property
    def unit(self) -> int:
        return self.grid.unit

    @property
    def cells(self) -> int:
        return self.grid.cells

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    @property
    def num_nodes(self) -> int:
        return math.ceil(self.world_size / self.cluster.gpus_per_node)


def resolve_model(name_or_path: str) -> ModelSpec:
    return load_model(name_or_path.strip())


def _group_summary(lay: Layout) -> pd.DataFrame:
    """Per parallelism with size > 1: number of groups, ranks per group, nodes one group spans (most over
    its groups) and the rank stride inside a group."""
    rows = []
    for p in GROUP_PARALLELISMS:
        if lay.size(p) == 1:
            continue
        g = lay.groups(p)
        nodes = np.asarray(lay.node_of(g))
        span = int(max(len(np.unique(r)) for r in nodes[: min(len(nodes), 64)]))
        rows.append({"parallelism": p, "groups": len(g), "size": g.shape[1], "nodes_per_group": span,
                     "stride": int(g[0, 1] - g[0, 0]), "first_group": g[0].tolist()[:8]})
    return pd.DataFrame(rows, columns=["parallelism", "groups", "size", "nodes_per_group", "stride",
                                       "first_group"])


def _matrices(trace: Trace, world: int, gpus_per_node: int) -> tuple[dict[str, np.ndarray], Grid]:
    """Per parallelism present and per algorithm, the matrix summed into at most MATRIX_CELLS² blocks
    (:func:`llmcomm.matrix_view.binned_matrices`: an image from the group structure, no flow list)."""
    grid = view_grid(world, gpus_per_node, MATRIX_CELLS, GPU_LEVEL_MAX)
    images = binned_matrices(trace, ALGORITHMS, grid.unit, world_size=world)
    order = [p for p in ("tp", "sp", "cp", "ep", "pp", "dp") if any(k[0] == p for k in images)]
    out = {f"{p.upper()} {ALGORITHM_LABEL[a]}": images[(p, a)] for p in order for a in ALGORITHMS}
    return out, grid


def _volumes(trace: Trace) -> pd.DataFrame:
    v = trace.volumes(["parallelism"], sent_only=True)
    v = v[v["bytes"] > 0].reset_index(drop=True)
    total = float(v["bytes"].sum())
    return v.assign(share=v["bytes"] / total if total else 0.0)


def _calls(model: ModelSpec, parallel: ParallelConfig, lay: Layout, rank: int, microbatch: int) -> pd.DataFrame:
    """The calls rank ``rank`` issues for micro-batch ``microbatch``, in issue order, with their group."""
    if not 0 <= rank < parallel.world_size:
        raise ConfigError(f"rank={rank} is outside 0..{parallel.world_size - 1}")
    m = parallel.num_microbatches
    if not 0 <= microbatch < m:
        raise ConfigError(f"microbatch={microbatch} is outside 0..{m - 1} (num_microbatches={m})")
    stage = lay.pp_stage(rank)
    prog = stage_plan(Context(model, parallel), stage).microbatch_calls(microbatch)  # the predictor's plan
    pp_group = lay.group_of(rank, "pp")
    rows = []
    for i, c in enumerate(prog):
        if c.group in ("p2p", "cp_p2p"):
            peers = [pp_group[(stage + c.peer) % parallel.pp]] if c.group == "p2p" else []
            members = sorted({rank, *peers})
        else:
            members = lay.group_rows(c.group, np.array([rank]))[0].tolist()
        shown = ", ".join(map(str, members[:8])) + (f", … ({len(members)})" if len(members) > 8 else "")
        rows.append({"step": i, "phase": c.phase, "layer": c.layer, "parallelism": c.parallelism, "op": c.op,
                     "group": c.group, "ranks": shown, "bytes": c.bytes, "dtype": c.dtype})
    return pd.DataFrame(rows, columns=["step", "phase", "layer", "parallelism", "op", "group", "ranks", "bytes",
                                       "dtype"])


@dataclass(frozen=True)
class _Job:
    """What depends on the job alone, not on the rank and micro-batch shown (cached by :func:`_job`)."""

    model: ModelSpec
    parallel: ParallelConfig
    cluster: Cluster
    layout: Layout
    traffic: Trace
    group_table: pd.DataFrame
    group_summary: pd.DataFrame
    matrices: dict[str, np.ndarray]
    grid: Grid
    volumes: pd.DataFrame
    breakdown: Breakdown | None
    time_error: str
    timings: dict[str, float]

    traffic_is_default: bool  # traffic is the prediction as predict_traffic returns it by default

    @cached_property
    def trace(self) -> Trace:
        """:attr:`View.trace`: the default prediction (:attr:`traffic` when that is it, else predicted now)."""
        if self.traffic_is_default:
            return self.traffic
        return predict_traffic(self.model, self.parallel, cluster=self.cluster)


def _stamp(name_or_path: str) -> float:
    """A file's modification time (so an edited YAML is read again), 0 for a catalogue name."""
    p = Path(name_or_path.strip())
    return p.stat().st_mtime if p.is_file() else 0.0


def _traffic(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster) -> tuple[Trace, bool]:
    """The prediction the matrices and bytes are computed from: aggregated (one row per distinct call with its
    ``count``, ``predict_traffic(aggregate=True)``) when :func:`llmcomm.matrix_view.count_exact` says its
    matrices are bit for bit those of the expanded prediction (every call moves whole bytes: sums of whole
    numbers are exact in any order) — the bytes per parallelism are sums of whole numbers too — else the
    prediction as ``predict_traffic`` returns it by default (the explorer's matrices before aggregation). A
    prediction of 256 GPUs has up to 400 k rows expanded and about 2 k aggregated. Above
    ``llmcomm.predict.AUTO_AGGREGATE_ROWS`` expanded rows (the sum of the counts) the aggregated prediction is the
    default one. Returns the trace and whether it is the default one."""
    agg = predict_traffic(model, parallel, cluster=cluster, aggregate=True)
    assert agg.ref_events is not None  # a prediction refers to its layout's groups
    if int(agg.ref_events.ints("count").sum()) > AUTO_AGGREGATE_ROWS:  # expanded rows: predict_traffic's own rule
        return agg, True
    if count_exact(agg, ALGORITHMS):
        return agg, False
    return predict_traffic(model, parallel, cluster=cluster), True


@lru_cache(maxsize=JOB_CACHE)
def _job(key: Choice, _model_stamp: float, _cluster_stamp: float) -> _Job:
    t0 = time.perf_counter()
    model = resolve_model(key.model)
    parallel = key.parallel()
    if parallel.world_size > MAX_WORLD:
        raise ConfigError(f"tp*cp*dp*pp={parallel.world_size} GPUs: the explorer computes jobs of at most "
                          f"{MAX_WORLD:,} GPUs")
    cluster = load_cluster(key.cluster.strip())
    sized = cluster.for_world(parallel.world_size) if cluster.num_nodes is None else cluster
    trace, default = _traffic(model, parallel, sized)  # validates model × parallel × cluster (the CLI's rules)
    lay = Layout(parallel, sized.gpus_per_node)
    t1 = time.perf_counter()
    table = lay.group_table()
    table = table[table["node"] < LAYOUT_NODES].reset_index(drop=True)
    summary = _group_summary(lay)
    t2 = time.perf_counter()
    matrices, grid = _matrices(trace, parallel.world_size, sized.gpus_per_node)
    volumes = _volumes(trace)
    t3 = time.perf_counter()
    breakdown, why = None, ""
    try:
        breakdown = iteration_time(model, parallel, sized)
    except LLMCommError as e:
        why = str(e)
    t4 = time.perf_counter()
    return _Job(model, parallel, sized, lay, trace, table, summary, matrices, grid, volumes,
                breakdown, why, {"predict_s": t1 - t0, "layout_s": t2 - t1, "matrices_s": t3 - t2,
                                 "time_s": t4 - t3}, default)


def compute(choice: Choice) -> View:
    """The :class:`View` of ``choice``; raises the package's :class:`ConfigError` when a rule is broken.

    The job's part (everything but the call sequence) is cached for the last :data:`JOB_CACHE` jobs, so
    changing the rank or micro-batch shown, or going back to a configuration just seen, costs no prediction;
    an edited model or cluster YAML is read again. Work is bounded: a job of more than :data:`MAX_WORLD` GPUs
    is refused before anything is built."""
    key = choice.replace(rank=0, microbatch=0)
    j = _job(key, _stamp(choice.model), _stamp(choice.cluster))
    t0 = time.perf_counter()
    calls = _calls(j.model, j.parallel, j.layout, choice.rank, choice.microbatch)
    timings = {**j.timings, "calls_s": time.perf_counter() - t0}
    return View(choice, j.model, j.parallel, j.cluster, j.layout, j.traffic, j.grid, j.group_table,
                j.group_summary, j.matrices, j.volumes, calls, j.breakdown, j.time_error, timings, j)
