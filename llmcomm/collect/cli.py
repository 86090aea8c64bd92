"""``llmcomm collect``: run a small hybrid-parallel training job on CPU (gloo) and record its communication.

Example::

    llmcomm collect --model tiny-gpt --tp 2 --pp 2 --dp 2 --iters 4 --out data/traces/gpt_tp2pp2dp2.parquet

The model, the configuration and the output name are checked before any worker starts; the trace, its
manifest and (MoE) routing file appear together when every rank has finished, or not at all.
"""

from __future__ import annotations

import argparse
import shlex
import sys

DEFAULT_MICROBATCHES = 4  # micro-batches per iteration when --global-batch is not given


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..cli import add_quiet

    p = subparsers.add_parser("collect", help="record the communication of a real (CPU, gloo) training run",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="catalogue name (tiny-gpt, tiny-moe) or YAML path")
    names = {"tp": "tensor", "pp": "pipeline", "dp": "data", "ep": "expert (MoE models; divides dp)"}
    for dim, what in names.items():
        p.add_argument(f"--{dim}", type=int, default=1, help=f"{what}-parallel degree")
    p.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp > 1)")
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="pipeline schedule")
    p.add_argument("--micro-batch", type=int, default=2, help="sequences per micro-batch")
    p.add_argument("--global-batch", type=int, default=None,
                   help=f"sequences per iteration (default: micro-batch x dp x {DEFAULT_MICROBATCHES} micro-batches)")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the model's)")
    p.add_argument("--iters", type=int, required=True, help="training iterations (at least 1)")
    p.add_argument("--routing-iters", type=int, default=None,
                   help="keep per-call events only for the first N iterations; routing counts are kept for "
                        "all (default: keep every iteration)")
    p.add_argument("--aux-loss-coef", type=float, default=0.01,
                   help="MoE load-balancing (aux) loss weight; 0 turns balancing off")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the batch order")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--out", required=True, help="output trace, NAME.parquet (NAME.manifest.json is written beside it)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds without progress after which the run is stopped")
    p.add_argument("--recorder-mode", choices=("kernel", "dispatch"), default="kernel",
                   help="how calls are intercepted: kernel (low overhead) or dispatch (TorchDispatchMode); "
                        "both record the same events")
    add_quiet(p)
    p.add_argument("--inject-fault", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..output_paths import check_file
    from ..specs import ParallelConfig, load_model
    from .launch import collect

    out = check_file(args.out, option="--out", suffixes=(".parquet",), writes="a parquet trace")
    spec = load_model(args.model)
    gb = args.global_batch or args.micro_batch * args.dp * DEFAULT_MICROBATCHES
    par = ParallelConfig(tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep, sp=args.sp, micro_batch=args.micro_batch,
                         global_batch=gb, seq_len=args.seq_len, schedule=args.schedule, act_dtype="fp32",
                         grad_reduce_dtype="fp32", param_dtype="fp32")
    command = "llmcomm " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else ""
    trace = collect(spec, par, out, iters=args.iters, record_iters=args.routing_iters,
                    seed=args.seed, lr=args.lr, timeout=args.timeout, command=command, fault=args.inject_fault,
                    recorder_mode=args.recorder_mode, aux_loss_coef=args.aux_loss_coef,
                    progress=not args.quiet and sys.stderr.isatty())
    loss = trace.meta["loss"]
    print(f"{out}: {len(trace)} events from {trace.world_size} ranks, {trace.meta['iterations']} iterations, "
          f"loss {loss[0]:.3f} -> {loss[-1]:.3f}, {trace.meta['wall_seconds']:.1f} s")
    return 0
