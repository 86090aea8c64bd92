"""Analytical traffic predictor: every communication call every rank issues in one training iteration.

``predict_traffic(model, parallel)`` returns a :class:`llmcomm.trace.Trace` (``source = "predicted"``) whose
rows are tagged with parallelism, phase, layer, micro-batch, op, group, peer, bytes and dtype, in the order
the pipeline schedule issues them. One small module per parallelism holds the formulas: :mod:`.tp`,
:mod:`.pp`, :mod:`.dp`, :mod:`.ep`, :mod:`.cp`; :mod:`.schedule` orders the steps; :mod:`.program` strings them together
per stage; :mod:`.expand` spreads a stage's program over its ranks with numpy.

``framework="megatron"`` describes Megatron-LM (``megatron/core``). ``framework="torch"`` describes what torch's
own parallel APIs issue in the project's collector (``llmcomm.collect``); :mod:`.torch_rules` builds that
program and lists every difference from Megatron-LM.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import pandas as pd

from ..bounds import check_predict_size
from ..errors import ConfigError
from ..layout import Layout
from ..specs import Cluster, ModelSpec, ParallelConfig, load_model, validate
from ..trace import Trace
from ..vocab import FrameworkName
from . import expand, program, torch_rules
from .audit import audit_table
from .calls import Call, Context
from .ep import peer_tokens, routing_counts
from .support import check_supported as _check_supported

AUTO_AGGREGATE_ROWS = 500_000

__all__ = ["predict_traffic", "audit_table", "Context"]


def predict_traffic(model: ModelSpec | str, parallel: ParallelConfig, *, cluster: Cluster | None = None,
                    framework: FrameworkName = "megatron", routing: pd.DataFrame | np.ndarray | None = None,
                    aggregate: bool | None = None) -> Trace:
    """Predict one training iteration's communication of ``model`` under ``parallel``.

    ``cluster`` (optional) checks the world size and sets ``gpus_per_node`` in the trace meta.
    ``routing`` (MoE): token counts per (layer, micro-batch, source rank, expert) as a DataFrame
    (``iteration, microbatch, layer, src_rank, expert, tokens``; one iteration) or a dense array of shape
    ``(num_layers, num_microbatches, world_size, num_experts)``; without it, all-to-all sizes are the
    expected value under uniform routing. ``aggregate``: one row per distinct call with ``count``
    (``layer = microbatch = -1``); ``None`` picks it when the expanded table would exceed
    ``AUTO_AGGREGATE_ROWS`` rows. Raises :class:`ConfigError` naming the broken rule before any work (also a
    world size above :data:`llmcomm.bounds.MAX_PREDICT_GPUS`, with the memory it would need)."""
    if isinstance(model, str):
        model = load_model(model)
    check_predict_size(parallel.world_size)
    check = cluster.for_world(parallel.world_size) if cluster is not None and cluster.num_nodes is None else cluster
    validate(model, parallel, check)
    _check_supported(model, parallel, framework)
    ctx = Context(model, parallel, framework)
    lay = Layout(parallel, cluster.gpus_per_node if cluster is not None else 8)
    # Megatron: each stage as a program.StagePlan (one build per class of steps; expanded or aggregated below)
    programs: list[list[Call]] | list[program.StagePlan] = (
        [torch_rules.stage_program(ctx, r) for r in range(parallel.pp)] if framework == "torch"
        else [program.stage_plan(ctx, r) for r in range(parallel.pp)])
    if routing is not None and not model.is_moe:
        raise ConfigError(f"routing was given but {model.name} is not an MoE model")
    d_tokens = None
    iteration = 0
    if routing is not None:
        counts, iteration = routing_counts(routing, ctx, parallel.world_size)
        if parallel.ep > 1:
            d_tokens = peer_tokens(counts, parallel.ep)
    total = sum(len(p) for p in programs) * (parallel.world_size // parallel.pp)
    if aggregate is None:
        aggregate = total > AUTO_AGGREGATE_ROWS and d_tokens is None
    if aggregate and d_tokens is not None:
        raise ConfigError("aggregate=True cannot merge routed all-to-alls (their splits differ per layer and "
                          "micro-batch); use aggregate=False with routing")
    parts = []
    for r, prog in enumerate(programs):
        if isinstance(prog, program.StagePlan):
            calls, call_counts = prog.aggregated() if aggregate else (prog.calls(), [1] * len(prog))
        else:
            seq = cast(list[Call], prog)
            calls, call_counts = expand.aggregate_calls(seq) if aggregate else (seq, [1] * len(seq))
        if not calls:
            continue
        parts.append(expand.stage_table(lay, r, calls, call_counts, iteration, d_tokens, model.hidden_size * ctx.act,
                                        ctx.probs_bytes))
    events = expand.to_ref_events(lay, parts)
    if parts:
        order = np.argsort(events.ints("rank"), kind="stable")
        if not np.array_equal(order, np.arange(len(order))):
            events = events.take(order)
    events.check("predicted")
    meta = {"source": "predicted", "framework": framework, "model": model.to_dict(),
            "parallel": parallel.to_dict(), "world_size": parallel.world_size,
            "gpus_per_node": lay.gpus_per_node, "aggregated": bool(aggregate), "iteration": iteration,
            "cluster": cluster.name if cluster is not None else None}
    return Trace(meta=meta, routing=routing if isinstance(routing, pd.DataFrame) else None, ref_events=events)
