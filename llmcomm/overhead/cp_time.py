"""Context parallelism in the iteration time: the CP calls of a stage in closed form, the attention work a CP
rank does, and how much of the CP communication stays exposed, per ``cp_comm_type`` (Megatron-LM's
``--cp-comm-type``; the calls, their sources and byte counts are :mod:`llmcomm.predict.cp`'s, which this module
writes in closed form and ``tests/test_overhead_bytes.py`` checks call for call against the predictor).

Work per CP rank (``cp`` ranks share one micro-batch's ``s`` tokens, two load-balanced chunks each: Megatron's
``get_batch_on_this_cp_rank``, megatron/core/utils.py:2660, TE's "DualChunkSwap", context_parallel.py:4963)::

    linear layers, norms, element-wise work, embedding, output layer: on T = b·s/cp tokens
    attention core:  F_attn(rank) = F_attn(b, s) / cp

The second holds for each type: ``p2p`` computes ``cp`` steps of equal work (step 0: the rank's two chunks
against themselves, causal, 2 of the ``(2·cp)²/2`` causal chunk pairs' worth; step ``i > 0`` with ``i <= rank``:
both query chunks against the first KV chunk, else the second query chunk against both KV chunks: 2 full chunk
pairs; context_parallel.py:1698-1980), ``all_gather`` the rank's two query chunks against the KV prefix each needs
(:3354-3400, ``get_kv_seq_info_after_all_gather``), ``a2a`` the whole sequence for ``a/(tp·cp)`` heads (Ulysses, :4339-4480). With ``F_attn(b, s/cp)``
what :func:`llmcomm.overhead.utilization.layer_features` gives for ``s/cp`` tokens,
``F_attn(rank) = cp · F_attn(b, s/cp)`` (:func:`attention_per_rank`).

Exposed CP seconds per micro-batch of a stage with ``n`` transformer layers (``t_a``: one layer's attention core
forward, :func:`llmcomm.overhead.iteration.class_times`' rule ``backward = 2·forward``; ``t(x)``: the bandwidth
model's time of call ``x`` on the CP group as the layout places it)::

    p2p:        forward  (cp − 1) · max(0, t(KV) − t_a/cp)              step i's send/recv under step i's kernel
                backward 2 · max(0, t(KV) − 2·t_a/cp) + (cp − 2) · max(0, t(2·KV) − 2·t_a/cp)
                (full recomputation: the forward's steps again, under the recomputed forward)
    all_gather: t(AG K) + t(AG V)  forward;  t(AG K) + t(AG V) + t(RS dK) + t(RS dV)  backward   (all exposed)
    a2a:        t(Q) + t(K) + t(V) + t(O)  forward;  t(dO) + t(dQ) + t(dK) + t(dV)  backward   (all exposed)

``p2p`` (TE ``AttnFuncWithCPAndKVP2P``): forward step ``i`` waits for the KV block step ``i − 1`` received
(:1700-1703), then posts the next send/recv (:1705-1715) and runs its kernel on the block it holds: the transfer
of step ``i`` overlaps the attention of step ``i`` on the other stream (``flash_attn_streams``), and step 0 runs on
the rank's own K, V, so no transfer precedes the first kernel. Backward (:2460-2720): step ``i`` posts its
send/recv (KV at ``i = 0``, KV and the dKV so far at ``0 < i < cp − 1``, dKV at ``i = cp − 1``), runs step ``i``'s
attention backward and then waits for the receive (:2717-2719): the same overlap, step for step. The ring runs at
the pace of its slowest pair: a CP group spanning nodes is timed inter-node (``rpn = 1``).
``all_gather`` (TE ``AttnFuncWithCPAndKVAllGather``: "KV all-gather between CP ranks is exposed", :3016; Megatron
transformer_config.py:1037: "The all-gather is not async, and cannot be overlapped"): the gathers run on the
compute stream before the kernels (:3215-3216, :3788-3789) and the reduce-scatters after them (:4122-4123). TE
overlaps only its two per-chunk kernels with each other (two streams, "wave quantization", :3251), not the
communication.
``a2a`` (TE ``AttnFuncWithCPAndQKVOA2A``): the all-to-alls are issued back to back and each is waited on before
the attention (or the next layer) can use it (``flash_attn_a2a_communicate``, :387-536); only the layout
reshuffles run on ``cp_stream``: all exposed, as Megatron says of Ulysses.

Not modelled: ``a2a+p2p`` (refused by the rule ``cp-hierarchical``), FP8 attention's FP8 KV ring and its dKV
all-to-all in the last backward step (``fp8_dot_product_attention`` off, Megatron's default, :2477), and the
softmax-correction kernels between steps (element-wise, small against the attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs import ModelSpec

RING_FWD, RING_BWD1, RING_BWD2, EXPOSED = "ring_f", "ring_b1", "ring_b2", "exposed"  # CommItem tags


@dataclass(frozen=True)
class CpCall:
    """Calls of one kind per transformer layer per micro-batch: ``per_layer`` calls of ``nbytes`` each;
    ``fwd_kind``: a forward call (issued again in the backward under full recomputation); ``tag``: how its time
    is exposed (:func:`exposed`)."""

    op: str
    phase: str
    nbytes: np.ndarray
    per_layer: np.ndarray
    fwd_kind: bool
    tag: str


def type_code(cp_comm_type: np.ndarray) -> dict[str, np.ndarray]:
    """Boolean rows per ``cp_comm_type`` (``p2p``, ``all_gather``, ``a2a``)."""
    t = np.asarray(cp_comm_type, dtype=object)
    return {k: t == k for k in ("p2p", "all_gather", "a2a")}


def head_bytes(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray, act: np.ndarray) -> dict[str, np.ndarray]:
    """``q``, ``k``, ``v``, ``o`` bytes of one rank (:func:`llmcomm.predict.cp.head_bytes` over arrays)."""
    qh, kvh = model.num_attention_heads // tp, model.kv_heads // tp
    return {"q": tokens * qh * model.q_head_dim * act, "k": tokens * kvh * model.q_head_dim * act,
            "v": tokens * kvh * model.value_head_dim * act, "o": tokens * qh * model.value_head_dim * act}


def cp_calls(model: ModelSpec, cp: np.ndarray, cp_comm_type: np.ndarray, tokens: np.ndarray, tp: np.ndarray,
             act: np.ndarray) -> list[CpCall]:
    """The CP calls of one transformer layer per micro-batch in closed form (:mod:`llmcomm.predict.cp`), zero
    counts where ``cp = 1`` or the row's type differs. Send/receive pairs are listed by their send."""
    on = cp > 1
    ty = {k: (v & on).astype(np.int64) for k, v in type_code(cp_comm_type).items()}
    hb = head_bytes(model, tokens, tp, act)
    kv = hb["k"] + hb["v"]
    p2p, ag, a2a = ty["p2p"], ty["all_gather"], ty["a2a"]
    out = [CpCall("send", "forward", kv, p2p * (cp - 1), True, RING_FWD),
           CpCall("send", "backward", kv, p2p * 2, False, RING_BWD1),
           CpCall("send", "backward", 2 * kv, p2p * (cp - 2), False, RING_BWD2)]
    for x in ("k", "v"):
        out.append(CpCall("all_gather", "forward", cp * hb[x], ag, True, EXPOSED))
        out.append(CpCall("all_gather", "backward", cp * hb[x], ag, False, EXPOSED))
        out.append(CpCall("reduce_scatter", "backward", cp * hb[x], ag, False, EXPOSED))
    for x in ("q", "k", "v", "o"):
        out.append(CpCall("all_to_all", "forward", hb[x], a2a, True, EXPOSED))
        out.append(CpCall("all_to_all", "backward", hb[x], a2a, False, EXPOSED))
    return out


def ring_ranks_per_node(cp: np.ndarray, k_cp: np.ndarray) -> np.ndarray:
    """Ranks per node of a CP ring step's pair: 2 when the whole CP group sits on one node, else 1 (the ring
    steps together, at the pace of its slowest pair)."""
    return np.where(k_cp >= cp, 2, 1)


def attention_per_rank(L: np.ndarray, C: np.ndarray, cp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Layer and attention-core features (:func:`llmcomm.overhead.utilization.layer_features`, computed for
    ``s/cp`` tokens) with the attention core scaled to a CP rank's share, ``cp · F_attn(b, s/cp) = F_attn(b,
    s)/cp`` (module docstring; also the unfused score traffic): ``L + (cp − 1)·C``, ``cp·C``. Unchanged at
    ``cp = 1``."""
    if not np.count_nonzero(cp > 1):
        return L, C
    k = (cp.astype(np.float64) - 1.0)[:, None]
    return L + k * C, C + k * C


def exposed(calls: list[tuple[str, np.ndarray, np.ndarray]], cp: np.ndarray, attn_fwd: np.ndarray) -> np.ndarray:
    """Exposed CP seconds per micro-batch of a stage (module docstring) from its CP call kinds ``(tag, seconds
    per call, calls per micro-batch)``, the CP size and one layer's attention-core forward seconds
    ``attn_fwd``. A ring step's transfer hides under that
    step's kernel, ``t_a/cp`` forward (and recomputed forward), ``2·t_a/cp`` backward."""
    step = attn_fwd / np.maximum(cp, 1)
    out = np.zeros(len(cp))
    for tag, t, count in calls:
        if tag == RING_FWD:
            out += count * np.maximum(0.0, t - step)
        elif tag in (RING_BWD1, RING_BWD2):
            out += count * np.maximum(0.0, t - 2.0 * step)
        else:
            out += count * t
    return out
