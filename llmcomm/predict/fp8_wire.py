"""What TransformerEngine puts on the wire for a transformer block's sequence-parallel collectives under FP8.

Megatron-LM's TE layers (``TELayerNormColumnParallelLinear`` for ``linear_qkv``/``linear_fc1``, ``TERowParallel
Linear`` for ``linear_proj``/``linear_fc2``, ``TEColumnParallelLinear`` for the shared experts' ``linear_fc1``) hand
the SP all-gathers and reduce-scatters to TransformerEngine, which quantizes *before* it gathers. Per block and
micro-batch, with ``n = T·h`` elements of the gathered buffer (``T = b·s/cp`` tokens) and ``act`` bytes per
activation element (:mod:`.tp`):

=================  =====================================================  ==================================
collective         delayed / tensorwise                                    mxfp8 / blockwise
=================  =====================================================  ==================================
``fwd_ag``         FP8, ``n`` bytes (the qkv/fc1 input, quantized by the   ``n + n/32`` (E8M0 scales) /
  (qkv, fc1 in)    fused LayerNorm)                                        ``n + 4·n/128`` (fp32 per 128)
``fwd_rs``         ``act`` (the proj/fc2 GEMM output is BF16); FP8 ``n``   ``act``
  (proj, fc2 out)  only with ``tp_comm_overlap`` and the userbuffers
                   layer's ``fp8_buf`` (:data:`llmcomm.vocab.FP8_BUF_LAYERS`)
``bwd_ag_grad``    FP8, ``n`` (the proj/fc2 grad output, quantized then    both usages: ``2·(n + n/32)`` /
  (proj, fc2)      gathered)                                               ``2·(n + 4·n/128)``
``bwd_ag_input``   FP8, ``n`` (the saved FP8 ln_out re-gathered for        column-wise only: ``n + n/32`` /
  (qkv, fc1 wgrad) wgrad)                                                  ``n + 4·n/128``
``bwd_rs``         ``act`` (dgrad of qkv/fc1 is BF16)                      ``act``
  (qkv, fc1 dgrad)
=================  =====================================================  ==================================

Current scaling (``fp8_recipe='tensorwise'``, TE ``Float8CurrentScaling``) adds, before each gathered FP8 cast
(``fwd_ag`` and ``bwd_ag_grad``; the re-gather reuses the saved FP8 tensor), one ``MAX`` all-reduce of the fp32
amax (4 bytes) over the TP group so every shard carries one scale (:func:`amax_allreduce`). Delayed scaling
takes its scale from the amax history (one reduction per step over the amax group, not a per-collective call).
Without SP (or ``tp == 1``) nothing changes: the all-reduces of the row-parallel outputs and the column-parallel
input gradients are of BF16 GEMM outputs.

Sources (file:line at the version):

* TransformerEngine v1.8 (NeMo 24.07 ships TE 1.8.0.dev0: docs.nvidia.com/nemo-framework/user-guide/24.09/
  softwarecomponentversions.html, "NeMo Framework 24.07"; TE 1.x has only DelayedScaling):
  ``module/layernorm_linear.py:126-127`` (``ln_out`` allocated ``uint8`` under FP8), ``:155-157`` (gathered as
  such), ``:308-318`` (the FP8 ``ln_out`` saved), ``:439-444`` (re-gathered for wgrad), ``:561-564`` (dgrad
  reduce-scattered in the activation dtype); ``module/base.py:670-689`` (``grad_output_preprocess``: grad output
  cast to FP8, then gathered; BF16 only with ``override_linear_precision.wgrad``, Megatron's ``--no-fp8-wgrad``,
  not modelled); ``module/linear.py:136-146`` (TE ``Linear`` casts its SP input before the gather),
  ``:357-360`` (row-parallel output reduce-scattered as computed), ``:194-199`` (with userbuffers and an FP8
  buffer the proj/fc2 GEMM writes FP8 into the reduce-scatter buffer); ``module/base.py:88-95, 238-239, 261``
  (``initialize_ub``: the all-gather buffers ``qkv_fprop, qkv_dgrad, proj_dgrad, fc1_fprop, fc1_dgrad,
  fc2_dgrad`` are FP8 under FP8; ``proj_fprop``/``fc2_fprop`` only with the config's ``fp8_buf``; the wgrad
  reduce-scatter buffers never).
* TransformerEngine v2.9 (the Megatron-Bridge containers: 25.09 TE 2.7.0, 25.11 TE 2.9, 26.02 TE 2.12, 26.04
  TE 2.14+71bbefb, 26.06 TE 2.16 — NVIDIA-NeMo/Megatron-Bridge ``docs/releases/software-versions.md:101, 78,
  54, 32, 9`` at 067f987; 26.02.01 and 26.04.01 are not stated there: the rule of 26.02 and 26.04 is used —
  the rule below is the same at every one of these versions for the recipes the rows use):
  ``module/layernorm_linear.py:237-266`` forward (the norm output quantized, ``with_quantized_norm``, then
  ``gather_along_first_dim(ln_out, tp_group, quantizer=quantizer)`` after ``set_usage(rowwise=True,
  columnwise=False)``), ``:380`` (row-parallel output reduce-scattered as computed), ``:400-402, 669``
  (``ln_out_needs_gather``: the saved quantized ``ln_out`` re-gathered for wgrad, row-wise for FP8, column-wise
  for MXFP8/blockwise), ``:746`` (dgrad reduce-scattered unquantized); ``module/linear.py:204`` (TE ``Linear``
  gathers its quantized SP input), ``:344``; ``module/base.py:1161-1193`` (``grad_output_preprocess``, FP8 with
  all-gather: ``gather_along_first_dim(grad_output, tp_group, quantizer=quantizer)``), ``:289, 475``
  (``initialize_ub``, as in 1.8); ``distributed.py:903-985`` (``_all_gather_fp8``: ``_data`` only, "Assume
  scaling factors are identical across ranks", :963), ``:1053`` / ``:1445`` (``_all_gather_fp8_blockwise`` /
  ``_all_gather_mxfp8``: data and ``scale_inv`` per usage); ``layernorm_linear.py:1734-1776`` and
  ``linear.py:1653-1670`` (``_customize_quantizers_float8_current_scaling``: ``with_amax_reduction`` over
  ``tp_group`` for the SP column-parallel input and the SP row-parallel grad output) and
  ``csrc/quantizer.cpp:521-528`` (the ``MAX`` all-reduce of ``amax`` before the cast). Blockwise gathered the
  norm output in BF16 in TE 2.3-2.4 (``force_hp_blockwise_ln_out_gather``); no table container ships those.
* Megatron-LM maps ``--fp8-recipe`` to TE's recipes in ``megatron/core/fp8_utils.py`` ``get_fp8_recipe``
  (delayed: ``DelayedScaling``, tensorwise: ``Float8CurrentScaling``, blockwise: ``Float8BlockScaling``, mxfp8:
  ``MXFP8BlockScaling``); ``custom`` is a user factory whose wire format is unknown (refused here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError

SP_COLLECTIVES = ("fwd_ag", "fwd_rs", "bwd_ag_grad", "bwd_ag_input", "bwd_rs")


@dataclass(frozen=True)
class Wire:
    """The quantized form of one collective: ``usages`` copies of 1-byte data, each with ``scale_bytes`` per
    ``scale_block`` elements of scales (``scale_block = 0``: a per-tensor scale, not sent)."""

    usages: int = 1
    scale_block: int = 0
    scale_bytes: int = 0

    def nbytes(self, elements: Any) -> Any:
        """Bytes on the wire for ``elements`` elements (an int, or an integer array: element by element)."""
        scales = elements // self.scale_block * self.scale_bytes if self.scale_block else 0
        return self.usages * (elements + scales)


_TENSOR = Wire()
_MX, _MX2 = Wire(1, 32, 1), Wire(2, 32, 1)  # E8M0 scale per 32 elements
_BLK, _BLK2 = Wire(1, 128, 4), Wire(2, 128, 4)  # fp32 scale per 128 elements (1D blocks)
# recipe -> collective -> Wire (None: the activation dtype); fwd_rs's FP8 case is the userbuffers one (wire())
RULE: dict[str, dict[str, Wire | None]] = {
    "delayed": {"fwd_ag": _TENSOR, "fwd_rs": None, "bwd_ag_grad": _TENSOR, "bwd_ag_input": _TENSOR, "bwd_rs": None},
    "tensorwise": {"fwd_ag": _TENSOR, "fwd_rs": None, "bwd_ag_grad": _TENSOR, "bwd_ag_input": _TENSOR,
                   "bwd_rs": None},
    "mxfp8": {"fwd_ag": _MX, "fwd_rs": None, "bwd_ag_grad": _MX2, "bwd_ag_input": _MX, "bwd_rs": None},
    "blockwise": {"fwd_ag": _BLK, "fwd_rs": None, "bwd_ag_grad": _BLK2, "bwd_ag_input": _BLK, "bwd_rs": None},
}
AMAX_BYTES = 4  # one fp32 amax per current-scaling cast, MAX all-reduced over the TP group


def _recipe(fp8: str | None, recipe: str) -> str | None:
    if fp8 is None:
        return None
    if recipe not in RULE:
        raise ConfigError(f"fp8_recipe={recipe!r}: the bytes TransformerEngine sends are known for "
                          f"{tuple(RULE)} only (a 'custom' recipe's quantizers are the user's)")
    return recipe


def wire(kind: str, fp8: str | None, recipe: str, tp_comm_overlap: bool = False, fp8_buf: bool = False
         ) -> Wire | None:
    """The quantized form collective ``kind`` (one of :data:`SP_COLLECTIVES`) travels in, or None where it
    travels in the activation dtype. ``fp8_buf``: the userbuffers config sets ``fp8_buf`` for this block's
    row-parallel fprop layer (``proj_fprop``/``fc2_fprop``), which matters only for ``fwd_rs`` with
    ``tp_comm_overlap``."""
    r = _recipe(fp8, recipe)
    if r is None:
        return None
    if kind == "fwd_rs" and tp_comm_overlap and fp8_buf and r in ("delayed", "tensorwise"):
        return _TENSOR
    return RULE[r][kind]


def nbytes(kind: str, elements: int, act: int, fp8: str | None, recipe: str, tp_comm_overlap: bool = False,
           fp8_buf: bool = False) -> tuple[int, str | None]:
    """``(bytes, dtype)`` of collective ``kind`` over ``elements`` elements: ``elements·act`` and None (the
    activation dtype) where it is not quantized, else the quantized bytes and ``"fp8"``."""
    w = wire(kind, fp8, recipe, tp_comm_overlap, fp8_buf)
    return (elements * act, None) if w is None else (w.nbytes(elements), "fp8")


def amax_allreduce(kind: str, fp8: str | None, recipe: str) -> bool:
    """True where current scaling all-reduces the amax over the TP group before the cast that ``kind`` gathers
    (``fwd_ag``, ``bwd_ag_grad`` with ``fp8_recipe='tensorwise'``)."""
    return _recipe(fp8, recipe) == "tensorwise" and kind in ("fwd_ag", "bwd_ag_grad")


def _recipe_rows(fp8: np.ndarray, recipe: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The ``fp8`` rows grouped by their ``recipe`` (hashed, not sorted): ``[(recipe, row mask)]``."""
    f = np.asarray(fp8, bool)
    idx = np.flatnonzero(f.ravel())
    rec = np.broadcast_to(np.asarray(recipe, dtype=object), f.shape).ravel()[idx]
    codes, recipes = pd.factorize(rec, use_na_sentinel=False)
    out = []
    for i, r in enumerate(recipes):
        m = np.zeros(f.size, bool)
        m[idx[codes == i]] = True
        out.append((str(r), m.reshape(f.shape)))
    return out


def sp_bytes(kind: str, elements: np.ndarray, act: np.ndarray, fp8: np.ndarray, recipe: np.ndarray,
             tp_comm_overlap: np.ndarray | None = None, fp8_buf: np.ndarray | None = None,
             groups: list[tuple[str, np.ndarray]] | None = None) -> np.ndarray:
    """:func:`nbytes` over arrays (the iteration-time formulation's rows): ``fp8`` a boolean mask, ``recipe``
    the rows' ``fp8_recipe`` strings; integer bytes, ``elements·act`` on every row that is not quantized.
    ``groups``: the FP8 rows by recipe where the caller has them (:func:`_recipe_rows`)."""
    out = np.asarray(elements * act)
    if not np.count_nonzero(fp8):
        return out
    tco = np.zeros(len(out), bool) if tp_comm_overlap is None else np.asarray(tp_comm_overlap, bool)
    fb = np.zeros(len(out), bool) if fp8_buf is None else np.asarray(fp8_buf, bool)
    out = out.copy()
    ub = tco & fb
    for r, rows in _recipe_rows(fp8, recipe) if groups is None else groups:  # disjoint rows: any order
        for on_ub in (False, True):
            m = rows & (ub == on_ub)
            if np.count_nonzero(m):
                w = wire(kind, "hybrid", r, on_ub, on_ub)
                if w is not None:
                    out[m] = w.nbytes(np.asarray(elements)[m])
    return out


def block_bytes(elements: np.ndarray, act: np.ndarray, fp8: np.ndarray | None, recipe: np.ndarray | None,
                tp_comm_overlap: np.ndarray | None = None, buf_proj: np.ndarray | None = None,
                buf_fc2: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per row, the bytes of each SP collective of a block (:data:`SP_COLLECTIVES`, the forward reduce-scatter
    as ``fwd_rs_proj`` and ``fwd_rs_fc2`` for the attention and MLP block's userbuffers layer) and, where any row
    uses current scaling, ``amax``: :data:`AMAX_BYTES` on those rows, 0 elsewhere. Without FP8 rows every entry
    is ``elements·act`` (the same array object), so the closed form's items stay those of a BF16 table."""
    a = np.asarray(elements * act)
    if fp8 is None or recipe is None or not np.count_nonzero(fp8):
        return {k: a for k in ("fwd_ag", "fwd_rs_proj", "fwd_rs_fc2", "bwd_ag_grad", "bwd_ag_input", "bwd_rs")}
    f = np.asarray(fp8, bool)
    g = _recipe_rows(f, recipe)  # once for the six collectives
    out = {k: sp_bytes(k, elements, act, f, recipe, groups=g) for k in ("fwd_ag", "bwd_ag_grad", "bwd_ag_input",
                                                                         "bwd_rs")}
    for name, buf in (("fwd_rs_proj", buf_proj), ("fwd_rs_fc2", buf_fc2)):
        out[name] = sp_bytes("fwd_rs", elements, act, f, recipe, tp_comm_overlap, buf, groups=g)
    cur = f & (np.asarray(recipe, dtype=object) == "tensorwise")
    if np.count_nonzero(cur):
        out["amax"] = np.where(cur, AMAX_BYTES, 0).astype(np.int64)
    return out
