"""Predictions over several configurations, for the notebooks: one trace per labelled case, and the TP
share as the number of micro-batches grows (finding F2)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import pandas as pd

from ..analysis.volumes import bytes_by, tp_share
from ..specs import ModelSpec, ParallelConfig, load_model
from ..trace import Trace


def predict_cases(cases: Mapping[str, tuple[str | ModelSpec, dict]], **kw) -> dict[str, Trace]:
    """``{label: (model, ParallelConfig keyword arguments)}`` -> ``{label: predicted Trace}``; ``kw`` go
    to :func:`~llmcomm.predict.predict_traffic`."""
    from . import predict_traffic

    traces = {}
    for label, (model, parallel) in cases.items():
        spec = load_model(model) if isinstance(model, str) else model
        traces[label] = predict_traffic(spec, ParallelConfig(**parallel), **kw)
    return traces


def tp_share_vs_microbatches(model: ModelSpec, parallel: ParallelConfig, microbatches: Iterable[int],
                             algorithm: str | None = None) -> pd.DataFrame:
    """TP share of the bytes for each number of micro-batches ``m`` (global batch = m · micro_batch · dp):
    columns ``microbatches``, bytes of ``tp``, ``pp``, ``dp``, ``ep``, and ``tp_share``.

    TP and PP bytes grow as ``m`` (per micro-batch terms) while DP bytes are per iteration, so the share
    is ``m·t / (m·t + m·p + d)``, rising towards ``t / (t + p)``."""
    from . import predict_traffic

    rows = []
    for m in microbatches:
        swept = dataclasses.replace(parallel, global_batch=m * parallel.micro_batch * parallel.dp)
        trace = predict_traffic(model, swept, aggregate=True)
        by_parallelism = bytes_by(trace, ("parallelism",), algorithm).set_index("parallelism")["bytes"]
        rows.append({"microbatches": m,
                     **{kind: float(by_parallelism.get(kind, 0.0)) for kind in ("tp", "pp", "dp", "ep")},
                     "tp_share": tp_share(trace, algorithm)})
    return pd.DataFrame(rows)
