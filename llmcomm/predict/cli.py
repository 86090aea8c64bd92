"""``llmcomm predict MODEL --tp .. --pp ..``: predict one iteration's traffic and print a summary."""

from __future__ import annotations

import argparse

from ..specs import ParallelConfig, load_cluster, load_model


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
    from .summary import summary_text

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
