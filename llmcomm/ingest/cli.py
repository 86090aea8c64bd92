"""``llmcomm ingest PATH... --out OUT``: real traces into the events table.

``OUT`` ending in ``.parquet`` is one trace file; any other name (or ``--dataset``) a partitioned dataset
folder with one file per rank, streamed with memory bounded by about one input file. ``--bandwidth`` reads
nccl-tests / vTrain / AICB timings into a bandwidth table instead (``.csv`` or ``.parquet``). Output is
written to a temporary name and renamed, so a failure leaves nothing under ``OUT``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..atomic import atomic_path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ingest", help="import Kineto / execution-trace / AICB files (or bandwidth logs)",
                              description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", help="files, folders or tar archives")
    p.add_argument("--out", required=True, help="trace.parquet, a dataset folder, or (with --bandwidth) .csv")
    for dim in ("tp", "pp", "dp", "ep", "cp"):
        p.add_argument(f"--{dim}", type=int, default=None, help=f"{dim} degree (tags unnamed groups by ranks)")
    p.add_argument("--rank", type=int, default=None, help="rank of a single file that does not say it")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--dataset", action="store_true", help="write a partitioned dataset even for a .parquet name")
    p.add_argument("--force", action="store_true", help="replace an existing dataset folder")
    p.add_argument("--bandwidth", action="store_true", help="read bandwidth measurements instead of traces")
    p.add_argument("--op", default=None, help="collective of nccl-tests logs whose op cannot be inferred")
    p.set_defaults(func=run)


def _parallel(args: argparse.Namespace):  # noqa: ANN202
    from ..specs import ParallelConfig

    dims = {d: getattr(args, d) for d in ("tp", "pp", "dp", "ep", "cp") if getattr(args, d) is not None}
    if not dims:
        return None
    return ParallelConfig(**dims)


def run(args: argparse.Namespace) -> int:
    from . import ingest_bandwidth, ingest_to_dataset, ingest_trace

    out = Path(args.out)
    if args.bandwidth:
        df = ingest_bandwidth(args.paths, op=args.op)
        with atomic_path(out) as tmp:
            if out.suffix == ".parquet":
                df.to_parquet(tmp, index=False)
            else:
                df.to_csv(tmp, index=False)
        print(f"{out}: {len(df)} bandwidth rows from {df['source'].nunique()} file(s)")
        return 0
    parallel = _parallel(args)
    if args.dataset or out.suffix != ".parquet":
        ingest_to_dataset(args.paths, out, parallel, rank=args.rank, gpus_per_node=args.gpus_per_node,
                          overwrite=args.force)
        print(f"{out}: dataset written")
        return 0
    trace = ingest_trace(args.paths, parallel, rank=args.rank, gpus_per_node=args.gpus_per_node)
    trace.write(out)
    print(f"{out}: {len(trace)} events from {len(trace.meta['ranks'])} rank(s), formats {trace.meta['formats']}")
    return 0
