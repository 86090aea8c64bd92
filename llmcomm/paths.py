"""Where the project's folders are: the one place that knows where ``data/`` lives."""

from __future__ import annotations

import os
import stat
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # the checkout: data/, notebooks/, figures/
ENV_DATA = "LLMCOMM_DATA"


def data_dir() -> Path:
    """The project's ``data/`` folder (model and cluster catalogues, curated traces, the external-data
    manifest); ``$LLMCOMM_DATA`` overrides it."""
    return Path(_data_root())


_DEFAULT_DATA = str(PROJECT_ROOT / "data")


def _data_root() -> str:
    return os.environ.get(ENV_DATA) or _DEFAULT_DATA


def data_stamp(relative: str) -> tuple[str, int]:
    """``(path, st_mtime_ns)`` of the file ``relative`` (``"calibration/x.json"``) under :func:`data_dir`, the
    stamp ``-1`` where it is not a file: what a cache of a file's parsed contents keys on. Strings and one
    ``os.stat``, no ``Path`` objects: callers on the one-configuration path of ``iteration_time`` ask it several
    times per call."""
    path = os.path.join(_data_root(), relative)
    try:
        st = os.stat(path)
    except OSError:
        return path, -1
    return path, st.st_mtime_ns if stat.S_ISREG(st.st_mode) else -1
