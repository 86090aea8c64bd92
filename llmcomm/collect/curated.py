"""The curated recorded traces under ``data/traces/`` and how to regenerate them (``make traces``).

``python -m llmcomm.collect.curated [NAME ...]`` reruns the listed runs (default: all) and prints the wall
time of each and of the whole. Every run uses the CLI's defaults otherwise (seed 0, lr 3e-3, fp32).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..paths import data_dir
from ..specs import ParallelConfig


@dataclass(frozen=True)
class CuratedRun:
    name: str
    model: str
    parallel: dict[str, Any]
    iters: int
    record_iters: int | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    aux_loss_coef: float = 0.01  # MoE load-balancing loss weight (0: off)

    def config(self) -> ParallelConfig:
        return ParallelConfig(act_dtype="fp32", grad_reduce_dtype="fp32", param_dtype="fp32", **self.parallel)

    def path(self, root: Path | None = None) -> Path:
        return (root or data_dir() / "traces") / f"{self.name}.parquet"

    def command(self) -> str:
        p = self.config()
        args = [f"--model {self.model}"] + [f"--{d} {getattr(p, d)}" for d in ("tp", "pp", "dp", "ep")
                                             if getattr(p, d) > 1]
        if p.sp:
            args.append("--sp")
        if p.pp > 1:
            args.append(f"--schedule {p.schedule}")
        args += [f"--micro-batch {p.micro_batch}", f"--global-batch {p.global_batch}", f"--iters {self.iters}"]
        if self.record_iters:
            args.append(f"--routing-iters {self.record_iters}")
        if self.aux_loss_coef != 0.01:
            args.append(f"--aux-loss-coef {self.aux_loss_coef:g}")
        return "llmcomm collect " + " ".join(args) + f" --out data/traces/{self.name}.parquet"


RUNS: tuple[CuratedRun, ...] = (
    CuratedRun("gpt_tp2pp2dp2", "tiny-gpt", dict(tp=2, pp=2, dp=2, micro_batch=2, global_batch=16), 4,
               note="3-D: 4 micro-batches, 1F1B"),
    CuratedRun("gpt_tp4", "tiny-gpt", dict(tp=4, micro_batch=2, global_batch=8), 4, note="TP only"),
    CuratedRun("gpt_pp4", "tiny-gpt", dict(pp=4, micro_batch=2, global_batch=16, schedule="1f1b"), 4,
               note="PP only, 8 micro-batches, 1F1B"),
    CuratedRun("gpt_pp4_gpipe", "tiny-gpt", dict(pp=4, micro_batch=2, global_batch=16, schedule="gpipe"), 4,
               note="PP only, 8 micro-batches, GPipe"),
    CuratedRun("gpt_dp4", "tiny-gpt", dict(dp=4, micro_batch=2, global_batch=16), 4, note="DP only"),
    CuratedRun("gpt_tp2sp_pp2dp2", "tiny-gpt", dict(tp=2, sp=True, pp=2, dp=2, micro_batch=2, global_batch=16), 4,
               note="3-D with sequence parallelism"),
    CuratedRun("gpt_tp2pp2_timeline", "tiny-gpt", dict(tp=2, pp=2, micro_batch=2, global_batch=16), 12,
               note="TP x PP, 8 micro-batches, 12 iterations: the temporal pattern (notebook 03)"),
    CuratedRun("moe_ep4dp4", "tiny-moe", dict(dp=4, ep=4, micro_batch=2, global_batch=16), 300, record_iters=4,
               note="EP over the DP ranks; routing for 300 iterations"),
    CuratedRun("moe_ep2tp2", "tiny-moe", dict(tp=2, dp=2, ep=2, micro_batch=2, global_batch=8), 300,
               record_iters=4, note="EP x TP; routing for 300 iterations"),
    CuratedRun("moe8e_ep4_aux", "tiny-moe-8e", dict(dp=4, ep=4, micro_batch=2, global_batch=8), 2000,
               record_iters=4, note="8 experts top-2 over EP 4, aux-loss balancing on; routing for 2,000 "
                                    "iterations (notebook 09)"),
    CuratedRun("moe8e_ep4_noaux", "tiny-moe-8e", dict(dp=4, ep=4, micro_batch=2, global_batch=8), 2000,
               record_iters=4, aux_loss_coef=0.0, note="as moe8e_ep4_aux with the load-balancing loss off"),
)


def run_one(run: CuratedRun, root: Path | None = None, timeout: float = 600.0) -> float:
    """Regenerate one curated trace; returns its wall time in seconds."""
    from .launch import collect

    t0 = time.time()
    tr = collect(run.model, run.config(), run.path(root), iters=run.iters, record_iters=run.record_iters,
                 timeout=timeout, command=run.command(), aux_loss_coef=run.aux_loss_coef)
    dt = time.time() - t0
    loss = tr.meta["loss"]
    print(f"{run.name:<20} {len(tr):>6} events  loss {loss[0]:.3f} -> {loss[-1]:.3f}  {dt:6.1f} s", flush=True)
    return dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmcomm.collect.curated", description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"runs to regenerate (default all): {[r.name for r in RUNS]}")
    ap.add_argument("--out-dir", type=Path, default=None, help="default: data/traces")
    args = ap.parse_args(argv)
    runs = [r for r in RUNS if not args.names or r.name in args.names]
    unknown = set(args.names) - {r.name for r in RUNS}
    if unknown:
        ap.error(f"unknown run(s) {sorted(unknown)}")
    t0 = time.time()
    for r in runs:
        run_one(r, args.out_dir)
    print(f"curated traces: {len(runs)} runs in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
