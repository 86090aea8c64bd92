"""Shared fixtures. ``external(name)`` gives a verified copy of a third-party file through the data
manifest (llmcomm.data); a missing file fails the test loudly, it never skips."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("MPLBACKEND", "Agg")  # llmcomm.plots leaves the backend to its caller

if "LLMCOMM_EXTERNAL" not in os.environ and (ROOT.parent / "shared" / "external").is_dir():
    os.environ["LLMCOMM_EXTERNAL"] = str(ROOT.parent / "shared" / "external")


@pytest.fixture(scope="session")
def external() -> Callable[[str], Path]:
    from llmcomm import data

    return data.path


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT
