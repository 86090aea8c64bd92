"""GPU utilization: the time one GPU spends on a transformer layer's work, as a saturating function of the
work's shape, fitted on measured iteration times (:mod:`llmcomm.overhead.calibrate`).

The model (per layer, per micro-batch, per *pass*: a forward pass is one pass, a backward pass two, a
recomputed forward one more)::

    t_pass = max(θ_Lg, θ_gemm · (F_gemm + F_attn) / P)     matmuls of the layer on one TP rank
           + max(θ_Lm, θ_mem · B / H)                      elementwise kernels (memory traffic)
           + θ_tp · log2(tp)                               TP synchronisation

``θ_Lg`` and ``θ_Lm`` are the host's time to issue one layer pass's matmul and elementwise kernels: kernels run
asynchronously, so each class takes the longer of issuing and executing its kernels (work shorter than its
launch time leaves the GPU idle: the floor of a few ms per layer per micro-batch the data show at small
per-GPU work). ``θ_tp`` is a fixed cost per layer pass growing with the TP group (the all-reduce waits for
every rank); the shipped fit drives it to its bound, 0.

    F_gemm = 2·b·s·(h·a·d + 2·h·g·d + a·d·h + k·h·f)/tp        weight matmuls (MoE: the routed share)
    F_attn = 4·b·s²·a·d/tp                                    Q·Kᵀ and scores·V
    B      = 22·b·s·h/w + F·b·s·f/tp + 13·b·(a/tp)·s²           bytes (16-bit; w = tp with SP, else 1): two
             LayerNorms and two fused bias-dropout-adds with their bool masks on the full activation, the fused
             activation on the FFN activation (F = 4 the bias-GeLU, 6 a gated MLP's SwiGLU), and the unfused
             core's scores written by Q·Kᵀ, read and written by the fused softmax and by dropout (+ its bool
             mask), read by scores·V (:data:`llmcomm.step.ACTIVATION_BYTES`, :func:`~llmcomm.step.
             ffn_activation_bytes`, ``SCORE_BYTES``: each kernel of Megatron-DeepSpeed's
             ``megatron/model/transformer.py`` counted there; the gated count Megatron-LM's)

``P`` is the GPU's peak dense BF16/FP16 FLOP/s and ``H`` its memory bandwidth. The output layer adds
``2·b·s·h·V'/tp`` FLOPs and its fp32 cross-entropy ``20·b·s·V'/tp`` bytes (5 passes over fp32 logits) per
pass; the embedding lookup ``2·b·s·h`` bytes. The access counts fix how the memory traffic scales with the
shape; ``θ_mem`` scales them all (1 if the counts and the bandwidth were exact).

Fitted values (``data/calibration/utilization.json``, vTrain's 1,440 single-node runs): ``θ_gemm`` 1.092 (95 % CI
1.059–1.125: matmuls at 92 % of peak), ``θ_mem`` 1.19, launch floors 0.24 and 0.55 ms per layer pass, ``θ_tp`` on its
bound 0. With the former counts (16 accesses of ``b·s·h``, 5 of the scores, no dropout masks, no ``scores·V`` read)
``θ_gemm`` sat on its bound 1.0 and ``θ_mem`` was 1.41 (in-sample MAPE 6.29 % vs 6.21 % now; leave-one-shape-out
6.13 % vs 6.65 %). The identification is fragile, a finding: ``θ_gemm`` ≈ 1.09 holds for activation counts of
22–26 B and score counts of 12–13.5 B per element, but at 28 B or more (an unfused dropout mask in fp16) or a score
count of 10 B or 14 B the alternating fit lands on ``θ_gemm`` ≈ 1.0 again (in-sample MAPE within 0.2 points either
way); the shipped counts are the kernels as the code runs them, not chosen by the fit.

Why this form: it is linear in θ once the sides of the ``max`` are known (statsmodels gives coefficients with
confidence intervals) and it saturates.
``1/θ_gemm`` is the matmul efficiency a large GEMM reaches; the byte terms grow like ``h`` while the FLOP terms
grow like ``h²``, so as the hidden size grows the achieved FLOP/s of a layer rises towards ``P/θ_gemm`` and
never past it; at small sizes the launch floors dominate. The fit alternates: assign each row's layers to
launch-bound or work-bound under the current θ, fit by weighted least squares, repeat. Extrapolating from the
calibration data
(hidden 1,024–2,048, sequence 1,024) to hidden 12,288 moves a layer from launch- and memory-bound towards
``P/θ_gemm``: it cannot predict more than peak. How fast it gets there rests on two hidden sizes (fitted on
hidden 1,024 alone the model misses hidden 2,048 by about a third: the data cannot tell matmul from memory
scaling without both). What the single-node data cannot separate, the form fixes
by mechanism: the sequence length is 1,024 in every calibration row, so the attention core (``∝ s²``) shares
the GEMM efficiency and the scores' traffic the memory coefficient rather than getting their own.

Carrying to other GPUs (stated rules): FLOP terms scale with the cluster's ``peak_bf16_flops``, byte terms
with its HBM bandwidth (:func:`hbm_bandwidth`, datasheet values), fixed costs stay as measured (host-side
launch cost does not shrink with a faster GPU: a conservative choice).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import write_bytes
from ..errors import DataError
from ..specs import Cluster, data_dir
from ..step import ACTIVATION_BYTES, SCORE_BYTES, ffn_activation_bytes

FEATURES = ("gemm", "mem", "launch_gemm", "launch_mem", "tp")
K = len(FEATURES)
I = {f: i for i, f in enumerate(FEATURES)}  # noqa: E741 - index by feature name

# HBM bandwidth (bytes/s) by GPU, NVIDIA datasheets: A100 40GB 1,555 GB/s, A100 80GB SXM 2,039 GB/s,
# H100 SXM 3.35 TB/s, H200 SXM 4.8 TB/s.
HBM_BANDWIDTH = {"A100-SXM4-40GB": 1.555e12, "A100-SXM4-80GB": 2.039e12, "H100": 3.35e12, "H200": 4.8e12}
CALIBRATION = "calibration/utilization.json"


def hbm_bandwidth(cluster: Cluster) -> float:
    """The GPU memory bandwidth of ``cluster``: its own ``hbm_bandwidth`` (datasheet, in the cluster file) when
    given, else that of ``cluster.gpu`` from :data:`HBM_BANDWIDTH` (longest matching key); unknown GPUs:
    A100-40GB's bandwidth scaled by the ratio of peak FLOP/s (stated rule)."""
    if cluster.hbm_bandwidth is not None:
        return float(cluster.hbm_bandwidth)
    best = max((k for k in HBM_BANDWIDTH if k in cluster.gpu), key=len, default=None)
    if best is not None:
        return HBM_BANDWIDTH[best]
    return HBM_BANDWIDTH["A100-SXM4-40GB"] * cluster.peak_bf16_flops / 312e12


def layer_features(b: np.ndarray, s: np.ndarray, tp: np.ndarray, h: int, a: int, g: int, d: int, f_eff: int,
                   k: int, peak: float, hbm: float, full_width: np.ndarray | None = None,
                   fused: np.ndarray | None = None, activation: str = "gelu") -> tuple[np.ndarray, np.ndarray]:
    """Features (columns :data:`FEATURES`) of one forward pass of one transformer layer on one GPU, and of
    its attention core alone (what selective recomputation re-runs: ``F_attn`` and the scores' traffic).

    ``f_eff`` is the FFN width the layer's tokens run through: ``f`` for a dense layer, ``(topk + shared)·f_e``
    for an MoE layer (expected, balanced routing). ``full_width`` divides the full-activation traffic
    (``tp`` with sequence parallelism, else 1). ``activation``: the model's ``activation_kind``, which FFN activation kernel
    runs (:func:`llmcomm.step.ffn_activation_bytes`, its forward count per element of ``T·f_eff/tp``).

    ``fused`` marks rows whose attention core is one fused kernel (``attention_backend`` flash/fused/auto,
    :data:`llmcomm.vocab.FUSED_ATTENTION_BACKENDS`; the step description's :class:`llmcomm.step.AttentionCore`)::

        unfused:  F_attn = 4·T·s·a·d/tp (full score matrix)      score bytes = 13·b·(a/tp)·s² (SCORE_BYTES)
        fused:    F_attn = 2·T·s·a·d/tp (causal: the kernel skips the masked half of the blocks, FlashAttention-2,
                  Dao 2023, §3.1)                                score bytes = 0 (scores stay on chip)
    """
    b, s, tp = (np.asarray(x, dtype=np.float64) for x in (b, s, tp))
    fw = np.ones_like(tp) if full_width is None else np.asarray(full_width, dtype=np.float64)
    T = b * s
    X = np.zeros((T.shape[0], K))
    core = np.zeros((T.shape[0], K))
    proj = h * a * d + 2 * h * g * d + a * d * h
    f_attn = 4.0 * T * s * a * d / tp
    score_bytes = float(SCORE_BYTES) * b * (a / tp) * s * s
    if fused is not None:
        fz = np.asarray(fused, dtype=bool)
        f_attn = np.where(fz, 0.5 * f_attn, f_attn)
        score_bytes = np.where(fz, 0.0, score_bytes)
    X[:, I["gemm"]] = (2.0 * T * (proj + k * h * f_eff) / tp + f_attn) / peak
    X[:, I["mem"]] = (float(ACTIVATION_BYTES) * T * h / fw + float(ffn_activation_bytes(activation)[0]) * T * f_eff / tp + score_bytes) / hbm
    X[:, I["launch_gemm"]] = 1.0
    X[:, I["launch_mem"]] = 1.0
    X[:, I["tp"]] = np.log2(tp)
    core[:, I["gemm"]] = f_attn / peak
    core[:, I["mem"]] = score_bytes / hbm
    return X, core


def output_features(b: np.ndarray, s: np.ndarray, tp: np.ndarray, h: int, vocab_padded: np.ndarray,
                    peak: float, hbm: float) -> np.ndarray:
    """Features of one forward pass of the output layer (``2·b·s·h·V'/tp`` FLOPs) and its cross-entropy
    (``20·b·s·V'/tp`` bytes: 5 passes over fp32 logits)."""
    T = np.asarray(b, dtype=np.float64) * np.asarray(s, dtype=np.float64)
    v = np.asarray(vocab_padded, dtype=np.float64) / np.asarray(tp, dtype=np.float64)
    X = np.zeros((T.shape[0], K))
    X[:, I["gemm"]] = 2.0 * T * h * v / peak
    X[:, I["mem"]] = 20.0 * T * v / hbm
    return X


def embedding_features(b: np.ndarray, s: np.ndarray, h: int, hbm: float) -> np.ndarray:
    """Features of one pass of the embedding lookup: one full activation written (``2·b·s·h`` bytes)."""
    T = np.asarray(b, dtype=np.float64) * np.asarray(s, dtype=np.float64)
    X = np.zeros((T.shape[0], K))
    X[:, I["mem"]] = 2.0 * T * h / hbm
    return X


@dataclass(frozen=True)
class Utilization:
    """Fitted coefficients θ (:data:`FEATURES`), their covariance, and what they were fitted on.

    ``scale`` multiplies achieved speed (``scale = 2`` halves every compute time): the knob of the F5 sweep.
    """

    coef: tuple[float, ...]
    stderr: tuple[float, ...] = ()
    ci_low: tuple[float, ...] = ()
    ci_high: tuple[float, ...] = ()
    fitted_on: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    scale: float = 1.0

    def __post_init__(self) -> None:
        if len(self.coef) != K:
            raise DataError(f"utilization: coef has {len(self.coef)} entries, expected {K} ({FEATURES})")

    def work(self, X: np.ndarray) -> np.ndarray:
        """Seconds of GPU work of feature rows ``X``: ``θ_gemm·X_gemm + θ_mem·X_mem`` (divided by ``scale``)."""
        th = self.coef
        return (X[:, I["gemm"]] * th[I["gemm"]] + X[:, I["mem"]] * th[I["mem"]]) / self.scale

    def _parts(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        th = self.coef
        return (th[I["launch_gemm"]] * X[:, I["launch_gemm"]], th[I["gemm"]] * X[:, I["gemm"]],
                th[I["launch_mem"]] * X[:, I["launch_mem"]], th[I["mem"]] * X[:, I["mem"]])

    def layer_pass(self, X: np.ndarray) -> np.ndarray:
        """Seconds of one layer pass: ``max(θ_Lg, θ_gemm·X_gemm) + max(θ_Lm, θ_mem·X_mem) + θ_tp·log2(tp)``
        (divided by ``scale``)."""
        lg, g, lm, m = self._parts(X)
        return (np.maximum(lg, g) + np.maximum(lm, m) + self.coef[I["tp"]] * X[:, I["tp"]]) / self.scale

    def launch_bound(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether the matmul and the elementwise kernels of a layer pass are bound by launching."""
        lg, g, lm, m = self._parts(X)
        return lg > g, lm > m

    @staticmethod
    def design(X: np.ndarray, launch_bound: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """The linear design row of a layer pass given the side of each ``max``."""
        bg, bm = launch_bound
        D = X.copy()
        D[bg, I["gemm"]] = 0.0
        D[~bg, I["launch_gemm"]] = 0.0
        D[bm, I["mem"]] = 0.0
        D[~bm, I["launch_mem"]] = 0.0
        return D

    def achieved_flops(self, X: np.ndarray, flops: np.ndarray) -> np.ndarray:
        """FLOP/s a layer pass of features ``X`` and ``flops`` reaches: ``flops / layer_pass``."""
        return flops / self.layer_pass(X)

    def with_gemm_efficiency(self, theta_gemm: float) -> Utilization:
        """This model with ``θ_gemm`` replaced (the rest kept): what a GPU whose GEMMs are timed from measured
        kernels uses (:func:`llmcomm.overhead.iteration.combine`)."""
        import dataclasses

        coef = list(self.coef)
        coef[I["gemm"]] = float(theta_gemm)
        return dataclasses.replace(self, coef=tuple(coef))

    def scaled(self, scale: float) -> Utilization:
        import dataclasses

        return dataclasses.replace(self, scale=self.scale * scale)

    def gemm_efficiency(self) -> float:
        """``1/θ_gemm``: the fraction of peak a large GEMM reaches (the limit as sizes grow)."""
        return 1.0 / self.coef[I["gemm"]]

    def launch_floor(self) -> float:
        """``θ_Lg + θ_Lm`` (divided by ``scale``): seconds of a layer pass too small to leave the launch floor on
        either side, the least any layer pass costs (plus ``θ_tp·log2 tp``)."""
        return (self.coef[I["launch_gemm"]] + self.coef[I["launch_mem"]]) / self.scale

    def table(self) -> Any:
        """Coefficients with standard errors and 95% confidence intervals as a DataFrame, and each one's
        ``status``: ``fitted``, or ``at bound`` for a coefficient the fit fixed at its physical bound
        (:mod:`llmcomm.overhead.calibrate`: ``θ_gemm ≥ 1``, fixed costs ``≥ 0``; stored with standard error 0).
        A bound is not an estimate: its standard error and interval are NaN here, not 0."""
        import pandas as pd

        t = pd.DataFrame({"feature": FEATURES, "coef": self.coef,
                          "stderr": self.stderr or [np.nan] * K,
                          "ci_low": self.ci_low or [np.nan] * K, "ci_high": self.ci_high or [np.nan] * K})
        at_bound = t["stderr"].eq(0.0)
        t.loc[at_bound, ["stderr", "ci_low", "ci_high"]] = np.nan
        t["status"] = np.where(at_bound, "at bound", np.where(t["stderr"].isna() & ~at_bound, "", "fitted"))
        return t

    # -- storage -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"features": list(FEATURES), "coef": list(self.coef), "stderr": list(self.stderr),
                "ci_low": list(self.ci_low), "ci_high": list(self.ci_high), "fitted_on": self.fitted_on,
                "metrics": self.metrics, "command": self.command}

    def save(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        write_bytes(p, (json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n").encode())
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Utilization:
        p = Path(path)
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise DataError(f"{p}: cannot read a utilization calibration: {e}") from None
        if d.get("features") != list(FEATURES):
            raise DataError(f"{p}: field 'features'={d.get('features')} is not {list(FEATURES)}; regenerate it "
                            "with `python -m llmcomm.overhead.calibrate`")
        return cls(coef=tuple(d["coef"]), stderr=tuple(d.get("stderr", ())), ci_low=tuple(d.get("ci_low", ())),
                   ci_high=tuple(d.get("ci_high", ())), fitted_on=d.get("fitted_on", ""),
                   metrics=d.get("metrics", {}), command=d.get("command", ""))

    @classmethod
    def default(cls) -> Utilization:
        """The shipped calibration, ``data/calibration/utilization.json``."""
        return _default()


_CACHE: dict[str, Utilization] = {}


def _default() -> Utilization:
    p = data_dir() / CALIBRATION
    key = str(p)
    if key not in _CACHE:
        if not p.is_file():
            raise DataError(f"{p}: the shipped utilization calibration is missing; regenerate it with "
                            "`python -m llmcomm.overhead.calibrate`")
        _CACHE[key] = Utilization.load(p)
    return _CACHE[key]
