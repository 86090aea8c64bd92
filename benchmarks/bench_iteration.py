"""Speed of the iteration-time formulation (llmcomm.overhead): one configuration through ``iteration_time``
and a table of candidate configurations through the vectorized ``iteration_times`` (GPT-3 175B, A100
cluster, shipped calibration). Targets: one configuration under 1 ms; at least 1e5 configurations per second
on one core.

``iteration_time`` keeps the stage description of its most recent configurations
(``llmcomm.overhead.iteration.STAGE_CACHE_SIZE``), so a configuration asked again costs the combination of its
terms only: both are measured, the same configuration repeated, and distinct configurations each seen for the
first time (the cache emptied before).

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
from llmcomm.errors import ConfigError  # noqa: E402
from llmcomm.overhead import iteration as _iteration  # noqa: E402
from llmcomm.overhead import iteration_time, iteration_times  # noqa: E402
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
    _iteration._STAGES.clear()  # each configuration below is seen for the first time
    t0, c0 = time.perf_counter(), time.process_time()
    for p in distinct:
        iteration_time(model, p, cluster)
    cold, cold_cpu = (time.perf_counter() - t0) / len(distinct), (time.process_time() - c0) / len(distinct)
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
          f"{'met' if one < 1e-3 else 'NOT met'} by wall time); total {b.total_s:.2f} s, comm overhead "
          f"{b.comm_overhead:.1%}")
    print(f"iteration_time, {len(distinct)} distinct configurations each seen for the first time: "
          f"{cold * 1e3:.3f} ms per call wall, {cold_cpu * 1e3:.3f} ms CPU (target < 1 ms: "
          f"{'met' if cold < 1e-3 else 'NOT met'} by wall time)")
    print(f"iteration_times: {len(table):,} configurations in {dt:.3f} s = {rate:,.0f} configurations/s "
          f"(target >= 1e5/s: {'met' if rate >= 1e5 else 'NOT met'}); first call, with the regime look-ups: "
          f"{first:.3f} s = {len(table) / first:,.0f}/s; CPU time of the warm call {dt_cpu:.3f} s = "
          f"{len(table) / dt_cpu:,.0f}/s; median total {out['total_s'].median():.2f} s")
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} (wall times stretch on a shared machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
