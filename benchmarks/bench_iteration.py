"""Speed of the iteration-time formulation (llmcomm.overhead): one configuration through ``iteration_time``
and a table of candidate configurations through the vectorized ``iteration_times`` (GPT-3 175B, A100
cluster, shipped calibration). Targets: one configuration under 1 ms; at least 1e5 configurations per second
on one core.

``iteration_time`` keeps the stage description of its most recent configurations
(``llmcomm.overhead.iteration.STAGE_CACHE_SIZE``), so a configuration asked again costs the combination of its
terms only: both are measured, the same configuration repeated, and distinct configurations each seen for the
first time (the cache emptied before).

Configurations "seen for the first time" are timed with every per-configuration cache emptied (the stage
cache, the memory check's, the calls each bandwidth timer keeps, the last configuration's ``ParallelTable``) but the
per-model, per-shape and per-regime ones kept (what a sweep has after its first configurations); "nothing cached"
empties those too (the bandwidth timers, the memory model's stage layouts, one configuration's placement arrays). Besides GPT-3 175B's grid, one
configuration of each mechanism of the catalogue (LLaMA-3 70B with every overlap and FP8, CP, FSDP, interleaved
pipelines, Mixtral and Qwen3 with EP) is timed the same ways. CPU time (``time.process_time``) is printed beside
wall time, since wall time stretches on a shared machine; the targets are judged on CPU time.

    .venv/bin/python benchmarks/bench_iteration.py [--rows N]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
import warnings

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one core
    os.environ.setdefault(_v, "1")

import pandas as pd  # noqa: E402

from llmcomm import ParallelConfig, load_cluster, load_model  # noqa: E402
from llmcomm import parallel_table as _parallel_table  # noqa: E402
from llmcomm import step as _step  # noqa: E402
from llmcomm.errors import ConfigError  # noqa: E402
from llmcomm.overhead import bandwidth as _bandwidth  # noqa: E402
from llmcomm.overhead import capacity as _capacity  # noqa: E402
from llmcomm.overhead import iteration as _iteration  # noqa: E402
from llmcomm.overhead import iteration_time, iteration_times  # noqa: E402
from llmcomm.overhead import memory as _memory  # noqa: E402
from llmcomm.overhead.capacity import MemoryWarning  # noqa: E402


def candidates(n: int) -> pd.DataFrame:
    """A grid of GPT-3 175B configurations (tp, pp, dp, micro-batch, recompute, schedule), repeated to n rows."""
    rows = []
    for tp, pp, dp, mb, rec, sp, dist in itertools.product(
            (1, 2, 4, 8), (1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16, 32, 64), (1, 2, 4, 8),
            ("none", "selective", "full"), (False, True), (False, True)):
        if sp and tp == 1:
            continue
        rows.append({"tp": tp, "pp": pp, "dp": dp, "micro_batch": mb, "global_batch": 1536 // (mb * dp) * mb * dp
                     if 1536 % (mb * dp) == 0 else mb * dp, "recompute": rec, "sp": sp,
                     "distributed_optimizer": dist})
    grid = pd.DataFrame(rows)
    return pd.concat([grid] * (n // len(grid) + 1), ignore_index=True).iloc[:n]


# one configuration per mechanism (model, cluster, fields)
CASES = {
    "GPT-3 175B tp8 pp16 dp8, full recompute": ("gpt3-175b", "a100-80g-hdr200", dict(
        tp=8, pp=16, dp=8, micro_batch=1, global_batch=1536, recompute="full")),
    "LLaMA-3 70B vpp5, TP/DP overlap, FP8": ("llama3-70b", "h100-80g-ndr400", dict(
        tp=4, pp=4, vpp=5, dp=8, sp=True, micro_batch=1, global_batch=512, seq_len=8192,
        distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=True,
        fp8="hybrid", fp8_param_gather=True)),
    "LLaMA-3 70B cp2": ("llama3-70b", "h100-80g-ndr400", dict(
        tp=4, pp=4, vpp=5, dp=4, cp=2, sp=True, micro_batch=1, global_batch=256, seq_len=8192,
        distributed_optimizer=True, overlap_grad_reduce=True, tp_comm_overlap=True)),
    "LLaMA-3 8B FSDP": ("llama3-8b", "h100-80g-ndr400", dict(
        tp=1, pp=1, dp=16, micro_batch=1, global_batch=128, fsdp=True, distributed_optimizer=True,
        overlap_grad_reduce=True)),
    "GPT-3 175B vpp4, every overlap, FP8": ("gpt3-175b", "h100-80g-ndr400", dict(
        tp=8, pp=8, vpp=4, dp=8, micro_batch=1, global_batch=512, sp=True, distributed_optimizer=True,
        overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=True, fp8="hybrid",
        overlap_p2p_comm=True)),
    "Mixtral 8x7B ep8": ("mixtral-8x7b", "h100-80g-ndr400", dict(
        tp=1, pp=4, dp=16, ep=8, micro_batch=1, global_batch=256, seq_len=4096, distributed_optimizer=True,
        recompute="selective")),
    "Qwen3-235B ep8 vpp47, a2a overlap": ("qwen3-235b-a22b", "h100-80g-ndr400", dict(
        tp=4, pp=2, vpp=47, dp=16, ep=8, sp=True, micro_batch=1, global_batch=512, seq_len=4096,
        distributed_optimizer=True, overlap_grad_reduce=True, moe_a2a_overlap=True, recompute="selective")),
}


def forget_configurations() -> None:
    """Empty the caches that hold one configuration's values: the stage cache, the memory check's, and the calls
    each bandwidth timer keeps (the regimes stay)."""
    _iteration._STAGES.clear()
    _capacity._memory.cache_clear()
    _parallel_table._LAST_ONE.clear()  # the last configuration's table (stages and the memory check share it)
    for _, timer in _iteration._TIMERS.values():
        getattr(timer, "memo", {}).clear()


def forget_everything() -> None:
    """:func:`forget_configurations` and the per-model and per-regime caches too (bandwidth timers, stage
    layouts of the memory model)."""
    forget_configurations()
    _iteration._TIMERS.clear()
    _bandwidth._default_cached.cache_clear()  # the default model per cluster as asked (kept per size)
    _step._shape_placement_rows.cache_clear()  # one configuration's placement arrays per shape
    for name in ("_stage_parameters", "_stage_info", "_fsdp_units", "_shape"):
        f = getattr(_memory, name, None)
        if hasattr(f, "cache_clear"):
            f.cache_clear()


def timed(fn: object, reps: int, before: object = None) -> tuple[float, float]:
    """``(wall, CPU)`` seconds per call of ``fn()`` over ``reps`` calls, ``before()`` (untimed) ahead of each."""
    wall = cpu = 0.0
    for _ in range(reps):
        if before is not None:
            before()  # type: ignore[operator]
        t0, c0 = time.perf_counter(), time.process_time()
        fn()  # type: ignore[operator]
        wall, cpu = wall + time.perf_counter() - t0, cpu + time.process_time() - c0
    return wall / reps, cpu / reps


def ms(wall: float, cpu: float) -> str:
    return f"{wall * 1e3:.3f} ms wall, {cpu * 1e3:.3f} ms CPU ({'met' if cpu < 1e-3 else 'NOT met'})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    args = ap.parse_args(argv)
    model, cluster = load_model("gpt3-175b"), load_cluster("a100-80g-hdr200")
    par = ParallelConfig(tp=8, pp=16, dp=8, micro_batch=1, global_batch=1536, recompute="full")
    iteration_time(model, par, cluster)  # warm: imports, calibration files
    reps = 500
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(reps):
        b = iteration_time(model, par, cluster)
    one, one_cpu = (time.perf_counter() - t0) / reps, (time.process_time() - c0) / reps
    distinct = []  # configurations that are valid and fit in memory (no MemoryWarning)
    for row in candidates(4000).drop_duplicates().to_dict("records"):
        p = ParallelConfig(**row)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", MemoryWarning)
                iteration_time(model, p, cluster)
        except (ConfigError, MemoryWarning):
            continue
        distinct.append(p)
        if len(distinct) == 300:
            break
    forget_configurations()  # each configuration below is seen for the first time
    t0, c0 = time.perf_counter(), time.process_time()
    for p in distinct:
        iteration_time(model, p, cluster)
    cold, cold_cpu = (time.perf_counter() - t0) / len(distinct), (time.process_time() - c0) / len(distinct)
    bare_wall = bare_cpu = 0.0
    for p in distinct[:60]:  # nothing cached at all
        w, c = timed(lambda p=p: iteration_time(model, p, cluster), 1, forget_everything)
        bare_wall, bare_cpu = bare_wall + w / 60, bare_cpu + c / 60
    per_case = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemoryWarning)
        for label, (mname, cname, kw) in CASES.items():
            m, c, p = load_model(mname), load_cluster(cname), ParallelConfig(**kw)
            iteration_time(m, p, c)  # the model's and cluster's files read
            per_case.append((label, timed(lambda m=m, p=p, c=c: iteration_time(m, p, c), 20, forget_configurations),
                             timed(lambda m=m, p=p, c=c: iteration_time(m, p, c), 5, forget_everything),
                             timed(lambda m=m, p=p, c=c: iteration_time(m, p, c), 50)))
    table = candidates(args.rows)
    t0 = time.perf_counter()
    iteration_times(model, table, cluster)  # cold: the bandwidth model's regimes are looked up once each
    first = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    out = iteration_times(model, table, cluster)
    dt, dt_cpu = time.perf_counter() - t0, time.process_time() - c0
    rate = len(table) / dt
    print(f"iteration_time, the same configuration repeated (gpt3-175b tp8 pp16 dp8, 1,536 sequences): "
          f"{one * 1e3:.3f} ms per call wall, {one_cpu * 1e3:.3f} ms CPU (target < 1 ms: "
          f"{'met' if one_cpu < 1e-3 else 'NOT met'} by CPU time); total {b.total_s:.2f} s, comm overhead "
          f"{b.comm_overhead:.1%}")
    print(f"iteration_time, {len(distinct)} distinct configurations each seen for the first time: "
          f"{cold * 1e3:.3f} ms per call wall, {cold_cpu * 1e3:.3f} ms CPU (target < 1 ms: "
          f"{'met' if cold_cpu < 1e-3 else 'NOT met'} by CPU time); nothing cached (60 of them): "
          f"{ms(bare_wall, bare_cpu)}")
    print("iteration_time per mechanism: first seen | nothing cached | repeated")
    for label, first_seen, bare, again in per_case:
        print(f"  {label:40s} {ms(*first_seen)} | {ms(*bare)} | {ms(*again)}")
    print(f"iteration_times: {len(table):,} configurations in {dt:.3f} s wall = {rate:,.0f} configurations/s, "
          f"CPU {dt_cpu:.3f} s = {len(table) / dt_cpu:,.0f}/s (target >= 1e5/s: "
          f"{'met' if len(table) / dt_cpu >= 1e5 else 'NOT met'} by CPU time); first call, with the regime "
          f"look-ups: {first:.3f} s = {len(table) / first:,.0f}/s; median total {out['total_s'].median():.2f} s")
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} (wall times stretch on a shared machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
