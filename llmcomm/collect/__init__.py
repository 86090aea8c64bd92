"""Real traces from real runs: the recorder, small GPT and MoE workloads, their parallelization with torch's
own APIs, the launcher and the curated runs.

Importing this package does not import torch; ``record`` and ``Recorder`` load it on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Recorder", "record"]


def __getattr__(name: str) -> Any:
    if name in ("record", "Recorder"):  # the function and class of the submodule of the same name
        record_module = importlib.import_module(f"{__name__}.record")
        return getattr(record_module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
