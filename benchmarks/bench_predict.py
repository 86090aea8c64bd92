"""Speed of the analytical predictor: GPT-3 175B on 16,384 GPUs (tp 8, pp 16, dp 128, global batch 1536,
sequence 2048; Narayanan et al. 2021's configuration scaled to dp 128).

Prints wall time of the three steps (events, ring flows, sparse direct matrix), events/s (calls the
aggregated rows stand for, per second) and peak memory (tracemalloc peak of Python allocations and the
process's peak RSS), measured on a second, untimed run since tracemalloc slows Python. Targets: under 2 s in total and under 2 GiB peak.

    .venv/bin/python benchmarks/bench_predict.py
"""

from __future__ import annotations

import resource
import sys
import time
import tracemalloc

from llmcomm import ParallelConfig, load_model
from llmcomm.predict import predict_traffic


def main() -> int:
    model = load_model("gpt3-175b")
    parallel = ParallelConfig(tp=8, pp=16, dp=128, micro_batch=1, global_batch=1536, seq_len=2048)
    predict_traffic(load_model("gpt3-125m"), ParallelConfig(tp=2, pp=2, dp=2, global_batch=4))  # warm imports
    t0 = time.perf_counter()
    trace = predict_traffic(model, parallel)  # aggregate=None -> aggregated (count column) at this size
    t1 = time.perf_counter()
    flows = trace.flows("ring")
    t2 = time.perf_counter()
    matrix = trace.matrix("direct")
    t3 = time.perf_counter()
    # memory: a second run under tracemalloc (which slows Python several-fold, so it is not timed)
    del trace, flows, matrix
    tracemalloc.start()
    trace = predict_traffic(model, parallel)
    flows = trace.flows("ring")
    matrix = trace.matrix("direct")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    calls = int(trace.events["count"].sum())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    total = t3 - t0
    print(f"GPT-3 175B, {parallel.world_size:,} GPUs (tp 8, pp 16, dp 128, m {parallel.num_microbatches})")
    print(f"  events : {len(trace):>10,} rows standing for {calls:,} calls   {t1 - t0:6.3f} s"
          f"   ({calls / (t1 - t0):,.0f} calls/s, {len(trace) / (t1 - t0):,.0f} rows/s)")
    print(f"  flows  : {len(flows):>10,} ring flows                           {t2 - t1:6.3f} s")
    print(f"  matrix : {matrix.nnz:>10,} nonzeros (direct, sparse CSR)            {t3 - t2:6.3f} s")
    print(f"  total  : {total:.3f} s (target < 2 s)   tracemalloc peak {peak / 2**30:.2f} GiB, "
          f"peak RSS {rss / 2**30:.2f} GiB (target < 2 GiB)")
    return 0 if total < 2 and max(peak, rss) < 2 * 2**30 else 1


if __name__ == "__main__":
    sys.exit(main())
