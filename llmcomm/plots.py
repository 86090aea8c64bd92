"""Figures with one house style. Every function takes tidy data and returns a matplotlib Axes or Figure;
none touches global state except :func:`apply_style`, which notebooks call once."""

from __future__ import annotations

from collections.abc import Sequence

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


# ================================================================================================
# Communication matrices and traffic volumes
# ================================================================================================
def comm_matrix(matrix, gpus_per_node: int = 8, ax: Axes | None = None, title: str | None = None,  # noqa: ANN001
                max_cells: int = 512, log: bool = True, cmap: str = "viridis") -> Axes:
    """Heat map of a ``world × world`` (sparse) byte matrix, sender rows, receiver columns, node boundaries
    drawn as white lines. Above ``max_cells`` ranks, ranks are binned into equal blocks (bytes summed)."""
    import scipy.sparse as sps

    ax = ax or plt.subplots(figsize=(5.5, 4.5))[1]
    m = sps.coo_matrix(matrix)
    n = m.shape[0]
    k = max(1, int(np.ceil(n / max_cells)))
    cells = int(np.ceil(n / k))
    dense = np.zeros((cells, cells))
    np.add.at(dense, (m.row // k, m.col // k), m.data)
    shown = np.where(dense > 0, np.log10(np.where(dense > 0, dense, 1)), np.nan) if log else dense
    im = ax.imshow(shown, cmap=cmap, interpolation="nearest", origin="upper")
    cb = ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    cb.set_label("log10 bytes" if log else "bytes")
    nodes = int(np.ceil(n / gpus_per_node))
    if 1 < nodes <= 128:
        for b in range(1, nodes):
            pos = b * gpus_per_node / k - 0.5
            ax.axhline(pos, color="w", lw=0.6, alpha=0.8)
            ax.axvline(pos, color="w", lw=0.6, alpha=0.8)
    ax.set_xlabel("receiver rank" + (f" (bins of {k})" if k > 1 else ""))
    ax.set_ylabel("sender rank" + (f" (bins of {k})" if k > 1 else ""))
    ax.grid(False)
    ax.set_title(title or "communication matrix")
    return ax


def volume_bars(df: pd.DataFrame, x: str = "config", ax: Axes | None = None, title: str | None = None,
                unit: float = 2**30, normalize: bool = False, legend: bool = True) -> Axes:
    """Stacked bars of bytes per parallelism (tidy ``df``: ``x``, ``parallelism``, ``bytes``), in GiB.

    ``normalize=True`` stacks each bar's shares to 100% (so configurations of very different size stay
    readable) and writes the bar's total above it."""
    ax = ax or plt.subplots(figsize=(6, 4))[1]
    piv = df.pivot_table(index=x, columns="parallelism", values="bytes", aggfunc="sum", fill_value=0)
    order = [p for p in PARALLELISM_COLORS if p in piv.columns]
    totals = piv.sum(axis=1)
    shown = piv.div(totals, axis=0) * 100 if normalize else piv / unit
    shown[order].plot(kind="bar", stacked=True, ax=ax, color=[PARALLELISM_COLORS[p] for p in order], width=0.7)
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
        ax.legend(title="", fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.legend(title="", fontsize=8)
    return ax


def pair_class_bars(df: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Stacked shares of wire bytes per ``parallelism`` × ``pair_class`` (intra-/inter-node) for each
    ``config`` (tidy ``df``: ``config, parallelism, pair_class, share``)."""
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    piv = df.assign(label=df["parallelism"] + " " + df["pair_class"]).pivot_table(
        index="config", columns="label", values="share", fill_value=0)
    piv.plot(kind="bar", stacked=True, ax=ax, width=0.7)
    ax.set(ylabel="share of wire bytes", xlabel="")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
    ax.legend(fontsize=7, title="", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return ax


def tp_share_curve(df: pd.DataFrame, ax: Axes | None = None, hue: str = "model", threshold: float = 0.99) -> Axes:
    """TP share of bytes against the number of micro-batches (``df``: ``microbatches``, ``tp_share``,
    ``hue``), log-x, with the threshold drawn."""
    ax = ax or plt.subplots(figsize=(6, 4))[1]
    sns.lineplot(data=df.assign(pct=100 * df["tp_share"]), x="microbatches", y="pct", hue=hue, marker="o", ax=ax)
    ax.axhline(100 * threshold, color="k", ls="--", lw=0.8)
    ax.set(xscale="log", xlabel="micro-batches per iteration", ylabel="TP share of bytes [%]")
    return ax


def comm_matrix_grid(panels: list[tuple[str, object]], gpus_per_node: int = 8, ncols: int = 4,
                     size: float = 3.2, max_cells: int = 512) -> plt.Figure:
    """Several :func:`comm_matrix` panels (``[(title, matrix), ...]``) in one figure."""
    n = len(panels)
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, min(ncols, n), figsize=(size * 1.25 * min(ncols, n), size * nrows),
                             squeeze=False)
    for ax, (title, m) in zip(axes.ravel(), panels, strict=False):
        comm_matrix(m, gpus_per_node=gpus_per_node, ax=ax, title=title, max_cells=max_cells)
        ax.title.set_fontsize(8)
        ax.xaxis.label.set_fontsize(7)
        ax.yaxis.label.set_fontsize(7)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


# ================================================================================================
# Temporal pattern of recorded traces
# ================================================================================================
def comm_timeline(events: pd.DataFrame, ranks: list[int] | None = None, ax: Axes | None = None,
                  t0_ns: int | None = None, title: str | None = None, min_width_s: float = 2e-4) -> Axes:
    """Per-rank timeline: one bar per call from ``t_start_ns`` to ``t_end_ns`` (at least ``min_width_s``
    wide so instantaneous calls stay visible), one row per rank, coloured by parallelism; the first call of
    each iteration on the top rank is marked by a dotted line."""
    e = events[events["t_start_ns"].notna()]
    ranks = sorted(e["rank"].unique()) if ranks is None else list(ranks)
    e = e[e["rank"].isin(ranks)]
    t0 = int(e["t_start_ns"].min()) if t0_ns is None else int(t0_ns)
    ax = ax or plt.subplots(figsize=(10, 0.45 * len(ranks) + 1.2))[1]
    for row, r in enumerate(ranks):
        er = e[e["rank"] == r]
        for par, g in er.groupby("parallelism"):
            s = (g["t_start_ns"].to_numpy(np.int64) - t0) / 1e9
            f = (g["t_end_ns"].fillna(g["t_start_ns"]).to_numpy(np.int64) - t0) / 1e9
            w = np.maximum(f - s, min_width_s)
            ax.broken_barh(list(zip(s, w, strict=True)), (row - 0.4, 0.8),
                           facecolors=PARALLELISM_COLORS.get(str(par), "0.5"), label=str(par))
    top = e[e["rank"] == ranks[0]]
    for t in top.groupby("iteration")["t_start_ns"].min().to_numpy(np.int64):
        ax.axvline((t - t0) / 1e9, color="k", ls=":", lw=0.7)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles, strict=True))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="upper right", ncol=len(uniq))
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set(xlabel="time [s]", title=title or "", ylim=(-0.6, len(ranks) - 0.4))
    ax.invert_yaxis()
    return ax


def acf_plot(acf: pd.DataFrame, lag_s: float, marks: dict[str, float] | None = None, n_obs: int | None = None,
             ax: Axes | None = None, title: str | None = None) -> Axes:
    """Autocorrelation against lag in seconds (``acf``: ``lag``, ``acf``; one lag = ``lag_s``), with the
    expected periods in ``marks`` (name -> seconds) as dashed lines and, given ``n_obs``, the white-noise
    95% band ``±1.96/√n``."""
    ax = ax or plt.subplots(figsize=(8, 3.2))[1]
    ax.plot(acf["lag"] * lag_s, acf["acf"], color=PARALLELISM_COLORS["tp"], lw=1.2)
    if n_obs:
        band = 1.96 / np.sqrt(n_obs)
        ax.axhspan(-band, band, color="0.85", zorder=0, label="95% white noise")
    for (name, sec), c in zip((marks or {}).items(), sns.color_palette("dark", len(marks or {})), strict=True):
        ax.axvline(sec, color=c, ls="--", lw=1, label=f"{name} period")
    ax.axhline(0, color="k", lw=0.6)
    ax.set(xlabel="lag [s]", ylabel="autocorrelation", title=title or "")
    ax.legend(fontsize=8)
    return ax


# ===================================================================================================
# Real traces and bandwidth measurements (notebook 04_real_traces; llmcomm.ingest)
# ===================================================================================================
def call_duration_spread(seq: pd.DataFrame, ax: Axes | None = None, top: int = 10,
                         title: str | None = None) -> Axes:
    """Distribution of each collective's duration (µs, log-x) over all its calls, one row per collective
    label (``seq``: ``collective``, ``duration_us``, ``parallelism`` as from
    :func:`llmcomm.ingest.summary.call_sequence`); the ``top`` collectives with most calls."""
    ax = ax or plt.subplots(figsize=(7, 0.45 * top + 1.2))[1]
    order = seq["collective"].value_counts().index[:top].tolist()
    d = seq[seq["collective"].isin(order) & (seq["duration_us"] > 0)]
    pal = {c: PARALLELISM_COLORS.get(c.split("/")[1], "#8C8C8C") for c in order}
    sns.boxplot(data=d, y="collective", x="duration_us", order=order, hue="collective", palette=pal,
                legend=False, whis=(1, 99), fliersize=1.5, linewidth=0.8, ax=ax)
    ax.set(xscale="log", xlabel="duration per call [µs]", ylabel="", title=title or "")
    return ax


def busbw_fit(res: pd.DataFrame, ax: Axes | None = None, hue: str = "group_size", title: str | None = None) -> Axes:
    """Measured bus bandwidth (dots; rows set aside as spikes: crosses) and the fitted model (lines) against
    message size, one colour per ``hue`` value. ``res``: :attr:`llmcomm.overhead.Bandwidth.residuals`
    (``bytes, x, time_s, pred_s, used`` and ``hue``); busbw = bus bytes / time."""
    ax = ax or plt.subplots(figsize=(6.5, 4))[1]
    levels = sorted(res[hue].unique())
    pal = sns.color_palette("viridis", len(levels))
    for color, level in zip(pal, levels, strict=True):
        d = res[res[hue] == level].sort_values("bytes")
        used = d["used"].to_numpy(bool)
        ax.plot(d["bytes"][used], d["x"][used] / d["time_s"][used] / 1e9, "o", ms=2.5, color=color, alpha=0.6)
        ax.plot(d["bytes"][~used], d["x"][~used] / d["time_s"][~used] / 1e9, "x", ms=4, color=color)
        ax.plot(d["bytes"], d["x"] / d["pred_s"] / 1e9, "-", lw=1.2, color=color, label=str(level))
    ax.set(xscale="log", xlabel="message size [bytes]", ylabel="bus bandwidth [GB/s]", title=title or "")
    ax.legend(title=hue.replace("_", " "), fontsize=7, ncol=2)
    return ax


def relative_residuals(res: pd.DataFrame, ax: Axes | None = None, hue: str = "group_size",
                       title: str | None = None) -> Axes:
    """(predicted − measured) / measured against message size for the fitted rows of ``res``
    (:attr:`llmcomm.overhead.Bandwidth.residuals`), one colour per ``hue`` value."""
    ax = ax or plt.subplots(figsize=(6.5, 3))[1]
    d = res[res["used"]].copy()
    levels = sorted(d[hue].unique())
    d[hue] = d[hue].astype(str)
    sns.scatterplot(data=d, x="bytes", y="rel_err", hue=hue, hue_order=[str(v) for v in levels], s=8,
                    palette=sns.color_palette("viridis", len(levels)), linewidth=0, ax=ax, legend=False)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="message size [bytes]", ylabel="relative residual", title=title or "")
    return ax


def effective_bandwidth_lines(df: pd.DataFrame, ax: Axes | None = None, hue: str = "label",
                              title: str | None = None) -> Axes:
    """Modelled bus bandwidth against message size, one line per ``hue`` value, in the frame's order
    (:func:`llmcomm.overhead.effective_bandwidth`)."""
    ax = ax or plt.subplots(figsize=(6.5, 4))[1]
    order = list(pd.unique(df[hue]))
    sns.lineplot(data=df, x="bytes", y="busbw", hue=hue, hue_order=order, ax=ax, lw=1.4,
                 palette=sns.color_palette("tab10", len(order)))
    ax.set(xscale="log", xlabel="message size [bytes]", ylabel="bus bandwidth [GB/s]", title=title or "")
    ax.legend(fontsize=7)
    return ax


def a2a_matrix_heatmap(mat: np.ndarray, ax: Axes | None = None, unit: float = 2**10, title: str | None = None,
                       label: str = "KiB") -> Axes:
    """A small all-to-all matrix (sender rows, receiver columns) with its values written in ``unit``s."""
    ax = ax or plt.subplots(figsize=(5.5, 4.5))[1]
    sns.heatmap(mat / unit, annot=mat.shape[0] <= 16, fmt=".1f", cmap="rocket_r", square=True,
                cbar_kws={"label": label}, ax=ax, annot_kws={"fontsize": 7})
    ax.set(xlabel="receiver rank", ylabel="sender rank", title=title or "")
    return ax


def busbw_curves(bw: pd.DataFrame, ax: Axes | None = None, hue: str = "ranks", title: str | None = None,
                 placement: str = "out-of-place", style: str | None = None) -> Axes:
    """Bus bandwidth (GB/s) against message size (log-x), one line per ``hue`` value (in numeric order when
    numeric) and optionally per ``style`` value (tidy bandwidth table from
    :func:`llmcomm.ingest.ingest_bandwidth`)."""
    ax = ax or plt.subplots(figsize=(6.5, 4))[1]
    d = bw[(bw["placement"] == placement) & (bw["bytes"] > 0)].copy()
    levels = sorted(d[hue].dropna().unique(), key=lambda v: (str(type(v)), v))
    d[hue] = d[hue].astype(str)
    order = [str(v) for v in levels]
    sns.lineplot(data=d, x="bytes", y="busbw", hue=hue, hue_order=order, style=style,
                 palette=sns.color_palette("viridis", len(order)), legend="full", ax=ax, lw=1.2)
    ax.set(xscale="log", xlabel="message size [bytes]", ylabel="bus bandwidth [GB/s]", title=title or "")
    ax.legend(fontsize=7, ncol=2)
    return ax


def comparison_matrices(measured, predicted, *, gpus_per_node: int = 8, titles: tuple[str, str] = (  # noqa: ANN001
        "measured", "predicted"), size: float = 3.4) -> plt.Figure:
    """Measured and predicted ``world × world`` byte matrices on one log colour scale, and their difference
    (measured − predicted, bytes, symmetric diverging scale; white = equal)."""
    import scipy.sparse as sps

    a, b = sps.csr_matrix(measured).toarray(), sps.csr_matrix(predicted).toarray()
    fig, axes = plt.subplots(1, 3, figsize=(3 * size * 1.35, size * 1.1), layout="constrained")
    positive = np.concatenate([a[a > 0], b[b > 0]])
    vmin, vmax = (np.log10(positive.min()), np.log10(positive.max())) if len(positive) else (0, 1)
    for ax, m, title in zip(axes[:2], (a, b), titles, strict=True):
        shown = np.where(m > 0, np.log10(np.where(m > 0, m, 1)), np.nan)
        im = ax.imshow(shown, cmap="viridis", vmin=vmin, vmax=vmax, interpolation="nearest")
        ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=axes[1], fraction=0.046, pad=0.03).set_label("log10 bytes (both panels)")
    d = a - b
    lim = max(float(np.abs(d).max()), 1.0)
    im = axes[2].imshow(d, cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
    axes[2].set_title("measured − predicted", fontsize=9)
    fig.colorbar(im, ax=axes[2], fraction=0.046, pad=0.03).set_label("bytes")
    n = a.shape[0]
    for ax in axes:
        ax.grid(False)
        ax.set_xlabel("receiver rank", fontsize=8)
        ax.set_ylabel("sender rank", fontsize=8)
        for boundary in range(gpus_per_node, n, gpus_per_node):
            ax.axhline(boundary - 0.5, color="0.3", lw=0.6)
            ax.axvline(boundary - 0.5, color="0.3", lw=0.6)
    return fig


def comparison_bars(by_kind: pd.DataFrame, *, x: str = "parallelism", ax: Axes | None = None,
                    unit: float = 2**20, title: str | None = None) -> Axes:
    """Bytes per ``x`` on both sides of a comparison (``by_kind`` of :class:`llmcomm.compare.Comparison`:
    ``bytes_measured``, ``bytes_predicted``), in MiB, log scale."""
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    t = by_kind.groupby(x, observed=True)[["bytes_measured", "bytes_predicted"]].sum().reset_index()
    long = t.melt(id_vars=x, var_name="side", value_name="bytes")
    long["side"] = long["side"].str.removeprefix("bytes_")
    long["MiB"] = long["bytes"] / unit
    sns.barplot(data=long, x=x, y="MiB", hue="side", ax=ax, palette={"measured": "#4c72b0",
                                                                     "predicted": "#dd8452"})
    ax.set_yscale("log")
    ax.set(ylabel="MiB per iteration (log)", title=title or "bytes per parallelism")
    ax.legend(title="side", fontsize=8)
    return ax


def breakdown_bars(df: pd.DataFrame, *, x: str = "config", y: str = "seconds", hue: str = "term",
                   ax: Axes | None = None, title: str | None = None) -> Axes:
    """Stacked bars of ``y`` per ``hue`` (the named terms of an iteration) for each ``x`` (a configuration),
    communication terms hatched."""
    ax = ax or plt.subplots(figsize=(8, 4))[1]
    wide = df.pivot_table(index=x, columns=hue, values=y, aggfunc="sum", sort=False).fillna(0.0)
    kinds = df.drop_duplicates(hue).set_index(hue)["kind"] if "kind" in df.columns else pd.Series(dtype=str)
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


def best_config_shift(df: pd.DataFrame, *, x: str = "gpus", y: str = "tflops_per_gpu", hue: str = "cluster",
                      label: str = "config", ax: Axes | None = None, title: str | None = None) -> Axes:
    """``y`` of the best configuration against ``x`` (log2), one line per ``hue``, each point annotated with its
    ``label``."""
    ax = ax or plt.subplots(figsize=(8, 4.5))[1]
    sns.lineplot(data=df, x=x, y=y, hue=hue, marker="o", ax=ax)
    ax.set_xscale("log", base=2)
    for r in df.itertuples():
        ax.annotate(getattr(r, label), (getattr(r, x), getattr(r, y)), fontsize=6, rotation=20,
                    xytext=(3, 3), textcoords="offset points")
    ax.set(title=title or "", ylabel=y.replace("_", " "))
    return ax


def published_speedups(df: pd.DataFrame, *, x: str = "model", ys: Sequence[str] = (
        "predicted_speedup_2021", "predicted_speedup"), ax: Axes | None = None, title: str | None = None) -> Axes:
    """Grouped bars of predicted speed-ups per ``x`` (one bar per column in ``ys``), with the 1× line."""
    ax = ax or plt.subplots(figsize=(8, 4))[1]
    long = df.melt(id_vars=x, value_vars=list(ys), var_name="features", value_name="speed-up")
    sns.barplot(data=long, x=x, y="speed-up", hue="features", ax=ax)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.tick_params(axis="x", rotation=30, labelsize=7)
    ax.set(title=title or "", ylabel="predicted speed-up (×)")
    return ax
