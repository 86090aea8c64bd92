"""Run every notebook through papermill and collect what they write.

``reproduce(profile)`` executes ``notebooks/*.ipynb`` in name order. Each notebook's defaults are its
``parameters`` cell (the one place they are set; the paired ``notebooks/NN_name.py`` is its jupytext source);
``notebooks/params.yaml`` holds only the ``quick`` profile's overrides that keep the test run fast. The full
profile writes figures under ``figures/<notebook>/`` and the numbers each notebook checks under
``figures/results/<notebook>.json``; the quick profile writes under ``build/figures-quick/`` so that it never
overwrites the committed figures. Executed copies go to ``build/notebooks/`` (``build/notebooks-quick/``), or
``<out_dir>/executed/`` for another output folder. A notebook's figures and results appear together when it
has run to the end, or not at all (also on Ctrl-C): it writes into a staging folder that is moved into place.

Inside a notebook, :class:`Outputs` is the one way to write a figure or a checked number, and
:func:`data_file` the way to find a file of the project's ``data/`` folder from any working directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .atomic import write_bytes
from .errors import ConfigError, LLMCommError
from .paths import PROJECT_ROOT
from .stable_bytes import figure_bytes, json_bytes, jsonable

ROOT = PROJECT_ROOT
NOTEBOOKS = ROOT / "notebooks"
PROFILES = ("full", "quick")
FIGURES = ROOT / "figures"


def default_out_dir(profile: str) -> Path:
    """Where a profile writes figures: ``figures/`` (committed) for full, ``build/figures-quick/`` else."""
    return FIGURES if profile == "full" else ROOT / "build" / f"figures-{profile}"


def data_file(relative: str | os.PathLike[str]) -> Path:
    """A file of the project's ``data/`` folder (``"traces/gpt_tp4.parquet"``), independent of the
    working directory; absolute paths are returned unchanged."""
    from .paths import data_dir

    p = Path(relative)
    return p if p.is_absolute() else data_dir() / p


class NotebookFailed(LLMCommError, RuntimeError):
    """A notebook raised; the message names the notebook and the failing cell's error."""


@dataclass
class Outputs:
    """Where one notebook writes: ``out.figure(fig, "name")``, ``out.check("name", cond, value=...)``,
    ``out.value("name", x)``, then ``out.save()``."""

    notebook: str
    out_dir: str | os.PathLike[str] | None = None  # None: the committed figures/ folder
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir) if self.out_dir is not None else FIGURES

    @property
    def root(self) -> Path:
        """The folder this notebook's figures and results go under (``out_dir``, else ``figures/``)."""
        return Path(self.out_dir) if self.out_dir is not None else FIGURES

    @property
    def figure_dir(self) -> Path:
        return self.root / self.notebook

    def say(self, text: str) -> None:
        """Show a result sentence (Markdown, built by the notebook from its computed values)."""
        try:
            from IPython.display import Markdown, display

            display(Markdown(text))
        except ImportError:  # pragma: no cover - IPython ships with the notebook dependencies
            print(text)

    def figure(self, fig: Any, name: str, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
        """Save a matplotlib Figure (or an object with ``.figure``) as PNG and PDF, atomically, with
        :func:`llmcomm.stable_bytes.figure_bytes` (no dates or version tags, PDF coordinates to 0.001 pt), so an
        unchanged figure is byte-identical on any machine."""
        fig = getattr(fig, "figure", fig)
        paths = []
        for fmt in formats:
            data = figure_bytes(fig, fmt)
            p = self.figure_dir / f"{name}.{fmt}"
            if not p.exists() or p.read_bytes() != data:
                write_bytes(p, data)
            paths.append(p)
        self.figures.append(name)
        return paths

    def value(self, name: str, value: Any) -> Any:
        """Record a number that the notebook reports (not a pass/fail check); floats are written with
        :func:`llmcomm.stable_bytes.rounded`'s six significant digits."""
        self.values[name] = jsonable(value)
        return value

    def check(self, name: str, condition: bool, value: Any = None, expect: str = "") -> None:
        """Record a numeric check and fail the notebook if it does not hold."""
        ok = bool(condition)
        self.checks[name] = {"passed": ok, "value": jsonable(value), "expect": expect}
        if not ok:
            raise AssertionError(f"check {name!r} failed: value={value!r} expected {expect}")

    def save(self) -> Path:
        p = self.root / "results" / f"{self.notebook}.json"
        doc = {"notebook": self.notebook, "checks": self.checks, "values": self.values,
               "figures": sorted(set(self.figures))}
        data = json_bytes(doc)
        if not p.exists() or p.read_bytes() != data:
            write_bytes(p, data)
        return p


def notebook_paths(only: Sequence[str] | None = None) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if only:
        paths = [p for p in paths if any(p.stem.startswith(o) or p.stem == o for o in only)]
    return paths


def notebook_parameters(name: str, profile: str = "full", params_file: Path | None = None) -> dict[str, Any]:
    """The overrides of one notebook's parameters for ``profile`` (``params.yaml``: ``name: {quick: {...}}``).

    The defaults are the notebook's ``parameters`` cell; the full profile runs them unchanged, so any key of
    a section other than a profile name is refused (defaults are set in one place)."""
    if profile not in PROFILES:
        raise ConfigError(f"profile={profile!r} is not one of {PROFILES}")
    params_file = params_file or NOTEBOOKS / "params.yaml"
    doc = yaml.safe_load(params_file.read_text(encoding="utf-8")) or {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{params_file}: expected a mapping of notebook name -> {{quick: {{...}}}}")
    section = doc.get(name) or {}
    if not isinstance(section, dict) or set(section) - set(PROFILES):
        extra = sorted(set(section) - set(PROFILES)) if isinstance(section, dict) else section
        raise ConfigError(f"{params_file}: {name}: keys {extra} are not a profile {PROFILES}; a notebook's "
                          "defaults belong in its parameters cell, params.yaml holds only profile overrides")
    return dict(section.get(profile) or {})


KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]  # ipykernel's "running over TCP without encryption" warning:
# the kernel listens on 127.0.0.1 for this one run; papermill offers no other transport


def check_out_dir(out_dir: Path, option: str = "--out-dir") -> None:
    """Refuse an output folder that is an existing file, or whose parent does not exist, before any notebook
    runs (:class:`~llmcomm.errors.UsageError`)."""
    from .errors import UsageError

    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{option} {out_dir}: is an existing file; figures and results go into a folder")
    parent = out_dir.parent
    if not out_dir.exists() and not parent.is_dir():
        raise UsageError(f"{option} {out_dir}: folder {parent} does not exist (create it first)")


def default_build_dir(profile: str, out_dir: Path) -> Path:
    """Where executed notebooks go: ``build/notebooks/`` (``build/notebooks-quick/``) for the profile's own
    output folder, else ``<out_dir>/executed/``, so that a run into another folder never replaces the executed
    copies of the default one."""
    if out_dir.resolve() == default_out_dir(profile).resolve():
        return ROOT / "build" / ("notebooks" if profile == "full" else f"notebooks-{profile}")
    return out_dir / "executed"


@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) until the block ends, so that a publication of renames is not cut in half."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[Any] = []
    old = signal.signal(signal.SIGINT, lambda *a: caught.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if caught:
            raise KeyboardInterrupt


def _publish(stage: Path, out_dir: Path, name: str) -> None:
    """Move one notebook's staged outputs into ``out_dir``: its figure folder replaces ``out_dir/<name>`` by
    one rename (files whose bytes did not change keep the old file and its time stamp; files the notebook no
    longer writes go), then its results JSON replaces ``out_dir/results/<name>.json``. Ctrl-C waits until both
    are in place."""
    new_figs, new_res = stage / name, stage / "results" / f"{name}.json"
    dest_figs, dest_res = out_dir / name, out_dir / "results" / f"{name}.json"
    with _deferred_interrupt():
        if new_figs.is_dir():
            if dest_figs.is_dir():
                for f in new_figs.iterdir():
                    old = dest_figs / f.name
                    if old.is_file() and f.is_file() and old.read_bytes() == f.read_bytes():
                        os.replace(old, f)
                trash = stage / f".old-{name}"
                os.replace(dest_figs, trash)
            os.replace(new_figs, dest_figs)
        if new_res.is_file():
            dest_res.parent.mkdir(parents=True, exist_ok=True)
            if dest_res.is_file() and dest_res.read_bytes() == new_res.read_bytes():
                new_res.unlink()
            else:
                os.replace(new_res, dest_res)


def reproduce(profile: str = "full", only: Sequence[str] | None = None, out_dir: Path | None = None,
              build_dir: Path | None = None, progress: bool = True) -> list[Path]:
    """Execute notebooks with papermill; raise :class:`NotebookFailed` naming the first failure.

    ``out_dir`` defaults to :func:`default_out_dir` of the profile, ``build_dir`` (executed copies) to
    :func:`default_build_dir`. Each notebook writes into a staging folder inside ``out_dir``; only when it has
    run to the end are its figures and results moved into place together (:func:`_publish`), so a failure or a
    Ctrl-C leaves the previous outputs as they were and no partial set. The kernel runs in the caller's working
    directory: notebooks find their files through the package, not through relative paths."""
    import papermill as pm
    from tqdm.auto import tqdm

    paths = notebook_paths(only)
    if not paths:
        raise LLMCommError(f"no notebook matches {list(only or [])} in {NOTEBOOKS}")
    overrides = {nb.stem: notebook_parameters(nb.stem, profile) for nb in paths}  # a bad params.yaml fails first
    out_dir = Path(out_dir or default_out_dir(profile)).resolve()
    check_out_dir(out_dir)
    build_dir = Path(build_dir or default_build_dir(profile, out_dir)).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    build_dir.mkdir(parents=True, exist_ok=True)
    done = []
    bar = tqdm(paths, desc="notebooks", unit="nb", disable=not progress)
    for nb in bar:
        bar.set_postfix_str(nb.stem)
        stage = Path(tempfile.mkdtemp(prefix=f".staging-{nb.stem}-", dir=out_dir))
        try:
            params = {**overrides[nb.stem], "out_dir": str(stage)}
            target = build_dir / nb.name
            staged_nb = stage / nb.name
            t0 = time.perf_counter()
            try:
                pm.execute_notebook(str(nb), str(staged_nb), parameters=params, kernel_name="python3",
                                    progress_bar=False, extra_arguments=KERNEL_ARGUMENTS)
            except pm.PapermillExecutionError as e:
                if staged_nb.is_file():
                    os.replace(staged_nb, target)
                raise NotebookFailed(
                    f"notebook {nb.name} failed in cell {e.exec_count}: {e.ename}: {e.evalue}"
                    f" (executed copy: {target}; outputs left as they were)"
                ) from None
            _publish(stage, out_dir, nb.stem)
            os.replace(staged_nb, target)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        bar.write(f"{nb.stem}: {time.perf_counter() - t0:.1f} s")
        done.append(target)
    return done
