"""Predictions over several configurations, for the notebooks: which labelled cases fit their model, one trace
per case, the TP share as the number of micro-batches grows, and its closed form (finding F2).

* :func:`valid_cases`: the cases whose configuration passes :func:`~llmcomm.specs.validate`, and why the
  others do not.
* :func:`predict_cases`: one predicted trace per case.
* :func:`tp_share_vs_microbatches`, :func:`tp_share_sweeps`: the TP share for each number of micro-batches.
* :func:`tp_closed_form`: a dense GPT's TP bytes per micro-batch by hand, and the cap PP puts on the TP share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import pandas as pd

from ..errors import ConfigError
from ..predict import predict_traffic
from ..specs import ModelSpec, ParallelConfig, load_model, validate
from ..trace import Trace
from ..vocab import AlgorithmName
from .volumes import bytes_by, tp_share

Case = tuple[str | ModelSpec, dict]


def _model(model: str | ModelSpec) -> ModelSpec:
    return load_model(model) if isinstance(model, str) else model


def valid_cases(cases: Mapping[str, Case]) -> tuple[dict[str, Case], dict[str, str]]:
    """Split ``{label: (model, ParallelConfig keyword arguments)}`` into the cases whose configuration fits the
    model (:class:`ParallelConfig` builds and :func:`~llmcomm.specs.validate` passes: heads, layers, experts
    divisible by the group sizes...) and ``{label: "model: the broken rule"}`` for the others, both in the
    order of ``cases``."""
    valid: dict[str, Case] = {}
    skipped: dict[str, str] = {}
    for label, (model, parallel) in cases.items():
        try:
            validate(_model(model), ParallelConfig(**parallel))
            valid[label] = (model, parallel)
        except ConfigError as e:
            skipped[label] = f"{model if isinstance(model, str) else model.name}: {e}"
    return valid, skipped


def predict_cases(cases: Mapping[str, tuple[str | ModelSpec, dict]], **kw) -> dict[str, Trace]:
    """``{label: (model, ParallelConfig keyword arguments)}`` -> ``{label: predicted Trace}``; ``kw`` go
    to :func:`~llmcomm.predict.predict_traffic`."""
    return {label: predict_traffic(_model(model), ParallelConfig(**parallel), **kw)
            for label, (model, parallel) in cases.items()}


def tp_share_vs_microbatches(model: ModelSpec, parallel: ParallelConfig, microbatches: Iterable[int],
                             algorithm: AlgorithmName | None = None) -> pd.DataFrame:
    """TP share of the bytes for each number of micro-batches ``m`` (global batch = m · micro_batch · dp):
    columns ``microbatches``, bytes of ``tp``, ``pp``, ``dp``, ``ep``, and ``tp_share``.

    TP and PP bytes grow as ``m`` (per micro-batch terms) while DP bytes are per iteration, so the share
    is ``m·t / (m·t + m·p + d)``, rising towards ``t / (t + p)``."""
    rows = []
    for m in microbatches:
        swept = dataclasses.replace(parallel, global_batch=m * parallel.micro_batch * parallel.dp)
        trace = predict_traffic(model, swept, aggregate=True)
        by_parallelism = bytes_by(trace, ("parallelism",), algorithm).set_index("parallelism")["bytes"]
        rows.append({"microbatches": m,
                     **{kind: float(by_parallelism.get(kind, 0.0)) for kind in ("tp", "pp", "dp", "ep")},
                     "tp_share": tp_share(trace, algorithm)})
    return pd.DataFrame(rows)


def tp_share_sweeps(cases: Mapping[str, Case], microbatches: Iterable[int]) -> pd.DataFrame:
    """:func:`tp_share_vs_microbatches` (message bytes) of every case with ``tp > 1`` (a case without TP has no
    TP bytes), stacked with ``configuration`` (its label) and ``sp`` (``"with SP"`` or ``"without SP"``).
    An interleaved schedule (``vpp > 1``) needs the number of micro-batches to be a multiple of ``pp``:
    only those ``m`` are swept for it."""
    microbatches = list(microbatches)
    frames = []
    for label, (model, kw) in cases.items():
        parallel = ParallelConfig(**kw)
        if parallel.tp <= 1:
            continue
        step = parallel.pp if parallel.vpp > 1 else 1
        frames.append(tp_share_vs_microbatches(_model(model), parallel, [m for m in microbatches if m % step == 0])
                      .assign(configuration=label, sp="with SP" if parallel.sp else "without SP"))
    return pd.concat(frames, ignore_index=True)


@dataclasses.dataclass(frozen=True)
class TPClosedForm:
    """A dense GPT's TP message bytes by hand (see :func:`tp_closed_form`); bytes are integers."""

    activation_bytes: int       # A = b·s·h·2
    cross_entropy_bytes: int    # CE = 3·4·b·s
    tp_bytes: int               # t = 4·L·A + 2·A + CE, without SP
    tp_sp_bytes: int            # t_SP = 10·L·A + 5·A + CE, with SP
    cap: float                  # t / (t + 2(pp−1)·A)
    cap_sp: float               # t_SP / (t_SP + 2(pp−1)·A/tp)
    iteration_tp_bytes: int     # m · (world/pp) · t
    iteration_tp_sp_bytes: int  # m · (world/pp) · t_SP


def tp_closed_form(model: ModelSpec, parallel: ParallelConfig) -> TPClosedForm:
    """TP message bytes of one micro-batch of a dense GPT with learned positions, summed along the pipeline
    (one rank per stage), and the cap PP puts on TP's share of message bytes (finding F2).

    With ``A = b·s·h·2`` (a bf16 activation) and ``CE = 3·4·b·s`` (the cross-entropy's three fp32
    all-reduces):

    * without SP, ``t = 4·L·A + 2·A + CE``: two all-reduces per layer each way, the embedding's forward and the
      output layer's backward all-reduce;
    * with SP, ``t_SP = 10·L·A + 5·A + CE``: per layer an all-gather and a reduce-scatter each way plus the
      backward re-gather of each input for the weight gradients; ``5A`` the embedding's forward all-reduce and
      backward all-gather, the output layer's forward all-gather and its backward reduce-scatter and
      all-gather.

    Each of the ``pp − 1`` stage boundaries adds two PP sends per micro-batch (forward activation, backward
    gradient) of ``A`` (``A/tp`` with SP), so TP's share of message bytes, ``m·t / (m·t + m·p + d)``, is capped
    at ``cap = t / (t + 2(pp−1)·A)`` and ``cap_sp = t_SP / (t_SP + 2(pp−1)·A/tp)`` however many micro-batches
    there are. An iteration's TP bytes are ``m · (world/pp) · t`` (every rank of a stage issues its layers'
    calls)."""
    tokens = parallel.micro_batch * parallel.sequence_length(model)
    a = tokens * model.hidden_size * 2
    ce = 3 * tokens * 4
    t = 4 * model.num_layers * a + 2 * a + ce
    t_sp = 10 * model.num_layers * a + 5 * a + ce
    ranks_per_stage = parallel.world_size // parallel.pp
    return TPClosedForm(activation_bytes=a, cross_entropy_bytes=ce, tp_bytes=t, tp_sp_bytes=t_sp,
                        cap=t / (t + 2 * (parallel.pp - 1) * a),
                        cap_sp=t_sp / (t_sp + 2 * (parallel.pp - 1) * a / parallel.tp),
                        iteration_tp_bytes=parallel.num_microbatches * ranks_per_stage * t,
                        iteration_tp_sp_bytes=parallel.num_microbatches * ranks_per_stage * t_sp)
