"""A layer pass's utilization at shapes the calibration did not see: the fitted :class:`Utilization` evaluated over
hidden size and TP degree (notebook 06's extrapolation), the check that it saturates, and where one pass's time
goes (matmul or element-wise side, launch- or work-bound). Tables only; the figures are in :mod:`llmcomm.plots`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..specs import Cluster
from . import utilization as U


def layer_utilization(util: U.Utilization, cluster: Cluster, *, hidden: Sequence[int], tps: Sequence[int],
                      tokens: int, heads_per_hidden: float = 1 / 128, seq: int = 2048) -> pd.DataFrame:
    """Achieved FLOP/s of one GPT layer pass (FFN 4h, head size 128 unless ``h/128`` heads do not divide)
    as a fraction of peak, for each hidden size and TP degree at ``tokens = b·s``: the model's extrapolation."""
    rows = []
    hbm = U.hbm_bandwidth(cluster)
    for h in hidden:
        a = max(1, int(round(h * heads_per_hidden)))
        for tp in tps:
            if a % tp or (4 * h) % tp:
                continue
            b = np.array([tokens / seq])
            X, _ = U.layer_features(b, np.array([seq]), np.array([tp]), h, a, a, h // a, 4 * h, 2,
                                    cluster.peak_bf16_flops, hbm)
            flops = X[:, U.I["gemm"]] * cluster.peak_bf16_flops
            rows.append({"hidden": h, "tp": tp,
                         "utilization": util.achieved_flops(X, flops)[0] / cluster.peak_bf16_flops,
                         "launch_bound": bool(util.launch_bound(X)[0][0])})
    return pd.DataFrame(rows)


def saturates_below(curves: pd.DataFrame, limit: float, tol: float = 1e-12) -> bool:
    """Whether a :func:`layer_utilization` table saturates: per ``tp``, ``utilization`` never decreases as
    ``hidden`` grows, and it never passes ``limit`` (``1/θ_gemm``); both within ``tol``."""
    rising = all((np.diff(g.sort_values("hidden")["utilization"].to_numpy()) >= -tol).all()
                 for _, g in curves.groupby("tp"))
    return bool((curves["utilization"] <= limit + tol).all() and rising)


def layer_components(util: U.Utilization, cluster: Cluster, *, shapes: Sequence[dict[str, int]], seq: int = 2048
                     ) -> pd.DataFrame:
    """Where one layer pass's time goes, per shape (``hidden``, ``heads``, ``tp``, ``micro_batch``): the matmul
    side ``max(θ_Lg, θ_gemm·F/P)``, the elementwise side ``max(θ_Lm, θ_mem·B/H)`` and whether each is bound by
    launching, as milliseconds and shares."""
    rows = []
    hbm = U.hbm_bandwidth(cluster)
    th = util.coef
    for sh in shapes:
        h, a, tp, b = sh["hidden"], sh["heads"], sh["tp"], sh["micro_batch"]
        X, _ = U.layer_features(np.array([b]), np.array([seq]), np.array([tp]), h, a, a, h // a, 4 * h, 2,
                                cluster.peak_bf16_flops, hbm)
        g, lg = th[U.I["gemm"]] * X[0, U.I["gemm"]], th[U.I["launch_gemm"]]
        m, lm = th[U.I["mem"]] * X[0, U.I["mem"]], th[U.I["launch_mem"]]
        tot = util.layer_pass(X)[0]
        rows.append({**sh, "matmul_ms": max(g, lg) * 1e3, "matmul_launch_bound": lg > g,
                     "elementwise_ms": max(m, lm) * 1e3, "elementwise_launch_bound": lm > m,
                     "tp_ms": th[U.I["tp"]] * X[0, U.I["tp"]] * 1e3, "pass_ms": tot * 1e3,
                     "matmul_share": max(g, lg) / tot})
    return pd.DataFrame(rows)
