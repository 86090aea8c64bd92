"""Figures with one house style. Every function takes tidy data and returns a matplotlib Axes or Figure;
none touches global state except :func:`apply_style`, which notebooks call once."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg") if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline") else None

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

PARALLELISM_COLORS = {"tp": "#4C72B0", "sp": "#64B5CD", "cp": "#8172B3", "pp": "#DD8452",
                      "dp": "#55A868", "ep": "#C44E52", "other": "#8C8C8C"}


def apply_style() -> None:
    """The project's seaborn theme (call once per notebook)."""
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.1,
                  rc={"figure.dpi": 110, "savefig.dpi": 150, "savefig.bbox": "tight"})


def layout_grid(coords: pd.DataFrame, color_by: str, ax: Axes | None = None, gpus_per_node: int = 8,
                title: str | None = None) -> Axes:
    """Ranks as cells (rows: nodes, columns: local GPU), coloured and labelled by their ``color_by`` group.

    ``coords`` is :attr:`llmcomm.layout.Layout.coords` with a ``color_by`` column (a group id per rank)."""
    ax = ax or plt.subplots(figsize=(6, 0.45 * (coords["node"].max() + 1) + 1))[1]
    n = len(coords)
    nodes = int(np.ceil(n / gpus_per_node))
    ids = coords[color_by].to_numpy()
    uniq = {v: i for i, v in enumerate(pd.unique(ids))}
    pal = sns.color_palette("husl", max(len(uniq), 1))
    for r, gid in zip(coords["rank"].to_numpy(), ids, strict=True):
        row, col = divmod(int(r), gpus_per_node)
        ax.add_patch(Rectangle((col, nodes - 1 - row), 0.95, 0.9, color=pal[uniq[gid]], alpha=0.85))
        ax.text(col + 0.47, nodes - 1 - row + 0.45, f"r{r}\ng{gid}", ha="center", va="center", fontsize=7)
    ax.set_xlim(0, gpus_per_node)
    ax.set_ylim(0, nodes)
    ax.set_xticks(np.arange(gpus_per_node) + 0.47, [str(i) for i in range(gpus_per_node)])
    ax.set_yticks(np.arange(nodes) + 0.45, [f"node {nodes - 1 - i}" for i in range(nodes)])
    ax.set_xlabel("local GPU")
    ax.grid(False)
    ax.set_title(title or f"{color_by} groups")
    return ax


def parameter_check(df: pd.DataFrame, ax: Axes | None = None, tolerance: float = 0.02) -> Axes:
    """Relative error of computed vs published parameter counts per model (columns ``name, family,
    rel_error``), with the ±tolerance band shaded."""
    d = df.sort_values(["family", "computed"])
    ax = ax or plt.subplots(figsize=(6, 0.22 * len(d) + 1))[1]
    ax.axvspan(-100 * tolerance, 100 * tolerance, color="0.9", zorder=0)
    sns.scatterplot(data=d.assign(pct=100 * d["rel_error"]), x="pct", y="name", hue="family", ax=ax, s=45, zorder=3)
    ax.axvline(0, color="k", lw=0.8)
    ax.set(xlabel="(computed − published) / published  [%]", ylabel="")
    ax.legend(fontsize=7, loc="lower right")
    return ax
