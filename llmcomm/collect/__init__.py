"""Real traces from real runs: the recorder, small GPT and MoE workloads, their parallelization with torch's
own APIs, the launcher and the curated runs.

Importing this package does not import torch; ``record`` and ``Recorder`` load it on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Recorder", "record"]


def __getattr__(name: str) -> Any:
    if name in ("record", "Recorder"):
        from . import record as _record_module

        return getattr(_record_module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
