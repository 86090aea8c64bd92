"""``llmcomm predict MODEL --tp .. --pp ..``: predict one iteration's traffic and print a summary."""

from __future__ import annotations

import argparse

import pandas as pd

from ..specs import ParallelConfig, load_cluster, load_model
from ..trace import Trace


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("predict", help="predict one training iteration's communication")
    p.add_argument("model", help="catalogue name or YAML path")
    for dim in ("tp", "pp", "dp", "ep", "cp", "vpp"):
        p.add_argument(f"--{dim}", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--recompute", nargs="?", const="full", default="none", choices=("none", "selective", "full"))
    p.add_argument("--distributed-optimizer", action="store_true")
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe", "interleaved"))
    p.add_argument("--cluster", default=None, help="cluster name (sets GPUs per node)")
    p.add_argument("--framework", default="megatron", choices=("megatron", "torch"))
    p.add_argument("--out", default=None, help="write the trace to this parquet file")
    p.add_argument("--matrix", default=None, help="write the communication matrix figure (png)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from . import predict_traffic

    model = load_model(args.model)
    parallel = ParallelConfig(tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep, cp=args.cp, vpp=args.vpp,
                              sp=args.sp, micro_batch=args.micro_batch, global_batch=args.global_batch,
                              seq_len=args.seq_len, recompute=args.recompute,
                              distributed_optimizer=args.distributed_optimizer, fsdp=args.fsdp,
                              schedule="interleaved" if args.vpp > 1 else args.schedule)
    cluster = load_cluster(args.cluster) if args.cluster else None
    trace = predict_traffic(model, parallel, cluster=cluster, framework=args.framework)
    gpn = cluster.gpus_per_node if cluster else 8
    print(summary_text(trace, gpn))
    if args.out:
        print(f"trace: {trace.write(args.out)}")
    if args.matrix:
        import matplotlib.pyplot as plt

        from ..plots import comm_matrix

        fig, ax = plt.subplots(figsize=(6, 5))
        comm_matrix(trace.matrix("direct"), gpus_per_node=gpn, ax=ax, title=f"{model.name}: bytes (direct)")
        fig.savefig(args.matrix, dpi=150, bbox_inches="tight")
        print(f"matrix: {args.matrix}")
    return 0


def summary_text(trace: Trace, gpus_per_node: int = 8) -> str:
    """The summary ``predict`` prints: bytes per parallelism, per phase, per pair class, and the TP share."""
    from ..analysis import bytes_by, pair_classes, tp_share
    from ..units import format_bytes

    def table(df: pd.DataFrame, keys: list[str]) -> list[str]:
        lines = []
        for _, row in df.iterrows():
            name = " / ".join(str(row[k]) for k in keys)
            lines.append(f"  {name:<28} {format_bytes(row['bytes']):>12}  {100 * row['share']:6.2f}%")
        return lines

    out = [f"{trace.meta.get('model', {}).get('name', '?')}: {trace.world_size} ranks, "
           f"{int(trace.events['count'].sum()):,} calls ({len(trace):,} rows)",
           "message bytes per parallelism:", *table(bytes_by(trace, ["parallelism"]), ["parallelism"]),
           "message bytes per phase:", *table(bytes_by(trace, ["phase"]), ["phase"]),
           f"wire bytes (ring) per pair class ({gpus_per_node} GPUs per node):",
           *table(pair_classes(trace, gpus_per_node).sort_values("bytes", ascending=False),
                  ["parallelism", "pair_class"]),
           f"TP share of message bytes: {100 * tp_share(trace):.2f}%"]
    return "\n".join(out)
