"""The element-wise bytes of a layer pass counted kernel by kernel (llmcomm.step.ACTIVATION_BYTES,
ffn_activation_bytes, SCORE_BYTES: Megatron-DeepSpeed's GPT layer, Megatron-LM's gated MLP) and the rule that a GPU whose GEMMs are measured takes no A100
matmul efficiency (llmcomm.overhead.iteration.combine)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import TINY
from stub_bandwidth import StubBandwidth

from llmcomm import step
from llmcomm.overhead import Utilization, iteration_time
from llmcomm.overhead import utilization as U
from llmcomm.specs import ParallelConfig, load_cluster


def test_counts_by_kernel():
    """Per element, 16-bit: LayerNorm read + write (4 B) twice; fused bias-dropout-add reads x and the
    residual, writes the sum (6 B) and a bool mask (1 B), twice: 22 B of b·s·h. Bias-GeLU read + write: 4 B of
    b·s·f/tp forward; backward reads the gradient and the input, writes the input's gradient, and the bias
    gradient reads it again: 8 B. Unfused scores: Q·Kᵀ writes (2), softmax reads + writes (4), dropout reads + writes (4) and its
    mask (1), scores·V reads (2): 13 B of b·(a/tp)·s²."""
    assert step.ACTIVATION_BYTES == 2 * (2 + 2) + 2 * (2 + 2 + 2 + 1)
    assert step.ffn_activation_bytes("gelu") == (2 + 2, 2 + 2 + 2 + 2)
    assert step.SCORE_BYTES == 2 + (2 + 2) + (2 + 2 + 1) + 2


def test_layer_bytes_by_hand():
    """b=1, s=4 (T=4 tokens), tp=2, h=8, a=2 heads of d=4, f=32, no SP, unfused, H=1 byte/s:
    22·4·8 + 4·4·32/2 + 13·1·(2/2)·4·4 = 704 + 256 + 208 = 1168 bytes; the attention core alone 208."""
    one = np.array([1.0])
    X, core = U.layer_features(one, np.array([4.0]), np.array([2.0]), 8, 2, 2, 4, 32, 2, 1.0, 1.0, one,
                               np.array([False]))
    assert X[0, U.I["mem"]] == pytest.approx(1168.0, rel=1e-12)
    assert core[0, U.I["mem"]] == pytest.approx(208.0, rel=1e-12)
    _, fused = U.layer_features(one, np.array([4.0]), np.array([2.0]), 8, 2, 2, 4, 32, 2, 1.0, 1.0, one,
                                np.array([True]))
    assert fused[0, U.I["mem"]] == 0.0  # a fused attention kernel keeps its scores on chip


def test_measured_gemms_take_no_a100_efficiency():
    """On H100 (measured GEMM seconds) θ_gemm is taken as 1 whatever the utilization fit says; on A100
    (``FLOPs/peak`` features) it scales the matmuls."""
    model = dataclasses.replace(TINY, name="small-gemm", vocab_size=128)
    par = ParallelConfig(tp=2, pp=1, dp=1, micro_batch=1, global_batch=2, attention_backend="unfused")
    base = Utilization(coef=(1.0, 1.2, 0.0, 0.0, 0.0))
    slow = Utilization(coef=(1.5, 1.2, 0.0, 0.0, 0.0))
    h100, a100 = load_cluster("h100-80g-ndr400"), load_cluster("vtrain-a100")
    bw = StubBandwidth()
    assert iteration_time(model, par, h100, bw, slow) == iteration_time(model, par, h100, bw, base)
    fa, fs = iteration_time(model, par, a100, bw, base), iteration_time(model, par, a100, bw, slow)
    assert fs.forward_s > fa.forward_s and fs.tp_comm_s == fa.tp_comm_s
