"""``llmcomm tune MODEL --gpus N --cluster NAME --global-batch B``: rank parallel configurations."""

from __future__ import annotations

import argparse

HELP = "rank parallel configurations of a model on a cluster by predicted iteration time"
DESCRIPTION = ("Enumerate every valid tp/pp/dp/ep/micro-batch/vpp/SP/recompute/distributed-optimizer configuration, "
               "drop those that do not fit in GPU memory, and rank the rest with the iteration-time formulation "
               "(llmcomm.overhead).")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tune", help=HELP, description=DESCRIPTION)
    p.add_argument("model", help="catalogue name or YAML path")
    p.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    p.add_argument("--cluster", required=True, help="cluster name from `llmcomm clusters` or a YAML path")
    p.add_argument("--global-batch", type=int, required=True, help="global batch in sequences")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the model's)")
    p.add_argument("--top", type=int, default=10, help="rows to print (default: 10)")
    p.add_argument("--no-prune", action="store_true", help="evaluate every fitting candidate (exhaustive)")
    p.add_argument("--memory-fraction", type=float, default=0.9,
                   help="share of GPU memory a configuration may use (default: 0.9)")
    for dim in ("tp", "pp", "ep", "micro-batch", "vpp"):
        p.add_argument(f"--{dim}", type=_ints, default=None,
                       help=f"only these {dim} values, comma-separated (default: all valid)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from .search import tune
    from .space import SearchSpace

    space = SearchSpace(tp=args.tp, pp=args.pp, ep=args.ep, micro_batch=args.micro_batch, vpp=args.vpp)
    r = tune(args.model, args.gpus, args.cluster, args.global_batch, args.seq_len, space=space,
             prune=not args.no_prune, memory_fraction=args.memory_fraction)
    s = r.stats
    print(f"{r.model.name} on {r.gpus} × {r.cluster.gpu} ({r.cluster.name}), global batch {r.global_batch}, "
          f"sequence {r.meta['seq_len']}")
    print(f"{s['enumerated']:,} candidates, {s['evaluated']:,} evaluated, {s['pruned']:,} pruned "
          f"({', '.join(f'{k}: {v:,}' for k, v in s['pruned_by_rule'].items())}) in {s['wall_s']:.2f} s")
    top = r.top(args.top).copy()
    top["total_bytes"] = (top["total_bytes"] / 1e9).round(1)
    top = top.rename(columns={"total_s": "time_s", "total_bytes": "memory_GB", "distributed_optimizer": "dist_opt",
                              "micro_batch": "mb", "comm_overhead": "comm"})
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(top.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0
