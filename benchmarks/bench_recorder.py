"""Recorder overhead: step time of the same 2-rank TP training job without recording and with each recorder
mode, in one run (same processes).

    .venv/bin/python benchmarks/bench_recorder.py [--tp 2] [--steps 5] [--reps 9] [--scale 1]

Blocks of ``steps`` iterations cycle through off / ``kernel`` / ``dispatch``, ``reps`` rounds, the order of
the three rotated from one round to the next, so that each mode sees the same machine load and none always
runs first. Per round, each mode's ratio is the median step time of its block over that of the round's "off"
block; the report gives the median ratio over the rounds and its spread (lowest and highest round, and the
interquartile range), since one ratio from one run moved between 1.00 and 1.13 on an idle machine. The target
is a median ratio < 1.10. It also gives the cost per recorded call, ``(median step(mode) − median step(off)) /
calls per step``, in µs: a ratio depends on how much arithmetic the model does per call (tiny-gpt's hidden 64
is a worst case), the cost per call does not. The recorder is entered once per block, as a training run enters
it once per run (entering and leaving the ``kernel`` mode registers and removes its ~40 kernels, about 0.5 ms,
once). The first step of every block is left out (the recorder's first calls warm its caches).

``dispatch`` (a ``TorchDispatchMode``): every aten op, not only communication, passes through one Python
call, ~8 µs on this CPU, independent of tensor sizes; on tiny-gpt (h=64, ~800 aten ops per step and rank,
~12 ms of compute) that is a large share. ``kernel`` (the default): Python kernels for the communication
ops only, at the BackendSelect key; other ops pay nothing, each communication call one Python call.
``--scale 4`` (h=256, f=1024) shows the per-op cost shrinking with the arithmetic per op.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODES = ("off", "kernel", "dispatch")


def _worker(rank: int, world: int, port: int, steps: int, reps: int, out: str, scale: int) -> None:
    import dataclasses

    import torch
    import torch.distributed as dist

    from llmcomm import ParallelConfig, load_model
    from llmcomm.collect.corpus import batch, load_corpus
    from llmcomm.collect.instrument import mark_layers
    from llmcomm.collect.model import build_model, cross_entropy
    from llmcomm.collect.parallelize import apply_tp, build_mesh
    from llmcomm.collect.record import Recorder

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    par = ParallelConfig(tp=world, micro_batch=4)
    mesh = build_mesh(par)
    spec = load_model("tiny-gpt")
    spec = dataclasses.replace(spec, hidden_size=spec.hidden_size * scale, ffn_hidden_size=spec.ffn_hidden_size * scale)
    model = build_model(spec)
    apply_tp(model, mesh["tp"])
    rec = Recorder(rank)
    rec.register_mesh(mesh)
    mark_layers(model.layers, rec)  # hooks stay on in every mode; only the interception differs
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    corpus = load_corpus()
    times: dict[str, list[list[float]]] = {m: [] for m in MODES}  # per mode: one list of step times per round
    events: dict[str, int] = dict.fromkeys(MODES, 0)
    it = 0
    for r in range(reps):
        for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
            rec.mode = "dispatch" if mode == "off" else mode
            rec.rows.clear()
            block = []
            with rec if mode != "off" else contextlib.nullcontext():
                for _ in range(steps):
                    x, y = (torch.from_numpy(a) for a in batch(corpus, it, 4, 64))
                    dist.barrier()
                    t0 = time.perf_counter()
                    rec.step(it)
                    cross_entropy(model(x), y).backward()
                    opt.step()
                    opt.zero_grad()
                    block.append(time.perf_counter() - t0)
                    it += 1
            times[mode].append(block)
            events[mode] = len(rec.rows)
    if rank == 0:
        Path(out).write_text(json.dumps({"times": times, "events": events}))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    from llmcomm.collect.launch import free_port

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="steps per block")
    ap.add_argument("--reps", type=int, default=9, help="rounds of one block per mode")
    ap.add_argument("--scale", type=int, default=1, help="multiply hidden and FFN sizes of tiny-gpt")
    a = ap.parse_args(argv)
    if a.steps < 2 or a.reps < 1:
        ap.error("--steps must be >= 2 (the first step of a block is left out) and --reps >= 1")
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "times.json")
        mp.spawn(_worker, args=(a.tp, free_port(), a.steps, a.reps, out, a.scale), nprocs=a.tp)
        res = json.loads(Path(out).read_text())
    for line in report(res["times"], res["events"], a.steps, a.scale, a.tp):
        print(line)
    return 0


def report(times: dict[str, list[list[float]]], events: dict[str, int], steps: int, scale: int,
           tp: int) -> list[str]:
    """The lines printed (module docstring): per mode the median step, the median ratio to "off" over the
    rounds with its spread, and the cost per recorded call."""
    block_med = {m: [statistics.median(b[1:]) for b in times[m]] for m in MODES}
    med = {m: statistics.median(block_med[m]) for m in MODES}
    rounds = len(block_med["off"])
    lines = [f"tiny-gpt x{scale} (hidden {64 * scale}), tp={tp}, {rounds} interleaved rounds of {steps} steps per "
             "mode (first step of each block left out), same processes"]
    for m in MODES:
        if m == "off":
            lines.append(f"  {'without recording':<26} {med[m] * 1e3:8.2f} ms per step")
            continue
        ratios = sorted(t / o for t, o in zip(block_med[m], block_med["off"], strict=True))
        q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
        calls = events[m] / steps
        per_call = (med[m] - med["off"]) / calls * 1e6 if calls else float("nan")
        lines.append(f"  {'recording, mode=' + m:<26} {med[m] * 1e3:8.2f} ms per step  ratio median "
                     f"{statistics.median(ratios):.3f} (IQR {q[0]:.3f}-{q[2]:.3f}, range {ratios[0]:.3f}-"
                     f"{ratios[-1]:.3f})  {calls:.0f} calls per step, {per_call:.1f} us per call")
    lines.append("target: median ratio < 1.10 (on this worst-case model; the cost per call carries to others)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
