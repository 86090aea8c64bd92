"""Figures with one house style, in seaborn's calling convention.

Every function takes its data first (a tidy DataFrame), then keyword-only ``x=``, ``y=``, ``hue=`` (column
names, never hard-coded) and ``ax=None``, in that order, then its own options; it draws on ``ax`` (a new
figure when None) and returns the Axes. :func:`comm_matrix_grid` draws several panels and returns the
Figure (like seaborn's figure-level functions it has no ``ax``). None touches global state except
:func:`apply_style`, which notebooks call once; the matplotlib backend is left to the caller
(``MPLBACKEND``, set by the Makefile and the tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.colors import Normalize, to_rgba
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator

PARALLELISM_COLORS = {"tp": "#4C72B0", "sp": "#64B5CD", "cp": "#8172B3", "pp": "#DD8452",
                      "dp": "#55A868", "ep": "#C44E52", "other": "#8C8C8C"}
NODE_LINE = {"color": "0.45", "lw": 0.6, "ls": "--"}  # node boundaries: visible on colour and on white
MAX_NODE_LINES = 32  # beyond this many nodes the boundary lines would hide the matrix


def apply_style() -> None:
    """The project's seaborn theme (call once per notebook)."""
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.1,
                  rc={"figure.dpi": 110, "savefig.dpi": 150, "savefig.bbox": "tight"})


def axes_or_new(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    """``ax``, or the axes of a new figure of ``figsize`` inches when it is ``None`` (seaborn's ``ax=None``)."""
    return ax if ax is not None else plt.subplots(figsize=figsize)[1]


def binary_bytes(n: float, _pos: object = None) -> str:
    """A byte count in binary units for tick labels: 1 KiB = 2^10 B, 1 MiB = 2^20 B, 1 GiB = 2^30 B."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def layout_grid(data: pd.DataFrame, *, x: str = "rank", y: str = "node", hue: str = "tp_group",
                ax: Axes | None = None, gpus_per_node: int = 8, title: str | None = None) -> Axes:
    """Ranks as cells (rows: the ``y`` node, columns: ``x`` rank modulo ``gpus_per_node``), coloured and
    labelled by their ``hue`` group (e.g. :meth:`llmcomm.layout.Layout.group_table`)."""
    nodes = int(data[y].max()) + 1
    ax = axes_or_new(ax, (6, 0.45 * nodes + 1))
    ids = data[hue].to_numpy()
    uniq = {v: i for i, v in enumerate(pd.unique(ids))}
    pal = sns.color_palette("husl", max(len(uniq), 1))
    for r, node, gid in zip(data[x].to_numpy(), data[y].to_numpy(), ids, strict=True):
        col, row = int(r) % gpus_per_node, nodes - 1 - int(node)
        ax.add_patch(Rectangle((col, row), 0.95, 0.9, color=pal[uniq[gid]], alpha=0.85))
        ax.text(col + 0.47, row + 0.45, f"r{r}\ng{gid}", ha="center", va="center", fontsize=7)
    ax.set_xlim(0, gpus_per_node)
    ax.set_ylim(0, nodes)
    ax.set_xticks(np.arange(gpus_per_node) + 0.47, [str(i) for i in range(gpus_per_node)])
    ax.set_yticks(np.arange(nodes) + 0.45, [f"node {nodes - 1 - i}" for i in range(nodes)])
    ax.set_xlabel("local GPU")
    ax.grid(False)
    ax.set_title(title or f"{hue}")
    return ax


def parameter_check(data: pd.DataFrame, *, x: str = "rel_error", y: str = "name", hue: str = "family",
                    ax: Axes | None = None, tolerance: float = 0.02) -> Axes:
    """Relative error ``x`` (a fraction, drawn in %) of computed vs published parameter counts per model
    ``y``, coloured by ``hue``, with the ±tolerance band shaded. Rows keep the data's order within each
    ``hue`` value."""
    d = data.sort_values(hue, kind="stable")
    ax = axes_or_new(ax, (6, 0.22 * len(d) + 1))
    ax.axvspan(-100 * tolerance, 100 * tolerance, color="0.9", zorder=0, label=f"±{100 * tolerance:g}%")
    sns.scatterplot(data=d.assign(_pct=100 * d[x]), x="_pct", y=y, hue=hue, ax=ax, s=45, zorder=3)
    ax.axvline(0, color="k", lw=0.8)
    ax.set(xlabel="(computed − published) / published  [%]", ylabel="")
    ax.legend(fontsize=7, loc="lower right", title=hue)
    return ax


def _binned(data: pd.DataFrame, x: str, y: str, hue: str, world_size: int, max_cells: int
            ) -> tuple[np.ndarray, int]:
    """Sum ``hue`` over (``y``, ``x``) rank pairs into a dense matrix of ``ceil(n/k)`` cells per side,
    ``k = ceil(n / max_cells)`` ranks per cell; zero cells are NaN (drawn as background)."""
    k = max(1, int(np.ceil(world_size / max_cells)))
    cells = int(np.ceil(world_size / k))
    dense = np.zeros((cells, cells))
    np.add.at(dense, (data[y].to_numpy(np.int64) // k, data[x].to_numpy(np.int64) // k),
              data[hue].to_numpy(np.float64))
    return np.where(dense > 0, dense, np.nan), k


def _matrix_panel(ax: Axes, dense: np.ndarray, k: int, world_size: int, gpus_per_node: int, norm: Normalize,
                  cmap: str, log: bool, title: str | None):
    im = ax.imshow(np.log10(dense) if log else dense, cmap=cmap, norm=norm, interpolation="nearest",
                   origin="upper")
    nodes = int(np.ceil(world_size / gpus_per_node))
    if 1 < nodes <= MAX_NODE_LINES:
        for b in range(1, nodes):
            pos = b * gpus_per_node / k - 0.5
            ax.axhline(pos, **NODE_LINE)
            ax.axvline(pos, **NODE_LINE)
    elif nodes > MAX_NODE_LINES:
        title = f"{title or 'communication matrix'}\n({nodes} nodes: boundaries not drawn)"
    ax.set_xlabel("receiver rank" + (f" (bins of {k})" if k > 1 else ""))
    ax.set_ylabel("sender rank" + (f" (bins of {k})" if k > 1 else ""))
    ax.grid(False)
    ax.set_title(title or "communication matrix")
    return im


def comm_matrix(data: pd.DataFrame, *, x: str = "dst", y: str = "src", hue: str = "bytes",
                ax: Axes | None = None, world_size: int | None = None, gpus_per_node: int = 8,
                max_cells: int = 512, log: bool = True, cmap: str = "viridis", title: str | None = None) -> Axes:
    """Heat map of the bytes ``hue`` sent from rank ``y`` (rows) to rank ``x`` (columns), summed over rows
    of ``data`` (e.g. :meth:`llmcomm.Trace.flows`). Node boundaries are dashed grey lines; pairs that never
    talk stay white. Above ``max_cells`` ranks, ranks are binned into equal blocks (bytes summed)."""
    n = world_size or int(max(data[x].max(), data[y].max()) + 1)
    ax = axes_or_new(ax, (5.5, 4.5))
    dense, k = _binned(data, x, y, hue, n, max_cells)
    shown = np.log10(dense) if log else dense
    norm = Normalize(np.nanmin(shown), np.nanmax(shown)) if np.isfinite(shown).any() else Normalize(0, 1)
    im = _matrix_panel(ax, dense, k, n, gpus_per_node, norm, cmap, log, title)
    cb = ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    cb.set_label(f"log10 {hue}" if log else hue)
    return ax


def comm_matrix_grid(data: pd.DataFrame, *, x: str = "dst", y: str = "src", hue: str = "bytes",
                     col: str = "panel", world_size: int | None = None, gpus_per_node: int = 8, ncols: int = 4,
                     size: float = 3.2, max_cells: int = 512, cmap: str = "viridis") -> plt.Figure:
    """One :func:`comm_matrix` panel per value of ``col`` (in order of appearance), all on one shared
    log colour scale with one colour bar, so that colours compare across panels."""
    titles = list(pd.unique(data[col]))
    n = world_size or int(max(data[x].max(), data[y].max()) + 1)
    mats = [_binned(data[data[col] == t], x, y, hue, n, max_cells) for t in titles]
    logs = np.concatenate([np.log10(d[np.isfinite(d)]) for d, _ in mats])
    norm = Normalize(float(logs.min()), float(logs.max())) if len(logs) else Normalize(0, 1)
    cols = min(ncols, len(titles))
    nrows = int(np.ceil(len(titles) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(size * 1.12 * cols + 0.8, size * nrows), squeeze=False)
    im = None
    for ax, title, (dense, k) in zip(axes.ravel(), titles, mats, strict=False):
        im = _matrix_panel(ax, dense, k, n, gpus_per_node, norm, cmap, True, str(title))
        ax.title.set_fontsize(8)
        ax.xaxis.label.set_fontsize(7)
        ax.yaxis.label.set_fontsize(7)
    for ax in axes.ravel()[len(titles):]:
        ax.set_visible(False)
    fig.tight_layout()
    if im is not None:
        cb = fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.02, pad=0.02)
        cb.set_label(f"log10 {hue} (one scale for all panels)")
    return fig


def volume_bars(data: pd.DataFrame, *, x: str = "config", y: str = "bytes", hue: str = "parallelism",
                ax: Axes | None = None, unit: float = 2**30, normalize: bool = False, legend: bool = True,
                title: str | None = None) -> Axes:
    """Stacked bars of ``y`` bytes per ``hue`` value for each ``x``, in GiB (``unit``).

    ``normalize=True`` stacks each bar's shares to 100% (so configurations of very different size stay
    readable) and writes the bar's total above it."""
    ax = axes_or_new(ax, (6, 4))
    piv = data.pivot_table(index=x, columns=hue, values=y, aggfunc="sum", fill_value=0, sort=False)
    order = [p for p in PARALLELISM_COLORS if p in piv.columns] + \
        [p for p in piv.columns if p not in PARALLELISM_COLORS]
    totals = piv.sum(axis=1)
    shown = piv.div(totals, axis=0) * 100 if normalize else piv / unit
    shown[order].plot(kind="bar", stacked=True, ax=ax, width=0.7,
                      color=[PARALLELISM_COLORS.get(p, "0.5") for p in order])
    ylabel = "share of bytes [%]" if normalize else ("GiB per iteration" if unit == 2**30 else "bytes")
    ax.set(ylabel=ylabel, xlabel="", title=title or "")
    if normalize:
        ax.set_ylim(0, 112)
        for i, tot in enumerate(totals.to_numpy()):
            ax.text(i, 101.5, f"{tot / 2**40:,.1f} TiB" if tot >= 2**40 else f"{tot / 2**30:,.1f} GiB",
                    ha="center", va="bottom", fontsize=7)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
    if not legend:
        ax.get_legend().remove()
    elif normalize:
        ax.legend(title=hue, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.legend(title=hue, fontsize=8)
    return ax


def pair_class_bars(data: pd.DataFrame, *, x: str = "config", y: str = "share",
                    hue: str | Sequence[str] = ("parallelism", "pair_class"), ax: Axes | None = None) -> Axes:
    """Stacked ``y`` (shares of wire bytes) per ``hue`` value for each ``x``; a sequence of ``hue`` columns
    is joined into one label (e.g. "tp intra-node"). Colours follow the first ``hue`` column (the
    parallelism's colour, as in every figure); labels containing "inter" are hatched."""
    ax = axes_or_new(ax, (7, 4))
    cols = [hue] if isinstance(hue, str) else list(hue)
    label = data[cols].astype(str).agg(" ".join, axis=1)
    piv = data.assign(_label=label).pivot_table(index=x, columns="_label", values=y, fill_value=0, sort=False)
    rank = {p: i for i, p in enumerate(PARALLELISM_COLORS)}
    order = sorted(piv.columns, key=lambda c: (rank.get(c.split(" ")[0], len(rank)), "inter" in c, c))
    piv[order].plot(kind="bar", stacked=True, ax=ax, width=0.7,
                    color=[PARALLELISM_COLORS.get(c.split(" ")[0], "0.5") for c in order])
    for container, name in zip(ax.containers, order, strict=True):
        for patch in container:
            patch.set_hatch("///" if "inter" in name else None)
            patch.set_edgecolor("white")
    ax.set(ylabel="share of wire bytes", xlabel="")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
    ax.legend(fontsize=7, title=" · ".join(cols), loc="center left", bbox_to_anchor=(1.01, 0.5))
    return ax


def tp_share_curve(data: pd.DataFrame, *, x: str = "microbatches", y: str = "tp_share", hue: str = "model",
                   ax: Axes | None = None, style: str | None = None, threshold: float = 0.99,
                   caps: Mapping[str, float] | None = None, ylabel: str = "TP share of bytes [%]") -> Axes:
    """TP share ``y`` (a fraction, drawn in %) against the number of micro-batches ``x`` (log-x), one line
    per ``hue`` (and ``style``) value; the ``threshold`` line is labelled, and each asymptotic cap in
    ``caps`` (label -> fraction, e.g. ``t / (t + p)``) is drawn as a dotted line with its value."""
    ax = axes_or_new(ax, (6, 4))
    sns.lineplot(data=data.assign(_pct=100 * data[y]), x=x, y="_pct", hue=hue, style=style, marker="o", ax=ax)
    ax.axhline(100 * threshold, color="k", ls="--", lw=0.8)
    ax.annotate(f"{100 * threshold:g}%", (0.01, 100 * threshold), xycoords=("axes fraction", "data"),
                va="top", fontsize=8)
    for label, cap in (caps or {}).items():
        ax.axhline(100 * cap, color="0.35", ls=":", lw=1)
        ax.annotate(f"{label}: {100 * cap:.1f}%", (0.99, 100 * cap), xycoords=("axes fraction", "data"),
                    ha="right", va="bottom", fontsize=7, color="0.25")
    ax.set(xscale="log", xlabel="micro-batches per iteration", ylabel=ylabel)
    ax.legend(title=hue if style is None else f"{hue} / {style}", fontsize=7, title_fontsize=8)
    return ax


def comm_timeline(data: pd.DataFrame, *, x: str = "t_start_ns", y: str = "rank", hue: str = "parallelism",
                  ax: Axes | None = None, x_end: str = "t_end_ns", row_group: str | None = None,
                  marks: Sequence[str] = (), marks_per: str | None = "iteration", t0_ns: int | None = None, title: str | None = None,
                  min_width_s: float = 2e-4) -> Axes:
    """Per-rank timeline: one bar per call from ``x`` to ``x_end`` (ns; at least ``min_width_s`` wide so
    instantaneous calls stay visible; a missing end draws the minimum width), one row per ``y`` value,
    coloured by ``hue``. ``row_group`` (e.g. a pipeline-stage column) labels the rows and separates its
    groups by a line. ``marks`` (e.g. ``["phase", "microbatch"]``) label the first call of each distinct
    combination on each row, per ``marks_per`` value ("forward", 0 -> "F0"); the first call of each
    iteration on the top row is a dotted line."""
    e = data[data[x].notna()]
    rows = sorted(e[y].unique())
    t0 = int(e[x].min()) if t0_ns is None else int(t0_ns)
    ax = axes_or_new(ax, (10, 0.55 * len(rows) + 1.4))
    for row, r in enumerate(rows):
        er = e[e[y] == r]
        for par, g in er.groupby(hue):
            s = (g[x].to_numpy(np.int64) - t0) / 1e9
            f = (g[x_end].fillna(g[x]).to_numpy(np.int64) - t0) / 1e9
            w = np.maximum(f - s, min_width_s)
            ax.broken_barh(list(zip(s, w, strict=True)), (row - 0.35, 0.7),
                           facecolors=PARALLELISM_COLORS.get(str(par), "0.5"), edgecolor="none",
                           label=str(par))  # no white edge: it would hide calls narrower than the edge
        if marks:
            key = [*([marks_per] if marks_per else []), *marks]
            first = er.sort_values(x).drop_duplicates(key)
            for rec in first.itertuples(index=False):
                vals = [getattr(rec, m) for m in marks]
                text = "".join(str(v)[0].upper() if isinstance(v, str) else str(v) for v in vals)
                ax.text((getattr(rec, x) - t0) / 1e9, row - 0.38, text, fontsize=5.5, ha="left", va="bottom",
                        color="0.2")
    if "iteration" in e.columns:
        top = e[e[y] == rows[0]]
        for t in top.groupby("iteration")[x].min().to_numpy(np.int64):
            ax.axvline((t - t0) / 1e9, color="k", ls=":", lw=0.7)
    labels = [f"{y} {r}" for r in rows]
    if row_group is not None:
        grp = e.groupby(y)[row_group].first()
        labels = [f"{y} {r} · {row_group} {grp[r]}" for r in rows]
        for i in range(1, len(rows)):
            if grp[rows[i]] != grp[rows[i - 1]]:
                ax.axhline(i - 0.5, color="0.3", lw=0.8)
    handles, names = ax.get_legend_handles_labels()
    uniq = dict(zip(names, handles, strict=True))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), title=hue,
              title_fontsize=8)
    ax.grid(axis="y", visible=False)
    ax.set_yticks(range(len(rows)), labels)
    ax.set(xlabel="time [s]", title=title or "", ylim=(-0.6, len(rows) - 0.4))
    ax.invert_yaxis()
    return ax


def acf_plot(data: pd.DataFrame, *, x: str = "lag", y: str = "acf", hue: str | None = None,
             ax: Axes | None = None, lag_s: float = 1.0, marks: Mapping[str, float] | None = None,
             n_obs: int | None = None, title: str | None = None) -> Axes:
    """Autocorrelation ``y`` against lag ``x`` in seconds (one lag = ``lag_s``), one line per ``hue`` value
    if given, with the expected periods in ``marks`` (name -> seconds) as dashed lines and, given
    ``n_obs``, the white-noise 95% band ``±1.96/√n``."""
    ax = axes_or_new(ax, (8, 3.2))
    d = data.assign(_lag_s=data[x] * lag_s)
    if hue is None:
        ax.plot(d["_lag_s"], d[y], color=PARALLELISM_COLORS["tp"], lw=1.2)
    else:
        sns.lineplot(data=d, x="_lag_s", y=y, hue=hue, ax=ax, lw=1.2)
    if n_obs:
        band = 1.96 / np.sqrt(n_obs)
        ax.axhspan(-band, band, color="0.85", zorder=0, label="95% white noise")
    for (name, sec), c in zip((marks or {}).items(), sns.color_palette("dark", len(marks or {})), strict=True):
        ax.axvline(sec, color=c, ls="--", lw=1, label=f"{name} period")
    ax.axhline(0, color="k", lw=0.6)
    ax.set(xlabel="lag [s]", ylabel="autocorrelation", title=title or "")
    ax.legend(fontsize=8)
    return ax


def call_duration_spread(data: pd.DataFrame, *, x: str = "duration_us", y: str = "collective",
                         hue: str = "parallelism", ax: Axes | None = None, top: int = 10,
                         title: str | None = None) -> Axes:
    """Distribution of each ``y`` collective's duration ``x`` (µs, log-x) over all its calls, coloured by
    ``hue`` (e.g. :func:`llmcomm.ingest.summary.call_sequence`); the ``top`` collectives with most calls."""
    ax = axes_or_new(ax, (7, 0.45 * top + 1.2))
    order = data[y].value_counts().index[:top].tolist()
    d = data[data[y].isin(order) & (data[x] > 0)]
    pal = {h: PARALLELISM_COLORS.get(str(h), "#8C8C8C") for h in d[hue].unique()}
    sns.boxplot(data=d, y=y, x=x, order=order, hue=hue, palette=pal, dodge=False, whis=(1, 99), fliersize=1.5,
                linewidth=0.8, ax=ax)
    ax.set(xscale="log", xlabel="duration per call [µs]", ylabel="", title=title or "")
    ax.legend(title=hue, fontsize=7, title_fontsize=8, loc="lower right")
    return ax


def busbw_fit(data: pd.DataFrame, *, x: str = "bytes", y: str = "busbw", hue: str = "group_size",
              ax: Axes | None = None, fit: str = "busbw_fit", used: str = "used", title: str | None = None) -> Axes:
    """Measured bus bandwidth ``y`` (dots; rows whose ``used`` is False, set aside as spikes: crosses) and the
    fitted model's ``fit`` (lines) against message size ``x``, one colour per ``hue`` value (e.g.
    :attr:`llmcomm.overhead.Bandwidth.residuals` with busbw = bus bytes / time, GB/s)."""
    ax = axes_or_new(ax, (6.5, 4))
    levels = sorted(data[hue].unique())
    pal = sns.color_palette("viridis", len(levels))
    for color, level in zip(pal, levels, strict=True):
        d = data[data[hue] == level].sort_values(x)
        ok = d[used].to_numpy(bool)
        ax.plot(d[x][ok], d[y][ok], "o", ms=2.5, color=color, alpha=0.6)
        ax.plot(d[x][~ok], d[y][~ok], "x", ms=4, color=color)
        ax.plot(d[x], d[fit], "-", lw=1.2, color=color, label=str(level))
    ax.set(xscale="log", xlabel="message size [bytes]", ylabel="bus bandwidth [GB/s]", title=title or "")
    ax.legend(title=hue.replace("_", " "), fontsize=7, ncol=2)
    return ax


def relative_residuals(data: pd.DataFrame, *, x: str = "bytes", y: str = "rel_err", hue: str = "group_size",
                       ax: Axes | None = None, used: str = "used", title: str | None = None) -> Axes:
    """(predicted − measured) / measured ``y`` against message size ``x`` for the rows whose ``used`` is True
    (e.g. :attr:`llmcomm.overhead.Bandwidth.residuals`), one colour per ``hue`` value."""
    ax = axes_or_new(ax, (6.5, 3))
    d = data[data[used]].copy()
    levels = sorted(d[hue].unique())
    d[hue] = d[hue].astype(str)
    sns.scatterplot(data=d, x=x, y=y, hue=hue, hue_order=[str(v) for v in levels], s=8,
                    palette=sns.color_palette("viridis", len(levels)), linewidth=0, ax=ax, legend=False)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="message size [bytes]", ylabel="relative residual", title=title or "")
    return ax


def effective_bandwidth_lines(data: pd.DataFrame, *, x: str = "bytes", y: str = "busbw", hue: str = "label",
                              ax: Axes | None = None, title: str | None = None) -> Axes:
    """Modelled bus bandwidth ``y`` against message size ``x``, one line per ``hue`` value, in the frame's
    order (e.g. :func:`llmcomm.overhead.effective_bandwidth`)."""
    ax = axes_or_new(ax, (6.5, 4))
    order = list(pd.unique(data[hue]))
    sns.lineplot(data=data, x=x, y=y, hue=hue, hue_order=order, ax=ax, lw=1.4,
                 palette=sns.color_palette("tab10", len(order)))
    ax.set(xscale="log", xlabel="message size [bytes]", ylabel="bus bandwidth [GB/s]", title=title or "")
    ax.legend(fontsize=7)
    return ax


def a2a_matrix_heatmap(data: pd.DataFrame, *, x: str = "dst", y: str = "src", hue: str = "bytes",
                       ax: Axes | None = None, unit: float = 2**10, label: str = "KiB",
                       title: str | None = None) -> Axes:
    """A small all-to-all matrix (``y`` sender rows, ``x`` receiver columns) of ``hue`` with its values
    written in ``unit``s."""
    ax = axes_or_new(ax, (5.5, 4.5))
    mat = data.pivot_table(index=y, columns=x, values=hue, aggfunc="sum", fill_value=0) / unit
    sns.heatmap(mat, annot=mat.shape[0] <= 16, fmt=".1f", cmap="rocket_r", square=True,
                cbar_kws={"label": label}, ax=ax, annot_kws={"fontsize": 7})
    ax.set(xlabel="receiver rank", ylabel="sender rank", title=title or "")
    return ax


def node_palette(levels: Sequence[int], gpus_per_node: int = 8) -> dict[str, tuple[float, float, float]]:
    """Colours for GPU counts: blues inside one node (``n <= gpus_per_node``), reds across nodes, so the
    node boundary (8 vs 16 GPUs) is a change of hue, not a step along one ramp."""
    intra = [v for v in levels if v <= gpus_per_node]
    inter = [v for v in levels if v > gpus_per_node]
    pal = dict(zip(intra, sns.color_palette("Blues", len(intra) + 2)[2:], strict=True))
    pal.update(zip(inter, sns.color_palette("Reds", len(inter) + 2)[2:], strict=True))
    return {str(k): v for k, v in pal.items()}


def busbw_curves(data: pd.DataFrame, *, x: str = "bytes", y: str = "busbw", hue: str = "ranks",
                 ax: Axes | None = None, style: str | None = None, gpus_per_node: int = 8,
                 title: str | None = None) -> Axes:
    """Bus bandwidth ``y`` (GB/s) against message size ``x`` (bytes, log-x with KiB/MiB/GiB ticks), one line
    per ``hue`` value (GPU count: :func:`node_palette`, blue inside a node, red across) and optionally per
    ``style`` value (e.g. :func:`llmcomm.ingest.ingest_bandwidth`'s table, filtered by the caller)."""
    ax = axes_or_new(ax, (6.5, 4))
    d = data[data[x] > 0].copy()
    levels = sorted(int(v) for v in d[hue].dropna().unique())
    d[hue] = d[hue].astype(int).astype(str)
    sns.lineplot(data=d, x=x, y=y, hue=hue, hue_order=[str(v) for v in levels], style=style,
                 palette=node_palette(levels, gpus_per_node), legend="full", ax=ax, lw=1.2)
    ax.set(xscale="log", xlabel="message size", ylabel="bus bandwidth [GB/s]", title=title or "")
    ax.xaxis.set_major_locator(LogLocator(base=32, numticks=12))  # 1 KiB, 32 KiB, 1 MiB, ...
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
    ax.xaxis.set_major_formatter(FuncFormatter(binary_bytes))
    inter = [v for v in levels if v > gpus_per_node]
    if style is None or inter:  # with a style, seaborn's legend already names hue and style as sub-headings
        legend_title = f"{hue}" + (f" (red: > {gpus_per_node}, across nodes)" if inter else "")
        ax.legend(fontsize=7, ncol=2, title=legend_title, title_fontsize=7)
    else:
        ax.legend(fontsize=7, ncol=2)
    return ax


def comparison_matrices(data: pd.DataFrame, *, x: str = "dst", y: str = "src", hue: str = "bytes",
                        col: str = "side", world_size: int | None = None, gpus_per_node: int = 8,
                        size: float = 3.4) -> plt.Figure:
    """Two ``world × world`` byte matrices (the two values of ``col`` in order of appearance, e.g. measured
    then predicted; bytes ``hue`` from rank ``y`` to rank ``x``) on one log colour scale, and their
    difference (first − second, bytes, symmetric diverging scale; white = equal)."""
    sides = list(pd.unique(data[col]))
    if len(sides) != 2:
        raise ValueError(f"comparison_matrices needs exactly two values of {col!r}, got {sides}")
    n = world_size or int(max(data[x].max(), data[y].max()) + 1)
    a, b = (_binned(data[data[col] == s], x, y, hue, n, n)[0] for s in sides)  # pairs that never talk: NaN
    fig, axes = plt.subplots(1, 3, figsize=(3 * size * 1.35, size * 1.1), layout="constrained")
    positive = np.concatenate([a[a > 0], b[b > 0]])
    vmin, vmax = (np.log10(positive.min()), np.log10(positive.max())) if len(positive) else (0, 1)
    for ax, m, title in zip(axes[:2], (a, b), sides, strict=True):
        im = ax.imshow(np.log10(m), cmap="viridis", vmin=vmin, vmax=vmax, interpolation="nearest")
        ax.set_title(str(title), fontsize=9)
    fig.colorbar(im, ax=axes[1], fraction=0.046, pad=0.03).set_label(f"log10 {hue} (both panels)")
    d = np.nan_to_num(a) - np.nan_to_num(b)
    lim = max(float(np.abs(d).max()), 1.0)
    im = axes[2].imshow(d, cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
    axes[2].set_title(f"{sides[0]} − {sides[1]}", fontsize=9)
    fig.colorbar(im, ax=axes[2], fraction=0.046, pad=0.03).set_label(hue)
    for ax in axes:
        ax.grid(False)
        ax.set_xlabel("receiver rank", fontsize=8)
        ax.set_ylabel("sender rank", fontsize=8)
        for boundary in range(gpus_per_node, n, gpus_per_node):
            ax.axhline(boundary - 0.5, color="0.3", lw=0.6)
            ax.axvline(boundary - 0.5, color="0.3", lw=0.6)
    return fig


def comparison_bars(data: pd.DataFrame, *, x: str = "parallelism",
                    y: Sequence[str] = ("bytes_measured", "bytes_predicted"), hue: str = "side",
                    ax: Axes | None = None, unit: float = 2**20, title: str | None = None) -> Axes:
    """Bytes per ``x`` on both sides of a comparison, one bar per column of ``y`` (e.g. ``by_kind`` of
    :class:`llmcomm.compare.Comparison`), in MiB, log scale; the legend (titled ``hue``) names each column
    without its ``bytes_`` prefix."""
    ax = axes_or_new(ax, (6, 3.5))
    t = data.groupby(x, observed=True)[list(y)].sum().reset_index()
    long = t.melt(id_vars=x, var_name=hue, value_name="bytes")
    long[hue] = long[hue].str.removeprefix("bytes_")
    long["MiB"] = long["bytes"] / unit
    sides = list(pd.unique(long[hue]))
    sns.barplot(data=long, x=x, y="MiB", hue=hue, ax=ax,
                palette=dict(zip(sides, sns.color_palette("deep", len(sides)), strict=True)))
    ax.set_yscale("log")
    ax.set(ylabel="MiB per iteration (log)", title=title or "bytes per parallelism")
    ax.legend(title=hue, fontsize=8)
    return ax


def breakdown_bars(data: pd.DataFrame, *, x: str = "config", y: str = "seconds", hue: str = "term",
                   ax: Axes | None = None, title: str | None = None) -> Axes:
    """Stacked bars of ``y`` per ``hue`` (the named terms of an iteration) for each ``x`` (a configuration),
    communication terms hatched."""
    ax = axes_or_new(ax, (8, 4))
    wide = data.pivot_table(index=x, columns=hue, values=y, aggfunc="sum", sort=False).fillna(0.0)
    kinds = data.drop_duplicates(hue).set_index(hue)["kind"] if "kind" in data.columns else pd.Series(dtype=str)
    bottom = np.zeros(len(wide))
    colors = sns.color_palette("tab10", n_colors=len(wide.columns))
    for color, term in zip(colors, wide.columns, strict=True):
        vals = wide[term].to_numpy()
        ax.barh(range(len(wide)), vals, left=bottom, color=color, label=term,
                hatch="//" if kinds.get(term) == "comm" else None, edgecolor="white", linewidth=0.3)
        bottom += vals
    ax.set_yticks(range(len(wide)), wide.index, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel=f"{y} per iteration", title=title or "")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False,
              title="term (hatched: communication)", title_fontsize=7)
    return ax


def best_config_shift(data: pd.DataFrame, *, x: str = "gpus", y: str = "tflops_per_gpu", hue: str = "cluster",
                      ax: Axes | None = None, label: str = "config", title: str | None = None) -> Axes:
    """``y`` of the best configuration against ``x`` (log2), one line per ``hue``, each point annotated with its
    ``label``."""
    ax = axes_or_new(ax, (8, 4.5))
    sns.lineplot(data=data, x=x, y=y, hue=hue, marker="o", ax=ax)
    ax.set_xscale("log", base=2)
    for r in data.itertuples():
        ax.annotate(getattr(r, label), (getattr(r, x), getattr(r, y)), fontsize=6, rotation=20,
                    xytext=(3, 3), textcoords="offset points")
    ax.set(title=title or "", ylabel=y.replace("_", " "))
    return ax


def published_speedups(data: pd.DataFrame, *, x: str = "model", y: Sequence[str] = (
        "predicted_speedup_2021", "predicted_speedup"), hue: str = "features", ax: Axes | None = None,
        title: str | None = None) -> Axes:
    """Grouped bars of predicted speed-ups per ``x``, one bar per column in ``y`` (named in the legend
    titled ``hue``), with the 1× line."""
    ax = axes_or_new(ax, (8, 4))
    long = data.melt(id_vars=x, value_vars=list(y), var_name=hue, value_name="speed-up")
    sns.barplot(data=long, x=x, y="speed-up", hue=hue, ax=ax)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.tick_params(axis="x", rotation=30, labelsize=7)
    ax.set(title=title or "", ylabel="predicted speed-up (×)")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), fontsize=7, title_fontsize=8)
    return ax


def call_sequence(data: pd.DataFrame, *, x: str = "step", y: str = "bytes", hue: str = "parallelism",
                  ax: Axes | None = None, phase: str | None = "phase", title: str | None = None) -> Axes:
    """One bar per call in issue order: position ``x``, height ``y`` bytes (log scale), colour by ``hue``
    (the parallelism colours of every figure); with ``phase``, backward calls are drawn lighter. Bars are one
    line collection, so a stage's hundreds of calls draw at once."""
    ax = axes_or_new(ax, (8, 3))
    xs, ys = data[x].to_numpy(), data[y].to_numpy(np.float64)
    back = (data[phase] == "backward").to_numpy() if phase is not None else np.zeros(len(data), bool)
    rgba = np.array([to_rgba(PARALLELISM_COLORS.get(v, "0.5"), 0.45 if b else 1.0)
                     for v, b in zip(data[hue], back, strict=True)]).reshape(-1, 4)
    width_pt = max(0.6, min(8.0, 0.8 * 72 * ax.figure.get_figwidth() * 0.75 / max(len(xs), 1)))
    floor = float(ys[ys > 0].min()) / 2 if (ys > 0).any() else 0.5
    ax.vlines(xs, floor, ys, colors=rgba, linewidth=width_pt)
    ax.set_yscale("log")
    ax.set_ylim(floor, float(ys.max()) * 1.6 if len(ys) else 1.0)
    ax.yaxis.set_major_formatter(FuncFormatter(binary_bytes))
    ax.yaxis.set_major_locator(LogLocator(base=2**10))
    ax.set(xlabel="call, in issue order", ylabel=f"{y} per call", title=title or "")
    if len(xs):
        ax.set_xlim(xs.min() - 0.8, xs.max() + 0.8)
    handles = [Rectangle((0, 0), 1, 1, color=PARALLELISM_COLORS.get(v, "0.5"), label=str(v))
               for v in pd.unique(data[hue])]
    if back.any():
        handles.append(Rectangle((0, 0), 1, 1, color="0.3", alpha=0.45, label="backward (lighter)"))
    if handles:
        ax.legend(handles=handles, fontsize=7, title=hue, title_fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0))
    return ax
