"""``llmcomm tune MODEL --gpus N --batch B --seq S --cluster NAME``: rank parallel configurations.

Prints the top configurations with their predicted time, its 90 % interval (``lo_s``–``hi_s``:
:mod:`llmcomm.overhead.interval`, the relative residuals of the single-node calibration), the breakdown
(seconds per term of the iteration-time formulation) and memory per GPU; ``--explain`` says, in a sentence per term, why the runner-up loses
(:func:`llmcomm.tune.report.explain`); ``--constraints cp=1,fp8=off,max_tp=8`` narrows the space
(:mod:`llmcomm.tune.constraints`), and a value the cost model refuses is named with the rule that refuses it.

The work is bounded before it starts (:mod:`llmcomm.bounds`: at most ``MAX_TUNE_GPUS`` GPUs and
``MAX_TUNE_CANDIDATES`` candidates), and a search that runs longer than a second says so on the terminal.
When a restriction (``--tp 3``) leaves no candidate, the message names it and the values that would work.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..cli_options import add_cluster, add_model, add_quiet, fraction, int_list, positive_int

if TYPE_CHECKING:
    from ..specs import ModelSpec
    from .space import SearchSpace

HELP = "rank parallel configurations of a model on a cluster by predicted iteration time"
DESCRIPTION = ("Enumerate every valid tp/cp/pp (with uneven first/last stages)/dp/ep/etp/micro-batch/vpp/SP/"
               "recompute/distributed-optimizer/attention-backend configuration the cost model can rank, drop those "
               "that do not fit in GPU memory, and rank the rest by predicted iteration time (llmcomm.overhead).")
BREAKDOWN = ("forward_s", "backward_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "bubble_s",
             "dp_comm_s", "optimizer_s")  # every term of llmcomm.overhead.iteration's Breakdown
INTERVAL = ("total_s_lo", "total_s_hi")  # the cost model's 90 % interval of total_s (llmcomm.overhead.interval)
RESTRICTIONS = ("tp", "pp", "ep", "micro_batch", "vpp")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tune", help=HELP, description=DESCRIPTION)
    add_model(p)
    p.add_argument("--gpus", type=positive_int, required=True, help="number of GPUs")
    add_cluster(p, required=True)
    p.add_argument("--batch", "--global-batch", dest="global_batch", type=positive_int, required=True,
                   help="global batch in sequences")
    p.add_argument("--seq", "--seq-len", dest="seq_len", type=positive_int, default=None,
                   help="sequence length (default: the model's)")
    p.add_argument("--constraints", default=None, metavar="LIST",
                   help="narrow the space, comma-separated NAME=VALUE: a dimension (tp=8, cp=1, recompute=full, "
                        "sp=on, tp=4/8), max_NAME/min_NAME (max_tp=8), fp8=on/off, tpo/ogr/opg=on/off (default: the whole space)")
    p.add_argument("--explain", action="store_true",
                   help="say, a sentence per term, why the runner-up loses to the best configuration")
    p.add_argument("--top", type=positive_int, default=10, help="rows to print")
    p.add_argument("--no-prune", action="store_true", help="evaluate every fitting candidate (exhaustive)")
    p.add_argument("--memory-fraction", type=fraction, default=0.9,
                   help="share of GPU memory a configuration may use, in (0, 1]")
    for dim in RESTRICTIONS:
        flag = dim.replace("_", "-")
        p.add_argument(f"--{flag}", dest=dim, type=int_list, default=None,
                       help=f"only these {flag} values, comma-separated (default: all valid)")
    add_quiet(p, "no progress line; print the table only")
    p.set_defaults(func=run)


@contextmanager
def progress_line(label: str, enabled: bool, after_s: float = 1.0) -> Iterator[None]:
    """After ``after_s`` seconds, show ``label`` and the elapsed time on stderr, updated twice a second, until
    the block ends (nothing at all for a block that ends sooner, or when not ``enabled``)."""
    if not enabled:
        yield
        return
    done = threading.Event()
    t0 = time.perf_counter()
    shown = [False]

    def tick() -> None:
        if done.wait(after_s):
            return
        while not done.is_set():
            sys.stderr.write(f"\r{label} ... {time.perf_counter() - t0:.0f} s")
            sys.stderr.flush()
            shown[0] = True
            done.wait(0.5)

    th = threading.Thread(target=tick, daemon=True)
    th.start()
    try:
        yield
    finally:
        done.set()
        th.join()
        if shown[0]:
            sys.stderr.write(f"\r{label}: done in {time.perf_counter() - t0:.1f} s\n")
            sys.stderr.flush()


def _shown(v: Any) -> str:
    """A dimension's value as the command line writes it (``fp8=None`` is ``off``, booleans ``on``/``off``)."""
    import numpy as np

    if v is None:
        return "off"
    if isinstance(v, (bool, np.bool_)):
        return "on" if v else "off"
    return str(v)


def _empty_because(model: ModelSpec, gpus: int, global_batch: int, seq_len: int | None, space: SearchSpace,
                   given: dict[str, str]) -> str | None:
    """Which of the restrictions ``given`` (``{dimension: how the user wrote it}``, e.g. ``{"cp": "--constraints
    cp=3"}``) left no candidate: those whose removal alone (the dimension back to the default space's values)
    gives some, with the values that would work, or ``None`` when the space is empty without any of them too."""
    import dataclasses

    from .space import SearchSpace, enumerate_candidates

    if not given:
        return None
    default = SearchSpace()
    cleared: dict[str, Any] = {d: getattr(default, d) for d in given}
    if not len(enumerate_candidates(model, gpus, global_batch, seq_len, dataclasses.replace(space, **cleared))):
        return None
    parts = []
    for d, how in given.items():
        one: dict[str, Any] = {d: getattr(default, d)}
        c = enumerate_candidates(model, gpus, global_batch, seq_len, dataclasses.replace(space, **one))
        if len(c):
            values = sorted({_shown(v) for v in c[d]}, key=lambda x: (len(x), x))  # numbers in numeric order
            parts.append(f"{how} (values that work here: {', '.join(values[:16])}"
                         f"{' ...' if len(values) > 16 else ''})")
    if not parts:
        return "the restrictions " + ", ".join(given.values()) + " together"
    return " or ".join(parts)


def _restrictions(args: argparse.Namespace, before: SearchSpace, space: SearchSpace) -> dict[str, str]:
    """``{dimension: how the user wrote it}`` for each dimension the options narrowed: ``--tp 3`` for a flag,
    ``--constraints cp=3`` for a constraint (the values it left, ``max_``/``min_`` included)."""
    from .space import EXPLICIT

    out = {d: f"--{d.replace('_', '-')} {','.join(map(str, getattr(args, d)))}" for d in RESTRICTIONS
           if getattr(args, d) is not None}
    for d in (*EXPLICIT, "uneven", "fp8_param_gather", "tp_comm_overlap", "overlap_grad_reduce",
              "overlap_param_gather", "overlap_p2p_comm", "moe_a2a_overlap"):
        if getattr(space, d) != getattr(before, d):
            out[d] = f"--constraints {d}={'/'.join(_shown(v) for v in getattr(space, d))}"
    return out


def _seconds(x: float) -> str:
    """Three decimals, a float's rounding residue below zero (a term of ``-3e-17`` s) printed as ``0.000``."""
    text = f"{x:.3f}"
    return "0.000" if text == "-0.000" else text


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from ..bounds import check_tune_candidates, check_tune_gpus
    from ..errors import ConfigError
    from ..specs import load_cluster, load_model
    from .search import tune
    from .space import SearchSpace, enumerate_candidates

    check_tune_gpus(args.gpus)
    model = load_model(args.model)
    cluster = load_cluster(args.cluster)
    from .constraints import parse
    from .space import REFUSABLE, refusals

    space = SearchSpace(**{d: getattr(args, d) for d in RESTRICTIONS if getattr(args, d) is not None})
    flagged = space
    if args.constraints:
        before, space = space, parse(args.constraints, args.gpus, space)
        named = {f for f in REFUSABLE if getattr(space, f) != getattr(before, f)}  # what the constraints narrowed
        refused = {k: v for k, v in refusals(model, args.gpus, args.global_batch, args.seq_len, space).items()
                   if k.split("=")[0] in named}
        if refused:
            raise ConfigError(f"--constraints {args.constraints}: " + "; ".join(f"{k} is refused by {v}"
                                                                                for k, v in refused.items()))
    show = not args.quiet and sys.stderr.isatty()
    with progress_line(f"tune: enumerating configurations of {model.name} on {args.gpus:,} GPUs", show):
        n = len(enumerate_candidates(model, args.gpus, args.global_batch, args.seq_len, space))
    check_tune_candidates(n)
    if n == 0:
        why = _empty_because(model, args.gpus, args.global_batch, args.seq_len, space,
                             _restrictions(args, flagged, space))
        if why is not None:
            raise ConfigError(f"{model.name} on {args.gpus:,} GPUs with global batch {args.global_batch}: no "
                              f"configuration is left by {why}")
    with progress_line(f"tune: ranking {n:,} candidates", show):
        r = tune(model, args.gpus, cluster, args.global_batch, args.seq_len, space=space,
                 prune=not args.no_prune, memory_fraction=args.memory_fraction,
                 exact_top=max(args.top, 2))  # the rows printed and the runner-up of --explain, exact
    s = r.stats
    if not args.quiet:
        print(f"{r.model.name} on {r.gpus:,} × {r.cluster.gpu} ({r.cluster.name}), global batch {r.global_batch}, "
              f"sequence {r.meta['seq_len']}")
        print(f"{s['enumerated']:,} candidates, {s['evaluated']:,} evaluated, {s['pruned']:,} pruned "
              f"({', '.join(f'{k}: {v:,}' for k, v in s['pruned_by_rule'].items())}) in {s['wall_s']:.2f} s")
    from .report import explain, label

    head = r.table.head(args.top)
    top = pd.DataFrame({"config": [label(x) for _, x in head.iterrows()], "time_s": head["total_s"],
                        "lo_s": head[INTERVAL[0]], "hi_s": head[INTERVAL[1]],
                        **{c.removesuffix("_s"): head[c] for c in BREAKDOWN},
                        "memory_GB": (head["total_bytes"] / 1e9).round(1), "tflops": head["tflops_per_gpu"]})
    if not args.quiet:
        print("predicted seconds per iteration (lo_s-hi_s: the cost model's 90% interval, from its single-node "
              "calibration residuals) and per term (llmcomm.overhead.iteration_times), memory per GPU:")
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 80):
        print(top.to_string(index=False, float_format=_seconds))
    if args.explain:
        if len(r.table) < 2:
            print("\nonly one configuration fits: there is no runner-up to explain")
        else:
            print(f"\nwhy {label(r.table.iloc[1])} (runner-up) loses to {label(r.best)}:")
            for sentence in explain(r.table.iloc[0], r.table.iloc[1]):
                print(f"  {sentence}")
    return 0
