"""``llmcomm ingest PATH... --out OUT``: real traces into the events table.

``OUT`` ending in ``.parquet`` is one trace file; any other name (or ``--dataset``) a partitioned dataset
folder with one file per rank, streamed with memory bounded by about one input file; ``--workers N`` reads
the rank files in parallel on Dask (``--scheduler ADDRESS``: an existing cluster), see
:mod:`llmcomm.ingest.parallel`. ``--bandwidth`` reads
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
    p.add_argument("--workers", type=int, default=None,
                   help="read rank files in parallel on N local Dask worker processes (needs llmcomm[scale])")
    p.add_argument("--scheduler", default=None,
                   help="address of an existing dask.distributed scheduler to read rank files on")
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
    dataset = args.dataset or out.suffix != ".parquet"
    if (args.workers is not None or args.scheduler is not None) and not dataset:
        from ..errors import ConfigError

        raise ConfigError(f"{out}: --workers/--scheduler read rank files into a dataset; add --dataset or "
                          "name a folder")
    if args.workers is not None or args.scheduler is not None:
        from .parallel import ingest_to_dataset_parallel

        ingest_to_dataset_parallel(args.paths, out, parallel, rank=args.rank, gpus_per_node=args.gpus_per_node,
                                   overwrite=args.force, workers=args.workers, scheduler=args.scheduler)
        print(f"{out}: dataset written")
        return 0
    if dataset:
        ingest_to_dataset(args.paths, out, parallel, rank=args.rank, gpus_per_node=args.gpus_per_node,
                          overwrite=args.force)
        print(f"{out}: dataset written")
        return 0
    trace = ingest_trace(args.paths, parallel, rank=args.rank, gpus_per_node=args.gpus_per_node)
    trace.write(out)
    print(f"{out}: {len(trace)} events from {len(trace.meta['ranks'])} rank(s), formats {trace.meta['formats']}")
    return 0
