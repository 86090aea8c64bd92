"""llmcomm: communication of distributed LLM training — predicted, recorded and imported traces.

Public names: the specs (:class:`ModelSpec`, :class:`ParallelConfig`, :class:`Cluster`, :func:`load_model`,
:func:`load_cluster`), the rank :class:`Layout`, :class:`Trace` with :func:`read_trace` and :func:`open_trace`,
and the entry points :func:`predict_traffic`, :func:`ingest_trace` and :func:`record` (needs torch).

Every subpackage and module is an attribute, loaded on first use as numpy and scipy do (``import llmcomm``
stays light): ``llmcomm.overhead.iteration_time``, ``llmcomm.analysis.TraceAnalysis``,
``llmcomm.predict.predict_traffic``, ``llmcomm.compare.compare`` (a trace against its prediction),
``llmcomm.tune.tune`` (ConfigTuner). No attribute is a function standing in for a module of the same name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import AnalysisError, ConfigError, DataError, LLMCommError, TraceFormatError, UsageError
from .ingest import ingest_bandwidth, ingest_trace
from .layout import Layout
from .predict import predict_traffic
from .specs import (
    Cluster,
    ModelSpec,
    ParallelConfig,
    TrainingJob,
    list_clusters,
    list_models,
    load_cluster,
    load_model,
    validate,
)
from .trace import EVENTS_SCHEMA, Trace, open_trace, read_trace

if TYPE_CHECKING:
    from .collect.record import record as record

__version__ = "0.1.0"

# the subpackages and modules reached as attributes (loaded on first use)
SUBMODULES = frozenset({
    "analysis", "atomic", "catalogue", "cli", "collect", "compare", "data", "errors", "events", "flows",
    "group_refs", "ingest", "layout", "matrix", "output_paths", "overhead", "paths", "plots", "plots_moe",
    "predict", "reproduce", "specs", "trace", "trace_io", "tune", "units", "vocab",
})


def __getattr__(name: str) -> Any:
    if name in SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "record":  # lazy: the recorder needs torch, `import llmcomm` does not
        from .collect.record import record

        return record
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | SUBMODULES | {"record"})


__all__ = [
    "AnalysisError", "EVENTS_SCHEMA", "Cluster", "ConfigError", "DataError", "LLMCommError", "Layout", "ModelSpec",
    "ParallelConfig", "Trace", "TraceFormatError", "TrainingJob", "UsageError", "ingest_bandwidth", "ingest_trace",
    "list_clusters", "list_models", "load_cluster", "load_model", "open_trace", "predict_traffic", "read_trace",
    "record", "validate",
]
