"""``llmcomm compare TRACE [--model NAME --tp .. --pp .. --dp ..]``: a trace against its prediction."""

from __future__ import annotations

import argparse

REPORT_SUFFIXES = (".md", ".html")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare", help="compare a measured trace with the prediction for its configuration, call by call",
        description="Compare a trace (parquet written by llmcomm, or any file llmcomm ingest reads) with the "
                    "prediction for its model and parallel configuration. Model and configuration come from "
                    "the trace's metadata unless given here.")
    p.add_argument("trace", help="a trace file (.parquet) or a file/folder that llmcomm ingest reads, a curated "
                   "trace name (gpt_tp2pp2dp2) or an external-data name (aicb/A100_example.csv)")
    p.add_argument("--model", default=None, help="catalogue name or YAML path (default: the trace's metadata)")
    for dim in ("tp", "pp", "dp", "ep", "cp", "vpp"):
        p.add_argument(f"--{dim}", type=int, default=None, help=f"{dim} size (default: the trace's metadata)")
    p.add_argument("--sp", action="store_true", default=None, help="sequence parallelism (default: metadata)")
    p.add_argument("--micro-batch", type=int, default=None, help="micro-batch size (default: metadata)")
    p.add_argument("--global-batch", type=int, default=None, help="global batch (default: metadata)")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: metadata or model)")
    p.add_argument("--distributed-optimizer", action="store_true", default=None,
                   help="Megatron's distributed optimizer (default: metadata)")
    p.add_argument("--framework", default="megatron", choices=("megatron", "torch"),
                   help="what issued the calls: Megatron-LM or torch's own parallel APIs (default: megatron)")
    p.add_argument("--iteration", type=int, default=None, help="iteration to compare (default: the last)")
    p.add_argument("--top", type=int, default=10, help="one-sided call groups to print (default: 10)")
    p.add_argument("--out", default=None, help="write the report to this .md or .html file (default: none)")
    p.set_defaults(func=run)


PARALLEL_OPTIONS = ("tp", "pp", "dp", "ep", "cp", "vpp", "sp", "micro_batch", "global_batch", "seq_len",
                    "distributed_optimizer")  # argparse destinations named as ParallelConfig fields


def _parallel_overrides(args: argparse.Namespace) -> dict:
    return {name: getattr(args, name) for name in PARALLEL_OPTIONS if getattr(args, name) is not None}


def run(args: argparse.Namespace) -> int:
    from ..output_paths import check_file
    from ..specs import ParallelConfig
    from . import compare, load_measured

    out = check_file(args.out, option="--out", suffixes=REPORT_SUFFIXES, writes="a Markdown or HTML report") \
        if args.out else None
    trace = load_measured(args.trace)
    overrides = _parallel_overrides(args)
    parallel = None
    if overrides:
        base = dict(trace.meta.get("parallel") or {})
        base.update(overrides)
        if overrides.keys() & {"tp", "pp", "dp", "micro_batch"} and "global_batch" not in overrides:
            base.pop("global_batch", None)
        if base.get("vpp", 1) > 1:
            base["schedule"] = "interleaved"
        parallel = ParallelConfig.from_dict(base, origin="the command line")
    c = compare(trace, model=args.model, parallel=parallel, framework=args.framework, iteration=args.iteration)
    print(f"{trace.meta['trace_name']}: iteration {c.iteration}, {len(c.ranks)} rank(s), model {c.meta['model']}, "
          f"{c.meta['parallel']}, framework {args.framework}")
    print(f"calls in the same order on {c.ordered_ranks} of {len(c.ranks)} ranks")
    for line in c.verdict_lines():
        print("  " + line)
    top = c.largest_differences(args.top)
    if len(top):
        print(f"largest one-sided calls (of {len(c.one_sided)} groups):")
        for what in top["what"]:
            print("  " + what)
    if out is not None:
        from ..atomic import write_bytes

        write_bytes(out, (c.to_html() if out.suffix == ".html" else c.to_markdown()).encode())
        print(f"report: {out}")
    return 0
