"""Real traces from real runs: the recorder, small GPT and MoE workloads, their parallelization with torch's
own APIs, the launcher and the curated runs.

Importing this package does not import torch: its modules (``record``, ``model``, ``moe``, ``parallelize``,
``train``, ``launch``, ``curated``...) and ``Recorder`` load on first use. The recorder function is
``llmcomm.record`` (``llmcomm.collect.record.record``); ``llmcomm.collect.record`` is its module.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Recorder"]


def __getattr__(name: str) -> Any:
    if name == "Recorder":
        return importlib.import_module(f"{__name__}.record").Recorder
    try:
        return importlib.import_module(f"{__name__}.{name}")  # a submodule, loaded on first use
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
