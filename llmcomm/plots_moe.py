"""Figures of MoE predictability (notebook 09) in the house style of :mod:`llmcomm.plots`: each function takes
tidy data (from :mod:`llmcomm.analysis.moe` or :mod:`llmcomm.predict.envelope`) and returns an Axes or
Figure."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .plots import a2a_matrix_heatmap


def over_training(df: pd.DataFrame, y: str, *, x: str = "iteration", hue: str | None = None, window: int = 50,
                  ax: Axes | None = None, title: str | None = None, ylabel: str | None = None,
                  logy: bool = False) -> Axes:
    """``y`` against ``x`` per ``hue``: raw values faint, their centred rolling mean over ``window`` steps
    bold."""
    ax = ax or plt.subplots(figsize=(6.5, 3.6))[1]
    groups = df.groupby(hue, sort=False) if hue else [(None, df)]
    for i, (name, g) in enumerate(groups):
        g = g.groupby(x, sort=True)[y].mean()
        c = f"C{i}"
        ax.plot(g.index, g.to_numpy(), color=c, alpha=0.15, lw=0.6)
        ax.plot(g.index, g.rolling(window, center=True, min_periods=1).mean().to_numpy(), color=c, lw=1.8,
                label=str(name) if name is not None else None)
    if hue:
        ax.legend(frameon=False, fontsize=8)
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel=x, ylabel=ylabel or y, title=title or "")
    return ax


def identity_panels(panels: Sequence[tuple[str, np.ndarray]], unit: float = 2**10, label: str = "KiB") -> Figure:
    """The four all-to-all matrices of one MoE layer and micro-batch side by side (sender rows)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.2))
    for ax, (name, mat) in zip(np.atleast_1d(axes), panels, strict=True):
        a2a_matrix_heatmap(np.asarray(mat, dtype=float), ax=ax, unit=unit, title=name, label=label)
    fig.tight_layout()
    return fig


def metric_bars(df: pd.DataFrame, *, x: str, y: str, hue: str, ax: Axes | None = None, title: str | None = None,
                ylabel: str | None = None) -> Axes:
    """Grouped bars of ``y`` per ``x`` and ``hue`` (e.g. a metric for the dense and the MoE trace)."""
    ax = ax or plt.subplots(figsize=(6.5, 3.4))[1]
    xs = list(pd.unique(df[x]))
    hs = list(pd.unique(df[hue]))
    w = 0.8 / len(hs)
    for i, h in enumerate(hs):
        v = df[df[hue] == h].set_index(x)[y].reindex(xs).to_numpy(dtype=float)
        ax.bar(np.arange(len(xs)) + (i - (len(hs) - 1) / 2) * w, v, w, label=str(h), color=f"C{i}")
    ax.set_xticks(np.arange(len(xs)), xs, rotation=15, ha="right")
    ax.legend(frameon=False, fontsize=8)
    ax.set(ylabel=ylabel or y, title=title or "")
    return ax


def exact_bounded_bars(split: pd.DataFrame, *, by: str, ax: Axes | None = None, title: str | None = None) -> Axes:
    """Stacked shares of all-to-all bytes per ``by``: exact per pair, bounded floor (the least a pair ever
    carried) and the bounded band (max − min, which can exceed the mean)."""
    ax = ax or plt.subplots(figsize=(6.5, 3.4))[1]
    w = split.pivot_table(index=by, columns="quantity", values="share", sort=False)
    xs = np.arange(len(w))
    bottom = np.zeros(len(w))
    for q, c, lab in (("exact_pairs", "C2", "exact per pair"), ("bounded_floor", "C0", "bounded: floor (min)"),
                      ("bounded_band", "C3", "bounded: band (max − min)")):
        v = w[q].to_numpy()
        ax.bar(xs, v, 0.6, bottom=bottom, color=c, label=lab)
        bottom += v
    ax.plot(xs, w["exact_send_totals"].to_numpy(), "k_", ms=30, mew=2, label="exact per-rank send totals")
    ax.set_xticks(xs, [str(i) for i in w.index], rotation=15, ha="right")
    ax.axhline(1.0, color="0.4", lw=0.8, ls=":")
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set(ylabel="share of mean all-to-all bytes", title=title or "")
    return ax


def envelope_ranges(env: pd.DataFrame, *, hue: str = "source", ax: Axes | None = None, unit: float = 2**10,
                    title: str | None = None) -> Axes:
    """Per (src → dst) pair: the [min, max] range of bytes as a bar, the expected value as a dot, per ``hue``;
    the uniform expectation and the hard top-k bounds as lines."""
    ax = ax or plt.subplots(figsize=(8, 3.6))[1]
    pairs = env[["src", "dst"]].drop_duplicates().sort_values(["src", "dst"])
    labels = [f"{s}→{d}" for s, d in pairs.itertuples(index=False)]
    pos = {tuple(p): i for i, p in enumerate(pairs.itertuples(index=False))}
    hs = list(pd.unique(env[hue]))
    w = 0.8 / len(hs)
    for i, h in enumerate(hs):
        g = env[env[hue] == h]
        xi = np.array([pos[(s, d)] for s, d in zip(g["src"], g["dst"], strict=True)]) + (i - (len(hs) - 1) / 2) * w
        ax.bar(xi, (g["max_bytes"] - g["min_bytes"]) / unit, w * 0.9, bottom=g["min_bytes"] / unit, color=f"C{i}",
               alpha=0.45, label=f"{h}: min–max")
        ax.plot(xi, g["expected_bytes"] / unit, "o", color=f"C{i}", ms=3.5, label=f"{h}: expected")
    u = env["uniform_bytes"].iloc[0] / unit
    ax.axhline(u, color="k", lw=1, ls="--", label="uniform (predict_traffic)")
    ax.axhline(env["hard_max_bytes"].iloc[0] / unit, color="C3", lw=1, ls=":", label="top-k hard max")
    ax.set_xticks(np.arange(len(labels)), labels, rotation=90, fontsize=7)
    ax.legend(frameon=False, fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    ax.set(xlabel="dispatch pair (global ranks)", ylabel="KiB per micro-batch", title=title or "")
    return ax


def acf_lines(acf: pd.DataFrame, *, hue: str, n_obs: int | None = None, ax: Axes | None = None,
              title: str | None = None) -> Axes:
    """Mean ACF over experts per ``hue`` (columns ``lag``, ``acf``), with the white-noise band
    ``±1.96/√n``."""
    ax = ax or plt.subplots(figsize=(6.5, 3.4))[1]
    for i, (h, g) in enumerate(acf.groupby(hue, sort=False)):
        m = g.groupby("lag")["acf"].mean()
        ax.plot(m.index, m.to_numpy(), color=f"C{i}", lw=1.6, label=str(h))
    if n_obs:
        b = 1.96 / np.sqrt(n_obs)
        ax.axhspan(-b, b, color="0.85", zorder=0, label="95% white-noise band")
    ax.legend(frameon=False, fontsize=8)
    ax.set(xlabel="lag [iterations]", ylabel="ACF of expert load share (mean over experts)", title=title or "")
    return ax
