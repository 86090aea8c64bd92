"""``llmcomm predict MODEL --tp .. --pp ..``: predict one iteration's traffic and print a summary.

Outputs (``--out`` trace, ``--matrix`` figure) are checked before any work and published together: both
appear, or neither.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..output_paths import FIGURE_SUFFIXES, check_distinct, check_file
from ..specs import Cluster, ParallelConfig, load_cluster, load_model
from ..vocab import FRAMEWORKS, PIPELINE_SCHEDULES, RECOMPUTE_MODES

if TYPE_CHECKING:
    import pandas as pd

    from ..trace import Trace

DEFAULT_GPUS_PER_NODE = 8  # without --cluster
MAX_CELLS = 512  # cells per side of the --matrix figure (ranks binned above it)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("predict", help="predict one training iteration's communication",
                              description=__doc__.splitlines()[0])
    p.add_argument("model", help="catalogue name (see llmcomm models) or YAML path")
    names = {"tp": "tensor", "pp": "pipeline", "dp": "data", "ep": "expert", "cp": "context"}
    for dim, what in names.items():
        p.add_argument(f"--{dim}", type=int, default=1, help=f"{what}-parallel degree")
    p.add_argument("--vpp", type=int, default=1,
                   help="virtual pipeline stages per rank; > 1 selects the interleaved schedule")
    p.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp > 1)")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per iteration (default: micro-batch x dp, one micro-batch per rank)")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the model's)")
    p.add_argument("--recompute", nargs="?", const="full", default="none", choices=RECOMPUTE_MODES,
                   help="activation recomputation; --recompute alone means full")
    p.add_argument("--distributed-optimizer", action="store_true",
                   help="Megatron's distributed optimizer (gradient reduce-scatter + parameter all-gather)")
    p.add_argument("--fsdp", action="store_true", help="fully sharded data parallelism")
    p.add_argument("--pipe-partitioned", action="store_true",
                   help="Megatron-DeepSpeed: DeepSpeed's pipeline engine sends pipeline tensors split over TP and "
                        "all-gathers them on arrival (not with --sp)")
    p.add_argument("--schedule", default="1f1b", choices=PIPELINE_SCHEDULES,
                   help="pipeline schedule (--vpp > 1 implies interleaved)")
    p.add_argument("--cluster", default=None,
                   help=f"cluster name or YAML path, sets GPUs per node (see llmcomm clusters; default: "
                        f"{DEFAULT_GPUS_PER_NODE} GPUs per node)")
    p.add_argument("--framework", default="megatron", choices=FRAMEWORKS,
                   help="whose calls to predict: Megatron-LM's or torch-native (torchtitan-style) training")
    p.add_argument("--out", default=None, help="write the trace to this .parquet file (default: none)")
    p.add_argument("--matrix", default=None,
                   help=f"write the communication-matrix figure ({', '.join(FIGURE_SUFFIXES)}; default: none)")
    p.set_defaults(func=run)


def parallel_from_args(args: argparse.Namespace) -> ParallelConfig:
    """The ParallelConfig the options describe; ``--schedule`` other than interleaved with ``--vpp > 1`` is
    refused (interleaving is what virtual stages are for) instead of being changed silently."""
    if args.vpp > 1 and args.schedule not in ("1f1b", "interleaved"):
        raise ConfigError(f"--schedule {args.schedule} --vpp {args.vpp}: virtual pipeline stages need the "
                          "interleaved 1F1B schedule; drop --vpp or use --schedule interleaved")
    return ParallelConfig(tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep, cp=args.cp, vpp=args.vpp,
                          sp=args.sp, micro_batch=args.micro_batch, global_batch=args.global_batch,
                          seq_len=args.seq_len, recompute=args.recompute,
                          distributed_optimizer=args.distributed_optimizer, fsdp=args.fsdp,
                          schedule="interleaved" if args.vpp > 1 else args.schedule,
                          pipe_partitioned=args.pipe_partitioned)


def warn_surprises(parallel: ParallelConfig, gpus_per_node: int, cluster: Cluster | None) -> None:
    """Warn about a legal but surprising configuration: a TP (or CP) group wider than a node, whose
    per-layer collectives then cross the inter-node network."""
    where = cluster.name if cluster else f"{gpus_per_node} GPUs per node (no --cluster)"
    for dim, size in (("tp", parallel.tp), ("tp*cp", parallel.tp * parallel.cp)):
        if size > gpus_per_node:
            warnings.warn(f"{dim}={size} spans {-(-size // gpus_per_node)} nodes of {where}: its per-layer "
                          "collectives cross the inter-node network (Megatron-LM keeps TP within a node)",
                          stacklevel=2)
            return


def run(args: argparse.Namespace) -> int:
    from . import predict_traffic

    out = check_file(args.out, option="--out", suffixes=(".parquet",), writes="a parquet trace") \
        if args.out else None
    matrix = check_file(args.matrix, option="--matrix", suffixes=FIGURE_SUFFIXES, writes="a figure") \
        if args.matrix else None
    check_distinct(out, matrix)
    model = load_model(args.model)
    parallel = parallel_from_args(args)
    cluster = load_cluster(args.cluster) if args.cluster else None
    gpn = cluster.gpus_per_node if cluster else DEFAULT_GPUS_PER_NODE
    warn_surprises(parallel, gpn, cluster)
    trace = predict_traffic(model, parallel, cluster=cluster, framework=args.framework)
    print(summary_text(trace, gpn))
    targets = [p for p in (out, matrix) if p is not None]
    if not targets:
        return 0
    from ..atomic import atomic_paths

    with atomic_paths(*targets) as tmps:
        staged = dict(zip(targets, tmps, strict=True))
        if out is not None:
            trace.write(staged[out])
        if matrix is not None:
            _write_matrix(trace, model.name, gpn, staged[matrix], matrix.suffix[1:])
    if out is not None:
        print(f"trace: {out}")
    if matrix is not None:
        print(f"matrix: {matrix}")
    return 0


def _write_matrix(trace: Trace, model_name: str, gpn: int, path: Path, fmt: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..matrix import binned_flows
    from ..plots import comm_matrix

    fig, ax = plt.subplots(figsize=(6, 5))
    try:
        comm_matrix(binned_flows(trace, "direct", MAX_CELLS), x="dst", y="src", hue="bytes", ax=ax,
                    world_size=trace.world_size, gpus_per_node=gpn, max_cells=MAX_CELLS,
                    title=f"{model_name}: bytes (direct)")
        fig.savefig(path, dpi=150, bbox_inches="tight", format=fmt)
    finally:
        plt.close(fig)


def summary_text(trace: Trace, gpus_per_node: int = 8) -> str:
    """The summary ``predict`` prints: bytes per parallelism, per phase, per pair class, and the TP share."""
    from ..analysis.api import bytes_by, pair_classes, tp_share
    from ..units import format_bytes

    def table(df: pd.DataFrame, keys: list[str]) -> list[str]:
        lines = []
        for _, row in df.iterrows():
            name = " / ".join(str(row[k]) for k in keys)
            lines.append(f"  {name:<28} {format_bytes(row['bytes']):>12}  {100 * row['share']:6.2f}%")
        return lines

    out = [f"{trace.meta.get('model', {}).get('name', '?')}: {trace.world_size} ranks, "
           f"{int(trace.volumes(by=[])['calls'].iloc[0]):,} calls ({len(trace):,} rows)",
           "message bytes per parallelism:", *table(bytes_by(trace, ["parallelism"]), ["parallelism"]),
           "message bytes per phase:", *table(bytes_by(trace, ["phase"]), ["phase"]),
           f"wire bytes (ring) per pair class ({gpus_per_node} GPUs per node):",
           *table(pair_classes(trace, gpus_per_node).sort_values("bytes", ascending=False),
                  ["parallelism", "pair_class"]),
           f"TP share of message bytes: {100 * tp_share(trace):.2f}%"]
    return "\n".join(out)
