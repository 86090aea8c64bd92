"""Trace sets of thousands of ranks: parallel ingest on Dask and an out-of-core matrix over the dataset.

    .venv/bin/python benchmarks/bench_scale_ingest.py [--ranks 4096] [--workers 1 2]

1. Synthesizes ``--ranks`` rank files in the layout of the real Kineto traces: gzip copies of PARAM's DLRM
   rank 0 file (``param/dlrm_kineto.tar.gz``, from ``$LLMCOMM_EXTERNAL``), each with its
   ``distributedInfo`` rewritten to its own rank and the world size (``bench_ingest._synthesize``); they
   live in a temporary folder and are deleted afterwards.
2. Ingests them into a dataset serially (``ingest_to_dataset``, no Dask) and with
   ``ingest_to_dataset_parallel`` on a local ``dask.distributed`` cluster of 1 and 2 single-threaded worker
   processes (reached through its scheduler address, as ``--scheduler`` would): wall time, speed-up over
   1 worker, and each worker's peak RSS (VmHWM, imports included) read on the workers afterwards. Each
   dataset is checked to equal the serial one file for file.
3. Builds the direct matrix over the whole dataset, in a fresh process each: out of core
   (``analysis.dataset.dataset_matrix``, one rank file at a time) and in memory
   (``read_trace(dataset).matrix``), with the peak RSS above the process's RSS before the call.

The machine's load average is printed: on a shared machine the speed-up is bounded by the cores free.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _status_bytes(field: str) -> int:
    """A size field of /proc/self/status (``"VmRSS:"``, ``"VmHWM:"``: the peak) in bytes."""
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0


MATRIX_CHILD = inspect.getsource(_status_bytes) + r"""
import json, sys, time
from llmcomm import read_trace
from llmcomm.analysis.dataset import dataset_matrix
mode, path = sys.argv[1], sys.argv[2]
base = _status_bytes("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")
t = time.perf_counter()
m = dataset_matrix(path, "direct") if mode == "dataset" else read_trace(path).matrix("direct")
dt = time.perf_counter() - t
print(json.dumps({"time_s": dt, "peak_bytes": _status_bytes("VmHWM:") - base, "nnz": int(m.nnz),
                  "sum": float(m.sum()), "matrix_bytes": int(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes)}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    os.environ.setdefault("LLMCOMM_EXTERNAL", str(ROOT.parent / "shared" / "external"))
    from bench_ingest import _synthesize
    from dask.distributed import Client, LocalCluster

    from llmcomm import data
    from llmcomm.ingest import ingest_to_dataset
    from llmcomm.ingest.parallel import ingest_to_dataset_parallel

    gib, mb = 2**30, 1e6
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as td:
        tmp = Path(td)
        with tarfile.open(data.path("param/dlrm_kineto.tar.gz")) as tf:
            m = sorted((m for m in tf.getmembers() if m.isfile() and "worker0" in m.name), key=lambda m: m.name)[0]
            template = tmp / "template.json"
            template.write_bytes(tf.extractfile(m).read())
        t = time.perf_counter()
        total = _synthesize(template, tmp / "ranks", args.ranks)
        gz = sum(f.stat().st_size for f in (tmp / "ranks").iterdir())
        print(f"{args.ranks:,} rank files: {total / mb:,.0f} MB JSON ({gz / mb:,.0f} MB gzip), one file "
              f"{template.stat().st_size / mb:.2f} MB; synthesized in {time.perf_counter() - t:.0f} s")
        t = time.perf_counter()
        serial = ingest_to_dataset(tmp / "ranks", tmp / "serial")
        ts = time.perf_counter() - t
        print(f"ingest serial (no Dask)  : {ts:7.1f} s  {total / ts / mb:6.1f} MB/s")
        times = {}
        for w in args.workers:
            with LocalCluster(n_workers=w, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \
                    Client(cl) as client:
                t = time.perf_counter()
                out = ingest_to_dataset_parallel(tmp / "ranks", tmp / f"w{w}", scheduler=cl.scheduler_address)
                times[w] = time.perf_counter() - t
                peaks = client.run(_status_bytes, "VmHWM:")
            same = sorted(p.name for p in out.iterdir()) == sorted(p.name for p in serial.iterdir())
            print(f"ingest Dask {w} worker(s)  : {times[w]:7.1f} s  {total / times[w] / mb:6.1f} MB/s  "
                  f"speed-up over 1 worker {times[min(times)] / times[w]:.2f}x  peak RSS per worker "
                  f"{', '.join(f'{p / gib:.2f}' for p in peaks.values())} GiB  same files as serial: {same}")
        ds_bytes = sum(f.stat().st_size for f in serial.iterdir())
        print(f"dataset: {len(list(serial.iterdir())):,} parquet files, {ds_bytes / mb:.1f} MB")
        for mode in ("dataset", "memory"):
            r = subprocess.run([sys.executable, "-c", MATRIX_CHILD, mode, str(serial)], capture_output=True,
                               text=True, cwd=ROOT, check=False)
            if r.returncode != 0:
                print(f"matrix ({mode}) failed: {r.stderr[-2000:]}")
                continue
            s = json.loads(r.stdout.strip().splitlines()[-1])
            label = "out of core, one rank file at a time" if mode == "dataset" else "in memory (read_trace)"
            print(f"direct matrix, {label:<37}: {s['time_s']:6.1f} s, peak +{s['peak_bytes'] / mb:7.1f} MB "
                  f"(the matrix itself {s['matrix_bytes'] / mb:.1f} MB, {s['nnz']:,} nonzeros, sum {s['sum']:.6g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
