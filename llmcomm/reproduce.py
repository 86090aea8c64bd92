"""Run every notebook through papermill and collect what they write.

``reproduce(profile)`` executes ``notebooks/*.ipynb`` in name order with parameters from
``notebooks/params.yaml`` (section ``defaults`` then the notebook's own section, then the profile's
overrides), writes executed copies under ``build/notebooks/``, figures under ``figures/<notebook>/`` and the
numbers each notebook checks under ``figures/results/<notebook>.json``.

Inside a notebook, :class:`Outputs` is the one way to write a figure or a checked number.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .atomic import write_bytes
from .errors import LLMCommError
from .paths import PROJECT_ROOT

ROOT = PROJECT_ROOT
NOTEBOOKS = ROOT / "notebooks"
PROFILES = ("full", "quick")


class NotebookFailed(LLMCommError, RuntimeError):
    """A notebook raised; the message names the notebook and the failing cell's error."""


def _jsonable(v: Any) -> Any:
    import numpy as np

    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


@dataclass
class Outputs:
    """Where one notebook writes: ``out.figure(fig, "name")``, ``out.check("name", cond, value=...)``,
    ``out.value("name", x)``, then ``out.save()``."""

    notebook: str
    out_dir: str | os.PathLike[str] | None = None  # None: the project's figures/
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.out_dir is None:
            self.out_dir = ROOT / "figures"

    @property
    def figure_dir(self) -> Path:
        return Path(self.out_dir) / self.notebook

    def figure(self, fig: Any, name: str, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
        """Save a matplotlib Figure (or an object with ``.figure``) as PNG and PDF, atomically.

        PDFs carry no creation date, and PNGs no software tag, so unchanged figures are byte-identical."""
        import io

        fig = getattr(fig, "figure", fig)
        paths = []
        for fmt in formats:
            buf = io.BytesIO()
            meta = {"CreationDate": None} if fmt == "pdf" else {"Software": None}
            fig.savefig(buf, format=fmt, metadata=meta)
            p = self.figure_dir / f"{name}.{fmt}"
            if not p.exists() or p.read_bytes() != buf.getvalue():
                write_bytes(p, buf.getvalue())
            paths.append(p)
        self.figures.append(name)
        return paths

    def value(self, name: str, value: Any) -> Any:
        """Record a number that the notebook reports (not a pass/fail check)."""
        self.values[name] = _jsonable(value)
        return value

    def check(self, name: str, condition: bool, value: Any = None, expect: str = "") -> None:
        """Record a numeric check and fail the notebook if it does not hold."""
        ok = bool(condition)
        self.checks[name] = {"passed": ok, "value": _jsonable(value), "expect": expect}
        if not ok:
            raise AssertionError(f"check {name!r} failed: value={value!r} expected {expect}")

    def save(self) -> Path:
        p = Path(self.out_dir) / "results" / f"{self.notebook}.json"
        doc = {"notebook": self.notebook, "checks": self.checks, "values": self.values,
               "figures": sorted(set(self.figures))}
        data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
        if not p.exists() or p.read_bytes() != data:
            write_bytes(p, data)
        return p


def notebook_paths(only: Sequence[str] | None = None) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if only:
        paths = [p for p in paths if any(p.stem.startswith(o) or p.stem == o for o in only)]
    return paths


def notebook_parameters(name: str, profile: str = "full", params_file: Path | None = None) -> dict[str, Any]:
    """Parameters for one notebook: ``defaults`` < the notebook's section < the profile's overrides."""
    if profile not in PROFILES:
        raise LLMCommError(f"profile={profile!r} is not one of {PROFILES}")
    params_file = params_file or NOTEBOOKS / "params.yaml"
    doc = yaml.safe_load(params_file.read_text(encoding="utf-8")) or {}
    section = doc.get(name, {}) or {}
    out = dict(doc.get("defaults", {}) or {})
    out.update({k: v for k, v in section.items() if k not in PROFILES})
    out.update(section.get(profile, {}) or {})
    return out


def reproduce(profile: str = "full", only: Sequence[str] | None = None, out_dir: Path | None = None,
              build_dir: Path | None = None, progress: bool = True) -> list[Path]:
    """Execute notebooks with papermill; raise :class:`NotebookFailed` naming the first failure."""
    import papermill as pm
    from tqdm.auto import tqdm

    out_dir = Path(out_dir or ROOT / "figures").resolve()
    build_dir = Path(build_dir or ROOT / "build" / "notebooks").resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    done = []
    paths = notebook_paths(only)
    if not paths:
        raise LLMCommError(f"no notebook matches {list(only or [])} in {NOTEBOOKS}")
    bar = tqdm(paths, desc="notebooks", unit="nb", disable=not progress)
    for nb in bar:
        bar.set_postfix_str(nb.stem)
        params = notebook_parameters(nb.stem, profile)
        params["out_dir"] = str(out_dir)
        target = build_dir / nb.name
        t0 = time.perf_counter()
        try:
            pm.execute_notebook(str(nb), str(target), parameters=params, cwd=str(NOTEBOOKS),
                                kernel_name="python3", progress_bar=False)
        except pm.PapermillExecutionError as e:
            raise NotebookFailed(
                f"notebook {nb.name} failed in cell {e.exec_count}: {e.ename}: {e.evalue}"
                f" (executed copy: {target})"
            ) from None
        bar.write(f"{nb.stem}: {time.perf_counter() - t0:.1f} s")
        done.append(target)
    return done
