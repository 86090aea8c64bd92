"""Speed of the ConfigTuner (llmcomm.tune) over its full space (tp, cp, pp with uneven first/last stages, dp, ep,
etp, micro-batch, vpp, SP, recompute, distributed optimizer, FSDP, attention backend, FP8 and its parameter gather
on H100, tp_comm_overlap, overlap_grad_reduce, overlap_param_gather: every value the cost model can rank),
exhaustive against pruned, with the candidate counts (``candidates``: configurations in the space;
``evaluated``: those the formulation timed) and whether both find the same optimum. The pruned search runs the
branch-and-bound of :mod:`llmcomm.tune.bound` with its default ``exact_top=10`` (the first ten rows exact;
rule ``lower-bound`` in the printed counts):

* LLaMA-3 405B on 16,384 H100s (h100-80g-ndr400), global batch 2,048 sequences of 8,192 tokens (16M tokens,
  Meta's pre-training recipe) — target: pruned search under 2 s;
* every catalogue model (tiny test models aside) on 1,024 H100s, global batch 1,024 at its own sequence length —
  target: pruned search under 1 s each;
* the SC'21 case kept: GPT-3 175B on 1,024 A100s (global batch 1,536).

The first search on a cluster of a given size also builds the cost model's bandwidth table for that world
(:func:`llmcomm.overhead.bandwidth.default`, cached per process); that one-off setup is printed on its own line
(``setup``), and the first search of each case (``pruned/cold``) also pays the cost model's first evaluation of
each group layout (its caches); the exhaustive and the pruned search are then timed warm, which is the search
cost proper. The targets apply to the warm pruned search. One core. ``cpu_s`` is the process CPU time of the
search (on a shared machine the wall time also holds other processes' time; both are printed, and the load
average before and after).

    .venv/bin/python benchmarks/bench_tune.py [--strict] [--only 405b|catalogue|sc21] [--models a,b] [--no-exhaustive]

``--models``: only these catalogue models; ``--no-exhaustive``: the pruned searches only (no check of the optimum
against the exhaustive one: for A/B timing of the pruned search, e.g. against another checkout on ``PYTHONPATH``).
"""

from __future__ import annotations

import os
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one core
    os.environ.setdefault(_v, "1")

from llmcomm import ConfigError, load_cluster, load_model  # noqa: E402
from llmcomm.specs import list_models  # noqa: E402
from llmcomm.tune import tune  # noqa: E402
from llmcomm.tune.report import label  # noqa: E402

H100, A100 = "h100-80g-ndr400", "a100-80g-hdr200"


def _case(name: str, gpus: int, cluster: str, batch: int, seq: int | None, target: float) -> bool:
    model, c = load_model(name), load_cluster(cluster)
    out = []
    runs = ((True, "pruned/cold"), (False, "exhaustive"), (True, "pruned"))
    if "--no-exhaustive" in sys.argv:
        runs = (runs[0], runs[2])
    for prune, tag in runs:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            r = tune(model, gpus, c, batch, seq, prune=prune)
        except ConfigError as e:
            print(f"{name:>18} {gpus:>6} {batch:>6} {'':>11} refused: {str(e)[:110]}", flush=True)
            return False
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        out.append(r)
        print(f"{name:>18} {gpus:>6} {batch:>6} {tag:>11} "
              f"{r.stats['enumerated']:>10,} {r.stats['evaluated']:>9,} {r.stats['pruned']:>8,} {dt:>7.2f} {cpu:>6.2f} "
              f"{target:>8.1f}  {label(r.best)} {r.best['total_s']:.3f} s (predicted)", flush=True)
    same = all(r.best["total_s"] == out[0].best["total_s"] for r in out)
    print(f"{'':>18} {'':>6} {'':>6} {'':>11} same optimum{'' if len(out) == 3 else ' (pruned twice)'}: {same}; "
          f"pruned rules: {out[-1].stats['pruned_by_rule']}")
    return cpu > target or not same


def _setup(cluster: str, gpus: int) -> None:
    t0 = time.perf_counter()
    tune(load_model("llama3-8b"), gpus, load_cluster(cluster), gpus, space={"tp": (8,), "pp": (1,)})
    print(f"{'setup':>18} {gpus:>6} {'':>6} {cluster:>10} bandwidth table and calibration: "
          f"{time.perf_counter() - t0:.2f} s (once per process and world size)", flush=True)


def main() -> int:
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    failed = False
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    print(f"{'model':>18} {'gpus':>6} {'batch':>6} {'search':>11} {'candidates':>10} {'evaluated':>9} {'pruned':>8} "
          f"{'wall_s':>7} {'cpu_s':>6} {'target_s':>8}  best")
    if only in (None, "405b"):
        _setup(H100, 16384)
        failed |= _case("llama3-405b", 16384, H100, 2048, 8192, 2.0)
    if only in (None, "catalogue"):
        _setup(H100, 1024)
        pick = sys.argv[sys.argv.index("--models") + 1].split(",") if "--models" in sys.argv else None
        for name in list_models():
            if not name.startswith("tiny") and (pick is None or name in pick):
                failed |= _case(name, 1024, H100, 1024, None, 1.0)
    if only in (None, "sc21"):
        _setup(A100, 1024)
        failed |= _case("gpt3-175b", 1024, A100, 1536, None, 1.0)
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    return 1 if failed and "--strict" in sys.argv else 0


if __name__ == "__main__":
    sys.exit(main())
