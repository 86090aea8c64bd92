"""Element-wise work Megatron-LM runs as separate eager PyTorch kernels around its fused paths in GPT-OSS-style
layers: the clamped gated activation of the routed experts and the unfused rotary embedding of YaRN. HBM bytes
per layer, rank and micro-batch, at the activation's ``a`` bytes per element (2: BF16), timed at HBM bandwidth in
the utilization model's memory feature like every other element-wise kernel of the formulation.

Read in the Megatron-LM that Megatron-Bridge pins (``3rdparty/Megatron-LM``) at the commits that published the
DGX-H100 rows: ``92c8482`` (25.11), ``23dd639`` (26.02), ``9ed8b0c`` (26.02.01), ``23265d2`` (26.04), ``2d1fa8d``
(26.04.01); the lines below are ``23dd639``'s and the code is the same at the others. GPT-OSS's settings:
Megatron-Bridge ``src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py`` at ``c0b9a00`` (26.02):
``position_embedding_type="yarn"`` (:59), ``yarn_rotary_scaling_factor=32`` (:61), ``yarn_mscale`` and
``yarn_mscale_all_dim`` unset (:66-67), ``activation_func=quick_gelu`` (:79), ``bias_activation_fusion=True``
(:81), ``activation_func_clamp_value=7.0`` (:84); at ``17a381f`` (26.04.01) the same in
``gpt_oss_bridge.py:65,73,83``.

**Clamped gated activation** (:func:`clamped_glu_bytes`; the model's ``activation_func_clamp_value``). The routed
experts' activation runs in ``TEGroupedMLP.forward``'s ``bias_act_func`` (``megatron/core/transformer/moe/
experts.py:775-801``: ``bias_activation_fusion`` with ``quick_gelu`` and a GLU calls
``weighted_bias_quick_geglu_impl``). That function (``megatron/core/fusions/fused_bias_geglu.py:410-442``) first
clamps the two halves of the first linear's output outside the fused kernel (:424-432)::

    x_glu, x_linear = input.chunk(2, -1)                                  views
    input = torch.cat((x_glu.clamp(max=v), x_linear.clamp(-v, v)), -1)   two clamps and a concatenation

and only then runs the compiled weighted quick-GEGLU (``jit_fuser``, one kernel: the activation the formulation
already counts). On the ``[N_r, 2·f']`` output (``N_r`` rows on the rank, ``f' = f_e/etp`` the expert FFN width
per expert-TP rank) each clamp reads and writes its half, the concatenation reads and writes the whole::

    forward   = (2 + 2)·a·N_r·2f'                  = 8·a·N_r·f'
    backward  = (3 + 2)·a·N_r·2f'                  = 10·a·N_r·f'
                each clamp's gradient reads the gradient and the input and writes its half (3 accesses; the
                bool masks of ``where`` are not counted), the chunk's backward concatenates the two halves (2);
                the concatenation's own backward is two views
    recompute = forward                            when ``recompute_modules`` holds ``moe_act`` (the checkpointed
                                                   ``bias_act_func``, experts.py:833-838) or ``moe``

``N_r = etp·L·k`` as :mod:`llmcomm.overhead.moe_time` counts it (``L = T/tp`` with sequence parallelism, else
``T``; balanced routing). Only the routed experts are counted (a dense ``MLP`` with a clamp and
``bias_activation_fusion`` raises in Megatron-LM, ``mlp.py:264-307``; unfused it runs the activation eager too).
The same function also builds ``torch.tensor(linear_offset, device=...)`` (:434) every call: a blocking
host-to-device copy, which PyTorch's ``copy_kernel_cuda`` (``aten/src/ATen/native/cuda/Copy.cu``) runs as
``memcpy_and_sync`` (``c10/cuda/CUDAFunctions.h``: ``cudaMemcpyAsync`` then ``cudaStreamSynchronize``) — a
host-device synchronisation in every MoE layer's forward and in its ``moe_act`` recompute, beside the alltoall
dispatcher's own. Host time is not in the formulation; it is not timed.

**YaRN RoPE, unfused** (:func:`rope_bytes`; ``position_embedding_type="yarn"``). Megatron-Bridge turns
``apply_rope_fusion`` off for every position embedding but ``"rope"`` (``gpt_provider.py:213-214`` calling
``src/megatron/bridge/utils/fusions.py:65-74``), and Megatron-LM itself takes the unfused path whenever YaRN's
concentration factor is not 1 (``megatron/core/models/common/embeddings/rope_utils.py:279-284``: TE's fused RoPE
has no ``mscale``; GPT-OSS: ``0.1·ln 32 + 1 = 1.347``, ``yarn_rotary_pos_embedding.py:252-270``, passed by
``attention.py:1098-1116``). ``_apply_rotary_pos_emb_bshd`` (``rope_utils.py:92-126``) runs on the query and the
key, each ``t`` of ``E`` elements::

    t·cos                    read + write                     2
    _rotate_half: -x2        read + write of half the tensor  1       (rope_utils.py:73-89)
                  cat        read + write                     2
    ·sin                     read + write                     2
    +                        read 2 + write                   3
    cat((t, t_pass))         read + write (t_pass is empty)   2
    forward  = 12·a·E   (+ cos, sin of the fp32 frequencies, ·mscale and the cast: 2·22·s·d_rot bytes a call)
    backward = 10·a·E   (grad·cos 2, grad·sin 2, the negation 1, the chunk's concatenation 2, the two branches'
                         gradients summed into t 3; the concatenations' own backward is views)

with ``E = T·(a_heads/tp)·d`` for the query and ``T·(g/tp)·d`` for the key (``T = b·s/cp``: a CP rank's tokens,
all of them on each TP rank after the QKV projection; ``d`` the head dim, ``rotary_percent`` 1); with MLA the
rotary part ``d_rot = qk_pos_emb_head_dim`` of every query head and of the one shared key head (MLA's
de-interleaving copy, ``rope_utils.py:115-118``, is not counted). Plain ``"rope"``
keeps TE's fused kernel, not counted by the formulation (unchanged).

Hook (:func:`add_layer_work`, called at the end of :func:`llmcomm.overhead.iteration._compute`): the forward bytes
join each layer pass's memory feature, the backward's beyond twice them the ``Bd``/``Bm`` terms (the formulation's
``backward = 2·forward + extra``, :func:`llmcomm.overhead.iteration.class_times`), the clamp's recompute the
``Rm`` features. A model with neither setting gets nothing added, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import utilization as U

CLAMP_FWD_ACCESSES = 4   # per element of the [N_r, 2f'] first-linear output: two half clamps (2) + cat (2)
CLAMP_BWD_ACCESSES = 5   # two half clamp gradients (3) + the chunk's backward concatenation (2)
ROPE_FWD_ACCESSES = 12   # per element of q or k: mul 2, neg 1, cat 2, mul 2, add 3, final cat 2
ROPE_BWD_ACCESSES = 10   # mul 2, mul 2, neg 1, chunk cat 2, gradient sum 3
ROPE_FREQ_BYTES = 44     # per fp32 frequency element and call: cos and sin, each read 4 + write 4 twice, cast 4 + 2


def _expert_rows(model: Any, c: dict[str, np.ndarray], T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(N_r, etp)``: rows the rank's routed experts run and the expert-TP size (:mod:`llmcomm.overhead.moe_time`)."""
    tp = c["tp"]
    etp = np.where(c["etp"] > 0, c["etp"], tp).astype(np.float64)
    L = np.asarray(T, dtype=np.float64) / np.where(c["sp"], tp, 1)
    return etp * L * model.moe_router_topk, etp


def clamped_glu_bytes(model: Any, c: dict[str, np.ndarray], T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(forward, backward)`` bytes of the clamps and concatenation before the routed experts' fused activation,
    per MoE layer, rank and micro-batch (module docstring)::

        forward = 8·a·N_r·f'      backward = 10·a·N_r·f'      f' = f_e/etp

    Zeros where the model sets no ``activation_func_clamp_value`` or has no experts."""
    n = len(c["tp"])
    if model.activation_func_clamp_value is None or not model.is_moe:
        return np.zeros(n), np.zeros(n)
    rows, etp = _expert_rows(model, c, T)
    a = np.asarray(c["act_dtype"], dtype=np.float64)
    elems = rows * 2.0 * model.expert_ffn_hidden_size / etp
    return CLAMP_FWD_ACCESSES * a * elems, CLAMP_BWD_ACCESSES * a * elems


def rope_bytes(model: Any, c: dict[str, np.ndarray], T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(forward, backward)`` bytes of the unfused RoPE of the query and the key, per layer, rank and
    micro-batch (module docstring)::

        E = T·(a_heads + g)/tp·d            (MLA: T·(a_heads/tp + 1)·qk_pos_emb_head_dim)
        forward = 12·a·E + 2·44·(T/b)·d_rot  backward = 10·a·E

    Zeros unless ``position_embedding_type == "yarn"``."""
    n = len(c["tp"])
    if model.position_embedding_type != "yarn":
        return np.zeros(n), np.zeros(n)
    tp = c["tp"].astype(np.float64)
    a = np.asarray(c["act_dtype"], dtype=np.float64)
    Tf = np.asarray(T, dtype=np.float64)
    if model.multi_latent_attention:
        d_rot, heads = float(model.qk_pos_emb_head_dim), model.num_attention_heads / tp + 1.0
    else:
        d_rot, heads = float(model.head_dim), (model.num_attention_heads + model.query_groups) / tp
    elems = Tf * heads * d_rot
    freqs = 2.0 * ROPE_FREQ_BYTES * (Tf / c["micro_batch"]) * d_rot  # [s, 1, 1, d] per call, query and key
    return ROPE_FWD_ACCESSES * a * elems + freqs, ROPE_BWD_ACCESSES * a * elems


def add_layer_work(model: Any, c: dict[str, np.ndarray], T: np.ndarray, out: dict[str, np.ndarray],
                   hbm: float) -> None:
    """Adds :func:`rope_bytes` (every layer) and :func:`clamped_glu_bytes` (MoE layers) to the features ``out`` of
    :func:`llmcomm.overhead.iteration._compute`, in place: forward bytes to ``Ld``/``Lm``'s memory feature, the
    backward's beyond twice the forward to ``Bd``/``Bm`` (created as zeros if absent), the clamp's forward to
    ``Rm`` where ``moe_act`` or ``moe`` is recomputed. Nothing is touched when neither applies."""
    if model.position_embedding_type != "yarn" and (model.activation_func_clamp_value is None or not model.is_moe):
        return
    mem = U.I["mem"]
    rf, rb = rope_bytes(model, c, T)
    gf, gb = clamped_glu_bytes(model, c, T)
    moe = 1.0 if model.is_moe else 0.0
    Ld, Lm = out["Ld"], out["Lm"]
    Ld[:, mem] += rf / hbm
    Lm[:, mem] += moe * (rf + gf) / hbm
    for key, L in (("Bd", Ld), ("Bm", Lm)):
        if key not in out:
            out[key] = np.zeros_like(L)
    out["Bd"][:, mem] += (rb - 2.0 * rf) / hbm
    out["Bm"][:, mem] += moe * (rb + gb - 2.0 * (rf + gf)) / hbm
    if "Rm" in out:
        z = np.zeros(len(c["tp"]), dtype=bool)
        replay = c.get("rm_moe_act", z) | c.get("rm_moe", z)
        out["Rm"][:, mem] += replay * gf / hbm
