"""Figures of MoE predictability (notebook 09) in the calling convention of :mod:`llmcomm.plots` (seaborn's):
tidy ``data`` first (from :mod:`llmcomm.analysis.moe` or :mod:`llmcomm.predict.envelope`), the columns as
keyword-only ``x``/``y``/``hue`` with defaults naming what those functions return, ``ax=None`` (a new figure)
for axes-level plots, the rest passed on as ``**kwargs``; each returns its Axes (or, for a row of panels, its
Figure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .plots import a2a_matrix_heatmap, axes_or_new


def over_training(data: pd.DataFrame, *, x: str = "iteration", y: str = "cv", hue: str | None = None,
                  ax: Axes | None = None, window: int = 50, title: str | None = None, ylabel: str | None = None,
                  logy: bool = False, **kwargs: Any) -> Axes:
    """``y`` against ``x`` per ``hue`` (mean over other rows at the same ``x``, e.g. over layers): raw values
    faint, their centred rolling mean over ``window`` steps bold. ``kwargs`` go to the bold line's ``ax.plot``."""
    ax = axes_or_new(ax, (6.5, 3.6))
    groups = data.groupby(hue, sort=False) if hue else [(None, data)]
    for i, (name, g) in enumerate(groups):
        g = g.groupby(x, sort=True)[y].mean()
        c = f"C{i}"
        ax.plot(g.index, g.to_numpy(), color=c, alpha=0.15, lw=0.6)
        ax.plot(g.index, g.rolling(window, center=True, min_periods=1).mean().to_numpy(), color=c,
                **{"lw": 1.8, **kwargs}, label=str(name) if name is not None else None)
    if hue:
        ax.legend(frameon=False, fontsize=8)
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel=x, ylabel=ylabel or y, title=title or "")
    return ax


def identity_panels(data: pd.DataFrame, *, x: str = "dst", y: str = "src", hue: str = "value",
                    col: str = "panel", unit: float = 2**10, label: str = "KiB", title: str | None = None,
                    **kwargs: Any) -> Figure:
    """One all-to-all matrix per value of ``col`` side by side, in order of appearance (``y`` sender rows,
    ``x`` receiver columns, ``hue`` bytes) on one colour scale with one colour bar: e.g. the four all-to-alls of
    one MoE layer and micro-batch (:func:`llmcomm.analysis.moe.identity_panel_cells`). Panel titles are wrapped
    after their first ``": "``; ``title`` (e.g. which iteration, micro-batch and layer) goes above all.
    ``kwargs`` go to :func:`llmcomm.plots.a2a_matrix_heatmap`."""
    names = list(pd.unique(data[col]))
    fig, axes = plt.subplots(1, len(names), figsize=(3.0 * len(names) + 1.0, 3.6), layout="constrained",
                             squeeze=False)
    top = float(data.groupby([col, y, x])[hue].sum().max()) / unit
    for ax, name in zip(axes[0], names, strict=True):
        a2a_matrix_heatmap(data[data[col] == name], x=x, y=y, hue=hue, ax=ax, unit=unit,
                           title=str(name).replace(": ", ":\n", 1), label=label,
                           **{"cbar": False, "vmin": 0.0, "vmax": top, **kwargs})
        ax.title.set_fontsize(9)
    fig.colorbar(axes[0][0].collections[0], ax=axes[0].tolist(), fraction=0.03, pad=0.02).set_label(
        f"{label} (one scale for all panels)")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def metric_bars(data: pd.DataFrame, *, x: str = "metric", y: str = "value", hue: str = "trace",
                ax: Axes | None = None, title: str | None = None, ylabel: str | None = None, fmt: str = "{:.2f}",
                **kwargs: Any) -> Axes:
    """Grouped bars of ``y`` per ``x`` and ``hue`` (e.g. a metric for the dense and the MoE trace), each bar's
    value written on it (``fmt``) so that a bar of zero stays visible. ``kwargs`` go to ``ax.bar``."""
    ax = axes_or_new(ax, (6.5, 3.4))
    xs = list(pd.unique(data[x]))
    hs = list(pd.unique(data[hue]))
    w = 0.8 / len(hs)
    for i, h in enumerate(hs):
        v = data[data[hue] == h].set_index(x)[y].reindex(xs).to_numpy(dtype=float)
        bars = ax.bar(np.arange(len(xs)) + (i - (len(hs) - 1) / 2) * w, v, w, label=str(h), color=f"C{i}",
                      **kwargs)
        ax.bar_label(bars, labels=["" if np.isnan(b) else fmt.format(b) for b in v], fontsize=7, padding=1)
    ax.set_xticks(np.arange(len(xs)), xs, rotation=15, ha="right")
    ax.legend(frameon=False, fontsize=8, ncol=len(hs), loc="upper center")
    ax.margins(y=0.12)
    ax.set(ylabel=ylabel or y, title=title or "")
    return ax


EXACT_QUANTITIES = {"exact_send_totals": "per-rank send totals", "exact_recv_totals": "per-rank receive totals",
                    "exact_call_totals": "call totals", "exact_pairs": "per pair"}


def exact_bounded_bars(data: pd.DataFrame, *, x: str = "share", y: str = "scope", hue: str = "quantity",
                       title: str | None = None, **kwargs: Any) -> Figure:
    """Which all-to-all bytes are known before the run, per ``y`` scope, from
    :func:`llmcomm.analysis.moe.exact_bounded_split` (``x``: each ``hue`` quantity as a fraction of the mean
    bytes). Left: the share of bytes in totals that never change (:data:`EXACT_QUANTITIES`; values written on
    the bars, so a share of 0 stays visible). Right: what the pairs that do change carry, summed over pairs,
    relative to their mean — from ``Σ min`` (certain anyway) to ``Σ max`` (what a planner must provision for
    every pair at once); 1 = the mean. ``kwargs`` go to ``ax.barh``."""
    w = data.pivot_table(index=y, columns=hue, values=x, sort=False)
    scopes = [str(s) for s in w.index]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.6 * len(w) + 1.6), sharey=True, layout="constrained",
                                      gridspec_kw={"width_ratios": [1.25, 1]})
    pos = np.arange(len(w))
    k = len(EXACT_QUANTITIES)
    h = 0.8 / k
    for i, (q, name) in enumerate(EXACT_QUANTITIES.items()):
        v = 100 * w[q].to_numpy()
        bars = left.barh(pos + (i - (k - 1) / 2) * h, v, h, color=f"C{i}", label=name, **kwargs)
        left.bar_label(bars, labels=[f"{b:.0f}%" if b >= 0.5 or b == 0 else f"{b:.2f}%" for b in v], fontsize=6,
                       padding=1)
    left.set(xlim=(0, 118), xlabel="bytes whose total never changes [% of mean bytes]",
             title="exact before the run")
    left.set_yticks(pos, scopes, fontsize=8)
    left.set_ylim(len(w) - 0.5, -0.5)
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, title="total of",
                title_fontsize=7)
    lo = w["bounded_floor"].to_numpy()
    hi = lo + w["bounded_band"].to_numpy()
    right.barh(pos, hi - lo, 0.5, left=lo, color="C3", alpha=0.55, label="Σ min … Σ max over pairs", **kwargs)
    right.plot(lo, pos, "|", color="C0", ms=14, mew=2, label="Σ min (certain)")
    right.plot(hi, pos, "|", color="C3", ms=14, mew=2, label="Σ max (to provision)")
    for p, b in zip(pos, hi, strict=True):
        right.annotate(f"{b:.2f}×", (b, p), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
    right.axvline(1.0, color="k", lw=0.8, ls=":", label="mean (1×)")
    right.set(xlim=(0, max(1.2, float(hi.max()) * 1.15)), title="bounded: pairs whose bytes change",
              xlabel="bytes of the changing pairs, summed, / their mean")
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def envelope_ranges(data: pd.DataFrame, *, x: Sequence[str] = ("src", "dst"),
                    y: Sequence[str] = ("min_bytes", "expected_bytes", "max_bytes"), hue: str = "source",
                    ax: Axes | None = None, unit: float = 2**10, title: str | None = None, **kwargs: Any) -> Axes:
    """Per pair ``x`` (sender, receiver): the [min, max] range of bytes (``y``: min, expected, max) as a bar, the
    expected value as a dot, per ``hue``; the uniform expectation and the hard top-k bounds (``uniform_bytes``,
    ``hard_max_bytes``) as lines: the columns of :func:`llmcomm.predict.envelope.a2a_envelope`. The y axis starts
    at zero so that every bar is whole. ``kwargs`` go to ``ax.bar``."""
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
               **{"alpha": 0.45, **kwargs}, label=f"{h}: min–max")
        ax.plot(xi, g["expected_bytes"] / unit, "o", color=f"C{i}", ms=3.5, label=f"{h}: expected")
    u = env["uniform_bytes"].iloc[0] / unit
    ax.axhline(u, color="k", lw=1, ls="--", label="uniform (predict_traffic)")
    ax.axhline(env["hard_max_bytes"].iloc[0] / unit, color="C3", lw=1, ls=":", label="top-k hard max")
    ax.set_xticks(np.arange(len(labels)), labels, rotation=90, fontsize=7)
    ax.set_ylim(0, env["hard_max_bytes"].iloc[0] / unit * 1.08)
    ax.legend(frameon=False, fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    ax.set(xlabel="dispatch pair (global ranks)", ylabel="KiB per micro-batch", title=title or "")
    return ax


def acf_lines(data: pd.DataFrame, *, x: str = "lag", y: str = "acf", hue: str = "run", ax: Axes | None = None,
              n_obs: int | None = None, title: str | None = None, **kwargs: Any) -> Axes:
    """Mean ``y`` (an autocorrelation, over experts) against ``x`` (lag) per ``hue``, with the white-noise
    band ``±1.96/√n`` for ``n_obs`` observations. ``kwargs`` go to ``ax.plot``."""
    ax = axes_or_new(ax, (6.5, 3.4))
    for i, (h, g) in enumerate(data.groupby(hue, sort=False)):
        m = g.groupby(x)[y].mean()
        ax.plot(m.index, m.to_numpy(), color=f"C{i}", **{"lw": 1.6, **kwargs}, label=str(h))
    if n_obs:
        b = 1.96 / np.sqrt(n_obs)
        ax.axhspan(-b, b, color="0.85", zorder=0, label="95% white-noise band")
    ax.legend(frameon=False, fontsize=8)
    ax.set(xlabel="lag [iterations]", ylabel="ACF of expert load share (mean over experts)", title=title or "")
    return ax
