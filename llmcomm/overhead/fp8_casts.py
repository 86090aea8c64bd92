"""The FP8 quantization traffic of one transformer layer under delayed scaling, counted per GEMM operand as
TransformerEngine 1.x runs it (the NeMo 24.07 rows: Megatron-Core ``core_r0.8.0`` builds every FP8 run on TE's
``DelayedScaling``), as element-wise bytes at HBM bandwidth.

For each linear GEMM of :func:`llmcomm.overhead.iteration.layer_gemm_shapes` (``m`` tokens, ``n`` outputs, ``k``
inputs, ``batch`` experts, on one rank) with ``X = m·k·batch`` input, ``Y = m·n·batch`` output and
``W = n·k·batch`` weight elements, and ``w`` = tp with sequence parallelism (else 1), the bytes read + written
per micro-batch (BF16 2 bytes, FP8 1 byte)::

    qkv, fc1 (LayerNormLinear, dense layers)
        forward   0                   the norm writes its output in FP8 itself (layernorm_linear.py:126, uint8
                                      ln_out; the norm's own read/write is the layer's element-wise work)
        backward  2·X + 4·Y           ln_out_total transposed for wgrad (layernorm_linear.py:584
                                      tex.fp8_transpose; X = the gathered T·h under SP, :444); the grad output
                                      cast and transposed in one kernel (base.py:705/:717
                                      fp8_cast_transpose(_bgrad)_fused: read 2, write 1 + 1)
    proj, fc2 (Linear, row-parallel input: never gathered)
        forward   3·X (SP) | 4·X      SP: cast only (linear.py:137 cast_to_fp8, the module is sequence_parallel);
                                      else cast + transpose fused (linear.py:129)
        backward  2·X (SP) | 0        SP: the saved FP8 input transposed for wgrad (linear.py:531)
                  + 3·Y/w + 2·Y (SP)  SP: the grad output's shard cast (base.py:679), gathered in FP8 (:689),
                  | 4·Y               transposed (:691); else fused cast + transpose (base.py:717)
    experts and shared experts (plain Linear, not gathered): forward 4·X, backward 4·Y; the routed experts'
        first linear 1·X forward (its transposed copy): quantizing the dispatched rows (3·X) is
        :func:`llmcomm.overhead.moe_time.expert_input_cast_bytes`'s
    weights   4·W per iteration       cast + transpose once, cached over the micro-batches (base.py:793
                                      get_fp8_workspace, :880 cast_transpose_; is_first_microbatch): 4·W/m per
                                      micro-batch of ``m``

Read at TransformerEngine v1.8 (3ec998e9; the same calls in v1.7–v1.10). Not counted: the amax-history
update (one fused kernel over ``amax_history_len × tensors`` floats per step) and the amax all-reduce (a few KB).
The formulation's own rule was ``3·X`` of proj and fc2 forward and twice that backward
(:func:`llmcomm.overhead.iteration._compute`); this count replaces it for ``fp8_recipe='delayed'`` and leaves
``'tensorwise'`` (TE 2.x current scaling) as it was.
"""

from __future__ import annotations

import numpy as np

LN_FUSED = ("qkv", "fc1")  # TE LayerNormLinear: the norm emits FP8 (Megatron's TE spec, dense layers)
ROW_PARALLEL = ("proj", "fc2")  # TE Linear with a TP-sharded input
PLAIN = ("expert_fc1", "expert_fc2", "shared_fc1", "shared_fc2")  # MoE linears: cast + transpose on their input


def delayed_cast_bytes(shapes: dict[str, tuple[np.ndarray, ...]], sp: np.ndarray, tp: np.ndarray,
                       microbatches: np.ndarray, moe: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(forward, backward)`` bytes per micro-batch on one rank of one layer's FP8 casts and transposes under
    delayed scaling (module docstring), from the layer's GEMM ``shapes`` (``name -> (m, n, k, batch)``,
    :func:`llmcomm.overhead.iteration.layer_gemm_shapes`), the SP flag, the TP size and the micro-batches per
    iteration (weights cast once per iteration). ``moe``: the layer's MLP is its experts' (and shared experts')
    GEMMs, not ``fc1``/``fc2``."""
    s = np.asarray(sp, dtype=bool) & (np.asarray(tp) > 1)
    w = np.where(s, np.asarray(tp, dtype=np.float64), 1.0)
    mb = np.maximum(np.asarray(microbatches, dtype=np.float64), 1.0)
    names = ("qkv", "proj") + (PLAIN if moe else ("fc1", "fc2"))
    fwd = np.zeros(len(w))
    bwd = np.zeros(len(w))
    for name in names:
        if name not in shapes:
            continue
        m_, n_, k_, b_ = (np.asarray(v, dtype=np.float64) for v in shapes[name])
        X, Y, W = m_ * k_ * b_, m_ * n_ * b_, n_ * k_ * b_
        fwd = fwd + 4.0 * W / mb
        if name in LN_FUSED:
            bwd = bwd + 2.0 * X + 4.0 * Y
        elif name in ROW_PARALLEL:
            fwd = fwd + np.where(s, 3.0, 4.0) * X
            bwd = bwd + np.where(s, 2.0 * X + 3.0 * Y / w + 2.0 * Y, 4.0 * Y)
        else:  # expert_fc1's cast is moe_time.expert_input_cast_bytes' (3·X): its transposed copy here
            fwd = fwd + (1.0 if name == "expert_fc1" else 4.0) * X
            bwd = bwd + 4.0 * Y
    return fwd, bwd
