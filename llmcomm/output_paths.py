"""Output paths of a command, checked before any work: a command that cannot write its result says so at once,
in one line naming the option and the rule, instead of failing after minutes of work (or writing one output
of two).

Rules: the folder must exist and accept a new file; a file output must not be an existing folder and its
name must end in a suffix of the format written (``--out pred.csv`` for a parquet trace is refused rather
than written as parquet under a CSV name); a dataset folder must not be an existing file, has no file
extension, and replaces an existing folder only when asked (``--force``). Violations raise
:class:`~llmcomm.errors.UsageError` (exit status 2 from the ``llmcomm`` command).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .errors import UsageError

FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


def _check_folder(path: Path, option: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise UsageError(f"{option} {path}: folder {parent} does not exist (create it first)")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: {parent} is not a folder")
    try:  # try it: os.access says yes to root even on a read-only file system
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot write in folder {parent} ({e.strerror or e})") from None


def check_file(path: str | os.PathLike[str], *, option: str, suffixes: Sequence[str], writes: str) -> Path:
    """Check an output file name (module docstring); return it as a Path."""
    raw = os.fspath(path)
    p = Path(raw)
    if not raw.strip():
        raise UsageError(f"{option} {raw!r}: an empty name; give a file name ending in {' or '.join(suffixes)}")
    if p.is_dir():
        raise UsageError(f"{option} {raw}: is a folder; give a file name ending in {' or '.join(suffixes)}")
    if raw.endswith(("/", os.sep)):
        raise UsageError(f"{option} {raw}: ends in a path separator, so it names a folder (which "
                         f"{'exists as a file' if p.exists() else 'does not exist'}); give a file name ending in "
                         f"{' or '.join(suffixes)}")
    if p.suffix.lower() not in suffixes:
        raise UsageError(f"{option} {raw}: this writes {writes}, so the name must end in {' or '.join(suffixes)}")
    _check_folder(p, option)
    return p


def check_folder(path: str | os.PathLike[str], *, option: str, force: bool, writes: str) -> Path:
    """Check an output folder name (module docstring); return it as a Path."""
    raw = os.fspath(path)
    if not raw.strip():
        raise UsageError(f"{option} {raw!r}: an empty name; give the name of a folder to create")
    p = Path(raw.rstrip("/" + os.sep) or raw)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{option} {raw}: is an existing file; {writes} is a folder")
    if p.suffix and p.suffix.lower() != ".parquet":
        raise UsageError(f"{option} {raw}: {writes} is a folder, and a folder name with the extension "
                         f"{p.suffix!r} looks like a file name; drop the extension")
    if p.exists() and not force:
        raise UsageError(f"{option} {raw}: already exists; pass --force to replace it")
    _check_folder(p, option)
    return p


def check_distinct(*paths: Path | None) -> None:
    """Two outputs of one command must not be the same file."""
    seen: dict[Path, Path] = {}
    for p in paths:
        if p is None:
            continue
        key = p.resolve()
        if key in seen:
            raise UsageError(f"{p}: given for two outputs of one command")
        seen[key] = p
