"""Analyses over traces: every function takes a :class:`~llmcomm.trace.Trace` (or its events) first and
returns a tidy DataFrame or a number (Holistic Trace Analysis style), grouped by what it studies:

* :class:`TraceAnalysis` — one entry point over one trace (HTA's ``TraceAnalysis``): volumes, pairs,
  temporal pattern, repeatability and all-to-all matrices with the trace given once;
* :mod:`.volumes` — bytes per parallelism / phase, shares, the TP share (finding F2);
* :mod:`.pairs` — bytes per pair class (intra- / inter-node), bytes outside every group (finding F1);
* :mod:`.temporal` — time series, autocorrelation, periods (finding F3);
* :mod:`.repeatability` — calls numbered in issue order and followed across iterations: identical
  sequences, message sizes, duration spread (finding F3);
* :mod:`.alltoall` — all-to-all matrices, exact or estimated from recorded margins (finding F4);
* :mod:`.moe` — MoE predictability: all-to-all matrices, uniformity, identities, predictors (finding F4);
* :mod:`.bandwidth` — peak bus bandwidth per sweep of a bandwidth table, small messages, saturation;
* :mod:`.sweeps` — predictions over several configurations, the TP share as micro-batches grow (F2);
* :mod:`.dataset` — volumes, matrix, rank summary and repeatability of a dataset, one rank file at a time;
* :mod:`.api` — every function above in one flat namespace (``import llmcomm.analysis.api as A``), as
  ``statsmodels.api``.

The modules load on first use (``llmcomm.analysis.volumes.tp_share``).
"""

from __future__ import annotations

import importlib
from typing import Any

from .trace_analysis import TraceAnalysis

MODULES = ("alltoall", "api", "bandwidth", "dataset", "events", "moe", "pairs", "repeatability", "sweeps",
           "temporal", "volumes")

__all__ = ["TraceAnalysis", *MODULES]


def __getattr__(name: str) -> Any:
    if name in MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(MODULES))
