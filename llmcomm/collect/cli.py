"""``llmcomm collect``: run a small hybrid-parallel training job on CPU (gloo) and record its communication.

Example::

    llmcomm collect --model tiny-gpt --tp 2 --pp 2 --dp 2 --iters 4 --out data/traces/gpt_tp2pp2dp2.parquet

The model, the configuration and the output name are checked before any worker starts; the trace, its
manifest and (MoE) routing file appear together when every rank has finished, or not at all.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys

DEFAULT_MICROBATCHES = 4  # micro-batches per iteration when --global-batch is not given


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..cli_options import (
        add_model,
        add_parallel,
        add_quiet,
        nonnegative_float,
        nonnegative_int,
        positive_float,
        positive_int,
    )
    from .checks import SCHEDULES

    p = subparsers.add_parser("collect", help="record the communication of a real (CPU, gloo) training run",
                              description=__doc__.split("\n\n")[0])
    add_model(p, flag=True)
    add_parallel(p, dims=("tp", "pp", "dp", "ep"), extras=("sp", "schedule", "micro_batch", "global_batch",
                                                          "seq_len"),
                 schedules=SCHEDULES, global_batch_text=f"micro-batch x dp x {DEFAULT_MICROBATCHES}: "
                 f"{DEFAULT_MICROBATCHES} micro-batches per iteration, so that a pipeline schedule has "
                 "micro-batches to interleave")
    p.add_argument("--iters", type=positive_int, required=True, help="training iterations (at least 1)")
    p.add_argument("--routing-iters", type=positive_int, default=None,
                   help="keep per-call events only for the first N iterations; routing counts are kept for "
                        "all (default: keep every iteration)")
    p.add_argument("--aux-loss-coef", type=nonnegative_float, default=0.01,
                   help="MoE load-balancing (aux) loss weight; 0 turns balancing off")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the weights and the batch order")
    p.add_argument("--lr", type=positive_float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--out", required=True, help="output trace, NAME.parquet (NAME.manifest.json is written beside it)")
    p.add_argument("--timeout", type=positive_float, default=120.0,
                   help="seconds without progress (a new iteration on every rank) after which the run is "
                        "stopped; set-up takes several seconds per rank")
    p.add_argument("--recorder-mode", choices=("kernel", "dispatch"), default="kernel",
                   help="how calls are intercepted: kernel (low overhead) or dispatch (TorchDispatchMode); "
                        "both record the same events")
    add_quiet(p)
    p.add_argument("--inject-fault", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..cli_options import parallel_from_args
    from ..errors import UsageError
    from ..output_paths import check_file
    from ..specs import load_model
    from .checks import check_collectable

    out = check_file(args.out, option="--out", suffixes=(".parquet",), writes="a parquet trace")
    spec = load_model(args.model)
    gb = args.global_batch or args.micro_batch * args.dp * DEFAULT_MICROBATCHES
    # CPU training on gloo: fp32 throughout (no bf16 matmuls worth having on CPU)
    par = parallel_from_args(args, global_batch=gb, act_dtype="fp32", grad_reduce_dtype="fp32", param_dtype="fp32")
    check_collectable(spec, par, args.iters, args.routing_iters)
    if importlib.util.find_spec("torch") is None:
        raise UsageError("collect runs a real training job and needs torch, which is not installed: "
                         "pip install 'llmcomm[collect]' (the collect extra)")
    from .launch import collect

    command = "llmcomm " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else ""
    trace = collect(spec, par, out, iters=args.iters, record_iters=args.routing_iters,
                    seed=args.seed, lr=args.lr, timeout=args.timeout, command=command, fault=args.inject_fault,
                    recorder_mode=args.recorder_mode, aux_loss_coef=args.aux_loss_coef,
                    progress=not args.quiet and sys.stderr.isatty())
    loss = trace.meta["loss"]
    print(f"{out}: {len(trace)} events from {trace.world_size} ranks, {trace.meta['iterations']} iterations, "
          f"loss {loss[0]:.3f} -> {loss[-1]:.3f}, {trace.meta['wall_seconds']:.1f} s")
    skipped = trace.meta.get("skipped_ops") or {}
    if skipped:
        what = ", ".join(f"{n:,} {op}" for op, n in sorted(skipped.items()))
        print(f"not recorded (no events-table op for them; counts of rank 0, also in the manifest): {what}",
              file=sys.stderr)
    return 0
