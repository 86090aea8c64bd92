"""Speed of the teaching explorer (llmcomm.explore) as its user sees it: the time from a changed value to all
five panels redrawn, for every catalogue model on every power-of-two GPU count from 8 to 4,096 (the
configuration ``llmcomm.tune.rule_of_thumb`` starts from on an H100 cluster; where no pipeline depth fits the
model in memory, the same rule without the memory limit: the explorer still shows the traffic, and its time
panel says the state does not fit), plus one 8,192-GPU job (node-level views). Target: under 1 s.

Each case is one :meth:`llmcomm.explore.Explorer.choose` on a live explorer (the widget path: compute the view,
draw every panel into its PNG, fill the tables and the status), coming from the previous case (another GPU count,
or another model), with the explorer's job cache emptied first so that every measured change is a new
configuration. What does not depend on the configuration (model and cluster files, fitted curves) stays cached,
as it does in the explorer. Wall time includes waiting for a shared CPU, so the CPU time of this process and the
load average are printed too.

First views (``--first``, run before the sweep): each of :data:`FIRST_VIEWS` (the worst of the sweep when met
first: a figure shape no view before it drew) in a fresh process: an explorer is constructed on a small job
unlike any of them (:data:`WARM`: one layout panel, two matrix panels, no call in its micro-batch; its
construction time is printed), then the one change to the measured job is timed alone: every figure of that
view is new to the explorer, and only the process's imports and the package's file caches are warm.

    .venv/bin/python benchmarks/bench_explore.py [--repeat N] [--gpus N ...] [--models NAME ...]
                                                 [--first [NAME:GPUS ...]] [--no-sweep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one core
    os.environ.setdefault(_v, "1")
os.environ.setdefault("MPLBACKEND", "Agg")

from llmcomm import list_models, load_cluster, load_model  # noqa: E402
from llmcomm.errors import LLMCommError  # noqa: E402
from llmcomm.explore import Choice, Explorer, view  # noqa: E402
from llmcomm.tune.search import rule_of_thumb  # noqa: E402

CLUSTER = "h100-80g-ndr400"
TARGET_S = 1.0
GPU_COUNTS = tuple(2**k for k in range(3, 13))  # 8 ... 4,096
WARM = Choice(model="gpt3-125m", cluster=CLUSTER, tp=1, pp=1, dp=8, global_batch=16)  # the explorer's start
FIRST_VIEWS = ("gpt3-175b:64", "qwen3-235b-a22b:128", "megatron-gpt-1t:512")  # first tp8·pp4, EP, tp8·pp32 jobs


def choice_for(name: str, gpus: int) -> tuple[Choice, str]:
    """The rule-of-thumb configuration of ``name`` on ``gpus`` GPUs, two micro-batches per DP rank, and a note
    ("" or "no fit": no pipeline depth fits the memory, the rule without the limit)."""
    model, cluster = load_model(name), load_cluster(CLUSTER)
    note = ""
    try:
        row = rule_of_thumb(model, gpus, cluster, global_batch=2 * gpus)
    except LLMCommError:
        row, note = rule_of_thumb(model, gpus, cluster, global_batch=2 * gpus, memory_fraction=float("inf")), "no fit"
    ep = int(row.get("ep", 1) or 1)
    return Choice(model=name, cluster=CLUSTER, tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]), ep=ep,
                  sp=bool(row.get("sp", False)) or (ep > 1 and int(row["tp"]) > 1), micro_batch=1,
                  global_batch=int(row["global_batch"])), note


def measure(ex: Explorer, choice: Choice, back: Choice, repeat: int) -> tuple[float, float, bool, str]:
    """Median wall and CPU seconds of ``ex.choose(choice)`` coming from ``back`` (a fresh job each time), whether
    the view was valid, and its matrix level."""
    fields = {k: v for k, v in choice.to_dict().items() if k not in ("rank", "microbatch")}
    rows, ok = [], True
    for i in range(repeat):
        if i:  # go back to the previous case, then measure the change again
            ex.choose(**{k: v for k, v in back.to_dict().items() if k not in ("rank", "microbatch")})
        view._job.cache_clear()
        t0, c0 = time.perf_counter(), time.process_time()
        ex.choose(**fields)
        rows.append((time.perf_counter() - t0, time.process_time() - c0))
        ok = ex.error == ""
    v = ex.view
    level = f"{v.level} ({v.cells}x{v.cells} of {v.unit})" if ok and v is not None else ex.error[:60]
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows), ok, level


def first_view(case: str) -> dict[str, float | str]:
    """In this process: construct an explorer on :data:`WARM`, then time the change to ``case``
    (``NAME:GPUS``, the rule-of-thumb configuration of :func:`choice_for`)."""
    name, gpus = case.rsplit(":", 1)
    choice, _ = choice_for(name, int(gpus))
    t0, c0 = time.perf_counter(), time.process_time()
    ex = Explorer(WARM)
    t1, c1 = time.perf_counter(), time.process_time()
    ex.choose(**{k: v for k, v in choice.to_dict().items() if k not in ("rank", "microbatch")})
    t2, c2 = time.perf_counter(), time.process_time()
    return {"case": case, "config": choice.label(), "construct_wall": t1 - t0, "construct_cpu": c1 - c0,
            "wall": t2 - t1, "cpu": c2 - c1, "error": ex.error}


def first_views(cases: list[str], repeat: int) -> None:
    """Each case ``repeat`` times, each in a fresh process (:func:`first_view`), alternating the cases."""
    print(f"first view of a shape in a fresh explorer (constructed on {WARM.label()}); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'case':<22} {'configuration':<36} {'construct wall/cpu s':>20} {'first view wall s':>17} {'cpu s':>6}")
    rows: dict[str, list[dict]] = {c: [] for c in cases}
    for _ in range(repeat):
        for case in cases:
            out = subprocess.run([sys.executable, __file__, "--one", case], capture_output=True, text=True,
                                 check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows[case].append(r)
            flag = f"  INVALID: {r['error'][:60]}" if r["error"] else ""
            print(f"{case:<22} {r['config']:<36} {r['construct_wall']:9.3f} / {r['construct_cpu']:6.3f}   "
                  f"{r['wall']:17.3f} {r['cpu']:6.3f}{flag}", flush=True)
    worst = max((statistics.median(x["cpu"] for x in rs), c) for c, rs in rows.items())
    print(f"first views: worst median cpu {worst[0]:.3f} s ({worst[1]}; target < {TARGET_S:.0f} s: "
          f"{'met' if worst[0] < TARGET_S else 'MISSED'}); median wall "
          f"{statistics.median(x['wall'] for rs in rows.values() for x in rs):.3f} s; load average "
          f"{os.getloadavg()[0]:.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--gpus", type=int, nargs="*", default=list(GPU_COUNTS))
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--first", nargs="*", default=None, metavar="NAME:GPUS",
                    help=f"first views in fresh processes (default cases: {' '.join(FIRST_VIEWS)})")
    ap.add_argument("--no-sweep", action="store_true", help="only the first views")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # one first view in this process (JSON)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(first_view(args.one)))
        return 0
    if args.first is not None:
        first_views(args.first or list(FIRST_VIEWS), args.repeat)
        if args.no_sweep:
            return 0
    cases: list[tuple[str, int, Choice, str]] = []
    for name in args.models or [m for m in list_models()]:
        for g in args.gpus:
            try:
                ch, note = choice_for(name, g)
            except LLMCommError as e:
                print(f"{name} on {g} GPUs: no configuration: {e}")
                continue
            cases.append((name, g, ch, note))
    cases.append(("gpt3-175b", 8192, Choice(model="gpt3-175b", cluster=CLUSTER, tp=8, pp=16, dp=64,
                                            global_batch=1024), "node-level"))
    ex = Explorer(Choice(model="gpt3-125m", cluster=CLUSTER, tp=1, pp=1, dp=8, global_batch=16))  # warm imports
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'model':<20} {'GPUs':>5} {'configuration':<30} {'wall s':>7} {'cpu s':>6}  matrix")
    worst: dict[str, tuple[float, str]] = {"wall": (0.0, ""), "cpu": (0.0, "")}
    walls, cpus, back = [], [], ex.choice()
    for name, g, ch, note in cases:
        wall, cpu, ok, level = measure(ex, ch, back, args.repeat)
        back = ch
        walls.append(wall)
        cpus.append(cpu)
        label = f"{name} on {g}"
        if g <= 4096:
            worst = {"wall": max(worst["wall"], (wall, label)), "cpu": max(worst["cpu"], (cpu, label))}
        flag = "" if ok else "  INVALID"
        print(f"{name:<20} {g:>5} {ch.label().split(' ', 1)[1] + (' ' + note if note else ''):<30} {wall:7.3f} "
              f"{cpu:6.3f}  {level}{flag}", flush=True)
    over = sum(w >= TARGET_S for w in walls[:-1])
    verdict = {True: "met", False: "MISSED"}
    print(f"{len(cases) - 1} changes up to 4,096 GPUs: median {statistics.median(walls[:-1]):.3f} s wall, "
          f"{over} at or above {TARGET_S:.0f} s; median {statistics.median(cpus[:-1]):.3f} s cpu, "
          f"{sum(c >= TARGET_S for c in cpus[:-1])} at or above {TARGET_S:.0f} s")
    print(f"worst change to all panels redrawn, up to 4,096 GPUs: wall {worst['wall'][0]:.3f} s "
          f"({worst['wall'][1]}), cpu {worst['cpu'][0]:.3f} s ({worst['cpu'][1]}) (target < {TARGET_S:.0f} s: "
          f"wall {verdict[worst['wall'][0] < TARGET_S]}, cpu {verdict[worst['cpu'][0] < TARGET_S]})")
    print(f"8,192 GPUs (node-level views): wall {walls[-1]:.3f} s")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
