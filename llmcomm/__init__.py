"""llmcomm: communication of distributed LLM training — predicted, recorded and imported traces.

Public names: the specs (:class:`ModelSpec`, :class:`ParallelConfig`, :class:`Cluster`, :func:`load_model`,
:func:`load_cluster`), the rank :class:`Layout`, :class:`Trace` with :func:`read_trace`, and the entry points
:func:`predict_traffic`, :func:`ingest_trace`, :func:`compare` (a trace against its prediction) and :func:`tune`
(ConfigTuner). ``llmcomm.compare`` and ``llmcomm.tune`` name these functions; their modules are reached with
``from llmcomm.compare import ...`` / ``from llmcomm.tune import ...``.
"""

from __future__ import annotations

from .compare import compare
from .errors import AnalysisError, ConfigError, DataError, LLMCommError, TraceFormatError
from .ingest import ingest_bandwidth, ingest_trace
from .layout import Layout, layout
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
from .trace import EVENTS_SCHEMA, Trace, read_trace
from .tune import tune

__version__ = "0.1.0"


def __getattr__(name: str):  # noqa: ANN202 - lazy: the recorder needs torch, `import llmcomm` does not
    if name == "record":
        from .collect.record import record

        return record
    raise AttributeError(f"module 'llmcomm' has no attribute {name!r}")

__all__ = [
    "AnalysisError", "EVENTS_SCHEMA", "Cluster", "ConfigError", "DataError", "LLMCommError", "Layout", "ModelSpec",
    "ParallelConfig", "Trace", "TraceFormatError", "TrainingJob", "compare", "layout", "list_clusters", "list_models",
    "ingest_bandwidth", "ingest_trace", "load_cluster", "load_model", "predict_traffic", "read_trace", "record", "tune", "validate",
]
