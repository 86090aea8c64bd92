"""Element-wise kernels of a Megatron-Core layer whose backward is not twice their forward, or that only some
models run: the FFN activation's backward (:func:`ffn_backward_extra`), the copy of the query that grouped-query
attention's reshape makes (:func:`query_copy_bytes`) and the per-head RMSNorm of the query and key
(``qk_layernorm``, Qwen3; :func:`qk_norm_bytes`). HBM bytes per layer, rank and micro-batch, timed at
HBM bandwidth in the utilization model's memory feature like every element-wise kernel of the formulation: the
forward bytes in the layer pass (``Ld``/``Lm``), the backward's beyond twice them as ``Bd``/``Bm`` (the
formulation's ``backward = 2·forward + extra``, :func:`llmcomm.overhead.iteration.class_times`), as
:mod:`llmcomm.overhead.eager_ops` counts its kernels.

**FFN activation.** Its forward bytes are in :func:`llmcomm.overhead.utilization.layer_features`; the count
per element of the ``f``-wide output is :func:`llmcomm.step.ffn_activation_bytes` (``(fwd, bwd)``: the
bias-GeLU ``(4, 8)``, the gated SwiGLU ``(6, 10)``, Nemotron's squared ReLU ``(4, 6)``). The backward beyond
twice the forward::

    extra = (bwd − 2·fwd)·T·f_eff/tp            0 for the bias-GeLU, −2·T·f_eff/tp for SwiGLU and squared ReLU

with ``T·f_eff/tp`` the elements :func:`~llmcomm.overhead.utilization.layer_features` counts (``f`` a dense
layer, ``(topk + S)·f_e`` an MoE layer).

**The query's reshape copy** (grouped-query attention). ``SelfAttention.get_query_key_value_tensors``
(Megatron-LM ``23dd639`` ``attention.py:1388-1462``; the same code at ``92c8482`` :1187-1217, ``2d1fa8d``
:1562-1592 and the NeMo 24.07 container's ``338af51`` :526) views the QKV output as ``[s, b, ng, (a/g + 2)·d]``
(``ng = g/tp`` groups on a rank, :1417-1423), splits it along the last dim into views (``SplitAlongDim``, TE's
``torch.split`` views; :1455-1458) and reshapes the query ``[s, b, ng, (a/g)·d] → [s, b, a/tp, d]`` (:1462).
The query's group stride is ``(a/g + 2)·d``, not ``(a/g)·d``: the two head dims merge into one stride only when
one of them is 1, so ``reshape`` copies (``clone`` + view: read + write of the query) exactly when ``ng = g/tp
> 1`` and ``a/g > 1`` (:func:`query_is_contiguous`). With ``g < tp`` each rank keeps one group
(``num_query_groups_per_partition = 1``, :294) and the reshape is a view; multi-head attention (``a/g = 1``, vTrain's
GPTs) never copies; multi-latent attention is another class (not counted). The key and value stay views
(nothing copies them here). Backward: ``clone``'s is the identity and the view's gradient is a view of the
(contiguous) query gradient, so no kernel::

    forward  = 2·a·E_q   where g/tp > 1 and a/g > 1, else 0        E_q = T·(a_heads/tp)·d
    backward = 0        (``extra = −2·forward`` against the formulation's twice-the-forward)

Not counted (here or elsewhere): the split's own backward, TE's ``SplitAlongDim`` concatenating ``dq``, ``dk``,
``dv`` unless they lie adjacent in one buffer (``transformer_engine/pytorch/utils.py:215-358`` at v2.12, the
``torch.cat`` at :358), which runs whether or not the reshape copied.

**q/k RMSNorm** (``qk_layernorm``; Megatron's ``--qk-layernorm``). Megatron-LM (lines of ``23dd639``, the same
code at the other commits Megatron-Bridge pins, ``92c8482``–``2d1fa8d``) builds ``q_layernorm`` and
``k_layernorm`` of width ``d`` (``attention.py:1281-1297``) as ``TENorm`` (``gpt_layer_specs.py:271, 280-285``;
TE ≥ 1.9, ``transformer_engine_spec_provider.py:55-62``), i.e. ``te.pytorch.RMSNorm`` for ``normalization=
"RMSNorm"`` (``extensions/transformer_engine.py:457-461``), and applies them to the query ``[s, b, a/tp, d]``
and the key ``[s, b, g/tp, d]`` after the QKV split (``attention.py:1456-1480``). TransformerEngine's op
(``transformer_engine/pytorch/ops/basic/rmsnorm.py`` at v2.12, the same at v2.7–v2.16, the Bridge containers'
TE) first makes its input contiguous (:182), runs ``rmsnorm_fwd`` (:187: reads ``x``, writes ``y`` and a fp32
``rstdev`` per row) and keeps ``x`` and ``rstdevs`` (:202); backward ``rmsnorm_bwd`` (:228) reads ``dy``, ``x``,
``rstdevs`` and writes ``dx`` (``dγ``: per-SM partials of ``d`` floats, not counted). Per element, ``a`` bytes
the activation::

    forward   = 2·a·(E_q + E_k) + 4·(R_q + R_k)         norm read + write, rstdev write
              + 2·a·E_k + [2·a·E_q]                    the .contiguous() copies (read + write)
    backward  = 3·a·(E_q + E_k) + 4·(R_q + R_k)         read dy and x, write dx; rstdev read

``E_q = T·(a_heads/tp)·d``, ``R_q = T·a_heads/tp`` rows; ``E_k = T·g'·d``, ``R_k = T·g'`` with ``g' = max(g/tp,
1)`` key heads on a rank (with ``g < tp`` each rank all-gathers and slices one group, ``attention.py:1397-1415``).
The key is a strided view of the QKV output (``SplitAlongDim``), so TE copies it; the query too unless
Megatron's reshape ``[s, b, g/tp, (a/g)·d] → [s, b, a/tp, d]`` (:1462) has already copied it, which it does
when both ``g/tp > 1`` and ``a/g > 1`` (the two head dims cannot merge into one stride: the group's keys and
values lie between); that copy is :func:`query_copy_bytes`' (counted there, with or without the norms), so the
query is copied exactly once either way. The copies' backward is the identity (no kernel); the gradient reaching the norm is a
fresh tensor (RoPE's backward output: ``grad_output.contiguous()``, :224, copies nothing). ``normalization="LayerNorm"`` runs TE's
LayerNorm op the same way (``ops/basic/layer_norm.py:199-247``) with a mean beside the rstdev: 8 bytes a row.
With multi-latent attention Megatron's ``qk_layernorm`` means the latent norms inside TE's
``LayerNormLinear`` (``gpt_layer_specs.py:238-247``): not counted here (zero).

Hook (:func:`add_layer_work`, called at the end of :func:`llmcomm.overhead.iteration._compute`). A bias-GeLU
model without ``qk_layernorm`` whose reshape never copies (multi-head attention) gets nothing added, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..step import ffn_activation_bytes
from . import utilization as U

RSTDEV_BYTES = {"RMSNorm": 4, "LayerNorm": 8}  # fp32 statistics per normalized row: rstdev (+ mean)
NORM_FWD_ACCESSES = 2   # per element: read x, write y
NORM_BWD_ACCESSES = 3   # per element: read dy and x, write dx
COPY_ACCESSES = 2       # per element of a strided input made contiguous: read + write


def ffn_backward_extra(model: Any, T: np.ndarray, tp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(dense, MoE)`` bytes of the FFN activation's backward beyond twice its forward, per layer, rank and
    micro-batch (module docstring): ``(bwd − 2·fwd)·T·f_eff/tp`` with the counts of
    :func:`llmcomm.step.ffn_activation_bytes`; zeros for the bias-GeLU, whose backward is twice its forward."""
    fwd, bwd = ffn_activation_bytes(model.activation_kind)
    per = float(bwd - 2 * fwd) * np.asarray(T, dtype=np.float64) / np.asarray(tp, dtype=np.float64)
    fe = (model.moe_router_topk + model.num_shared_experts) * model.expert_ffn_hidden_size if model.is_moe else 0
    return per * model.ffn_hidden_size, per * fe


def query_is_contiguous(model: Any, tp: np.ndarray) -> np.ndarray:
    """Whether Megatron's reshape of the query ``[s, b, g/tp, (a/g)·d]`` to ``[s, b, a/tp, d]`` copies it (so it
    leaves contiguous): when ``g/tp > 1`` and ``a/g > 1`` (module docstring); never with multi-latent attention."""
    g, a = model.query_groups, model.num_attention_heads
    return (g > np.asarray(tp)) & (a > g) & (not model.multi_latent_attention)


def query_copy_bytes(model: Any, c: dict[str, np.ndarray], T: np.ndarray) -> np.ndarray:
    """Forward bytes of the query's reshape copy per layer, rank and micro-batch (module docstring)::

        2·a·T·(a_heads/tp)·d   where :func:`query_is_contiguous`, else 0

    Its backward is no kernel."""
    tp = c["tp"].astype(np.float64)
    a = np.asarray(c["act_dtype"], dtype=np.float64)
    eq = np.asarray(T, dtype=np.float64) * model.num_attention_heads / tp * float(model.head_dim)
    return np.where(query_is_contiguous(model, c["tp"]), COPY_ACCESSES * a * eq, 0.0)


def qk_norm_bytes(model: Any, c: dict[str, np.ndarray], T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(forward, backward)`` bytes of the query's and key's norms (``qk_layernorm``), per layer, rank and
    micro-batch (module docstring)::

        forward  = 2·a·(E_q + E_k) + r·(R_q + R_k) + 2·a·E_k + [2·a·E_q unless the query is contiguous]
        backward = 3·a·(E_q + E_k) + r·(R_q + R_k)          r = 4 (RMSNorm), 8 (LayerNorm)

    Zeros without ``qk_layernorm`` or with multi-latent attention."""
    n = len(c["tp"])
    if not model.qk_layernorm or model.multi_latent_attention:
        return np.zeros(n), np.zeros(n)
    tp = c["tp"].astype(np.float64)
    a = np.asarray(c["act_dtype"], dtype=np.float64)
    Tf = np.asarray(T, dtype=np.float64)
    d = float(model.head_dim)
    rq = Tf * model.num_attention_heads / tp
    rk = Tf * np.maximum(model.query_groups / tp, 1.0)
    eq, ek = rq * d, rk * d
    stats = RSTDEV_BYTES[model.normalization] * (rq + rk)
    copies = COPY_ACCESSES * a * (ek + np.where(query_is_contiguous(model, c["tp"]), 0.0, eq))
    return NORM_FWD_ACCESSES * a * (eq + ek) + stats + copies, NORM_BWD_ACCESSES * a * (eq + ek) + stats


def add_layer_work(model: Any, c: dict[str, np.ndarray], T: np.ndarray, out: dict[str, np.ndarray],
                   hbm: float) -> None:
    """Adds :func:`qk_norm_bytes` and :func:`query_copy_bytes` (every layer) and :func:`ffn_backward_extra` to the
    features ``out`` of :func:`llmcomm.overhead.iteration._compute`, in place: the forwards to ``Ld``/``Lm``'s
    memory feature (``Lm`` only for an MoE model), every backward beyond twice its forward to ``Bd``/``Bm``
    (created as zeros if absent). Nothing is touched for a bias-GeLU MLP without ``qk_layernorm`` whose query is
    never copied."""
    copies = query_is_contiguous(model, c["tp"])
    if model.activation_kind == "gelu" and not model.qk_layernorm and not np.count_nonzero(copies):
        return
    mem = U.I["mem"]
    nf, nb = qk_norm_bytes(model, c, T)
    qc = query_copy_bytes(model, c, T)
    nf = nf + qc
    xd, xm = ffn_backward_extra(model, T, c["tp"])
    moe = 1.0 if model.is_moe else 0.0
    Ld, Lm = out["Ld"], out["Lm"]
    Ld[:, mem] += nf / hbm
    Lm[:, mem] += moe * nf / hbm
    for key, L in (("Bd", Ld), ("Bm", Lm)):
        if key not in out:
            out[key] = np.zeros_like(L)
    out["Bd"][:, mem] += (nb - 2.0 * nf + xd) / hbm
    out["Bm"][:, mem] += moe * (nb - 2.0 * nf + xm) / hbm
