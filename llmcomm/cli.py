"""The ``llmcomm`` command.

``llmcomm models [NAME]``, ``llmcomm clusters [NAME]``, ``llmcomm reproduce``; further subcommands come from
modules that implement ``register(subparsers)`` (``llmcomm.predict.cli``, ``llmcomm.collect.cli``,
``llmcomm.ingest.cli``, ``llmcomm.compare.cli``): a subcommand exists only where its module does, so none is a
placeholder.

Conventions: every option's help states its default; ``--quiet`` silences progress output; ``--debug``
shows the traceback of an unexpected error. Exit status: 0 success, 1 a data or configuration error (the
message names the file, field or rule), 2 a usage error (a malformed option, an output that cannot be
written, a name that matches nothing). Warnings (legal but surprising inputs) print as
``llmcomm: warning: ...`` and do not change the exit status.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .cli_options import add_quiet as add_quiet  # re-exported: subcommands used to import it from here
from .errors import LLMCommError, UsageError

SUBCOMMAND_MODULES = ("llmcomm.predict.cli", "llmcomm.overhead.cli", "llmcomm.collect.cli", "llmcomm.ingest.cli",
                      "llmcomm.compare.cli", "llmcomm.tune.cli", "llmcomm.network.cli",
                      "llmcomm.explore.cli")
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

_RST = re.compile(r":[a-z]+:`~?([^`]+)`|``([^`]+)``|`([^`]+)`")


def plain(text: str) -> str:
    """Text of a docstring without reStructuredText markup (``x``, :func:`x`, `x` -> x), for ``--help``."""
    return _RST.sub(lambda m: next(g for g in m.groups() if g is not None), text)


def first_line(doc: str | None) -> str:
    """The first line of a module docstring, as ``--help`` shows it."""
    return plain((doc or "").strip().splitlines()[0]) if doc else ""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already names its default, or there is
    none to name (a flag, an unset option)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if ("default" in text.lower() or d is None or d is False or d is argparse.SUPPRESS
                or not action.option_strings or isinstance(action, argparse._VersionAction)):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """ArgumentParser with :class:`HelpFormatter` and plain-text descriptions; subcommands inherit it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        if kwargs.get("description"):
            kwargs["description"] = plain(kwargs["description"])
        if kwargs.get("epilog"):
            kwargs["epilog"] = plain(kwargs["epilog"])
        super().__init__(*args, **kwargs)


def _fmt_count(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def _table(head: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    widths = [max(len(str(r[i])) for r in [*rows, head]) for i in range(len(head))]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip())
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _show_fields(d: dict[str, Any], extra: Sequence[tuple[str, Any]] = ()) -> None:
    width = max(len(k) for k in [*d, *(k for k, _ in extra)])
    for k, v in [*d.items(), *extra]:
        print(f"{k:<{width}}  {v}")


def cmd_models(args: argparse.Namespace) -> int:
    from .specs import list_models, load_model

    if args.name:
        m = load_model(args.name)
        extra = [("computed parameters", f"{m.num_parameters():,}")]
        if m.is_moe:
            extra.append(("active parameters", f"{m.num_active_parameters():,}"))
        _show_fields(m.to_dict(), extra)
        return 0
    rows = []
    for name in list_models():
        m = load_model(name)
        pub = m.published_parameters
        err = f"{100 * (m.num_parameters() - pub) / pub:+.2f}%" if pub else "-"
        rows.append((name, "MoE" if m.is_moe else "dense", m.num_layers, m.hidden_size,
                     _fmt_count(m.num_parameters()), _fmt_count(m.num_active_parameters()) if m.is_moe else "",
                     _fmt_count(pub), err))
    _table(("model", "kind", "layers", "hidden", "params", "active", "published", "diff"), rows)
    return 0


_UNITS = (("bandwidth", 1e9, "GB/s per GPU, one direction"), ("flops", 1e12, "TFLOP/s"), ("bytes", 1e9, "GB"))


def _with_unit(field: str, value: Any) -> Any:
    """A cluster field as ``llmcomm clusters NAME`` shows it: bandwidths, FLOP/s and bytes in readable units
    (four significant digits) with the exact value in base units beside it."""
    for suffix, div, unit in _UNITS:
        if field.endswith(suffix) and isinstance(value, (int, float)):
            base = {"bandwidth": "B/s", "flops": "FLOP/s", "bytes": "B"}[suffix]
            return f"{value / div:.4g} {unit} ({value:,.0f} {base})"
    return value


def cmd_clusters(args: argparse.Namespace) -> int:
    from .specs import list_clusters, load_cluster

    if args.name:
        _show_fields({k: _with_unit(k, v) for k, v in load_cluster(args.name).to_dict().items()})
        return 0
    rows = []
    for name in list_clusters():
        c = load_cluster(name)
        rows.append((name, c.gpu, c.gpus_per_node, f"{c.peak_bf16_flops / 1e12:.4g}",
                     f"{c.gpu_memory_bytes / 1e9:.4g}", f"{c.intra_node_bandwidth / 1e9:.4g}",
                     f"{c.inter_node_bandwidth / 1e9:.4g}"))
    _table(("cluster", "gpu", "gpus/node", "bf16 TFLOP/s", "memory GB", "intra GB/s", "inter GB/s"), rows)
    print("bandwidths: per GPU, one direction (intra: NVLink; inter: the NIC)")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from .reproduce import NOTEBOOKS, notebook_paths, reproduce

    if not notebook_paths(args.only or None):  # before reproduce() creates its build folder
        names = ", ".join(p.stem for p in notebook_paths(None))
        raise UsageError(f"--only {' '.join(args.only or [])}: no notebook in {NOTEBOOKS} starts with that; "
                         f"notebooks: {names}")
    reproduce(profile=args.profile, only=args.only or None, out_dir=args.out_dir, progress=not args.quiet)
    return 0


def module_exists(name: str) -> bool:
    """Whether ``name`` can be imported (its parent package may be missing too)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = Parser(prog="llmcomm", description=first_line(__doc__),
               epilog="exit status: 0 done, 1 a data or configuration error, 2 a usage error")
    p.add_argument("--version", action="version", version=f"llmcomm {__version__}")
    p.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    m = sub.add_parser("models", help="list the model catalogue, or show one model",
                       description="List the model catalogue with computed and published parameter counts, or "
                                   "show one model's fields.")
    m.add_argument("name", nargs="?", help="catalogue name or YAML path (default: list all)")
    m.set_defaults(func=cmd_models)
    c = sub.add_parser("clusters", help="list the cluster catalogue, or show one cluster",
                       description="List the cluster catalogue (GPU, GPUs per node, peak FLOP/s, bandwidths), or "
                                   "show one cluster's fields.")
    c.add_argument("name", nargs="?", help="catalogue name or YAML path (default: list all)")
    c.set_defaults(func=cmd_clusters)
    r = sub.add_parser("reproduce", help="run every notebook through papermill and write figures/",
                       description="Run the notebooks through papermill; figures and checked numbers go to "
                                   "figures/ (the quick profile: build/figures-quick/).")
    r.add_argument("--profile", choices=("full", "quick"), default="full",
                   help="parameter profile: full (the committed figures) or quick (small, for tests)")
    r.add_argument("--only", nargs="*", metavar="PREFIX", help="notebook name prefixes to run (default: all)")
    r.add_argument("--out-dir", type=Path, default=None,
                   help="folder for figures and results (default: figures/ for the full profile, "
                        "build/figures-quick/ for quick, so it never overwrites the committed figures)")
    add_quiet(r)
    r.set_defaults(func=cmd_reproduce)
    for mod in SUBCOMMAND_MODULES:
        if module_exists(mod):
            importlib.import_module(mod).register(sub)
    for sp in sub.choices.values():  # --debug after the subcommand too (kept from before it if unset)
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an unexpected error")
    return p


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    print(f"llmcomm: warning: {message}", file=file or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return its exit status (module docstring)."""
    args = build_parser().parse_args(argv)  # a usage error exits here with status 2
    debug = bool(getattr(args, "debug", False))
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            return int(args.func(args) or 0)
        except UsageError as e:
            print(f"llmcomm {args.command}: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        except LLMCommError as e:
            print(f"llmcomm {args.command}: error: {e}", file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            print(f"llmcomm {args.command}: interrupted", file=sys.stderr)
            return 130
        except Exception as e:
            if debug:
                raise
            print(f"llmcomm {args.command}: unexpected error: {type(e).__name__}: {e}\n"
                  "run with --debug for the traceback", file=sys.stderr)
            return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
