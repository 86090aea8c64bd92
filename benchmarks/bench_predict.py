"""Speed and memory of the analytical predictor at the largest scales.

GPT-3 175B with tp 8, pp 16 (Narayanan et al. 2021's configuration) and dp 128 / 512 / 1024, i.e. 16,384 /
65,536 / 131,072 GPUs (12 micro-batches per DP rank, sequence 2048), and Mixtral 8x7B on the same grid with ep 8 (sequence
4096) on 131,072 GPUs. Each case runs in its own subprocess (so cases do not share memory) and reports wall time
of ``predict_traffic`` + ``Trace.matrix`` (the blocked builder, :mod:`llmcomm.matrix`), the process's peak
RSS (imports included) and the matrix's nonzeros. Targets at 131,072 GPUs: events + ring matrix < 3 s and
< 2 GiB; events + direct matrix < 20 s and < 6 GiB.

    .venv/bin/python benchmarks/bench_predict.py                 # the default table
    .venv/bin/python benchmarks/bench_predict.py --cases gpt3:16384:direct gpt3:131072:node
    .venv/bin/python benchmarks/bench_predict.py --one gpt3:16384:direct   # a single case, JSON out

A case is ``model:gpus:what`` with what = ``ring`` / ``direct`` (GPU matrix) or ``node`` (direct, summed
to nodes of 8 GPUs). The machine's load average is printed with the table: timings on a shared machine
are upper bounds; the process's CPU time (user + system, one thread) is printed beside the wall time as the
figure an idle machine would approach. Pass/fail is judged on wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

from _cases import run_case

DEFAULT = ["gpt3:16384:direct", "gpt3:65536:direct", "gpt3:131072:ring", "gpt3:131072:direct",
           "gpt3:131072:node", "mixtral:131072:ring", "mixtral:131072:direct"]
TARGETS = {("gpt3", 131072, "ring"): (3.0, 2.0), ("gpt3", 131072, "direct"): (20.0, 6.0),
           ("mixtral", 131072, "ring"): (3.0, 2.0), ("mixtral", 131072, "direct"): (20.0, 6.0)}


def config(model: str, gpus: int):  # noqa: ANN201
    from llmcomm import ParallelConfig, load_model

    # rerun_mode="disabled" (Megatron's --rerun-mode disabled): the default rerun check all-reduces one int32
    # over the whole world each iteration, which makes the direct matrix world² (16,384 GPUs: 268 M nonzeros,
    # 35 s, 3.6 GiB; 131,072 GPUs: refused by llmcomm.bounds.check_matrix_flows) — the cases measure the rest
    if model == "gpt3":
        dp = gpus // 128
        return load_model("gpt3-175b"), ParallelConfig(tp=8, pp=16, dp=dp, micro_batch=1, global_batch=12 * dp,
                                                        seq_len=2048, rerun_mode="disabled")
    if model == "mixtral":  # the same grid as GPT-3's, experts spread over 8 of the DP ranks
        dp = gpus // 128
        return load_model("mixtral-8x7b"), ParallelConfig(tp=8, pp=16, dp=dp, ep=8, sp=True, micro_batch=1,
                                                           global_batch=12 * dp, seq_len=4096, rerun_mode="disabled")
    raise SystemExit(f"unknown model {model!r} (gpt3, mixtral)")


def one(case: str) -> dict:
    """Run one case in this process; wall time, peak RSS, rows, nonzeros."""
    from llmcomm.predict import predict_traffic

    model, gpus, what = case.split(":")
    spec, parallel = config(model, int(gpus))
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = ru0.ru_utime + ru0.ru_stime
    t0 = time.perf_counter()
    trace = predict_traffic(spec, parallel)
    t1 = time.perf_counter()
    if what == "node":
        m = trace.matrix("direct", level="node")
    else:
        m = trace.matrix(what)
    t2 = time.perf_counter()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rss = ru.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    cpu = ru.ru_utime + ru.ru_stime - cpu0
    # the calls from the count column of the references: reading trace.events would write out every member list
    # (Mixtral at 131,072 GPUs: +2 GiB after the measurement, which /usr/bin/time saw as the peak)
    ref = trace.ref_events
    counts = ref.ints("count") if ref is not None else trace.events["count"].to_numpy()
    return {"case": case, "model": model, "gpus": int(gpus), "what": what, "rows": len(trace),
            "calls": int(counts.sum()), "events_s": t1 - t0, "matrix_s": t2 - t1,
            "total_s": t2 - t0, "cpu_s": cpu, "peak_rss_gib": rss / 2**30, "nnz": int(m.nnz), "shape": list(m.shape)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=DEFAULT)
    ap.add_argument("--one", default=None, help="run one case here and print its JSON")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| model | GPUs | what | events | matrix | total (CPU time) | peak RSS | nonzeros | target |")
    print("|---|---|---|---|---|---|---|---|---|")
    ok = True
    for case in args.cases:
        model, gpus, what = case.split(":")
        target = TARGETS.get((model, int(gpus), what))
        tgt = f"< {target[0]:g} s, < {target[1]:g} GiB" if target else ""
        r, why = run_case(__file__, case, args.timeout)
        if r is None:
            print(f"| {model} | {int(gpus):,} | {what} | {why} | | | | | {tgt} |")
            ok = False
            continue
        met = target is None or (r["total_s"] < target[0] and r["peak_rss_gib"] < target[1])
        ok &= met
        print(f"| {model} | {r['gpus']:,} | {what} | {r['events_s']:.1f} s ({r['rows']:,} rows) | "
              f"{r['matrix_s']:.1f} s | {r['total_s']:.1f} s ({r['cpu_s']:.1f} s) | {r['peak_rss_gib']:.2f} GiB | "
              f"{r['nnz'] / 1e6:.1f} M | {tgt}{'' if met else ' MISSED'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
