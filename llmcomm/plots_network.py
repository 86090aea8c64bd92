"""Figures of the network view (notebook 11) in the calling convention of :mod:`llmcomm.plots`: tidy ``data``
first (from :mod:`llmcomm.network`), keyword-only columns, ``ax=None``; each returns its Axes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from .plots import axes_or_new, byte_ticks


def reach_bars(data: pd.DataFrame, *, x: str = "parallelism", y: str = "share", hue: str = "reach",
               ax: Axes | None = None, order: Sequence[str] | None = None, title: str | None = None,
               ylabel: str = "share of the parallelism's bytes") -> Axes:
    """Stacked bars: per ``x`` (a parallelism, a scenario) the share of its bytes by the highest tier reached
    (``hue``, in its categorical order, bottom = lowest tier)."""
    ax = axes_or_new(ax, (8.0, 4.0))
    wide = data.pivot_table(index=x, columns=hue, values=y, aggfunc="sum", observed=False).fillna(0.0)
    if order is not None:
        wide = wide.reindex([o for o in order if o in wide.index])
    bottom = np.zeros(len(wide))
    for i, col in enumerate(wide.columns):
        v = wide[col].to_numpy()
        ax.bar(np.arange(len(wide)), v, bottom=bottom, color=f"C{i}", label=str(col), width=0.7)
        bottom += v
    ax.set_xticks(np.arange(len(wide)), [str(i) for i in wide.index], rotation=35, ha="right")
    ax.set(ylabel=ylabel, xlabel="", ylim=(0, 1.05), title=title or "")
    ax.legend(frameon=False, fontsize=8, title=f"{hue} (highest tier)", title_fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


def link_load_spread(data: pd.DataFrame, *, x: str = "busy_s", y: str = "tier", hue: str = "ecmp",
                     ax: Axes | None = None, title: str | None = None, unit: float = 1e-3,
                     xlabel: str = "seconds at line rate per iteration [ms]") -> Axes:
    """Per link tier (rows) and ``hue`` (expected vs sampled ECMP), the distribution of per-link ``x`` as a
    box (quartiles, whiskers at the 1st and 99th percentiles) with the maximum marked."""
    ax = axes_or_new(ax, (7.0, 3.6))
    tiers = [t for t in pd.unique(data[y]) if (data[y] == t).any()]
    hues = list(pd.unique(data[hue]))
    step = 0.8 / max(len(hues), 1)
    for j, hname in enumerate(hues):
        vals, pos = [], []
        for i, t in enumerate(tiers):
            v = data[(data[y] == t) & (data[hue] == hname)][x].to_numpy() / unit
            if len(v):
                vals.append(v)
                pos.append(i - 0.4 + step * (j + 0.5))
        bp = ax.boxplot(vals, positions=pos, widths=step * 0.8, vert=False, whis=(1, 99), showfliers=False,
                        patch_artist=True, manage_ticks=False)
        for b in bp["boxes"]:
            b.set(facecolor=f"C{j}", alpha=0.6)
        ax.scatter([v.max() for v in vals], pos, marker="|", color=f"C{j}", s=80, label=f"{hname} (| = max)")
    ax.set_yticks(range(len(tiers)), [str(t) for t in tiers])
    ax.set(xlabel=xlabel, title=title or "")
    ax.invert_yaxis()
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    return ax


def demand_lines(data: pd.DataFrame, *, x: str = "t_start_s", y: str = "peak_demand", hue: str = "tier",
                 ax: Axes | None = None, title: str | None = None, unit: float = 1e-3) -> Axes:
    """Per ``hue`` (link tier) the peak link demand per time bin (1 = the link's capacity, dashed)."""
    ax = axes_or_new(ax, (8.0, 3.4))
    for i, (name, g) in enumerate(data.groupby(hue, observed=True, sort=False)):
        g = g.sort_values(x)
        ax.step(g[x].to_numpy() / unit, g[y].to_numpy(), where="post", color=f"C{i}", lw=1.2, label=str(name))
    ax.axhline(1.0, color="k", ls="--", lw=0.8, label="capacity")
    ax.set(xlabel="time in the iteration [ms]", ylabel="peak link demand / capacity", title=title or "")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="link tier",
              title_fontsize=8)
    return ax


def scenario_bars(data: pd.DataFrame, *, x: str = "scenario", y: str = "peak_busy_s", hue: str = "link_tier",
                  ax: Axes | None = None, title: str | None = None, reference: float | None = None,
                  reference_label: str = "", unit: float = 1e-3) -> Axes:
    """Grouped bars: per scenario and link tier the peak link's ``y`` (seconds at line rate per iteration);
    ``reference`` draws a horizontal line (e.g. the predicted iteration time)."""
    ax = axes_or_new(ax, (8.0, 3.8))
    wide = data.pivot_table(index=x, columns=hue, values=y, aggfunc="max", observed=True, sort=False)
    n = len(wide.columns)
    w = 0.8 / max(n, 1)
    for j, col in enumerate(wide.columns):
        ax.bar(np.arange(len(wide)) - 0.4 + w * (j + 0.5), wide[col].to_numpy() / unit, width=w, color=f"C{j}",
               label=str(col))
    if reference is not None:
        ax.axhline(reference / unit, color="k", ls="--", lw=0.8, label=reference_label)
    ax.set_xticks(np.arange(len(wide)), [str(i) for i in wide.index], rotation=15, ha="right")
    ax.set(ylabel="peak link: seconds at line rate [ms]", xlabel="", title=title or "")
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="link tier",
              title_fontsize=8)
    return ax


def tier_bytes_bars(data: pd.DataFrame, *, x: str = "tier", y: str = "bytes", hue: str | None = None,
                    ax: Axes | None = None, title: str | None = None) -> Axes:
    """Bytes per iteration per link tier (log scale, binary units)."""
    ax = axes_or_new(ax, (6.0, 3.4))
    ax.bar(np.arange(len(data)), data[y].to_numpy(), color="C0", width=0.6)
    ax.set_xticks(np.arange(len(data)), data[x].astype(str), rotation=15, ha="right")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(byte_ticks)
    ax.set(ylabel="bytes per iteration (all links of the tier)", xlabel="", title=title or "")
    return ax
