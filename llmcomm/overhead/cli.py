"""``llmcomm time MODEL --tp .. --pp .. --dp .. --cluster NAME [--nccl-tests LOGS...]``: the iteration-time
breakdown of one configuration (:func:`llmcomm.overhead.iteration_time`)."""

from __future__ import annotations

import argparse

from ..specs import ParallelConfig, load_cluster, load_model
from ..vocab import PIPELINE_SCHEDULES, RECOMPUTE_MODES


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("time", help="predict one training iteration's time, term by term")
    p.add_argument("model", help="catalogue name or YAML path")
    for dim in ("tp", "pp", "dp", "ep", "vpp"):
        p.add_argument(f"--{dim}", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--recompute", nargs="?", const="full", default="none", choices=RECOMPUTE_MODES)
    p.add_argument("--distributed-optimizer", action="store_true")
    p.add_argument("--schedule", default="1f1b", choices=PIPELINE_SCHEDULES)
    p.add_argument("--overlap-grad-reduce", action="store_true", help="Megatron-LM's bucketed DP overlap")
    p.add_argument("--pipe-partitioned", action="store_true",
                   help="Megatron-DeepSpeed: DeepSpeed's pipeline engine sends pipeline tensors split over TP and "
                        "all-gathers them on arrival (not with --sp)")
    p.add_argument("--cluster", required=True, help="cluster name (data/clusters) or YAML path")
    p.add_argument("--nccl-tests", nargs="+", default=None, metavar="LOG",
                   help="calibrate the bandwidth model on your own nccl-tests output instead of the shipped one")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .bandwidth import Bandwidth
    from .iteration import iteration_time

    model = load_model(args.model)
    parallel = ParallelConfig(tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep, vpp=args.vpp, sp=args.sp,
                              micro_batch=args.micro_batch, global_batch=args.global_batch, seq_len=args.seq_len,
                              recompute=args.recompute, distributed_optimizer=args.distributed_optimizer,
                              schedule="interleaved" if args.vpp > 1 else args.schedule,
                              pipe_partitioned=args.pipe_partitioned)
    cluster = load_cluster(args.cluster)
    bw = Bandwidth.from_nccl_tests(args.nccl_tests, cluster=cluster) if args.nccl_tests else None
    b = iteration_time(model, parallel, cluster, bw, overlap_grad_reduce=args.overlap_grad_reduce)
    f = b.to_frame()
    print(f"{model.name} on {cluster.name}: tp={parallel.tp} pp={parallel.pp} dp={parallel.dp} ep={parallel.ep} "
          f"vpp={parallel.vpp} micro-batch={parallel.micro_batch} global batch={parallel.global_batch} "
          f"({parallel.num_microbatches} micro-batches), recompute={parallel.recompute}; bandwidth: "
          f"{'your nccl-tests logs' if bw is not None else 'shipped calibration'}")
    width = max(len(t) for t in f["term"])
    for r in f.itertuples():
        print(f"  {r.term:<{width}}  {r.seconds * 1e3:12.2f} ms  {r.share:6.1%}  {r.kind}")
    print(f"  {'total':<{width}}  {b.total_s * 1e3:12.2f} ms")
    print(f"  exposed communication {b.exposed_comm_s * 1e3:.2f} ms = {b.comm_overhead:.1%} of the iteration "
          f"(critical stage: {b.critical_stage})")
    return 0
