"""The envelope of an MoE configuration's all-to-all matrix: per GPU pair, the least, expected and most bytes
a dispatch can carry, under a recorded routing history or a routing distribution — what a network planner
needs beside the mean that :func:`llmcomm.predict.predict_traffic` gives without routing.

With ``T`` tokens per rank and micro-batch (``Context.local_tokens``), top ``k`` of ``E`` experts, ``ep`` EP
ranks each holding ``E/ep`` experts, and ``b = h·act`` bytes per token copy, rank ``r`` sends EP position
``j`` ``D[r, j]·b`` bytes in a dispatch (:mod:`llmcomm.predict.ep`), and the combine is its transpose.

* ``min``/``expected``/``max``: over the routings of the history (or of samples drawn from a distribution)
  per (layer, micro-batch, src, dst); the matrices are built with the predictor's own
  :func:`~llmcomm.predict.ep.routing_counts` and :func:`~llmcomm.predict.ep.peer_tokens`, so the envelope of
  a one-iteration history is exactly ``predict_traffic(..., routing=that iteration)``'s dispatch.
* ``uniform``: ``predict_traffic`` without routing, ``T·k·b/ep``.
* ``hard_min``/``hard_max``: what top-k routing allows at all. A token's ``k`` copies go to ``k``
  *distinct* experts, at most ``E/ep`` of them on one rank, so one token sends rank ``j`` between
  ``max(0, k − (E − E/ep))`` and ``min(k, E/ep)`` copies: ``hard_min = T·max(0, k − E + E/ep)·b``,
  ``hard_max = T·min(k, E/ep)·b``.

:func:`sample_routing` draws routings from per-expert probabilities ``p``: each token picks ``k`` distinct
experts by Gumbel-top-k on ``ln p`` (the Plackett–Luce law of a top-k router with Gumbel noise).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..layout import Layout
from ..specs import ModelSpec, ParallelConfig, load_model
from ..vocab import FrameworkName
from .calls import Context
from .ep import check_routing_columns, peer_tokens, routing_counts, uniform_split_bytes

ENVELOPE_COLUMNS = ("layer", "microbatch", "src", "dst", "min_bytes", "expected_bytes", "max_bytes",
                    "uniform_bytes", "hard_min_bytes", "hard_max_bytes", "iterations")


def _context(model: ModelSpec | str, parallel: ParallelConfig, framework: FrameworkName) -> Context:
    spec = load_model(model) if isinstance(model, str) else model
    if not spec.is_moe:
        raise ConfigError(f"model {spec.name} is not an MoE model: it has no all-to-all envelope")
    if parallel.ep < 2:
        raise ConfigError(f"parallel.ep={parallel.ep}: an all-to-all envelope needs expert parallelism (ep >= 2)")
    return Context(spec, parallel, framework)


def dispatch_history(model: ModelSpec | str, parallel: ParallelConfig, routing: pd.DataFrame,
                     framework: FrameworkName = "megatron") -> tuple[np.ndarray, np.ndarray]:
    """Dispatch token matrices of every iteration of ``routing``: ``(iterations, D)`` with ``D`` of shape
    ``(n_iterations, num_layers, num_microbatches, world_size, ep)`` tokens (rank → EP position)."""
    ctx = _context(model, parallel, framework)
    check_routing_columns(routing)
    its = np.sort(pd.unique(routing["iteration"]))
    out = np.zeros((len(its), ctx.model.num_layers, ctx.num_microbatches, parallel.world_size, parallel.ep), dtype=np.int64)
    for i, (_, g) in enumerate(routing.groupby("iteration", sort=True)):
        counts, _ = routing_counts(g, ctx, parallel.world_size)
        out[i] = peer_tokens(counts, parallel.ep)
    return its, out


def a2a_envelope(model: ModelSpec | str, parallel: ParallelConfig, routing: pd.DataFrame,
                 framework: FrameworkName = "megatron") -> pd.DataFrame:
    """Per (MoE layer, micro-batch, src rank, dst rank) of the dispatch all-to-all: min, expected (mean) and
    max bytes over the iterations of ``routing`` (a recorded history, or :func:`sample_routing`), beside the
    uniform expectation and the hard bounds of top-k routing (module docstring). ``src``/``dst`` are global
    ranks; the combine's envelope is the same with ``src`` and ``dst`` swapped."""
    ctx = _context(model, parallel, framework)
    its, d = dispatch_history(ctx.model, parallel, routing, framework)
    m = ctx.model
    b = m.hidden_size * ctx.act
    el = m.num_experts // parallel.ep
    layers = [la for la, moe in enumerate(m.moe_layer_pattern()) if moe]
    groups, row = Layout(parallel).group_lookup("ep")
    d = d[:, layers]                                               # (I, L', M, W, ep)
    L, M, W, P = d.shape[1:]
    li, mi, si, pj = np.meshgrid(np.arange(L), np.arange(M), np.arange(W), np.arange(P), indexing="ij")
    t, k = ctx.local_tokens, m.moe_router_topk
    return pd.DataFrame({
        "layer": np.asarray(layers)[li.ravel()], "microbatch": mi.ravel(), "src": si.ravel(),
        "dst": groups[row[si.ravel()], pj.ravel()],
        "min_bytes": d.min(axis=0).ravel() * b, "expected_bytes": d.mean(axis=0).ravel() * b,
        "max_bytes": d.max(axis=0).ravel() * b, "uniform_bytes": uniform_split_bytes(ctx),
        "hard_min_bytes": t * max(0, k - (m.num_experts - el)) * b, "hard_max_bytes": t * min(k, el) * b,
        "iterations": len(its)})


def sample_routing(model: ModelSpec | str, parallel: ParallelConfig, expert_probs: np.ndarray, samples: int,
                   seed: int = 0, framework: FrameworkName = "megatron") -> pd.DataFrame:
    """``samples`` routings (``iteration`` = sample index) in the routing-table form: every rank's ``T``
    tokens per MoE layer and micro-batch pick ``k`` distinct experts by Gumbel-top-k on ``ln p``.
    ``expert_probs``: shape ``(E,)`` (every layer) or ``(num_layers, E)``, non-negative, each row summing to
    1."""
    ctx = _context(model, parallel, framework)
    m = ctx.model
    e_n, k = m.num_experts, m.moe_router_topk
    p = np.asarray(expert_probs, dtype=np.float64)
    p = np.broadcast_to(p, (m.num_layers, e_n)) if p.ndim == 1 else p
    if p.shape != (m.num_layers, e_n):
        raise ConfigError(f"expert_probs has shape {np.shape(expert_probs)}; expected ({e_n},) or "
                          f"({m.num_layers}, {e_n})")
    if (p < 0).any() or not np.allclose(p.sum(axis=1), 1.0):
        raise ConfigError("expert_probs must be non-negative and sum to 1 per layer")
    if (p > 0).sum(axis=1).min() < k:
        raise ConfigError(f"expert_probs gives fewer than k={k} experts a non-zero probability")
    layers = [la for la, moe in enumerate(m.moe_layer_pattern()) if moe]
    rng = np.random.default_rng(seed)
    W, M, T = parallel.world_size, ctx.num_microbatches, ctx.local_tokens
    with np.errstate(divide="ignore"):
        logp = np.log(p[layers])                                   # (L', E)
    g = rng.gumbel(size=(samples, len(layers), M, W, T, e_n)) + logp[None, :, None, None, None, :]
    top = np.argpartition(-g, k - 1, axis=-1)[..., :k]             # k distinct experts per token
    onehot = np.zeros(g.shape[:-1] + (e_n,), dtype=np.int64)
    np.put_along_axis(onehot, top, 1, axis=-1)
    counts = onehot.sum(axis=-2)                                   # (S, L', M, W, E)
    s, li, mi, w, e = np.meshgrid(np.arange(samples), np.arange(len(layers)), np.arange(M), np.arange(W),
                                  np.arange(e_n), indexing="ij")
    return pd.DataFrame({"iteration": s.ravel().astype(np.int32), "microbatch": mi.ravel().astype(np.int32),
                         "layer": np.asarray(layers, dtype=np.int32)[li.ravel()],
                         "src_rank": w.ravel().astype(np.int32), "expert": e.ravel().astype(np.int32),
                         "tokens": counts.ravel()})
