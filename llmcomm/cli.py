"""The ``llmcomm`` command.

``llmcomm models [NAME]``, ``llmcomm reproduce``; further subcommands come from modules that implement
``register(subparsers)`` (``llmcomm.predict.cli``, ``llmcomm.collect.cli``, ``llmcomm.ingest.cli``): a
subcommand exists only where its module does, so none is a placeholder.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from .errors import LLMCommError

SUBCOMMAND_MODULES = ("llmcomm.predict.cli", "llmcomm.collect.cli", "llmcomm.ingest.cli", "llmcomm.compare.cli")


def _fmt_count(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def cmd_models(args: argparse.Namespace) -> int:
    from .specs import list_models, load_model

    if args.name:
        m = load_model(args.name)
        width = max(len(k) for k in m.to_dict())
        for k, v in m.to_dict().items():
            print(f"{k:<{width}}  {v}")
        print(f"{'computed parameters':<{width}}  {m.num_parameters():,}")
        if m.is_moe:
            print(f"{'active parameters':<{width}}  {m.num_active_parameters():,}")
        return 0
    rows = []
    for name in list_models():
        m = load_model(name)
        pub = m.published_parameters
        err = f"{100 * (m.num_parameters() - pub) / pub:+.2f}%" if pub else "-"
        rows.append((name, "MoE" if m.is_moe else "dense", m.num_layers, m.hidden_size,
                     _fmt_count(m.num_parameters()), _fmt_count(m.num_active_parameters()) if m.is_moe else "",
                     _fmt_count(pub), err))
    head = ("model", "kind", "layers", "hidden", "params", "active", "published", "diff")
    widths = [max(len(str(r[i])) for r in [*rows, head]) for i in range(len(head))]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from .reproduce import reproduce

    reproduce(profile=args.profile, only=args.only or None)
    return 0


def module_exists(name: str) -> bool:
    """Whether ``name`` can be imported (its parent package may be missing too)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmcomm", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("models", help="list the model catalogue, or show one model")
    m.add_argument("name", nargs="?", help="catalogue name or YAML path")
    m.set_defaults(func=cmd_models)
    r = sub.add_parser("reproduce", help="run every notebook through papermill and write figures/")
    r.add_argument("--profile", choices=("full", "quick"), default="full")
    r.add_argument("--only", nargs="*", help="notebook name prefixes to run (default: all)")
    r.set_defaults(func=cmd_reproduce)
    for mod in SUBCOMMAND_MODULES:
        if module_exists(mod):
            importlib.import_module(mod).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LLMCommError as e:
        print(f"llmcomm: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
