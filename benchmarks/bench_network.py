"""Speed and memory of link loads at the largest scales.

GPT-3 175B (tp 8, pp 16, dp 1024; 12 micro-batches per DP rank, sequence 2048) and Mixtral 8x7B (the same
grid with ep 8, SP, sequence 4096) on 131,072 GPUs, placed contiguously on Llama 3's three-tier fat-tree
(``data/topologies/llama3-24k.yaml``) widened to 43 pods (132,096 GPUs) by ``Topology.for_world``; and GPT-3
on 1,048,576 GPUs (dp 8192, 342 pods). Each case runs in its own subprocess and reports the wall time of
``predict_traffic`` and of ``llmcomm.network.link_loads`` (ring flows, expected ECMP), the process's peak RSS
(imports and the prediction included), the GPU pairs routed and the links with traffic. Target at 131,072
GPUs: link loads < 10 s and < 4 GiB.

    .venv/bin/python benchmarks/bench_network.py
    .venv/bin/python benchmarks/bench_network.py --cases gpt3:131072:sample
    .venv/bin/python benchmarks/bench_network.py --one gpt3:131072:expected   # a single case, JSON out

A case is ``model:gpus:ecmp`` with ecmp = ``expected`` or ``sample`` (seeded per-flow hashing). Timings on a
shared machine are upper bounds; CPU time is printed beside the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

from _cases import run_case

DEFAULT = ["gpt3:131072:expected", "mixtral:131072:expected", "gpt3:131072:sample", "gpt3:1048576:expected"]
TARGETS = {("gpt3", 131072): (10.0, 4.0), ("mixtral", 131072): (10.0, 4.0)}


def config(model: str, gpus: int):  # noqa: ANN201
    from llmcomm import ParallelConfig, load_model

    dp = gpus // 128
    if model == "gpt3":
        return load_model("gpt3-175b"), ParallelConfig(tp=8, pp=16, dp=dp, micro_batch=1, global_batch=12 * dp,
                                                        seq_len=2048)
    if model == "mixtral":
        return load_model("mixtral-8x7b"), ParallelConfig(tp=8, pp=16, dp=dp, ep=8, sp=True, micro_batch=1,
                                                           global_batch=12 * dp, seq_len=4096)
    raise SystemExit(f"unknown model {model!r} (gpt3, mixtral)")


def one(case: str) -> dict:
    from llmcomm.network import link_loads, load_topology
    from llmcomm.predict import predict_traffic

    model, gpus, ecmp = case.split(":")
    spec, parallel = config(model, int(gpus))
    t0 = time.perf_counter()
    trace = predict_traffic(spec, parallel)
    t1 = time.perf_counter()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    topo = load_topology("llama3-24k").for_world(trace.world_size)
    loads = link_loads(trace, topo, ecmp=ecmp)
    t2 = time.perf_counter()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rss = ru.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    cpu = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime
    hot = loads.hottest(1).iloc[0]
    return {"case": case, "gpus": int(gpus), "pods": topo.domains(1), "predict_s": t1 - t0, "loads_s": t2 - t1,
            "cpu_s": cpu, "peak_rss_gib": rss / 2**30, "pairs": loads.meta["pairs"], "links": len(loads.links),
            "hottest": f"{hot['tier']} {hot['direction']} {hot['busy_s'] * 1e3:.1f} ms"}


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
    print("| model | GPUs | ECMP | pods | predict | link loads (CPU time) | peak RSS | GPU pairs | links | hottest | target |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for case in args.cases:
        model, gpus, ecmp = case.split(":")
        target = TARGETS.get((model, int(gpus)))
        tgt = f"< {target[0]:g} s, < {target[1]:g} GiB" if target else ""
        r, why = run_case(__file__, case, args.timeout)
        if r is None:
            print(f"| {model} | {int(gpus):,} | {ecmp} | {why} | | | | | | | {tgt} |")
            ok = False
            continue
        met = target is None or (r["loads_s"] < target[0] and r["peak_rss_gib"] < target[1])
        ok &= met
        print(f"| {model} | {r['gpus']:,} | {ecmp} | {r['pods']} | {r['predict_s']:.1f} s | {r['loads_s']:.1f} s "
              f"({r['cpu_s']:.1f} s) | {r['peak_rss_gib']:.2f} GiB | {r['pairs'] / 1e6:.2f} M | {r['links'] / 1e6:.2f} M | "
              f"{r['hottest']} | {tgt}{'' if met else ' MISSED'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
