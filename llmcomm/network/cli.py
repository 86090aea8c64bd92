"""``llmcomm network MODEL --topology NAME --tp .. --pp ..``: a predicted (or any stored) trace on a cluster's links.

Prints the topology, the bytes per iteration on each link tier with its peak link, the share of each
parallelism's bytes by the highest tier it reaches, and the hottest links relative to their capacity. MODEL is
a catalogue model (the iteration is predicted from the options) or a trace file (``.parquet``, as written by
``llmcomm predict --out``, ``llmcomm collect`` or ``llmcomm ingest``). A job larger than the topology runs on
it widened at the top tier (more pods), which the first line says.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..vocab import PIPELINE_SCHEDULES, RECOMPUTE_MODES
from .placement import POLICIES
from .routing import ECMP_MODES


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("network", help="map one iteration's traffic onto the links of a cluster topology",
                              description=__doc__.splitlines()[0])
    p.add_argument("model", help="catalogue model name, model YAML path, or a trace .parquet file")
    p.add_argument("--topology", required=True, help="topology name in data/topologies or a YAML path")
    names = {"tp": "tensor", "pp": "pipeline", "dp": "data", "ep": "expert", "cp": "context"}
    for dim, what in names.items():
        p.add_argument(f"--{dim}", type=int, default=1, help=f"{what}-parallel degree")
    p.add_argument("--vpp", type=int, default=1, help="virtual pipeline stages per rank (> 1: interleaved)")
    p.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp > 1)")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per iteration (default: micro-batch x dp)")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the model's)")
    p.add_argument("--recompute", nargs="?", const="full", default="none", choices=RECOMPUTE_MODES,
                   help="activation recomputation")
    p.add_argument("--distributed-optimizer", action="store_true", help="Megatron's distributed optimizer")
    p.add_argument("--schedule", default="1f1b", choices=PIPELINE_SCHEDULES, help="pipeline schedule")
    p.add_argument("--order", default=None, help="Megatron rank order, e.g. tp-cp-ep-dp-pp (default) or tp-pp-dp")
    p.add_argument("--placement", default="contiguous", choices=POLICIES, help="how ranks are put on servers")
    p.add_argument("--seed", type=int, default=0, help="seed of the random placement and of sampled ECMP")
    p.add_argument("--ecmp", default="expected", choices=ECMP_MODES,
                   help="ECMP as its expectation (even split) or a seeded per-flow hash sample")
    p.add_argument("--qps", type=int, default=1, help="queue pairs per connection hashed separately (sample)")
    p.add_argument("--no-pxn", action="store_true", help="cross-rail traffic climbs to the spine (no PXN relay)")
    p.add_argument("--algorithm", default="ring", choices=("ring", "direct"), help="how collectives become flows")
    p.add_argument("--top", type=int, default=10, help="hottest links to print")
    p.add_argument("--flows-out", default=None, help="write the flow list (src, dst, bytes, start) as .parquet/.csv")
    p.add_argument("--aicb-out", default=None,
                   help="write rank --aicb-rank's calls as an AICB workload .csv (a predicted MODEL only; the "
                        "prediction is expanded to one row per call, which for large jobs takes memory)")
    p.add_argument("--aicb-rank", type=int, default=0, help="the rank --aicb-out writes")
    p.set_defaults(func=run, fsdp=False, pipe_partitioned=False)


def _trace(args: argparse.Namespace):  # noqa: ANN202 - a Trace
    from ..trace import read_trace

    path = Path(args.model)
    if path.suffix == ".parquet":
        return read_trace(path)
    from ..predict import predict_traffic
    from ..specs import load_model

    return predict_traffic(load_model(args.model), _parallel(args))


def _parallel(args: argparse.Namespace):  # noqa: ANN202 - a ParallelConfig
    import dataclasses

    from ..predict.cli import parallel_from_args

    par = parallel_from_args(args)
    return dataclasses.replace(par, order=args.order) if args.order else par


def run(args: argparse.Namespace) -> int:
    from ..output_paths import check_file
    from ..units import format_bytes
    from .export import write_flow_list
    from .loads import link_loads
    from .topology import load_topology

    flows_out = check_file(args.flows_out, option="--flows-out", suffixes=(".parquet", ".csv"),
                           writes="a flow list") if args.flows_out else None
    aicb_out = check_file(args.aicb_out, option="--aicb-out", suffixes=(".csv",), writes="an AICB workload") \
        if args.aicb_out else None
    if aicb_out is not None and Path(args.model).suffix == ".parquet":
        from ..errors import UsageError

        raise UsageError("--aicb-out writes a prediction; give a catalogue MODEL, not a trace file")
    trace = _trace(args)
    topo = load_topology(args.topology).for_world(trace.world_size)
    loads = link_loads(trace, topo, args.placement, algorithm=args.algorithm, ecmp=args.ecmp, pxn=not args.no_pxn,
                       qps=args.qps, seed=args.seed)
    print(topo.describe())
    print(f"{trace.world_size:,} ranks, placement {args.placement}, {args.algorithm} flows, ECMP {args.ecmp}"
          f"{'' if args.no_pxn else ', PXN'}; {loads.meta['pairs']:,} GPU pairs")
    print("\nbytes per iteration by link tier")
    print(f"{'tier':<22} {'links used':>14} {'bytes':>12} {'peak link':>12} {'peak busy':>11} {'peak/mean':>9}")
    for r in loads.tiers.itertuples():
        print(f"{r.tier:<22} {r.used:>6,}/{r.links:<7,} {format_bytes(r.bytes):>12} {format_bytes(r.max_bytes):>12} "
              f"{r.max_busy_s * 1e3:>8.2f} ms {r.imbalance:>9.2f}")
    print("\nshare of each parallelism's bytes by the highest tier it reaches")
    wide = loads.reach.pivot(index="parallelism", columns="reach", values="share")
    print(f"{'':<6}" + "".join(f"{c:>14}" for c in wide.columns))
    for par, row in wide.iterrows():
        print(f"{par:<6}" + "".join(f"{v * 100:>13.1f}%" for v in row))
    print(f"\nhottest {args.top} links (busy = bytes / capacity per iteration)")
    print(f"{'tier':<22} {'dir':<5} {'plane':>5} {'lower':>8} {'port':>5} {'upper':>8} {'bytes':>12} {'flows':>7} "
          f"{'busy':>10}")
    for r in loads.hottest(args.top).itertuples():
        print(f"{r.tier:<22} {r.direction:<5} {r.plane:>5} {r.lower:>8} {r.port:>5} {r.upper:>8} "
              f"{format_bytes(r.bytes):>12} {r.flows:>7,} {r.busy_s * 1e3:>7.2f} ms")
    if flows_out is not None:
        write_flow_list(trace, flows_out, topology=topo, placement=args.placement, seed=args.seed,
                        algorithm=args.algorithm)
        print(f"\nflows: {flows_out}")
    if aicb_out is not None:
        from ..predict import predict_traffic
        from ..specs import load_model
        from .export import write_aicb

        full = predict_traffic(load_model(args.model), _parallel(args), aggregate=False)  # one row per call
        dropped = write_aicb(full, aicb_out, rank=args.aicb_rank)
        print(f"AICB workload (rank {args.aicb_rank}): {aicb_out}; {len(dropped)} calls on groups AICB cannot name "
              "left out")
    return 0
