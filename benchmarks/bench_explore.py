"""Speed of the teaching explorer (llmcomm.explore): for every catalogue model on 4,096 GPUs (the configuration
``llmcomm.tune.rule_of_thumb`` starts from on an H100 cluster) and one 8,192-GPU job (node-level views), the time
to recompute the view (:func:`llmcomm.explore.compute`: prediction, layout, matrices, bytes, calls, iteration
time) and to draw its five panels (:func:`llmcomm.explore.panels.render`). Target: recomputed in under 1 s.

    .venv/bin/python benchmarks/bench_explore.py [--repeat N] [--gpus N] [--models NAME ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one core
    os.environ.setdefault(_v, "1")
os.environ.setdefault("MPLBACKEND", "Agg")

from llmcomm import list_models, load_cluster, load_model  # noqa: E402
from llmcomm.errors import LLMCommError  # noqa: E402
from llmcomm.explore import Choice, compute  # noqa: E402
from llmcomm.explore.panels import PANELS, render  # noqa: E402
from llmcomm.tune.search import rule_of_thumb  # noqa: E402

CLUSTER = "h100-80g-ndr400"
TARGET_S = 1.0


def choice_for(name: str, gpus: int) -> Choice:
    """The rule-of-thumb configuration of ``name`` on ``gpus`` GPUs, two micro-batches per DP rank."""
    model = load_model(name)
    cluster = load_cluster(CLUSTER)
    # the global batch: 2 sequences per GPU rounded to what every split divides
    row = rule_of_thumb(model, gpus, cluster, global_batch=2 * gpus)
    ep = int(row.get("ep", 1) or 1)
    return Choice(model=name, cluster=CLUSTER, tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]), ep=ep,
                  sp=bool(row.get("sp", False)) or (ep > 1 and int(row["tp"]) > 1), micro_batch=1,
                  global_batch=int(row["global_batch"]))


def measure(choice: Choice, repeat: int) -> tuple[float, float, float, float, str]:
    """Median wall and CPU seconds to compute the view and to draw its panels, and the matrix level. CPU time
    (this process) is what the work costs on an idle core; wall time includes waiting for a shared machine."""
    rows, level = [], ""
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        v = compute(choice)
        t1, c1 = time.perf_counter(), time.process_time()
        for p in PANELS:
            render(v, p)
        t2, c2 = time.perf_counter(), time.process_time()
        rows.append((t1 - t0, c1 - c0, t2 - t1, c2 - c1))
        level = f"{v.level} ({v.cells}x{v.cells} cells of {v.unit})"
    return (*(statistics.median(r[i] for r in rows) for i in range(4)), level)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=4096)
    ap.add_argument("--models", nargs="*", default=None)
    args = ap.parse_args(argv)
    cases: list[tuple[str, Choice]] = []
    for name in args.models or list_models():
        try:
            cases.append((name, choice_for(name, args.gpus)))
        except LLMCommError as e:
            print(f"{name}: no configuration on {args.gpus} GPUs: {e}")
    cases.append(("gpt3-175b (8,192 GPUs)", Choice(model="gpt3-175b", cluster=CLUSTER, tp=8, pp=16, dp=64,
                                                    global_batch=1024)))
    compute(cases[0][1])  # warm imports and caches once
    print(f"{'case':<24} {'configuration':<24} {'compute s':>14} {'draw s':>14} {'total s':>14}  matrix")
    print(f"{'':<24} {'':<24} {'wall / cpu':>14} {'wall / cpu':>14} {'wall / cpu':>14}")
    worst = [0.0, 0.0, 0.0, 0.0]
    for name, ch in cases:
        cw, cc, dw, dc, level = measure(ch, args.repeat)
        worst = [max(a, b) for a, b in zip(worst, (cw, cc, cw + dw, cc + dc), strict=True)]
        print(f"{name:<24} {ch.label().split(' ', 1)[1]:<24} {cw:6.3f} / {cc:5.3f} {dw:6.3f} / {dc:5.3f} "
              f"{cw + dw:6.3f} / {cc + dc:5.3f}  {level}")
    verdict = {True: "met", False: "MISSED"}
    print(f"slowest recompute of the view: wall {worst[0]:.3f} s, cpu {worst[1]:.3f} s (target < {TARGET_S:.0f} s: "
          f"wall {verdict[worst[0] < TARGET_S]}, cpu {verdict[worst[1] < TARGET_S]})")
    print(f"slowest recompute + drawing of all five panels: wall {worst[2]:.3f} s, cpu {worst[3]:.3f} s "
          f"(wall {verdict[worst[2] < TARGET_S]}, cpu {verdict[worst[3] < TARGET_S]})")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
