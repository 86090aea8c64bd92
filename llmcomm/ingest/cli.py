"""``llmcomm ingest PATH... --out OUT``: real traces into the events table.

``OUT`` ending in ``.parquet`` is one trace file; a name without an extension (or ``--dataset``) a
partitioned dataset folder with one file per rank, streamed with memory bounded by about one input file;
``--workers N`` reads the rank files in parallel on Dask (``--scheduler ADDRESS``: an existing cluster), see
:mod:`llmcomm.ingest.parallel`.
``--bandwidth`` reads nccl-tests / vTrain / AICB timings into a bandwidth table instead (``.csv`` or
``.parquet``). Output is written to a temporary name and renamed, so a failure leaves nothing under ``OUT``.

Parallel dimensions not given are taken from the files where they say (``dp = world / (tp·pp·cp)`` from a
Kineto trace's world size; an AICB workload's group sizes); a configuration that contradicts a file's
world size is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..atomic import atomic_path

BANDWIDTH_SUFFIXES = (".csv", ".parquet")


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..cli_options import add_dims, add_quiet

    p = subparsers.add_parser("ingest", help="import Kineto / execution-trace / AICB files (or bandwidth logs)",
                              description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[2])
    p.add_argument("paths", nargs="+", help="files, folders or tar archives")
    p.add_argument("--out", required=True,
                   help="NAME.parquet (one trace), a folder name without extension (a dataset), or with "
                        "--bandwidth NAME.csv / NAME.parquet")
    add_dims(p, default_text={d: ("world size / (tp x pp x cp) from the files, else 1; used to tag unnamed "
                                  "groups by their ranks" if d == "dp" else "from the files, else 1; used to tag "
                                  "unnamed groups by their ranks") for d in ("tp", "pp", "dp", "ep", "cp")})
    p.add_argument("--rank", type=int, default=None,
                   help="rank of a single file that does not say it (default: the file's own)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node, for node placement")
    p.add_argument("--dataset", action="store_true", help="write a partitioned dataset even for a .parquet name")
    p.add_argument("--force", action="store_true", help="replace an existing dataset folder")
    p.add_argument("--workers", type=int, default=None,
                   help="read rank files in parallel on N local Dask worker processes (needs llmcomm[scale]; "
                        "default: serially in this process)")
    p.add_argument("--scheduler", default=None,
                   help="address of an existing dask.distributed scheduler to read rank files on (default: none)")
    p.add_argument("--bandwidth", action="store_true", help="read bandwidth measurements instead of traces")
    p.add_argument("--op", default=None,
                   help="collective of nccl-tests logs whose op cannot be inferred (default: from the log)")
    add_quiet(p)
    p.set_defaults(func=run)


def _dims(args: argparse.Namespace) -> dict[str, int] | None:
    """The parallel dimensions given on the command line (the rest come from the files)."""
    from ..errors import UsageError

    dims = {d: getattr(args, d) for d in ("tp", "pp", "dp", "ep", "cp") if getattr(args, d) is not None}
    for d, v in dims.items():
        if v < 1:
            raise UsageError(f"--{d} {v}: a parallel degree is a positive integer")
    return dims or None


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..output_paths import check_file, check_folder
    from . import ingest_bandwidth, ingest_to_dataset, ingest_trace
    from .sources import is_tar

    if args.rank is not None and args.rank < 0:
        raise UsageError(f"--rank {args.rank}: a rank is a non-negative integer")
    if args.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node {args.gpus_per_node}: must be a positive integer")
    many = len(args.paths) > 1 or any(Path(p).is_dir() or is_tar(Path(p)) for p in args.paths)
    progress = many and not args.quiet and sys.stderr.isatty()  # a bar of files read, for multi-file ingest
    if args.bandwidth:
        out = check_file(args.out, option="--out", suffixes=BANDWIDTH_SUFFIXES, writes="a bandwidth table")
        df = ingest_bandwidth(args.paths, op=args.op)
        with atomic_path(out) as tmp:
            if out.suffix == ".parquet":
                df.to_parquet(tmp, index=False)
            else:
                df.to_csv(tmp, index=False)
        print(f"{out}: {len(df)} bandwidth rows from {df['source'].nunique()} file(s)")
        return 0
    dims = _dims(args)
    raw = str(args.out)
    dataset = args.dataset or not raw.endswith(".parquet")
    engine = args.workers is not None or args.scheduler is not None
    if engine and not dataset:
        raise UsageError(f"--out {raw}: --workers/--scheduler read rank files into a dataset; add --dataset or "
                         "name a folder")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers {args.workers}: must be a positive integer")
    if dataset:
        out = check_folder(args.out, option="--out", force=args.force, writes="a dataset")
        if engine:
            from .parallel import ingest_to_dataset_parallel

            ingest_to_dataset_parallel(args.paths, out, dims, rank=args.rank, gpus_per_node=args.gpus_per_node,
                                       overwrite=args.force, workers=args.workers, scheduler=args.scheduler)
        else:
            ingest_to_dataset(args.paths, out, dims, rank=args.rank, gpus_per_node=args.gpus_per_node,
                              overwrite=args.force, progress=progress)
        print(f"{out}: dataset written")
        return 0
    out = check_file(args.out, option="--out", suffixes=(".parquet",), writes="a parquet trace")
    trace = ingest_trace(args.paths, dims, rank=args.rank, gpus_per_node=args.gpus_per_node, progress=progress)
    trace.write(out)
    formats = ", ".join(trace.meta["formats"])
    print(f"{out}: {len(trace)} events from {len(trace.meta['ranks'])} rank(s), format {formats}")
    return 0
