"""Write a file under a temporary name in its own folder, then rename it into place: a reader never sees a
half-written file, and a failure leaves nothing under the target name.

Permissions: the temporary file ``tempfile`` creates is private (mode 0600, a folder 0700); before it is
renamed into place it gets the mode of a file the user creates with ``open()`` (``0666 & ~umask``: 0644
under the usual umask 022; a folder ``0777 & ~umask``: 0755), so traces, datasets and figures can be shared.

:func:`atomic_paths` publishes several outputs of one command together: each is written under its own
temporary name, and only when all are written are they renamed into place, so a failure leaves none of them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def current_umask() -> int:
    """The process umask: from ``/proc/self/status`` where Linux states it, else by setting it and restoring
    it at once (which briefly changes it for other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode(directory: bool = False) -> int:
    """Mode of a new file (``0o666 & ~umask``) or folder (``0o777 & ~umask``) as the user would create it."""
    return (0o777 if directory else 0o666) & ~current_umask()


def make_public(path: str | os.PathLike[str], directory: bool = False) -> None:
    """Give ``path`` (a temporary file or folder from ``tempfile``) the mode :func:`default_mode` says."""
    os.chmod(path, default_mode(directory))


def temp_dir_beside(path: str | os.PathLike[str]) -> Path:
    """A new empty folder beside ``path`` (``.NAME.XXXX.tmp``) with a folder's default mode, for building a
    dataset folder that is then renamed to ``path``."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    make_public(tmp, directory=True)
    return tmp


def _temp_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def _publish(tmp: Path, path: Path) -> None:
    if tmp.exists():  # a writer may have replaced the file: set the mode on what is there now
        make_public(tmp, directory=tmp.is_dir())
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on a clean exit rename it to ``path``, else delete it."""
    path = Path(path)
    tmp = _temp_beside(path)
    try:
        yield tmp
        _publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_paths(*paths: str | os.PathLike[str]) -> Iterator[list[Path]]:
    """Yield one temporary path per target; on a clean exit rename them all into place, else delete them
    all: the outputs of one command appear together or not at all. (The renames are one after another;
    a crash between two of them is the only window in which some but not all are in place.)"""
    targets = [Path(p) for p in paths]
    tmps: list[Path] = []
    try:
        for p in targets:
            tmps.append(_temp_beside(p))
        yield tmps
        for tmp, p in zip(tmps, targets, strict=True):
            _publish(tmp, p)
    except BaseException:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """``path.write_bytes(data)``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path`` to fill; on a clean exit it becomes ``path`` (an
    existing ``path`` is moved aside first and deleted after, when ``overwrite``), else it is deleted. A
    reader never sees a half-filled folder, and a failure leaves ``path`` as it was. The folder gets a
    folder's default mode (:func:`default_mode`).

    Raises :class:`FileExistsError` when ``path`` exists and ``overwrite`` is false."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(path)
    try:
        yield tmp
        if path.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, trash / "old")
            os.replace(tmp, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
