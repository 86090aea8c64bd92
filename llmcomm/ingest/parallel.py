"""Many rank files at once: ingest into a dataset and map analyses over its rank files, on Dask or serially.

:func:`map_tasks` runs ``fn(item)`` for every item and returns the results in item order:

* ``workers=None`` and no ``scheduler``: serially in this process (no Dask needed);
* ``workers=N``: on a local ``dask.distributed`` cluster of ``N`` single-threaded worker *processes*
  (parsing JSON holds the GIL, so threads would not help), started for the call and closed after it;
* ``scheduler="tcp://host:8786"``: on an existing ``dask.distributed`` cluster, used as it is. Its workers
  must import ``llmcomm`` and see the same file system (the inputs and the folder beside ``--out``).

Dask is an optional extra (``pip install llmcomm[scale]``); without it ``workers=N`` falls back to the
serial path (with a warning), and a ``scheduler`` address is a :class:`~llmcomm.errors.ConfigError`.

:func:`ingest_to_dataset_parallel` writes the same dataset as :func:`llmcomm.ingest.ingest_to_dataset`
(file names, tables, per-file metadata): every input file is one task that parses it and writes its
``rank-NNNNN.parquet`` into a temporary folder beside ``out``; after all tasks succeeded, two files
claiming one rank are refused and the folder is renamed into place, so a failure leaves nothing under
``out``. Each worker holds about one input file in memory.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..atomic import atomic_dir
from ..errors import ConfigError, TraceFormatError
from ..paths import PROJECT_ROOT
from .sources import input_files

if TYPE_CHECKING:
    from . import ParallelLike

T = TypeVar("T")
R = TypeVar("R")


def dask_available() -> bool:
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        return False
    return True


CONNECT_TIMEOUT_S = 10  # seconds to wait for an existing scheduler (dask's own default is 30)


def probe_scheduler(address: str) -> None:
    """Fail fast, naming ``address``, when nothing listens at a ``tcp://host:port`` scheduler address (a
    refused connection is known at once; dask would retry for its whole timeout)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if parts.scheme not in ("tcp", "") or parts.hostname is None:
        return  # tls://, inproc://, ...: left to dask
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"scheduler {address}: not a host:port address") from None
    if port is None:
        return
    try:
        with socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise ConfigError(f"scheduler {address}: cannot connect ({e.strerror or type(e).__name__}); is a dask "
                          "scheduler running there?") from None


def map_tasks(fn: Callable[[T], R], items: Sequence[T], *, workers: int | None = None,
              scheduler: str | None = None, on_result: Callable[[R], None] | None = None) -> list[R]:
    """``[fn(x) for x in items]``, serially or on Dask (see the module doc). The first task that raises
    re-raises its exception here (a :class:`TraceFormatError` stays one).

    ``on_result``: each result is handed to it in item order as soon as it is ready and then dropped, so
    this process holds one result at a time (on Dask, finished ones wait on the workers); returns ``[]``."""
    items = list(items)
    if workers is not None and workers < 1:
        raise ConfigError(f"workers={workers} must be >= 1")
    if scheduler is None and workers is None:
        return _serial(fn, items, on_result)
    if not dask_available():
        if scheduler is not None:
            raise ConfigError(f"scheduler={scheduler!r} needs dask.distributed (pip install llmcomm[scale])")
        warnings.warn("dask.distributed is not installed (pip install llmcomm[scale]); running serially",
                      stacklevel=2)
        return _serial(fn, items, on_result)
    if not items:
        return []
    from dask.distributed import Client, LocalCluster

    if scheduler is not None:
        probe_scheduler(scheduler)
        try:
            client = Client(scheduler, set_as_default=False, timeout=f"{CONNECT_TIMEOUT_S}s")
        except (OSError, TimeoutError) as e:
            raise ConfigError(f"scheduler {scheduler}: no dask scheduler answered within {CONNECT_TIMEOUT_S} s "
                              f"({type(e).__name__})") from None
        with client:
            return _run(client, fn, items, on_result)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)}
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                      env=env) as cluster, Client(cluster, set_as_default=False) as client:
        return _run(client, fn, items, on_result)


def _serial(fn: Callable[[T], R], items: list[T], on_result: Callable[[R], None] | None) -> list[R]:
    if on_result is None:
        return [fn(x) for x in items]
    for x in items:
        on_result(fn(x))
    return []


def _run(client: Any, fn: Callable[[T], R], items: list[T], on_result: Callable[[R], None] | None) -> list[R]:
    futures = client.map(fn, items, pure=False)
    try:
        if on_result is None:
            return client.gather(futures, errors="raise")
        for fut in futures:  # item order; finished results wait on the workers, not here
            result = fut.result()
            fut.release()
            on_result(result)
            del result
        return []
    finally:
        client.cancel(futures)


# ---------------------------------------------------------------------------------------------- ingest
def _ingest_file(task: tuple[int, str], tmp: str, parallel: Any, rank: int | None,
                 gpus_per_node: int) -> list[dict[str, Any]]:
    """Parse one input file (a tar archive: each member) and write each table into ``tmp``; returns what
    was written: ``rank, file, name, rows`` per table."""
    from . import iter_rank_tables, write_rank_file

    index, path = task
    written = []
    for k, (_src, fmt, table, meta) in enumerate(iter_rank_tables([path], parallel, rank, gpus_per_node)):
        r = meta.get("rank")
        name = f"rank-{r:05d}.parquet" if r is not None else (f"part-{index:05d}.parquet" if k == 0
                                                                else f"part-{index:05d}-{k:04d}.parquet")
        write_rank_file(Path(tmp) / name, fmt, table, meta)
        written.append({"rank": r, "file": meta["file"], "name": name, "rows": table.num_rows})
    return written


def ingest_to_dataset_parallel(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                               out: str | os.PathLike[str], parallel: ParallelLike = None, *,
                               rank: int | None = None, gpus_per_node: int = 8, overwrite: bool = False,
                               workers: int | None = None, scheduler: str | None = None) -> Path:
    """:func:`llmcomm.ingest.ingest_to_dataset` with one task per input file on :func:`map_tasks`."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out = Path(out)
    if out.exists() and not overwrite:
        raise TraceFormatError(f"{out}: already exists (pass overwrite=True to replace it)")
    files = list(input_files(paths))  # the order iter_sources reads them; a tar archive is one input
    if not files:
        raise TraceFormatError(f"{paths}: no input files")
    with atomic_dir(out, overwrite=overwrite) as tmp:
        fn = partial(_ingest_file, tmp=str(tmp), parallel=parallel, rank=rank, gpus_per_node=gpus_per_node)
        results = map_tasks(fn, [(i, str(f)) for i, f in enumerate(files)], workers=workers, scheduler=scheduler)
        file_of_rank: dict[int, str] = {}
        tables = 0
        for written in results:
            for w in written:
                tables += 1
                if w["rank"] is None:
                    continue
                if w["rank"] in file_of_rank:
                    raise TraceFormatError(f"{w['file']}: field 'rank': rank {w['rank']} is already claimed "
                                           f"by {file_of_rank[w['rank']]}")
                file_of_rank[w["rank"]] = w["file"]
        if tables == 0:
            raise TraceFormatError(f"{paths}: no input files")
    return out

