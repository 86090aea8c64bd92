"""Figures of MoE predictability (notebook 09) in the calling convention of :mod:`llmcomm.plots` (seaborn's):
tidy ``data`` first (from :mod:`llmcomm.analysis.moe` or :mod:`llmcomm.predict.envelope`), the columns as
keyword-only ``x``/``y``/``hue`` with defaults naming what those functions return, ``ax=None`` (a new figure)
for axes-level plots; each returns its Axes (or, for a row of panels, its Figure)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .plots import a2a_matrix_heatmap, axes_or_new


def over_training(data: pd.DataFrame, *, x: str = "iteration", y: str = "cv", hue: str | None = None,
                  ax: Axes | None = None, window: int = 50, title: str | None = None, ylabel: str | None = None,
                  logy: bool = False) -> Axes:
    """``y`` against ``x`` per ``hue`` (mean over other rows at the same ``x``): raw values faint, their
    centred rolling mean over ``window`` steps bold."""
    ax = axes_or_new(ax, (6.5, 3.6))
    groups = data.groupby(hue, sort=False) if hue else [(None, data)]
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


def identity_panels(data: pd.DataFrame, *, x: str = "dst", y: str = "src", hue: str = "value",
                    col: str = "panel", unit: float = 2**10, label: str = "KiB") -> Figure:
    """One all-to-all matrix per value of ``col`` side by side, in order of appearance (``y`` sender rows,
    ``x`` receiver columns, ``hue`` bytes): e.g. the four all-to-alls of one MoE layer and micro-batch
    (:func:`llmcomm.analysis.moe.identity_panel_cells`)."""
    names = list(pd.unique(data[col]))
    fig, axes = plt.subplots(1, len(names), figsize=(3.4 * len(names), 3.2))
    for ax, name in zip(np.atleast_1d(axes), names, strict=True):
        a2a_matrix_heatmap(data[data[col] == name], x=x, y=y, hue=hue, ax=ax, unit=unit, title=str(name),
                           label=label)
    fig.tight_layout()
    return fig


def metric_bars(data: pd.DataFrame, *, x: str = "metric", y: str = "value", hue: str = "trace",
                ax: Axes | None = None, title: str | None = None, ylabel: str | None = None) -> Axes:
    """Grouped bars of ``y`` per ``x`` and ``hue`` (e.g. a metric for the dense and the MoE trace)."""
    ax = axes_or_new(ax, (6.5, 3.4))
    xs = list(pd.unique(data[x]))
    hs = list(pd.unique(data[hue]))
    w = 0.8 / len(hs)
    for i, h in enumerate(hs):
        v = data[data[hue] == h].set_index(x)[y].reindex(xs).to_numpy(dtype=float)
        ax.bar(np.arange(len(xs)) + (i - (len(hs) - 1) / 2) * w, v, w, label=str(h), color=f"C{i}")
    ax.set_xticks(np.arange(len(xs)), xs, rotation=15, ha="right")
    ax.legend(frameon=False, fontsize=8)
    ax.set(ylabel=ylabel or y, title=title or "")
    return ax


def exact_bounded_bars(data: pd.DataFrame, *, x: str = "scope", y: str = "share", hue: str = "quantity",
                       ax: Axes | None = None, title: str | None = None) -> Axes:
    """Stacked shares ``y`` of all-to-all bytes per ``x``, one bar segment per ``hue`` quantity of
    :func:`llmcomm.analysis.moe.exact_bounded_split`: exact per pair, bounded floor (the least a pair ever
    carried) and the bounded band (max − min, which can exceed the mean); exact per-rank send totals as a mark."""
    ax = axes_or_new(ax, (6.5, 3.4))
    w = data.pivot_table(index=x, columns=hue, values=y, sort=False)
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


def envelope_ranges(data: pd.DataFrame, *, x: Sequence[str] = ("src", "dst"),
                    y: Sequence[str] = ("min_bytes", "expected_bytes", "max_bytes"), hue: str = "source",
                    ax: Axes | None = None, unit: float = 2**10, title: str | None = None) -> Axes:
    """Per pair ``x`` (sender, receiver): the [min, max] range of bytes (``y``: min, expected, max) as a bar, the
    expected value as a dot, per ``hue``; the uniform expectation and the hard top-k bounds (``uniform_bytes``,
    ``hard_max_bytes``) as lines: the columns of :func:`llmcomm.predict.envelope.a2a_envelope`."""
    ax = axes_or_new(ax, (8, 3.6))
    env = data.rename(columns={**dict(zip(x, ("src", "dst"), strict=True)),
                               **dict(zip(y, ("min_bytes", "expected_bytes", "max_bytes"), strict=True))})
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


def acf_lines(data: pd.DataFrame, *, x: str = "lag", y: str = "acf", hue: str = "run", ax: Axes | None = None,
              n_obs: int | None = None, title: str | None = None) -> Axes:
    """Mean ``y`` (an autocorrelation, over experts) against ``x`` (lag) per ``hue``, with the white-noise
    band ``±1.96/√n`` for ``n_obs`` observations."""
    ax = axes_or_new(ax, (6.5, 3.4))
    for i, (h, g) in enumerate(data.groupby(hue, sort=False)):
        m = g.groupby(x)[y].mean()
        ax.plot(m.index, m.to_numpy(), color=f"C{i}", lw=1.6, label=str(h))
    if n_obs:
        b = 1.96 / np.sqrt(n_obs)
        ax.axhspan(-b, b, color="0.85", zorder=0, label="95% white-noise band")
    ax.legend(frameon=False, fontsize=8)
    ax.set(xlabel="lag [iterations]", ylabel="ACF of expert load share (mean over experts)", title=title or "")
    return ax
