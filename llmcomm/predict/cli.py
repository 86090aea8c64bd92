"""``llmcomm predict MODEL --tp .. --pp ..``: predict one iteration's traffic and print a summary.

Outputs (``--out`` trace, ``--matrix`` figure) are checked before any work and published together: both
appear, or neither.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from ..cli_options import add_cluster, add_model, add_parallel, add_quiet, parallel_from_args
from ..output_paths import FIGURE_SUFFIXES, check_distinct, check_file
from ..specs import Cluster, ParallelConfig, load_cluster, load_model
from ..vocab import FRAMEWORKS

if TYPE_CHECKING:
    import pandas as pd

    from ..trace import Trace

DEFAULT_GPUS_PER_NODE = 8  # without --cluster
MAX_CELLS = 512  # cells per side of the --matrix figure (ranks binned above it)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("predict", help="predict one training iteration's communication",
                              description=__doc__.splitlines()[0])
    add_model(p)
    add_parallel(p, extras=("vpp", "sp", "micro_batch", "global_batch", "seq_len", "recompute",
                            "distributed_optimizer", "fsdp", "pipe_partitioned", "schedule", "cp_comm_type")
                 + ("fp8", "fp8_recipe", "tp_comm_overlap", "tp_comm_overlap_fp8_buf"))  # acc-fp8wire: FP8 wire bytes
    add_cluster(p, required=False, default_text=f"{DEFAULT_GPUS_PER_NODE} GPUs per node; the cluster sets GPUs "
                                                "per node")
    p.add_argument("--framework", default="megatron", choices=FRAMEWORKS,
                   help="whose calls to predict: Megatron-LM's or torch-native (torchtitan-style) training")
    p.add_argument("--out", default=None, help="write the trace to this .parquet file (default: none)")
    p.add_argument("--matrix", default=None,
                   help=f"write the communication-matrix figure ({', '.join(FIGURE_SUFFIXES)}; default: none)")
    add_quiet(p, "no summary; only the names of the files written")
    p.set_defaults(func=run)


def warn_surprises(parallel: ParallelConfig, gpus_per_node: int, cluster: Cluster | None,
                   trace: Trace | None = None) -> None:
    """Warn about a legal but surprising configuration: TP (or TP x CP) groups that cross node boundaries,
    whose per-layer collectives then use the inter-node network (Megatron-LM keeps TP within a node). Groups
    wider than a node always cross; narrower ones cross when ``gpus_per_node`` is not a multiple of their size
    (tp 6 on 8-GPU nodes). With ``trace`` the warning gives the share of TP wire bytes that cross nodes
    (:func:`llmcomm.analysis.pair_classes`), else the share of TP groups that do."""
    from ..layout import Layout

    where = cluster.name if cluster else f"{gpus_per_node}-GPU nodes (no --cluster)"
    for dim, size in (("tp", parallel.tp), ("tp*cp", parallel.tp * parallel.cp)):
        if size > gpus_per_node:
            warnings.warn(f"{dim}={size} spans {-(-size // gpus_per_node)} nodes of {where}: its per-layer "
                          "collectives cross the inter-node network (Megatron-LM keeps TP within a node)",
                          stacklevel=2)
            return
    if parallel.tp == 1 or gpus_per_node % parallel.tp == 0 or parallel.world_size <= parallel.tp:
        return
    groups = Layout(parallel, gpus_per_node).groups("tp") // gpus_per_node
    crossing = int((groups.min(axis=1) != groups.max(axis=1)).sum())
    if not crossing:
        return
    share = f"{crossing} of {len(groups)} TP groups"
    if trace is not None:
        from ..analysis.api import pair_classes

        pc = pair_classes(trace, gpus_per_node)
        tp = pc[pc["parallelism"] == "tp"]
        total = float(tp["bytes"].sum())
        inter = float(tp.loc[tp["pair_class"] == "inter-node", "bytes"].sum())
        if total > 0:
            share += f", {100 * inter / total:.0f}% of TP wire bytes"
    warnings.warn(f"tp={parallel.tp} does not divide the {gpus_per_node} GPUs per node of {where}: {share} cross "
                  "a node boundary, so their per-layer collectives use the inter-node network", stacklevel=2)


def run(args: argparse.Namespace) -> int:
    from ..bounds import check_predict_size
    from . import predict_traffic

    out = check_file(args.out, option="--out", suffixes=(".parquet",), writes="a parquet trace") \
        if args.out is not None else None
    matrix = check_file(args.matrix, option="--matrix", suffixes=FIGURE_SUFFIXES, writes="a figure") \
        if args.matrix is not None else None
    check_distinct(out, matrix)
    model = load_model(args.model)
    parallel = parallel_from_args(args)
    check_predict_size(parallel.world_size, what="--tp x --pp x --dp x --cp")
    cluster = load_cluster(args.cluster) if args.cluster else None
    gpn = cluster.gpus_per_node if cluster else DEFAULT_GPUS_PER_NODE
    trace = predict_traffic(model, parallel, cluster=cluster, framework=args.framework)
    warn_surprises(parallel, gpn, cluster, trace)
    if not args.quiet:
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
