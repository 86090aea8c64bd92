"""Recorder overhead: step time of the same 2-rank TP training job without recording and with each recorder
mode, in one run (same processes).

    .venv/bin/python benchmarks/bench_recorder.py [--tp 2] [--steps 6] [--reps 4] [--scale 1]

Blocks of ``steps`` iterations cycle through off / ``kernel`` / ``dispatch`` (``reps`` times each) so all
see the same machine load; the ratio of the median step times to "off" is each mode's overhead (target
< 1.10). The recorder is entered once per block, as a training run enters it once per run (entering and
leaving the ``kernel`` mode registers and removes its ~40 kernels, about 0.5 ms, once).

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
    times: dict[str, list[float]] = {m: [] for m in MODES}
    events: dict[str, int] = dict.fromkeys(MODES, 0)
    it = 0
    for _ in range(reps):
        for mode in MODES:
            rec.mode = "dispatch" if mode == "off" else mode
            rec.rows.clear()
            with rec if mode != "off" else contextlib.nullcontext():
                for _ in range(steps):
                    x, y = (torch.from_numpy(a) for a in batch(corpus, it, 4, 64))
                    dist.barrier()
                    t0 = time.perf_counter()
                    rec.step(it)
                    cross_entropy(model(x), y).backward()
                    opt.step()
                    opt.zero_grad()
                    times[mode].append(time.perf_counter() - t0)
                    it += 1
            events[mode] = len(rec.rows)
    if rank == 0:
        Path(out).write_text(json.dumps({"times": times, "events": events}))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    from llmcomm.collect.launch import free_port

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--scale", type=int, default=1, help="multiply hidden and FFN sizes of tiny-gpt")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "times.json")
        mp.spawn(_worker, args=(a.tp, free_port(), a.steps, a.reps, out, a.scale), nprocs=a.tp)
        res = json.loads(Path(out).read_text())
    med = {m: statistics.median(res["times"][m][1:]) for m in MODES}
    n = len(res["times"]["off"]) - 1
    print(f"tiny-gpt x{a.scale} (hidden {64 * a.scale}), tp={a.tp}, median of {n} steps per mode, same processes")
    for m in MODES:
        what = "without recording" if m == "off" else f"recording, mode={m}"
        ratio = "" if m == "off" else f"  ratio {med[m] / med['off']:.3f}  ({res['events'][m]} events per block)"
        print(f"  {what:<26} {med[m] * 1e3:8.2f} ms{ratio}")
    print("target: ratio < 1.10")
    return 0


if __name__ == "__main__":
    sys.exit(main())
