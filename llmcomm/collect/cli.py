"""``llmcomm collect``: run a small hybrid-parallel training job on CPU (gloo) and record its communication.

Example::

    llmcomm collect --model tiny-gpt --tp 2 --pp 2 --dp 2 --iters 4 --out data/traces/gpt_tp2pp2dp2.parquet
"""

from __future__ import annotations

import argparse
import shlex
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("collect", help="record the communication of a real (CPU, gloo) training run",
                              description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="catalogue name (tiny-gpt, tiny-moe) or YAML path")
    for dim in ("tp", "pp", "dp", "ep"):
        p.add_argument(f"--{dim}", type=int, default=1, help=f"{dim.upper()} degree (default 1)")
    p.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp > 1)")
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="pipeline schedule")
    p.add_argument("--micro-batch", type=int, default=2, help="sequences per micro-batch (default 2)")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per iteration (default: micro-batch · dp · 4 micro-batches)")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the model's)")
    p.add_argument("--iters", type=int, required=True, help="training iterations")
    p.add_argument("--routing-iters", type=int, default=None,
                   help="keep per-call events only for the first N iterations (routing counts: all)")
    p.add_argument("--aux-loss-coef", type=float, default=0.01,
                   help="MoE load-balancing (aux) loss weight; 0 turns balancing off (default 0.01)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--out", required=True, help="output trace, NAME.parquet")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds without progress after which the run is stopped (default 120)")
    p.add_argument("--recorder-mode", choices=("kernel", "dispatch"), default="kernel",
                   help="how calls are intercepted: kernel (default, low overhead) or dispatch "
                        "(TorchDispatchMode); both record the same events")
    p.add_argument("--inject-fault", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..specs import ParallelConfig
    from .launch import collect

    gb = args.global_batch or args.micro_batch * args.dp * 4
    par = ParallelConfig(tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep, sp=args.sp, micro_batch=args.micro_batch,
                         global_batch=gb, seq_len=args.seq_len, schedule=args.schedule, act_dtype="fp32",
                         grad_reduce_dtype="fp32", param_dtype="fp32")
    command = "llmcomm " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else ""
    trace = collect(args.model, par, args.out, iters=args.iters, record_iters=args.routing_iters,
                    seed=args.seed, lr=args.lr, timeout=args.timeout, command=command, fault=args.inject_fault,
                    recorder_mode=args.recorder_mode, aux_loss_coef=args.aux_loss_coef)
    loss = trace.meta["loss"]
    print(f"{args.out}: {len(trace)} events from {trace.world_size} ranks, {trace.meta['iterations']} iterations, "
          f"loss {loss[0]:.3f} -> {loss[-1]:.3f}, {trace.meta['wall_seconds']:.1f} s")
    return 0
