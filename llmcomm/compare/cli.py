"""``llmcomm compare TRACE [--model NAME --tp .. --pp .. --dp ..]``: a trace against its prediction."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..cli_options import (
    FROM_METADATA,
    add_model,
    add_parallel,
    add_quiet,
    nonnegative_int,
    parallel_with_overrides,
)
from ..vocab import FRAMEWORKS

if TYPE_CHECKING:
    from . import Comparison

REPORT_SUFFIXES = (".md", ".html")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare", help="compare a measured trace with the prediction for its configuration, call by call",
        description="Compare a trace (parquet written by llmcomm, or any file llmcomm ingest reads) with the "
                    "prediction for its model and parallel configuration. Model and configuration come from "
                    "the trace's metadata unless given here.")
    p.add_argument("trace", help="a trace file (.parquet) or a file/folder that llmcomm ingest reads, a curated "
                   "trace name (gpt_tp2pp2dp2) or an external-data name (aicb/A100_example.csv)")
    add_model(p, flag=True, required=False, default_text=FROM_METADATA)
    add_parallel(p, dims=("tp", "pp", "dp", "ep", "cp"), from_metadata=True,
                 extras=("vpp", "sp", "micro_batch", "global_batch", "seq_len", "distributed_optimizer"))
    p.add_argument("--framework", default=None, choices=FRAMEWORKS,
                   help="what issued the calls: Megatron-LM or torch's own parallel APIs (default: the trace's "
                        "metadata: torch for a trace llmcomm collect wrote, else megatron)")
    p.add_argument("--iteration", type=nonnegative_int, default=None, help="iteration to compare (default: the last)")
    p.add_argument("--top", type=nonnegative_int, default=10, help="one-sided call groups to print")
    p.add_argument("--out", default=None, help="write the report to this .md or .html file (default: none)")
    add_quiet(p, "print the verdicts only")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..output_paths import check_file
    from . import compare, load_measured, trace_framework

    out = check_file(args.out, option="--out", suffixes=REPORT_SUFFIXES, writes="a Markdown or HTML report") \
        if args.out is not None else None
    trace = load_measured(args.trace)
    parallel = parallel_with_overrides(trace.meta.get("parallel"), args)
    framework = args.framework or trace_framework(trace.meta) or "megatron"
    c = compare(trace, model=args.model, parallel=parallel, framework=framework, iteration=args.iteration)
    if args.quiet:
        for line in c.verdict_lines():
            print(line)
        return _write_report(c, out)
    how = "--framework" if args.framework else ("the trace's metadata" if trace_framework(trace.meta) else
                                                 "default")
    print(f"{trace.meta['trace_name']}: iteration {c.iteration}, {len(c.ranks)} rank(s), model {c.meta['model']}, "
          f"{c.meta['parallel']}, framework {framework} ({how})")
    print(f"calls in the same order on {c.ordered_ranks} of {len(c.ranks)} ranks")
    for line in c.verdict_lines():
        print("  " + line)
    top = c.largest_differences(args.top)
    if len(top):
        print(f"largest one-sided calls (of {len(c.one_sided)} groups):")
        for what in top["what"]:
            print("  " + what)
    return _write_report(c, out)


def _write_report(c: Comparison, out: Path | None) -> int:
    if out is not None:
        from ..atomic import write_bytes

        write_bytes(out, (c.to_html() if out.suffix == ".html" else c.to_markdown()).encode())
        print(f"report: {out}")
    return 0
