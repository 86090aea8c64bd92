"""``llmcomm time MODEL --tp .. --pp .. --dp .. --cluster NAME [--nccl-tests LOGS...]``: the iteration-time
breakdown of one configuration (:func:`llmcomm.overhead.iteration_time`).

A configuration whose memory per GPU (:func:`llmcomm.overhead.memory`: weights, gradients, optimizer state and
activations) exceeds the cluster's GPU memory is refused with the numbers. With ``--nccl-tests`` each
collective regime the configuration uses is timed from your logs where they hold that scope (intra- or
inter-node), else from the shipped calibration; the table after the breakdown says which, and a warning
names the regimes your logs do not hold.
"""

from __future__ import annotations

import argparse
import warnings

from ..cli_options import add_cluster, add_model, add_parallel, add_quiet, parallel_from_args
from ..specs import load_cluster, load_model


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("time", help="predict one training iteration's time, term by term",
                              description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1])
    add_model(p)
    add_parallel(p, dims=("tp", "pp", "dp", "ep", "cp"),
                 extras=("vpp", "sp", "micro_batch", "global_batch", "seq_len", "recompute",
                         "distributed_optimizer", "schedule", "overlap_grad_reduce", "pipe_partitioned",
                         "overlap_param_gather", "tp_comm_overlap", "attention_backend", "fp8", "fp8_recipe",
                         "overlap_p2p_comm", "moe_a2a_overlap", "moe_flex_dispatcher_backend",
                         "align_grad_reduce", "fsdp", "cp_comm_type", "etp")
                 + ("tp_comm_overlap_fp8_buf",))  # acc-fp8wire
    add_cluster(p, required=True)
    p.add_argument("--nccl-tests", nargs="+", default=None, metavar="LOG",
                   help="time collectives from your own nccl-tests output where it covers them (default: the "
                        "shipped calibration)")
    add_quiet(p, "print the total only")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..predict.cli import warn_surprises
    from .capacity import check_fits
    from .iteration import iteration_time

    model = load_model(args.model)
    parallel = parallel_from_args(args)
    cluster = load_cluster(args.cluster)
    check_fits(model, parallel, cluster, action="raise",
               hint="; lower --micro-batch, add --recompute selective|full, --sp, or raise --tp/--pp")
    warn_surprises(parallel, cluster.gpus_per_node, cluster)
    bw = None
    if args.nccl_tests:
        from .bandwidth_sources import SourcedBandwidth

        bw = SourcedBandwidth.from_logs(args.nccl_tests, cluster)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=_memory_warning())  # refused above already
        b = iteration_time(model, parallel, cluster, bw)
    if args.quiet:
        print(f"{b.total_s:.6f} s")
        return 0
    f = b.to_frame()
    cp = f" cp={parallel.cp} ({parallel.cp_comm_type})" if parallel.cp > 1 else ""
    print(f"{model.name} on {cluster.name}: tp={parallel.tp} pp={parallel.pp} dp={parallel.dp} ep={parallel.ep}{cp} "
          f"vpp={parallel.vpp} micro-batch={parallel.micro_batch} global batch={parallel.global_batch} "
          f"({parallel.num_microbatches} micro-batches), recompute={parallel.recompute}"
          f"{'' if parallel.recompute_modules is None else ' ' + '+'.join(parallel.recompute_modules)}"
          f"{'' if parallel.recompute_method is None else f' ({parallel.recompute_method} {parallel.recompute_num_layers})'}"
          f"{'' if not parallel.fsdp else ', fsdp' + ('' if parallel.fsdp_reshard_after_forward else ' (shards kept)')}"
          f"; bandwidth: "
          f"{'per regime, below' if bw is not None else 'shipped calibration'}")
    width = max(len(t) for t in f["term"])
    for r in f.itertuples():
        print(f"  {r.term:<{width}}  {r.seconds * 1e3:12.2f} ms  {r.share:6.1%}  {r.kind}")
    print(f"  {'total':<{width}}  {b.total_s * 1e3:12.2f} ms")
    print(f"  exposed communication {b.exposed_comm_s * 1e3:.2f} ms = {b.comm_overhead:.1%} of the iteration "
          f"(critical stage: {b.critical_stage})")
    if bw is not None:
        _report_sources(bw)
    return 0


def _memory_warning() -> type[Warning]:
    from .capacity import MemoryWarning

    return MemoryWarning


def _report_sources(bw: object) -> None:
    """Which data timed each regime the configuration used, and a warning for those not in the logs."""
    from .bandwidth_sources import SourcedBandwidth

    assert isinstance(bw, SourcedBandwidth)
    src = bw.sources()
    print("bandwidth per regime (op, ranks, ranks per node -> data):")
    for r in src.itertuples():
        print(f"  {r.op:<14} {r.group_size:>6} ranks {r.ranks_per_node:>3}/node  {r.source}: {r.detail}")
    missing = bw.not_in_logs()
    if len(missing):
        what = ", ".join(f"{r.op} over {r.group_size} ranks ({r.ranks_per_node}/node)" for r in missing.itertuples())
        warnings.warn(f"{len(missing)} of {len(src)} regimes this configuration uses are not in your nccl-tests "
                      f"logs (no measurements of their scope), so they are timed from the "
                      f"{missing['source'].iloc[0]}: {what}", stacklevel=2)
