"""The fused attention kernel's time on Hopper from published kernel measurements, and sliding-window attention.

Before this module the formulation timed a fused attention core (``attention_backend`` flash/fused/auto) at
``F_attn / P``: Q·Kᵀ and P·V at 100 % of the BF16 datasheet peak (989 TFLOP/s on H100), the backward at twice the
forward. Neither holds. A fused attention kernel is not a GEMM: between its two matmuls it runs the online
softmax (an ``exp`` per score on the SFU, 3.9 TFLOP/s on H100 SXM5 against 989 TFLOP/s of BF16 matmul: FlashAttention-3,
Shah et al. 2024, §3), and its backward runs five matmuls where the forward runs two (``2.5×`` the forward's FLOPs:
recompute ``S = Q·Kᵀ``, ``dV = Pᵀ·dO``, ``dP = dO·Vᵀ``, ``dQ = dS·K``, ``dK = dSᵀ·Q``; FlashAttention-2, Dao 2023,
§3.1.2 and the FLOP count of its benchmarks) with ``dQ`` accumulated across key blocks.

**Which kernel.** On Hopper TransformerEngine's ``DotProductAttention`` prefers its cuDNN ``FusedAttention``
(``F16_arbitrary_seqlen``) over FlashAttention whenever both can run ("Disabling FlashAttention to give
FusedAttention preference on Hopper+ for performance reasons", TransformerEngine
``transformer_engine/pytorch/attention/dot_product_attention/utils.py``, ``get_attention_backend``), which is what
Megatron-LM's ``--attention-backend auto`` (and ``fused``) runs on an H100; ``flash`` turns cuDNN off (below).

**Measured throughput.** :data:`CUDNN_H100` holds cuDNN's fused attention throughput on one H100 80GB SXM5, BF16, as
printed on the bars of FlashAttention-3's Figures 5 and 6 (Shah et al., "FlashAttention-3: Fast and Accurate
Attention with Asynchrony and Low-precision", arXiv:2407.08608, 2024; batch × sequence = 16k tokens, hidden 2,048,
so 32 heads of 64 or 16 of 128): forward without and with a causal mask at head dims 64 and 128, backward without
a causal mask at head dims 64 and 128, sequence 512 … 16k. FLOPs are counted as there: forward
``4·b·heads·s²·d`` (halved with the causal mask), backward ``2.5×`` the forward.

**The rule** (nothing fitted)::

    t_fwd = F_fwd / R_fwd(d, s_k, causal)
    t_bwd = 2.5 · F_fwd / R_bwd(d, s_k, causal)
    R_bwd(d, s, causal) = R_bwd(d, s, non-causal) · R_fwd(d, s, causal) / R_fwd(d, s, non-causal)

``R`` is interpolated linearly in ``log2 s`` and in ``d`` between the measured points and held at the ends
(``s < 512`` takes 512's rate, ``s > 16k`` 16k's; ``d < 64`` takes 64's, ``d > 128`` 128's: cuDNN's causal
forward at ``d = 256``, the only larger head dim published, is within 6 % of ``d = 128``'s at 2k–16k). The
causal backward is not published: it takes the non-causal backward scaled by the forward's causal/non-causal
ratio at the same length (the masked diagonal blocks cost both passes alike). ``s_k`` is the key length one
kernel call sees: the sequence of one context-parallel rank (``s/cp``; TransformerEngine's p2p ring runs
``cp`` steps of that size), or the window (below).

**Sliding-window attention** (Megatron-LM ``--window-size w``, ``--window-attn-skip-freq k``;
``megatron/core/transformer/utils.py`` ``is_layer_window_attention``: layer ``l`` (1-indexed) is windowed unless
``l % k == 0``, every layer when ``k`` is unset). A windowed query attends to at most ``w + 1`` keys (itself
and ``w`` to its left), so over a sequence of ``s`` queries the causal kernel computes::

    pairs(s, w) = Σ_{i=1..s} min(i, w + 1) = (w+1)(w+2)/2 + (s − w − 1)(w + 1)     (s > w; else s(s+1)/2)

out of ``s(s+1)/2`` causal pairs, at the rate of a kernel whose key extent is ``w + 1`` (``s_k = w + 1``). The
share of windowed layers is ``1 − 1/k`` (all layers spread evenly over the stages: each stage's layer is the
average). Sinks (``softmax_type="learnable"``: one extra logit per head in the softmax's denominator) add no
matmul work and are not timed apart.

**Which kernel runs sinks** (checked for GPT-OSS 120B's DGX-H100 rows, TransformerEngine 2.9 to 2.15 in NeMo
25.11 to 26.04.01 by Megatron-Bridge's ``pyproject.toml`` pins). Learnable sinks disable FlashAttention and leave
FusedAttention or ``UnfusedDotProductAttention`` (TE v2.9 ``attention/dot_product_attention/utils.py:685-727``);
cuDNN's ``F16_arbitrary_seqlen`` backend takes them from cuDNN 9.13.1 (``common/fused_attn/fused_attn.cpp:371-375``
at v2.9, :487-488 at v2.15; sink support added in TE PR #2148, v2.8), with the sliding window ``(128, 0)`` under
a causal mask (:337-362). The unfused fallback would materialize the ``[b·a/tp, s, s + 1]`` scores with the sink
column appended (``backends.py:410-472``) and keep the BF16 probabilities for the backward: ``2·b·a·s²`` = 2.1 GB
per layer at ``b = 1``, 64 heads, ``s = 4,096``, i.e. 77 GB for the 9 layers × 4 micro-batches stage 0 holds under
1F1B at ``pp = 4`` (8.6 GB a layer at the 25.11 row's ``b = 4``) on 80 GB GPUs: the published runs can only have
run the fused kernel, which is what the formulation times (Megatron-Bridge's ``GPTOSSProvider`` falls back to
Megatron's local attention only below TE 2.8, ``gpt_oss_provider.py:87-89`` at ``c0b9a00``). Its speed with sinks
is not published; the rates above are cuDNN's without.

**Which kernel, by backend** (:func:`rate`'s ``flash``). ``attention_backend="flash"`` is TransformerEngine's
FlashAttention backend, never cuDNN: Megatron-LM sets ``NVTE_FLASH_ATTN=1, NVTE_FUSED_ATTN=0`` for it
(``megatron/core/models/common/language_module/language_module.py:112-115`` at 23dd639c), and TE disables its
FusedAttention when ``NVTE_FUSED_ATTN=0`` (TransformerEngine v1.8 ``transformer_engine/pytorch/attention.py:4445-4449``;
FlashAttention on by ``NVTE_FLASH_ATTN``, default 1, :4429-4433), calling the ``flash-attn`` package (:73). Through
TE 1.10 that package is FlashAttention-2 (TE v1.11 ``attention.py:101`` is the first with a FlashAttention-3 path,
used only when ``flash_attn_3`` is installed); the kit times ``flash`` at FlashAttention-2's rate,
:data:`FA2_H100`, the FlashAttention-2 bars of the same FlashAttention-3 figures as :data:`CUDNN_H100` (same shapes,
same FLOP counts), and FlashAttention-3 is not timed apart. ``fused`` and ``auto`` (TE prefers cuDNN on Hopper) run at
cuDNN's rate. NeMo 1.0's launcher exported ``NVTE_FUSED_ATTN=0`` to every run of its 24.07 configs
(NeMo-Framework-Launcher 24.07 ``launcher_scripts/conf/config.yaml:72``, "Disable cudnn FA until we've tested it
more"), which is how ``data/published/read_nemo_recipes.py`` reads those rows; the 24.07 container ran TE 1.8.0.dev0
with Megatron-Core 0.8 (NeMo Framework user guide 24.09, "Software Component Versions") and ships FlashAttention 2
for TE's flash path (NVIDIA/NeMo PR #9188, ``memory_optimizations.rst``: "Flash Attention is supported through the
Transformer Engine with the inclusion of Flash Attention 2").

Where it applies: the GPUs with a measured GEMM model (:func:`llmcomm.overhead.iteration.measured_gemm`: H100, and
H200, which carries the H100 figures — same GH100 SMs and clocks; attention is bound by the SMs, not HBM). The
A100 path (vTrain, ``attention_backend="unfused"``) keeps the utilization fit's terms byte for byte.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SEQ = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
BACKWARD_FLOPS = 2.5  # backward FLOPs per forward FLOP of the attention core (FlashAttention-2's count)
# cuDNN fused attention, H100 80GB SXM5, BF16, TFLOP/s at SEQ (FlashAttention-3, arXiv:2407.08608, Fig. 5 (a)-(d)
# forward, Fig. 6 (a)-(b) backward; the cuDNN bars)
CUDNN_H100: dict[tuple[str, bool, int], tuple[float, ...]] = {
    ("fwd", False, 64): (335, 373, 395, 408, 412, 413),
    ("fwd", True, 64): (225, 288, 334, 363, 379, 388),
    ("fwd", False, 128): (497, 574, 617, 609, 600, 595),
    ("fwd", True, 128): (315, 410, 484, 518, 529, 539),
    ("bwd", False, 64): (266, 348, 395, 417, 432, 433),
    ("bwd", False, 128): (305, 408, 465, 499, 518, 516),
}
# FlashAttention-2 (the flash-attn package TransformerEngine's FlashAttention backend calls), the same figures' bars
FA2_H100: dict[tuple[str, bool, int], tuple[float, ...]] = {
    ("fwd", False, 64): (282, 306, 318, 321, 322, 324),
    ("fwd", True, 64): (180, 229, 262, 284, 295, 299),
    ("fwd", False, 128): (309, 350, 362, 368, 370, 370),
    ("fwd", True, 128): (191, 260, 298, 319, 333, 335),
    ("bwd", False, 64): (198, 238, 264, 279, 287, 291),
    ("bwd", False, 128): (214, 260, 291, 310, 318, 322),
}
SOURCE = ("cuDNN fused attention and FlashAttention-2 on H100 80GB SXM5, BF16 (FlashAttention-3, Shah et al. 2024, "
          "arXiv:2407.08608, Figs. 5-6)")


def _curve(kind: str, causal: bool, d: np.ndarray, s: np.ndarray, table: dict[tuple[str, bool, int],
           tuple[float, ...]] = CUDNN_H100) -> np.ndarray:
    """Measured TFLOP/s of one pass kind at head dim ``d`` and key length ``s`` (interpolated, held at the ends)."""
    return _at(kind, causal, *_coords(d, s), table)


_LOG_SEQ = np.log2(np.asarray(SEQ, dtype=np.float64))  # the figures' key lengths on the interpolation axis


def _coords(d: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_curve`'s coordinates: ``log2`` of the key length held to the figures' range and the head dim's
    weight between the two measured ones (computed once for the curves one rate reads)."""
    x = np.log2(np.clip(np.asarray(s, dtype=np.float64), SEQ[0], SEQ[-1]))
    w = (np.clip(np.asarray(d, dtype=np.float64), *HEAD_DIMS) - HEAD_DIMS[0]) / (HEAD_DIMS[1] - HEAD_DIMS[0])
    return x, w


def _at(kind: str, causal: bool, x: np.ndarray, w: np.ndarray, table: dict[tuple[str, bool, int],
        tuple[float, ...]]) -> np.ndarray:
    """:func:`_curve` at coordinates :func:`_coords`."""
    lo = np.interp(x, _LOG_SEQ, table[(kind, causal, HEAD_DIMS[0])])
    hi = np.interp(x, _LOG_SEQ, table[(kind, causal, HEAD_DIMS[1])])
    return lo + w * (hi - lo)


def _rate(kind: str, d: np.ndarray, s: np.ndarray, causal: bool, table: dict[tuple[str, bool, int],
          tuple[float, ...]], at: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    x, w = _coords(d, s) if at is None else at
    if kind == "fwd":
        return 1e12 * _at("fwd", causal, x, w, table)
    b = _at("bwd", False, x, w, table)
    if causal:
        b = b * _at("fwd", True, x, w, table) / _at("fwd", False, x, w, table)
    return 1e12 * b


def rate(kind: str, d: np.ndarray, s: np.ndarray, causal: bool = True, flash: Any = False,
         at: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """FLOP/s of the fused attention kernel ``kind`` (``"fwd"``/``"bwd"``) at head dim ``d`` and key length ``s``
    (module docstring: the causal backward scaled by the forward's causal/non-causal ratio): cuDNN's, or where
    ``flash`` (a bool or a per-row mask: ``attention_backend="flash"``) FlashAttention-2's. ``at``: ``_coords(d,
    s)`` where the caller holds them."""
    at = _coords(d, s) if at is None else at
    cu = _rate(kind, d, s, causal, CUDNN_H100, at)
    fl = np.asarray(flash, dtype=bool)
    if not np.count_nonzero(fl):
        return cu
    return np.where(fl, _rate(kind, d, s, causal, FA2_H100, at), cu)


def window_pairs(s: np.ndarray, w: int) -> np.ndarray:
    """Query-key pairs a causal window of ``w`` tokens to the left computes over ``s`` queries (module docstring)."""
    s = np.asarray(s, dtype=np.float64)
    full = s * (s + 1.0) / 2.0
    wide = (w + 1.0) * (w + 2.0) / 2.0 + (s - w - 1.0) * (w + 1.0)
    return np.where(s > w, wide, full)


def windowed_share(num_layers: int, window_size: int | None, skip_freq: int | None) -> float:
    """Share of a model's layers Megatron-LM runs with the sliding window (``is_layer_window_attention``)."""
    if not window_size:
        return 0.0
    if skip_freq is None:
        return 1.0
    return sum(1 for layer in range(1, num_layers + 1) if layer % skip_freq != 0) / num_layers


def core_seconds(flops_fwd: np.ndarray, head_dim: int, s_kernel: np.ndarray, s_full: np.ndarray,
                 window_size: int | None = None, windowed: float = 0.0, flash: Any = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(forward, backward)`` seconds of one layer's causal fused attention core whose forward FLOPs without a
    window are ``flops_fwd`` (the causal count), on one GPU with the H100 figures. ``s_kernel``: the key length of
    one kernel call (the CP rank's ``s/cp``); ``s_full``: the sequence whose causal pairs ``flops_fwd`` counts;
    ``windowed``: the share of layers with the sliding window of ``window_size`` tokens (module docstring);
    ``flash``: rows timed at FlashAttention-2's rate (:func:`rate`)."""
    f = np.asarray(flops_fwd, dtype=np.float64)
    d = np.full(f.shape, float(head_dim))
    at = _coords(d, s_kernel)  # element-wise: broadcast as the rates' own coordinates would be
    t_f = (1.0 - windowed) * f / rate("fwd", d, s_kernel, flash=flash, at=at)
    t_b = (1.0 - windowed) * BACKWARD_FLOPS * f / rate("bwd", d, s_kernel, flash=flash, at=at)
    if windowed > 0.0 and window_size:
        s = np.asarray(s_full, dtype=np.float64)
        fw = f * window_pairs(s, window_size) / (s * (s + 1.0) / 2.0)
        sk = np.minimum(np.asarray(s_kernel, dtype=np.float64), window_size + 1.0)
        at = _coords(d, sk)
        t_f = t_f + windowed * fw / rate("fwd", d, sk, flash=flash, at=at)
        t_b = t_b + windowed * BACKWARD_FLOPS * fw / rate("bwd", d, sk, flash=flash, at=at)
    return t_f, t_b
