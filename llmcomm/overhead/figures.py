"""Figures of notebooks 06 (GPU utilization) and 07 (iteration time): functions that take tidy DataFrames and
return a matplotlib Figure (data first, keyword-only options)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..specs import Cluster
from . import utilization as U

TERM_COLORS = {"forward": "#4c72b0", "backward": "#55a868", "recompute": "#8172b2", "optimizer": "#937860",
               "tp_comm": "#c44e52", "ep_comm": "#dd8452", "pp_comm": "#da8bc3", "dp_comm": "#8c8c8c",
               "bubble": "#ccb974"}


def predicted_vs_measured(df: pd.DataFrame, *, hue: str, title: str = "", band: float = 0.1, ax: Any = None) -> Any:
    """Log-log scatter of ``predicted_s`` against ``time_s`` coloured by ``hue``, with y = x and ±``band``."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5.2, 4.6))
    for key, g in df.groupby(hue, sort=True):
        ax.scatter(g["time_s"], g["predicted_s"], s=14, alpha=0.75, label=str(key))
    lo = min(df["time_s"].min(), df["predicted_s"].min()) * 0.8
    hi = max(df["time_s"].max(), df["predicted_s"].max()) * 1.25
    x = np.array([lo, hi])
    ax.plot(x, x, color="black", lw=1)
    for f in (1 - band, 1 + band):
        ax.plot(x, f * x, color="grey", lw=0.8, ls="--")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured iteration time (s)",
           ylabel="predicted iteration time (s)", title=title)
    ax.legend(title=hue, fontsize=8, title_fontsize=8, loc="upper left")
    return ax.figure


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


def utilization_curves(df: pd.DataFrame, *, limit: float, calibrated: tuple[int, int], ax: Any = None) -> Any:
    """Lines of ``utilization`` against ``hidden`` per ``tp``; the limit ``1/θ_gemm`` and the calibrated
    hidden-size range marked."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5.6, 4))
    for tp, g in df.groupby("tp"):
        ax.plot(g["hidden"], g["utilization"], marker="o", ms=3, label=f"TP {tp}")
    ax.axhline(limit, color="black", lw=0.8, ls="--", label="limit 1/θ_gemm")
    ax.axvspan(*calibrated, color="grey", alpha=0.15, label="calibration data")
    ax.set(xscale="log", xlabel="hidden size", ylabel="achieved FLOP/s of a layer pass / peak", ylim=(0, 1.05))
    ax.legend(fontsize=8)
    return ax.figure


def breakdown_bars(df: pd.DataFrame, *, row: str, ax: Any = None, title: str = "") -> Any:
    """Horizontal stacked bars of ``seconds`` per ``term`` for each value of ``row`` (tidy: row, term,
    seconds), with the exposed-communication share printed at the end of each bar."""
    import matplotlib.pyplot as plt

    wide = df.pivot_table(index=row, columns="term", values="seconds", aggfunc="sum", sort=False)
    terms = [t for t in TERM_COLORS if t in wide.columns]
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.5 + 0.45 * len(wide)))
    left = np.zeros(len(wide))
    for t in terms:
        ax.barh(range(len(wide)), wide[t].to_numpy(), left=left, color=TERM_COLORS[t], label=t)
        left += wide[t].to_numpy()
    comm = wide[[t for t in terms if t.endswith("_comm")]].sum(axis=1).to_numpy()
    for i, (tot, c) in enumerate(zip(left, comm, strict=True)):
        ax.text(tot, i, f"  {c / tot:.0%} comm", va="center", fontsize=8)
    ax.set_yticks(range(len(wide)), [str(x) for x in wide.index])
    ax.invert_yaxis()
    ax.set(xlabel="seconds per iteration", xlim=(0, left.max() * 1.22), title=title)
    ax.legend(fontsize=7, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0 if not title else 1.08))
    return ax.figure


def overhead_surface(points: pd.DataFrame, *, cases: Sequence[str], cluster: str) -> Any:
    """For each case, the communication overhead against achieved utilization, one line per bandwidth scale."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 3.6), sharey=True, squeeze=False)
    p = points[points["cluster"] == cluster]
    for ax, case in zip(axes[0], cases, strict=True):
        g = p[p["case"] == case]
        for w, gw in g.groupby("bandwidth_scale"):
            gw = gw.sort_values("utilization")
            ax.plot(gw["utilization"], gw["comm_overhead"], marker="o", ms=3,
                    label=f"{gw['effective_bandwidth_GBps'].median():.0f} GB/s (×{w:g})")
        ax.set(title=case, xlabel="achieved GPU utilization")
        ax.legend(title="effective bandwidth", fontsize=7, title_fontsize=7)
    axes[0][0].set_ylabel("exposed communication / iteration")
    fig.suptitle(f"cluster {cluster}", fontsize=9)
    fig.tight_layout()
    return fig


def overhead_by_cluster(df: pd.DataFrame, *, ax: Any = None) -> Any:
    """Grouped bars of ``comm_overhead`` per case (x) and cluster (bars)."""
    import matplotlib.pyplot as plt

    wide = df.pivot_table(index="case", columns="cluster", values="comm_overhead", sort=False)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6))
    n = len(wide.columns)
    w = 0.8 / n
    for i, c in enumerate(wide.columns):
        ax.bar(np.arange(len(wide)) + (i - (n - 1) / 2) * w, wide[c].to_numpy(), width=w, label=c)
    ax.set_xticks(range(len(wide)), list(wide.index))
    ax.set(ylabel="exposed communication / iteration")
    ax.legend(fontsize=7)
    return ax.figure


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
