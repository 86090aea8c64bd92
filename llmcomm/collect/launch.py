"""Launch a recorded run: spawn one process per rank (gloo on 127.0.0.1, a free port), watch them, merge
their events into one trace with a manifest, and publish it under the output name only when every rank
succeeded.

Failure handling: a rank that raises ends the run at once with that rank's traceback; a rank that makes no
progress (no new iteration) for ``timeout`` seconds ends it too, naming the rank(s) furthest behind. Either
way every rank process is terminated and nothing is left under the output name (per-rank files live in a
temporary folder beside it, removed at the end).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import LLMCommError
from ..specs import ModelSpec, ParallelConfig
from ..trace import Trace, concat, manifest_path, read_trace, routing_path
from .train import RunConfig, error_path, run_rank


class CollectError(LLMCommError):
    """A recorded run failed (a rank raised or hung)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(cfg: RunConfig, world: int, timeout: float, progress: bool = False) -> None:
    import torch.multiprocessing as mp
    from tqdm import tqdm

    ctx = multiprocessing.get_context("spawn")
    heartbeat = ctx.Array("d", [time.time()] * world, lock=False)
    progress_of = ctx.Array("i", [-2] * world, lock=False)
    failed_at = ctx.Array("d", [0.0] * world, lock=False)
    pc = mp.start_processes(run_rank, args=(cfg, heartbeat, progress_of, failed_at), nprocs=world, join=False,
                            start_method="spawn")
    bar = tqdm(total=cfg.iters, desc=f"collect ({world} ranks)", unit=" iter", disable=not progress, leave=False)
    try:
        while True:
            try:
                if pc.join(timeout=0.5):
                    return
                bar.update(max(0, min(progress_of[r] for r in range(world))) - bar.n)  # iterations done
            except mp.ProcessRaisedException as e:
                raise CollectError(_first_failure(cfg, failed_at, e.error_index, str(e))) from None
            except mp.ProcessExitedException as e:
                raise CollectError(f"rank {e.error_index} exited with code {e.exit_code}") from None
            now = time.time()
            stale = [r for r in range(world) if now - heartbeat[r] > timeout]
            if stale:
                lo = min(progress_of[r] for r in range(world))
                behind = [r for r in range(world) if progress_of[r] == lo]
                raise CollectError(
                    f"no progress for {timeout:g} s (--timeout) on rank(s) {stale}; rank(s) {behind} are "
                    f"furthest behind ({_stage_text(lo)}); run stopped")
    finally:
        bar.close()
        for p in pc.processes:
            if p.is_alive():
                p.terminate()
        for p in pc.processes:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(1)


def _stage_text(progress: int) -> str:
    """What a rank was doing, from its progress counter (-2 before it started, -1 in set-up, else the
    iteration it reached)."""
    if progress == -2:
        return "still starting: importing torch and joining the process group"
    if progress == -1:
        return "still in set-up: building the model and its process groups"
    return f"at iteration {progress}: {progress} iteration(s) done"


def _first_failure(cfg: RunConfig, failed_at: Any, reported: int, reported_error: str) -> str:
    """The message naming the rank that failed first: torch reports whichever process exited first, often a
    peer that only lost its connection to the rank that raised; ``failed_at`` (set by each failing rank as it
    raises) orders them, and the first one's traceback is read from its :func:`error_path`."""
    times = {r: t for r, t in enumerate(failed_at) if t > 0}
    first = min(times, key=lambda r: times[r]) if times else reported
    text = error_path(cfg.out_dir, first)
    if first == reported or not text.is_file():
        return f"rank {reported} failed:\n{reported_error}"
    return f"rank {first} failed first:\n{text.read_text(encoding='utf-8')}"


def collect(model: str | ModelSpec, parallel: ParallelConfig, out: str | os.PathLike[str], *, iters: int,
            record_iters: int | None = None, seed: int = 0, lr: float = 3e-3, timeout: float = 120.0,
            command: str | None = None, fault: str | None = None, recorder_mode: str = "kernel",
            aux_loss_coef: float = 0.01, progress: bool = False) -> Trace:
    """Run a recorded training job and write ``out`` (events), ``<stem>.manifest.json`` and, for MoE,
    ``<stem>.routing.parquet``. Returns the trace as read back. ``recorder_mode``: see
    :class:`llmcomm.collect.record.Recorder` (both modes record the same events). ``aux_loss_coef``: weight of
    the MoE load-balancing loss (0: off). The model and configuration are checked before any worker starts
    (:mod:`llmcomm.collect.checks`); ``progress`` shows a progress bar of iterations on stderr."""
    from .. import specs
    from .checks import check_collectable

    spec = model if isinstance(model, ModelSpec) else specs.load_model(model)
    check_collectable(spec, parallel, iters, record_iters)
    out = Path(out)
    if out.suffix != ".parquet":
        raise CollectError(f"--out {out}: the trace name must end in .parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    world = parallel.world_size
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.stem}.", suffix=".tmp", dir=out.parent))
    t0 = time.time()
    try:
        cfg = RunConfig(model=spec.to_dict(), parallel=parallel.to_dict(), iters=iters, out_dir=str(tmp),
                        record_iters=record_iters, seed=seed, lr=lr, timeout=timeout, port=free_port(),
                        fault=fault, recorder_mode=recorder_mode,
                        aux_loss_coef=aux_loss_coef)
        _spawn(cfg, world, timeout, progress)
        wall = time.time() - t0
        trace = _merge(tmp, world)
        results = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]
        trace.meta.update(_manifest(spec, parallel, cfg, results, wall, command))
        staged = tmp / out.name
        trace.write(staged)
        manifest_path(staged).write_text(json.dumps(trace.meta, indent=1, sort_keys=True, default=str))
        for src, dst in ((routing_path(staged), routing_path(out)), (manifest_path(staged), manifest_path(out))):
            if src.exists():
                os.replace(src, dst)
            else:
                dst.unlink(missing_ok=True)
        os.replace(staged, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return read_trace(out)


def _merge(tmp: Path, world: int) -> Trace:
    return concat([read_trace(tmp / f"rank{r}.parquet") for r in range(world)], meta={})


def _manifest(spec: ModelSpec, parallel: ParallelConfig, cfg: RunConfig, results: list[dict[str, Any]],
              wall: float, command: str | None) -> dict[str, Any]:
    import torch

    last = [r for r in results if r["is_last_stage"]]
    iters = cfg.iters
    loss = [sum(r["losses"][i] for r in last) / len(last) for i in range(iters)]
    step = [max(r["step_seconds"][i] for r in results) for i in range(iters)]
    aux = [r["aux_loss"] for r in results if r["aux_loss"] and r["aux_loss"][0] == r["aux_loss"][0]]
    return {
        "source": "recorded", "framework": "torch", "model": spec.name, "model_spec": spec.to_dict(), "parallel": parallel.to_dict(),
        "world_size": parallel.world_size, "torch_version": torch.__version__, "backend": "gloo",
        "python": sys.version.split()[0], "command": command or "", "seed": cfg.seed, "lr": cfg.lr,
        "iterations": iters, "record_iterations": min(iters, cfg.record_iters) if cfg.record_iters else iters,
        "wall_seconds": round(wall, 3), "loss": loss, "step_seconds": step,
        "aux_loss": [sum(a[i] for a in aux) / len(aux) for i in range(iters)] if aux else None,
        "setup_seconds": max(r["setup_seconds"] for r in results),
        "skipped_ops": results[0]["skipped_ops"], "run_config": {k: v for k, v in asdict(cfg).items()
                                                               if k not in ("model", "parallel", "out_dir")},
        "corpus": "sorted *.py of the Python standard library, byte tokens (llmcomm.collect.corpus)",
    }
