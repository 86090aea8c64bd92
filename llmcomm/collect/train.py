"""One rank of a recorded training run: build, parallelize, train on the corpus, write this rank's events.

Each iteration takes ``global_batch`` windows of the corpus; DP rank ``d`` trains on rows
``[d·B/dp, (d+1)·B/dp)``, split into ``m = B/(b·dp)`` micro-batches of ``b`` rows. Without pipelining the
micro-batches run one after another with gradient sync only on the last; with pipelining the schedule
runs them. AdamW (lr ``lr``) updates after each iteration. Loss = next-byte cross-entropy (+ aux·coef for
MoE, injected in backward).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..atomic import write_bytes
from ..specs import ModelSpec, ParallelConfig


@dataclass
class RunConfig:
    """Everything a rank needs (picklable)."""

    model: dict[str, Any]
    parallel: dict[str, Any]
    iters: int
    out_dir: str
    record_iters: int | None = None
    seed: int = 0
    lr: float = 3e-3
    timeout: float = 120.0
    port: int = 0
    fault: str | None = None  # "RANK:raise|hang:ITER" (tests of the launcher's failure handling)
    recorder_mode: str = "kernel"  # how the recorder intercepts calls (llmcomm.collect.record.MODES)
    aux_loss_coef: float = 0.01  # MoE load-balancing loss weight (0: balancing off)
    extra: dict[str, Any] = field(default_factory=dict)


def _maybe_fault(cfg: RunConfig, rank: int, iteration: int) -> None:
    if not cfg.fault:
        return
    r, mode, it = cfg.fault.split(":")
    if int(r) == rank and int(it) == iteration:
        if mode == "raise":
            raise RuntimeError(f"injected fault on rank {rank} at iteration {iteration}")
        time.sleep(10 * cfg.timeout + 3600)


def _silence_torch_notices() -> None:
    """Hide torch's notices a ``collect`` user cannot act on (they are about torch's own internals), once per
    rank process: the deprecation notice of slicing the flattened ``dp`` mesh dimension (torch 2.9+), and
    FSDP2's caution that ``replicate``'s root module returned a view (this workload applies no in-place op
    to the logits)."""
    import warnings

    warnings.filterwarnings("ignore", message="Slicing a flattened dim", category=UserWarning)
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(\w+\) returned a view tensor",
                            category=UserWarning)


def error_path(out_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where a failing rank leaves its traceback as text (the launcher names the rank that failed first)."""
    return Path(out_dir) / f"rank{rank}.error.txt"


def run_rank(rank: int, cfg: RunConfig, heartbeat: Any, progress: Any, failed_at: Any) -> None:
    """Entry point of a spawned rank (``torch.multiprocessing`` passes ``rank`` first). On an exception the
    rank records when it failed (``failed_at[rank]``) and its traceback (:func:`error_path`) before raising on:
    when one rank fails, its peers fail soon after on the broken connections, and the launcher reports the
    first."""
    import torch

    _silence_torch_notices()
    torch.set_num_threads(1)
    world = ParallelConfig.from_dict(cfg.parallel).world_size
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg.port))
    import torch.distributed as dist

    # gloo's own timeout is only a backstop: the launcher's no-progress watch (``timeout`` seconds without a new
    # iteration) names the stuck rank, so it must fire first
    backstop = timedelta(seconds=2 * cfg.timeout + 30)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=backstop)
    try:
        _train(rank, cfg, heartbeat, progress)
    except BaseException:
        failed_at[rank] = time.time()
        error_path(cfg.out_dir, rank).write_text(traceback.format_exc(), encoding="utf-8")
        raise
    finally:
        dist.destroy_process_group()


def _train(rank: int, cfg: RunConfig, heartbeat: Any, progress: Any) -> None:
    import torch

    from .corpus import load_corpus
    from .record import Recorder

    spec = ModelSpec.from_dict(cfg.model)
    par = ParallelConfig.from_dict(cfg.parallel)

    def beat(it: int) -> None:
        heartbeat[rank] = time.time()
        progress[rank] = it

    beat(-1)
    rec = Recorder(rank, record_iters=cfg.record_iters, sp=par.sp, mode=cfg.recorder_mode)
    t_setup = time.time()
    with rec:
        job = _build(spec, par, rec, cfg)
        opt = torch.optim.AdamW(job.model.parameters(), lr=cfg.lr, weight_decay=0.0, foreach=False)
        corpus = load_corpus()
        losses: list[float] = []
        step_s: list[float] = []
        aux: list[float] = []
        t_setup = time.time() - t_setup
        for it in range(cfg.iters):
            beat(it)
            _maybe_fault(cfg, rank, it)
            t0 = time.perf_counter()
            rec.step(it)
            loss = _forward_backward(job, par, rec, _local_batch(corpus, it, par, spec, cfg.seed, job.dp_rank))
            rec.microbatch(-1)
            rec.layer(-1)
            rec.phase("optimizer")
            opt.step()
            opt.zero_grad(set_to_none=True)
            step_s.append(time.perf_counter() - t0)
            losses.append(loss)
            aux.append(_mean_aux(job.model))
        beat(cfg.iters)
    out = Path(cfg.out_dir)
    rec.write(out)
    write_bytes(out / f"rank{rank}.json", json.dumps({
        "rank": rank, "losses": losses, "step_seconds": step_s, "aux_loss": aux, "setup_seconds": t_setup,
        "local_parameters": sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                                for p in job.model.parameters()),
        "pp_stage": job.pp_rank, "is_last_stage": job.last, "skipped_ops": rec.skipped,
    }).encode())


@dataclass
class _Job:
    """One rank's parallelized model and where it sits: its PP stage (first / last) and DP rank."""

    model: Any
    schedule: Any  # a torch.distributed.pipelining schedule, or None without pipelining
    pp_rank: int
    dp_rank: int
    first: bool
    last: bool


def _build(spec: ModelSpec, par: ParallelConfig, rec: Any, cfg: RunConfig) -> _Job:
    """Build the model on the device mesh and apply each parallelism (PP, TP, EP, DP), with the recorder's
    layer, routing and pipeline marks."""
    from .instrument import mark_layers, mark_pipeline_stage, mark_routing
    from .model import build_model, cross_entropy
    from .parallelize import apply_dp, apply_ep, apply_pp, apply_tp, build_mesh, pipeline_schedule

    mesh = build_mesh(par)
    rec.register_mesh(mesh, names=("dp",))
    model = build_model(spec, cfg.seed, cfg.aux_loss_coef)
    pp_rank = mesh["pp"].get_local_rank()
    if par.pp > 1:
        apply_pp(model, pp_rank, par.pp)
    if par.tp > 1:
        apply_tp(model, mesh["tp"], par.sp)
    if par.ep > 1:
        apply_ep(model, mesh["ep"])
    if par.dp > 1:
        apply_dp(model, mesh["dp"], mesh["edp"], par.ep)
    mark_layers(model.layers, rec)
    mark_routing(model, rec)
    schedule = None
    if par.pp > 1:
        stage, schedule = pipeline_schedule(model, mesh, par.num_microbatches, par.schedule, cross_entropy)
        mark_pipeline_stage(stage, rec)
    return _Job(model, schedule, pp_rank, mesh["dp"].get_local_rank(), pp_rank == 0, pp_rank == par.pp - 1)


def _local_batch(corpus: Any, it: int, par: ParallelConfig, spec: ModelSpec, seed: int, dp_rank: int) -> Any:
    """This DP rank's rows ``[d·B/dp, (d+1)·B/dp)`` of iteration ``it``'s global batch, as tensors."""
    import torch

    from .corpus import batch

    rows = par.num_microbatches * par.micro_batch  # = global_batch / dp
    x_all, y_all = batch(corpus, it, rows * par.dp, par.sequence_length(spec), seed)
    return (torch.from_numpy(x_all[dp_rank * rows:(dp_rank + 1) * rows]),
            torch.from_numpy(y_all[dp_rank * rows:(dp_rank + 1) * rows]))


def _forward_backward(job: _Job, par: ParallelConfig, rec: Any, xy: Any) -> float:
    """One iteration's forward and backward passes; returns the loss (NaN on a pipeline stage but the last)."""
    import torch

    from .model import cross_entropy

    x, y = xy
    n_mb = par.num_microbatches
    rec.phase("forward")
    if job.schedule is not None:
        mb_losses: list[torch.Tensor] = []
        if job.first:
            job.schedule.step(x, target=y, losses=mb_losses)
        elif job.last:
            job.schedule.step(target=y, losses=mb_losses)
        else:
            job.schedule.step()
        return float(torch.stack([t.detach() for t in mb_losses]).mean()) if job.last else float("nan")
    total = 0.0
    for mb, (xm, ym) in enumerate(zip(x.chunk(n_mb), y.chunk(n_mb), strict=True)):
        rec.microbatch(mb)
        rec.phase("forward")
        rec.layer(-1)
        out = cross_entropy(job.model(xm), ym) / n_mb
        rec.phase("backward")
        rec.layer(-1)
        if par.dp > 1:
            job.model.set_requires_gradient_sync(mb == n_mb - 1)
        out.backward()
        total += float(out.detach())
    return total


def _mean_aux(model: Any) -> float:
    from .moe import MoE

    vals = [float(m.last_aux_loss) for m in model.modules() if isinstance(m, MoE) and m.last_aux_loss is not None]
    return sum(vals) / len(vals) if vals else float("nan")
