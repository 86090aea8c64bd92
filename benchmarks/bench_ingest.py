"""Kineto ingest speed and memory against Holistic Trace Analysis (HTA), on the same files, in one run.

    .venv/bin/python benchmarks/bench_ingest.py [--ranks 1000] [--repeat 3]

Part 1 parses the real Kineto traces (HTA's 2×A100 DDP trace and PARAM's 8 DLRM rank files) with
``llmcomm.ingest.ingest_trace`` and with HTA's ``parse_trace_dataframe`` (its per-rank parser, JSON
backend), each tool in its own fresh process: throughput in MB/s (uncompressed JSON) and events/s
(``traceEvents`` entries), and peak memory of the parse (peak RSS after resetting the high-water mark
through ``/proc/self/clear_refs``, minus RSS before). Note the tools do different work on the same bytes:
HTA builds a DataFrame of every event, llmcomm keeps the communication calls.

Part 2 streams a folder of ``--ranks`` rank files (copies of a DLRM rank file with the rank rewritten,
gzip) into a partitioned dataset with ``ingest_to_dataset`` and reports throughput and peak memory, which
should stay near one file's worth, then checks that ``read_trace`` reads all ranks back.

Needs HolisticTraceAnalysis (``pip install -e .[bench]``) and the external files (``$LLMCOMM_EXTERNAL``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, sys, time
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0
tool, files, repeat, mode = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if tool == "hta":
    import logging
    logging.disable(logging.CRITICAL)
    from hta.common.trace_parser import ParserConfig, parse_trace_dataframe
    cfg = ParserConfig()
    def run():
        return sum(len(parse_trace_dataframe(f, cfg)[1]) for f in files)
else:
    from llmcomm.ingest import ingest_trace
    def run():
        return len(ingest_trace(files))
if mode == "mem":  # a fresh process: modules imported, nothing parsed yet
    base = rss("VmRSS:")
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        n = run()
        peak = rss("VmHWM:") - base
    except OSError:
        import tracemalloc
        tracemalloc.start(); n = run(); peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
    print(json.dumps({"rows": n, "peak_bytes": peak}))
    raise SystemExit
run()  # warm-up: imports, caches
times = []
for _ in range(repeat):
    t = time.perf_counter(); n = run(); times.append(time.perf_counter() - t)
print(json.dumps({"time_s": min(times), "rows": n}))
"""


def _child(tool: str, files: list[str], repeat: int) -> dict:
    """Time (best of ``repeat`` after a warm-up) in one fresh process, peak memory in another."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out: dict = {}
    for mode in ("time", "mem"):
        r = subprocess.run([sys.executable, "-c", CHILD, tool, json.dumps(files), str(repeat), mode],
                           capture_output=True, text=True, env=env, cwd=ROOT, check=False)
        if r.returncode != 0:
            raise SystemExit(f"{tool} run failed:\n{r.stderr[-3000:]}")
        out.update(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def _json_stats(files: list[str]) -> tuple[int, int]:
    """Uncompressed bytes and number of traceEvents over the files (counted once, independently)."""
    total, events = 0, 0
    for f in files:
        raw = Path(f).read_bytes()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        total += len(data)
        events += len(json.loads(data)["traceEvents"])
    return total, events


def _inputs(tmp: Path) -> dict[str, list[str]]:
    from llmcomm import data

    hta_file = str(data.path("hta/nccl_data.json.gz"))
    dlrm = tmp / "dlrm"
    with tarfile.open(data.path("param/dlrm_kineto.tar.gz")) as tf:
        for m in tf.getmembers():
            if m.isfile() and ".." not in m.name and not m.name.startswith("/"):
                dlrm.mkdir(exist_ok=True)
                (dlrm / Path(m.name).name).write_bytes(tf.extractfile(m).read())
    return {"HTA DDP rank 0 (json.gz)": [hta_file], "DLRM 8 ranks (json)": sorted(str(p) for p in dlrm.iterdir())}


def _synthesize(template: Path, out: Path, ranks: int) -> int:
    """``ranks`` gzip copies of a rank file, each claiming its own rank (the file's own bytes with
    ``distributedInfo`` rewritten, so the profiler's layout is kept); returns total uncompressed bytes."""
    raw = template.read_bytes()

    def with_rank(r: int) -> bytes:
        def sub(m: re.Match) -> bytes:
            block = re.sub(rb'"rank": \d+', b'"rank": %d' % r, m.group(0))
            return re.sub(rb'"world_size": \d+', b'"world_size": %d' % ranks, block)

        return re.sub(rb'"distributedInfo": \{[^}]*\}', sub, raw, count=1)

    out.mkdir(parents=True)
    total = 0
    for r in range(ranks):
        blob = with_rank(r)
        total += len(blob)
        (out / f"rank{r:05d}.pt.trace.json.gz").write_bytes(gzip.compress(blob, compresslevel=1))
    return total


STREAM_CHILD = r"""
import json, sys, time
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
from llmcomm import read_trace
from llmcomm.ingest import ingest_to_dataset
src, out = sys.argv[1], sys.argv[2]
base = rss("VmRSS:")
try:
    open("/proc/self/clear_refs", "w").write("5")
except OSError:
    pass
t = time.perf_counter()
ingest_to_dataset(src, out)
dt = time.perf_counter() - t
peak = rss("VmHWM:") - base
tr = read_trace(out)
print(json.dumps({"time_s": dt, "peak_bytes": peak, "ranks": int(tr.events["rank"].nunique()), "rows": len(tr)}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1000, help="rank files to synthesize for the streaming part")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("LLMCOMM_EXTERNAL", str(ROOT.parent / "shared" / "external"))
    mb = 1e6
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        print(f"{'input':<28}{'tool':<9}{'MB/s':>9}{'events/s':>13}{'peak MB':>10}")
        ok = True
        for label, files in _inputs(tmp).items():
            nbytes, nevents = _json_stats(files)
            res = {tool: _child(tool, files, args.repeat) for tool in ("llmcomm", "hta")}
            for tool, r in res.items():
                print(f"{label:<28}{tool:<9}{nbytes / r['time_s'] / mb:>9.1f}{nevents / r['time_s']:>13,.0f}"
                      f"{r['peak_bytes'] / mb:>10.1f}")
            speed = res["hta"]["time_s"] / res["llmcomm"]["time_s"]
            mem = res["llmcomm"]["peak_bytes"] / max(res["hta"]["peak_bytes"], 1)
            print(f"{'':<28}ratio: {speed:.2f}x HTA's speed (target >= 3), {mem:.2f} of its peak memory "
                  f"(target <= 0.5)")
            ok &= speed >= 3 and mem <= 0.5
        if args.ranks:
            template = sorted((tmp / "dlrm").iterdir())[0]
            src = tmp / "many"
            total = _synthesize(template, src, args.ranks)
            r = subprocess.run([sys.executable, "-c", STREAM_CHILD, str(src), str(tmp / "dataset")],
                               capture_output=True, text=True, cwd=ROOT, check=False)
            if r.returncode != 0:
                raise SystemExit(f"streaming run failed:\n{r.stderr[-3000:]}")
            s = json.loads(r.stdout.strip().splitlines()[-1])
            one = template.stat().st_size
            print(f"\nstreaming {args.ranks} rank files ({total / mb:.0f} MB JSON) into a dataset: "
                  f"{total / s['time_s'] / mb:.1f} MB/s, {args.ranks / s['time_s']:.0f} files/s, "
                  f"peak {s['peak_bytes'] / mb:.1f} MB (one file: {one / mb:.2f} MB JSON), "
                  f"read back {s['ranks']} ranks / {s['rows']} events")
            ok &= s["ranks"] == args.ranks
        print("\nall targets met" if ok else "\nsome target NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
