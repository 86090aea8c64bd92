"""The MoE layer's work beyond its linear GEMMs and its activation, as Megatron-LM's alltoall dispatcher and
TransformerEngine's grouped linear run it on one rank, per MoE layer and micro-batch (forward pass).

Read in NVIDIA/Megatron-LM ``d98e8a6`` (``megatron/core/transformer/moe/``) and NVIDIA/TransformerEngine; each
function carries its formula and source. ``L`` tokens enter the MoE layer on a rank (``L = T/tp`` with sequence
parallelism, else ``T = b·s/cp``), each routed to ``k`` of ``E`` experts; the rank sends ``N = L·k`` rows and,
under balanced routing (what the formulation times: :func:`llmcomm.overhead.moe_fold.expert_rows`), receives
``N_r = etp·L·k`` rows spread over its ``E_l = E/ep`` local experts. Activations are ``a`` bytes per element
(2: BF16), probabilities fp32.

* :func:`grouped_gemm_seconds` — TE's grouped linear (``TEGroupedMLP``, ``experts.py``; ``GroupedLinear``) runs
  one cuBLAS GEMM per local expert on TE's pool of compute streams: ``te_general_grouped_gemm`` calls
  ``nvte_multi_stream_cublas_gemm`` ("for now, we only have multi-stream cublas backend",
  ``transformer_engine/pytorch/csrc/extensions/gemm.cpp``), which puts GEMM ``i`` on compute stream ``i mod S``
  (``transformer_engine/common/gemm/cublaslt_gemm.cu``), ``S = 4``
  (``transformer_engine/common/util/multi_stream.cpp``, ``get_num_compute_streams``). Timed as ``⌊E_l/S⌋``
  rounds of ``S`` same-shape GEMMs running at once — the measured model's batched GEMM of ``b = S`` (XLA's
  table measures ``b ∈ {1, 2, 4}``) — plus one of the remaining ``E_l mod S``; before, one batched GEMM of
  ``b = E_l`` (beyond the table's batches for ``E_l > 4``).
* :func:`dispatch_bytes` — the token permutations at HBM bandwidth (fused TE kernels, ``moe_permute_fusion``,
  ``moe_utils.py`` ``permute``/``unpermute``/``sort_chunks_by_idxs``), the router's element-wise work and, with
  ``add_bias_linear`` (GPT-OSS), the per-expert bias of the experts' second linear (``experts.py``
  ``TEGroupedMLP._apply_bias``, eager path).
* :func:`expert_input_cast_bytes` — FP8: the dispatched tokens entering the experts' first linear are quantized
  on their own (they do not come out of a TE LayerNorm, unlike ``qkv``/``fc1`` of a dense layer).

Per-expert padding: FP8 pads each expert's rows to the quantization alignment (``Fp8Padding``, built in
``TEGroupedMLP.__init__`` whenever ``fp8`` is set, ``experts.py:306-314``; TransformerEngine's
``transformer_engine/pytorch/module/fp8_padding.py``: 32 rows for MXFP8, 16 for the other recipes) and token dropping with
``moe_pad_expert_input_to_capacity`` pads to the capacity ``⌈k·T/E·cf⌉``; under balanced routing
(:func:`padded_rows`) both equal the balanced share on the NeMo rows (1,024–4,096 rows, multiples of 16;
capacity factor 1.0), so they change no time there; the shapes are padded anyway.

The backward is twice the forward (:func:`llmcomm.overhead.iteration.class_times`); the permutations' gradients
are one permutation each, so this counts them twice — an upper bound the kit's rule applies to every
element-wise kernel. Host-side costs (kernel launches, the dispatcher's device-to-host synchronisation of the
token counts, ``_maybe_dtoh_and_synchronize``) are not modelled: no measured per-kernel launch cost is in the
shared data to count them with, and the utilization fit's per-pass launch floor divided by a kernel count
gives an implausible ~78 µs per kernel. GPT-OSS 120B's H100 recipe runs without CUDA graphs; its experts'
activation clamps and YaRN's unfused RoPE are counted as bytes in :mod:`llmcomm.overhead.eager_ops`.

Where the host waits (``token_dispatcher.py`` at ``d98e8a6``): the alltoall dispatcher copies the token counts
to the host on a side stream and blocks the host on that copy once per MoE layer forward (``_maybe_dtoh_and_
synchronize``, :921-958) — before the EP all-to-all where ``ep·tp > 1`` (:596, :702-704), before returning
otherwise (:605) — in dropless mode only: with ``moe_pad_expert_input_to_capacity`` (drop-and-pad, the 25.09
"tokendrop" rows) the counts are the static capacity (:517-540) and nothing is copied or waited for (:927).
CUDA graphs over ``moe_preprocess`` move the copy (:466-470), not the wait. Pipeline exchanges with
``batch_p2p_comm`` (Megatron's default, ``model_parallel_config.py:390-398``; Megatron-Bridge keeps it wherever no
virtual pipeline overlaps P2P, ``comm_overlap.py:459-460`` at ``17a381f``: GPT-OSS's pp 4) end in a full
``torch.cuda.synchronize()`` (``pipeline_parallel/p2p_communication.py:420-424``). After either, the GPU's
queue is empty and the host's time to issue what follows is exposed where it exceeds the GPU's. The
formulation's ``max(launch floor, work)`` per layer pass already lets no pass run ahead into another, so the
waits add nothing to it as it stands; what it lacks is the MoE layer pass's own host time (the floor is a dense
A100 layer's; scaled by GEMM launches per pass — ``4 + 2·E/ep`` here against the calibration's 6 — it binds on
no NeMo row).
"""

from __future__ import annotations

from typing import Any

import numpy as np

TE_COMPUTE_STREAMS = 4  # transformer_engine/common/util/multi_stream.cpp, get_num_compute_streams()
FP8_ROW_ALIGN = 16  # TE Fp8Padding (module/fp8_padding.py): 16 rows for the per-tensor recipes (32 for MXFP8)
ROUTER_ACCESSES = 4  # fp32 passes over the router's [L, E] scores: softmax/sigmoid, top-k, probs scatter, mask


def grouped_gemm_seconds(gemm_model: Any, m: np.ndarray, n: np.ndarray, k: np.ndarray, experts: np.ndarray,
                         dtype: str, streams: int = TE_COMPUTE_STREAMS) -> np.ndarray:
    """Seconds of one grouped linear of ``experts`` same-shape GEMMs ``m × n × k`` (module docstring)::

        t = ⌊E_l/S⌋ · t_gemm(m, n, k, b=S) + [E_l mod S > 0] · t_gemm(m, n, k, b=E_l mod S)

    ``gemm_model``: a :class:`~llmcomm.overhead.gemm.GemmModel` (``time(m, n, k, b, dtype)``)."""
    e = np.asarray(experts, dtype=np.int64)
    full, rest = e // streams, e % streams
    t = full * gemm_model.time(m, n, k, np.full_like(e, streams), dtype)
    if np.count_nonzero(rest > 0):
        t = t + np.where(rest > 0, gemm_model.time(m, n, k, np.maximum(rest, 1), dtype), 0.0)
    return t


def padded_rows(rows: np.ndarray, fp8: np.ndarray) -> np.ndarray:
    """Rows of each local expert's GEMM as Megatron feeds them: FP8 pads every expert's rows up to a multiple
    of :data:`FP8_ROW_ALIGN` (``Fp8Padding`` in ``TEGroupedMLP.forward``, ``experts.py``); BF16 unpadded::

        m' = ⌈m/16⌉·16   (fp8)        m' = m   (bf16)"""
    r = np.asarray(rows, dtype=np.int64)
    return np.where(np.asarray(fp8, dtype=bool), -(-r // FP8_ROW_ALIGN) * FP8_ROW_ALIGN, r)


def dispatch_bytes(model: Any, c: dict[str, np.ndarray], T: np.ndarray) -> np.ndarray:
    """HBM bytes of one MoE layer's forward beyond its GEMMs and activation, per rank and micro-batch
    (``c``: :func:`llmcomm.overhead.iteration.arrays`; ``T = b·s/cp``)::

        permute            2·a·N·h + 4·L·E + 4·N      gather the N = L·k routed rows (read + write) and their
                                                     probabilities out of the [L, E] map (moe_utils.py:344
                                                     permute; token_dispatcher.py:661-680)
        sort by expert     [E_l > 1] 2·2·a·N_r·h + 8·N_r    after the dispatch all-to-all, rows of each source
                                                     rank regrouped by local expert, and back before the combine
                                                     (sort_chunks_by_idxs in dispatch_postprocess,
                                                     token_dispatcher.py:757-788, and combine_preprocess,
                                                     :803-822; the probabilities once)
        unpermute          a·(N + L)·h                read the N combined rows, write the L merged tokens
                                                     (moe_utils.py:497 unpermute, token_dispatcher.py:892; the
                                                     probabilities were applied in the experts' weighted
                                                     activation)
        router             4·4·L·E                    fp32 scores: softmax/top-k, probs, routing map
        expert fc2 bias    [add_bias_linear] 6·a·N_r·h   per expert ``out + bias·prob`` (write, read 2 + write)
                                                     and the concatenation (read + write):
                                                     TEGroupedMLP._apply_bias, eager path (experts.py:345-378)

    ``a`` = the activation's bytes; ``L = T/tp`` with sequence parallelism (else ``T``), ``N = L·k``,
    ``N_r = etp·N``, ``E_l = E/ep``. Zeros for a dense model."""
    n_rows = len(c["tp"])
    if not model.is_moe:
        return np.zeros(n_rows)
    h, k, E = model.hidden_size, model.moe_router_topk, model.num_experts
    tp = c["tp"]
    etp = np.where(c["etp"] > 0, c["etp"], tp)
    L = np.asarray(T, dtype=np.float64) / np.where(c["sp"], tp, 1)
    a = np.asarray(c["act_dtype"], dtype=np.float64)
    N = L * k
    Nr = etp * N
    sort = (E // c["ep"] > 1).astype(np.float64)
    out = 2.0 * a * N * h + 4.0 * L * E + 4.0 * N
    out = out + sort * (2.0 * 2.0 * a * Nr * h + 8.0 * Nr)
    out = out + a * (N + L) * h + ROUTER_ACCESSES * 4.0 * L * E
    if model.add_bias_linear:
        out = out + 6.0 * a * Nr * h
    return out


def expert_input_cast_bytes(model: Any, c: dict[str, np.ndarray], T: np.ndarray) -> np.ndarray:
    """FP8 rows: bytes of quantizing the ``N_r`` dispatched rows before the experts' first linear (read ``a``,
    write 1 byte per element; with current scaling, ``'tensorwise'``, one more read for the amax)::

        (a + 1 + [tensorwise]·a) · N_r · h

    TE quantizes a GEMM input that is not already FP8 (``GroupedLinear`` forward); the dense layer's
    ``qkv``/``fc1`` inputs come out of TE's LayerNorm in FP8 instead (:func:`llmcomm.overhead.iteration._compute`).
    Zero on BF16 rows and dense models."""
    n_rows = len(c["tp"])
    if not model.is_moe:
        return np.zeros(n_rows)
    tp = c["tp"]
    etp = np.where(c["etp"] > 0, c["etp"], tp)
    L = np.asarray(T, dtype=np.float64) / np.where(c["sp"], tp, 1)
    a = np.asarray(c["act_dtype"], dtype=np.float64)
    Nr = etp * L * model.moe_router_topk
    per = a + 1.0 + c["fp8_tensorwise"] * a
    return np.where(c["fp8"], per * Nr * model.hidden_size, 0.0)



def optimizer_bytes(dense: np.ndarray, expert: np.ndarray, shard: np.ndarray, expert_shard: np.ndarray,
                    per_param: float) -> np.ndarray:
    """HBM bytes of one rank's optimizer step, ``per_param`` bytes per parameter it steps: the dense (and
    replicated) parameters sharded over the data-parallel group, the routed experts' over the expert-data-parallel
    group of ``edp`` ranks (:func:`llmcomm.overhead.moe_fold.expert_dp`) with the distributed optimizer — Megatron
    builds the experts' optimizer over ``intra_expt_dp_group`` (``megatron/core/optimizer/__init__.py:1243``)::

        bytes = per_param · (dense / shard + expert / expert_shard)

    Where the experts share the dense buffer (``ep = 1``, ``etp = tp``) ``edp = dp·cp`` and this is
    ``per_param · (dense + expert) / shard`` as before, computed in that order (every dense model and MoE rows
    with ``expert_shard = shard`` are unchanged bit for bit)."""
    same = expert_shard == shard
    return np.where(same, per_param * (dense + expert) / shard,
                    per_param * dense / shard + per_param * expert / np.maximum(expert_shard, 1))
