"""Figures with one house style, in seaborn's calling convention.

Every function takes its data first (a tidy DataFrame), then keyword-only ``x=``, ``y=``, ``hue=`` (column
names, never hard-coded) and ``ax=None``, in that order, then its own options, and passes any other keyword
(``**kwargs``) on to the matplotlib or seaborn call that draws its main artists; it draws on ``ax`` (a new
figure when None) and returns the Axes. :func:`comm_matrix_grid`, :func:`comparison_matrices` and
:func:`overhead_surface` draw several panels and return the Figure (like seaborn's figure-level functions they
have no ``ax``). Shared encodings: one colour per parallelism (:data:`PARALLELISM_COLORS`) and per iteration term
(:data:`TERM_COLORS`), byte ticks from :func:`llmcomm.units.format_bytes`, log axes labelled by :func:`log_axis`. None touches global state except
:func:`apply_style`, which notebooks call once; the matplotlib backend is left to the caller
(``MPLBACKEND``, set by the Makefile and the tests).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.colors import Normalize, to_rgba
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from .units import format_bytes

PARALLELISM_COLORS = {"tp": "#4C72B0", "sp": "#64B5CD", "cp": "#8172B3", "pp": "#DD8452",
                      "dp": "#55A868", "ep": "#C44E52", "other": "#8C8C8C"}
NODE_LINE: dict[str, Any] = {"color": "0.45", "lw": 0.6, "ls": "--"}  # node boundaries: visible on colour and on white
MAX_NODE_LINES = 32  # beyond this many nodes the boundary lines would hide the matrix
MATRIX_FLOOR = 1e-6  # matrix cells under this share of the largest are left white (and the colour bar says so)
# one colour per term of an iteration (llmcomm.overhead.Breakdown), the same in every breakdown figure
TERM_COLORS = {"forward": "#4c72b0", "backward": "#55a868", "recompute": "#8172b2", "optimizer": "#937860",
               "tp_comm": "#c44e52", "ep_comm": "#dd8452", "pp_comm": "#da8bc3", "dp_comm": "#8c8c8c",
               "bubble": "#ccb974"}


def apply_style() -> None:
    """The project's seaborn theme (call once per notebook)."""
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.1,
                  rc={"figure.dpi": 110, "savefig.dpi": 150, "savefig.bbox": "tight"})


def axes_or_new(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    """``ax``, or the axes of a new figure of ``figsize`` inches when it is ``None`` (seaborn's ``ax=None``)."""
    return ax if ax is not None else plt.subplots(figsize=figsize)[1]


def byte_ticks(n: float, _pos: object = None) -> str:
    """Tick label of a byte count: :func:`llmcomm.units.format_bytes` in its compact form with a space
    (``"512 B"``, ``"1 KiB"``, ``"1.5 GiB"``); a matplotlib ``FuncFormatter`` function."""
    return format_bytes(n, compact=True, sep=" ")


def plain_number(v: float, _pos: object = None) -> str:
    """Tick label of a number without exponent notation: ``0.05``, ``3``, ``1,024``."""
    return format(v, ",.10g")


def log_axis(ax: Axes, axis: str = "x", *, base: float = 10) -> None:
    """Make ``axis`` of ``ax`` logarithmic with labels that do not overlap: plain numbers (``3``, ``10``, ``20``)
    at 1-2-5 steps when the axis spans under 1.5 decades of the current limits, 1-2-5 or powers only beyond, and
    no labels on minor ticks (matplotlib labels minor ticks of a short log axis as "3×10⁰", which collide)."""
    a = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=base)
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    decades = np.log(hi / lo) / np.log(base) if lo > 0 and hi > lo else 0.0
    subs: tuple[float, ...] = (1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)
    if base == 10 and decades < 0.7:
        subs = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
    a.set_major_locator(LogLocator(base=base, subs=subs))
    a.set_major_formatter(FuncFormatter(plain_number))
    a.set_minor_locator(LogLocator(base=base, subs="auto"))
    a.set_minor_formatter(NullFormatter())


def natural_order(values: Sequence[object]) -> list[object]:
    """``values`` (unique, in order) sorted by their leading number when they all start with one (``"3.6B"`` before
    ``"18.4B"``), else as given."""
    uniq = list(pd.unique(pd.Series(list(values), dtype=object)))

    def lead(v: object) -> float | None:
        m = re.match(r"\s*([-+]?\d+(?:\.\d+)?)", str(v))
        return float(m.group(1)) if m else None

    keys = [lead(v) for v in uniq]
    numbers = [k for k in keys if k is not None]
    if len(numbers) == len(keys):
        return [v for _, v in sorted(zip(numbers, uniq, strict=True), key=lambda kv: kv[0])]
    return uniq


def layout_grid(data: pd.DataFrame, *, x: str = "rank", y: str = "node", hue: str = "tp_group",
                ax: Axes | None = None, gpus_per_node: int = 8, title: str | None = None, **kwargs: Any) -> Axes:
    """Ranks as cells (rows: the ``y`` node, columns: ``x`` rank modulo ``gpus_per_node``), coloured and
    labelled by their ``hue`` group (e.g. :meth:`llmcomm.layout.Layout.group_table`). :func:`layout_cells` gives
    each cell's place, colour and label (to recolour the same cells in place)."""
    nodes = int(data[y].max()) + 1
    ax = axes_or_new(ax, (6, 0.45 * nodes + 1))
    for col, row, color, label in zip(*layout_cells(data, x=x, y=y, hue=hue, gpus_per_node=gpus_per_node),
                                      strict=True):
        # add_artist: add_patch would also grow the data limits by each cell (most of a cell's cost), and the
        # limits are set below
        ax.add_artist(Rectangle((col, row), 0.95, 0.9, **{"color": color, "alpha": 0.85, **kwargs}))
        ax.text(col + 0.47, row + 0.45, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, gpus_per_node)
    ax.set_ylim(0, nodes)
    ax.set_xticks(np.arange(gpus_per_node) + 0.47, [str(i) for i in range(gpus_per_node)])
    ax.set_yticks(np.arange(nodes) + 0.45, [f"node {nodes - 1 - i}" for i in range(nodes)])
    ax.set_xlabel("local GPU")
    ax.grid(False)
    ax.set_title(title or f"{hue}")
    return ax


def layout_cells(data: pd.DataFrame, *, x: str = "rank", y: str = "node", hue: str = "tp_group",
                 gpus_per_node: int = 8) -> tuple[list[int], list[int], list[tuple[float, float, float]], list[str]]:
    """The cells of :func:`layout_grid` in row order: column, row (node 0 on top), colour (one ``husl`` colour
    per ``hue`` group, in order of appearance) and label (``r<rank>`` over ``g<group>``)."""
    nodes = int(data[y].max()) + 1
    ids = data[hue].to_numpy()
    uniq = {v: i for i, v in enumerate(pd.unique(ids))}
    pal = sns.color_palette("husl", max(len(uniq), 1))
    cols, rows, colors, labels = [], [], [], []
    for r, node, gid in zip(data[x].to_numpy(), data[y].to_numpy(), ids, strict=True):
        cols.append(int(r) % gpus_per_node)
        rows.append(nodes - 1 - int(node))
        colors.append(pal[uniq[gid]])
        labels.append(f"r{r}\ng{gid}")
    return cols, rows, colors, labels


def parameter_check(data: pd.DataFrame, *, x: str = "rel_error", y: str = "name", hue: str = "family",
                    ax: Axes | None = None, tolerance: float = 0.02, **kwargs: Any) -> Axes:
    """Relative error ``x`` (a fraction, drawn in %) of computed vs published parameter counts per model
    ``y``, coloured by ``hue``, with the ±tolerance band shaded. Rows keep the data's order within each
    ``hue`` value."""
    d = data.sort_values(hue, kind="stable")
    ax = axes_or_new(ax, (6, 0.22 * len(d) + 1))
    ax.axvspan(-100 * tolerance, 100 * tolerance, color="0.9", zorder=0, label=f"±{100 * tolerance:g}%")
    sns.scatterplot(data=d.assign(_pct=100 * d[x]), x="_pct", y=y, hue=hue, ax=ax, **{"s": 45, "zorder": 3, **kwargs})
    ax.axvline(0, color="k", lw=0.8)
    ax.set(xlabel="(computed − published) / published  [%]", ylabel="")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=hue)  # outside: no point hidden
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
                  cmap: str, log: bool, title: str | None, node_lines: str = "lines", **kwargs: Any):
    im = ax.imshow(np.log10(dense) if log else dense, cmap=cmap, norm=norm, interpolation="nearest",
                   origin="upper", **kwargs)
    title = (_node_boundary_collection(ax, k, world_size, gpus_per_node, title) if node_lines == "collection"
             else _node_boundaries(ax, k, world_size, gpus_per_node, title))
    ax.set_xlabel(_matrix_axis_label("receiver", k))
    ax.set_ylabel(_matrix_axis_label("sender", k))
    ax.grid(False)
    ax.set_title(title or "communication matrix")
    return im


def _matrix_axis_label(side: str, k: int) -> str:
    """A matrix panel's axis label: ``"sender rank"`` / ``"receiver rank"``, with the bin size above 1."""
    return f"{side} rank" + (f" (bins of {k})" if k > 1 else "")


def _node_boundaries(ax: Axes, k: int, world_size: int, gpus_per_node: int, title: str | None) -> str | None:
    """The dashed node boundaries of a matrix panel in bins of ``k`` ranks (up to :data:`MAX_NODE_LINES` nodes);
    returns ``title``, with a note when there are too many nodes to draw."""
    positions, title = _boundary_positions(k, world_size, gpus_per_node, title)
    for pos in positions:
        ax.axhline(pos, **NODE_LINE)
        ax.axvline(pos, **NODE_LINE)
    return title


NODE_COLLECTION = "node-boundaries"  # gid of the one collection holding a panel's node boundaries


def _boundary_segments(ax: Axes, positions: list[float]) -> list[list[tuple[float, float]]]:
    """The segments of ``axhline(pos)`` then ``axvline(pos)`` per position, in data coordinates of ``ax``'s
    current limits: left to right, bottom to top (the direction their dashes start from)."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    return [s for p in positions for s in ([(x0, p), (x1, p)], [(p, y0), (p, y1)])]


def _node_boundary_collection(ax: Axes, k: int, world_size: int, gpus_per_node: int, title: str | None
                              ) -> str | None:
    """:func:`_node_boundaries` as one line collection (gid :data:`NODE_COLLECTION`) of the same segments in
    the same order and style: the same pixels on a raster canvas (the explorer's tests compare them), one
    artist instead of two lines per node (a line costs more to make than to draw)."""
    from matplotlib.collections import LineCollection

    positions, title = _boundary_positions(k, world_size, gpus_per_node, title)
    lc = LineCollection(_boundary_segments(ax, positions), colors=NODE_LINE["color"], linewidths=NODE_LINE["lw"],
                        linestyles=NODE_LINE["ls"], zorder=2)
    lc.set_gid(NODE_COLLECTION)
    ax.add_collection(lc, autolim=False)
    return title


def _boundary_positions(k: int, world_size: int, gpus_per_node: int, title: str | None
                        ) -> tuple[list[float], str | None]:
    """Where :func:`_node_boundaries` draws its lines (in cells), and the panel's title."""
    nodes = int(np.ceil(world_size / gpus_per_node))
    if 1 < nodes <= MAX_NODE_LINES:
        return [b * gpus_per_node / k - 0.5 for b in range(1, nodes)], title
    if nodes > MAX_NODE_LINES:
        title = f"{title or 'communication matrix'}\n({nodes} nodes: boundaries not drawn)"
    return [], title


def _move_node_boundaries(ax: Axes, k: int, world_size: int, gpus_per_node: int, title: str | None
                          ) -> str | None:
    """:func:`_node_boundaries` on axes that hold only the lines of earlier calls: those lines are moved (the
    first ones, in the order they were drawn) and shown, missing ones drawn, surplus ones hidden (a new line
    costs more than drawing it; a hidden one is not drawn), so the axes draw the lines a new call would draw, in
    the same order."""
    positions, title = _boundary_positions(k, world_size, gpus_per_node, title)
    kept = [c for c in ax.collections if c.get_gid() == NODE_COLLECTION]
    if kept:  # drawn by _node_boundary_collection: its segments replaced
        from matplotlib.collections import LineCollection

        assert isinstance(kept[0], LineCollection)  # the gid is only ever given to one
        kept[0].set_segments(_boundary_segments(ax, positions))
        return title
    lines = list(ax.lines)
    for i, pos in enumerate(positions):
        if 2 * i + 1 < len(lines):
            lines[2 * i].set_ydata([pos, pos])
            lines[2 * i + 1].set_xdata([pos, pos])
            for line in lines[2 * i:2 * i + 2]:  # as axhline / axvline leave their path
                line.get_path()._interpolation_steps = mpl.axis.GRIDLINE_INTERPOLATION_STEPS  # type: ignore[attr-defined]  # private, as axhline sets it
                line.set_visible(True)
        else:
            ax.axhline(pos, **NODE_LINE)
            ax.axvline(pos, **NODE_LINE)
    for line in lines[2 * len(positions):]:
        line.set_visible(False)
    return title


def _floor_cells(dense: np.ndarray, floor: float | None, top: float) -> tuple[np.ndarray, float]:
    """Cells of ``dense`` below ``floor × top`` as NaN (not drawn); returns the matrix and the largest hidden cell
    (0 if none)."""
    if not floor or not np.isfinite(top):
        return dense, 0.0
    hide = np.isfinite(dense) & (dense < floor * top)
    hidden = float(np.nanmax(np.where(hide, dense, np.nan))) if hide.any() else 0.0
    return np.where(hide, np.nan, dense), hidden


def _floor_note(floor: float | None, hidden: float) -> str:
    if not floor or hidden <= 0:
        return ""
    size = f"{hidden:.2g} B" if hidden < 2**10 else byte_ticks(hidden)
    return f"\nwhite: none, or < {floor:g} × the largest (≤ {size})"


def comm_matrix(data: pd.DataFrame, *, x: str = "dst", y: str = "src", hue: str = "bytes",
                ax: Axes | None = None, world_size: int | None = None, gpus_per_node: int = 8,
                max_cells: int = 512, log: bool = True, cmap: str = "viridis", title: str | None = None,
                floor: float | None = MATRIX_FLOOR, **kwargs: Any) -> Axes:
    """Heat map of the bytes ``hue`` sent from rank ``y`` (rows) to rank ``x`` (columns), summed over rows
    of ``data`` (e.g. :meth:`llmcomm.Trace.flows`). Node boundaries are dashed grey lines; pairs that never
    talk stay white. Above ``max_cells`` ranks, ranks are binned into equal blocks (bytes summed).

    ``floor``: cells under ``floor`` × the largest cell are left white too, and the colour bar says so when any
    was (default :data:`MATRIX_FLOOR`: the 4-byte loss and gradient-norm all-reduces of a dense job would
    otherwise paint every pair of their group at 10⁻¹⁰ of a PP pair's bytes); ``None`` draws every cell.
    ``kwargs`` go to ``imshow``."""
    n = world_size or int(max(data[x].max(), data[y].max()) + 1)
    ax = axes_or_new(ax, (5.5, 4.5))
    dense, k = _binned(data, x, y, hue, n, max_cells)
    top = float(np.nanmax(dense)) if np.isfinite(dense).any() else np.nan
    dense, hidden = _floor_cells(dense, floor, top)
    shown = np.log10(dense) if log else dense
    norm = Normalize(np.nanmin(shown), np.nanmax(shown)) if np.isfinite(shown).any() else Normalize(0, 1)
    im = _matrix_panel(ax, dense, k, n, gpus_per_node, norm, cmap, log, title, **kwargs)
    cb = ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    cb.set_label((f"log10 {hue}" if log else hue) + _floor_note(floor, hidden), fontsize=8 if hidden else None)
    return ax


def comm_matrix_grid(data: pd.DataFrame, *, x: str = "dst", y: str = "src", hue: str = "bytes",
                     col: str = "panel", world_size: int | None = None, gpus_per_node: int = 8, ncols: int = 4,
                     size: float = 3.2, max_cells: int = 512, cmap: str = "viridis",
                     floor: float | None = MATRIX_FLOOR, **kwargs: Any) -> plt.Figure:
    """One :func:`comm_matrix` panel per value of ``col`` (in order of appearance), all on one shared
    log colour scale with one colour bar, so that colours compare across panels. ``floor`` as in
    :func:`comm_matrix`, relative to the largest cell of any panel; ``kwargs`` go to ``imshow``."""
    titles = list(pd.unique(data[col]))
    n = world_size or int(max(data[x].max(), data[y].max()) + 1)
    mats = [_binned(data[data[col] == t], x, y, hue, n, max_cells) for t in titles]
    return _matrix_grid(titles, mats, n, gpus_per_node, ncols, size, cmap, floor, hue, **kwargs)[0]


class MatrixImages:
    """:func:`comm_matrix_grid` of matrices already summed into blocks of ``unit`` ranks (``{title: (cells,
    cells) array}``, e.g. :func:`llmcomm.matrix_view.binned_matrices`; zero cells are background), its figure
    (``.fig``) kept with its artists: :meth:`update` puts new matrices of the
    same titles, block size and world (:meth:`fits`) into the same images, colour scale and colour-bar label,
    so a redraw costs one rendering, not a new figure and its layout. ``subplotpars`` (``left, right, bottom,
    top, wspace, hspace``, e.g. :func:`subplot_params` of an earlier grid of as many panels) replace the tight
    layout, which costs as much as a drawing. ``node_lines="collection"`` draws each panel's node boundaries as
    one line collection (:func:`_node_boundary_collection`: the same pixels, fewer artists; a vector file would
    hold one path group instead of lines)."""

    def __init__(self, images: Mapping[str, np.ndarray], *, unit: int, world_size: int, gpus_per_node: int = 8,
                 ncols: int = 4, size: float = 3.2, cmap: str = "viridis", hue: str = "bytes",
                 floor: float | None = MATRIX_FLOOR, subplotpars: Mapping[str, float] | None = None,
                 node_lines: str = "lines", **kwargs: Any) -> None:
        self.key = self._key(images, unit, world_size, gpus_per_node)
        self.hue, self.floor = hue, floor
        mats = [(np.where(m > 0, m, np.nan), unit) for m in images.values()]
        self.fig, self.ims, self.colorbar = _matrix_grid(list(images), mats, world_size, gpus_per_node, ncols,
                                                         size, cmap, floor, hue, subplotpars, node_lines,
                                                         **kwargs)

    @staticmethod
    def _key(images: Mapping[str, np.ndarray], unit: int, world_size: int, gpus_per_node: int) -> tuple:
        return (tuple(images), tuple(m.shape for m in images.values()), unit, world_size, gpus_per_node)

    def fits(self, images: Mapping[str, np.ndarray], *, unit: int, world_size: int, gpus_per_node: int = 8) -> bool:
        """Whether ``images`` can be drawn into this figure (same titles, shapes, blocks and nodes)."""
        return self._key(images, unit, world_size, gpus_per_node) == self.key

    def reshape(self, images: Mapping[str, np.ndarray], *, unit: int, world_size: int, gpus_per_node: int = 8
                ) -> None:
        """Show ``images`` of as many panels as this figure's (any titles, cells, blocks and world), in place:
        each image's data and extent, its axes' limits, node boundaries (the lines moved, not drawn anew: a new
        line costs more than drawing it), title and axis labels (those not emptied, e.g. by ``label_outer``), then
        :meth:`update`; the figure then :meth:`fits` ``images``."""
        if len(images) != len(self.key[0]):
            raise ValueError(f"MatrixImages.reshape: {len(images)} panels {list(images)}, this figure has "
                             f"{len(self.key[0])} ({list(self.key[0])})")
        for im, title, m in zip(self.ims, images, images.values(), strict=True):
            ax, n = im.axes, m.shape[0]
            im.set_extent((-0.5, n - 0.5, n - 0.5, -0.5))
            ax.set_xlim(-0.5, n - 0.5)
            ax.set_ylim(n - 0.5, -0.5)
            ax.set_title(str(_move_node_boundaries(ax, unit, world_size, gpus_per_node, str(title))), fontsize=8)
            if ax.get_xlabel():
                ax.set_xlabel(_matrix_axis_label("receiver", unit))
            if ax.get_ylabel():
                ax.set_ylabel(_matrix_axis_label("sender", unit))
        self.key = self._key(images, unit, world_size, gpus_per_node)
        self.update(images)

    def update(self, images: Mapping[str, np.ndarray]) -> None:
        """Show ``images`` (which :meth:`fits`) in place: data, shared log scale and colour-bar label."""
        mats, norm, hidden = _grid_scale([np.where(m > 0, m, np.nan) for m in images.values()], self.floor)
        if self.colorbar is None:
            return
        shared = self.ims[0].norm
        with shared.callbacks.blocked():  # both limits at once: a colour bar told of a new vmin above the old
            shared.vmin, shared.vmax = norm.vmin, norm.vmax  # vmax swaps them (matplotlib's nonsingular)
        for im, dense in zip(self.ims, mats, strict=True):
            im.set_data(np.log10(dense))
        self.colorbar.update_normal(self.ims[-1])
        self.colorbar.set_label(_grid_label(self.hue, self.floor, hidden), fontsize=8 if hidden else None)


def _grid_scale(mats: list[np.ndarray], floor: float | None) -> tuple[list[np.ndarray], Normalize, float]:
    """The matrices with cells under ``floor`` × the largest of any as NaN, their shared log10 scale and the
    largest hidden cell."""
    finite = [d[np.isfinite(d)] for d in mats]
    top = max((float(f.max()) for f in finite if len(f)), default=np.nan)
    floored = [_floor_cells(d, floor, top) for d in mats]
    hidden = max((h for _, h in floored), default=0.0)
    out = [d for d, _ in floored]
    logs = np.concatenate([np.log10(d[np.isfinite(d)]) for d in out]) if out else np.zeros(0)
    norm = Normalize(float(logs.min()), float(logs.max())) if len(logs) else Normalize(0, 1)
    return out, norm, hidden


def _grid_label(hue: str, floor: float | None, hidden: float) -> str:
    return f"log10 {hue} (one scale for all panels)" + _floor_note(floor, hidden)


def subplot_params(fig: plt.Figure) -> dict[str, float]:
    """The figure's subplot parameters (after ``tight_layout``), to lay out a figure of the same shape alike."""
    sp = fig.subplotpars
    return {"left": sp.left, "right": sp.right, "bottom": sp.bottom, "top": sp.top, "wspace": sp.wspace,
            "hspace": sp.hspace}


def _matrix_grid(titles: list, mats: list[tuple[np.ndarray, int]], n: int, gpus_per_node: int, ncols: int,
                 size: float, cmap: str, floor: float | None, hue: str,
                 subplotpars: Mapping[str, float] | None = None, node_lines: str = "lines", **kwargs: Any
                 ) -> tuple[plt.Figure, list, Any]:
    dense_list, norm, hidden = _grid_scale([d for d, _ in mats], floor)
    mats = [(d, k) for d, (_, k) in zip(dense_list, mats, strict=True)]
    cols = min(ncols, len(titles))
    nrows = int(np.ceil(len(titles) / cols))
    figsize = (size * 1.12 * cols + 0.8, size * nrows)
    if subplotpars is None:  # laid out by tight_layout, which measures every cell of the grid
        fig, grid = plt.subplots(nrows, cols, figsize=figsize, squeeze=False)
        axes = grid.ravel().tolist()
    else:  # laid out by its parameters: no axes for the empty cells of the last row (they are hidden, and the
        # colour bar is placed by the union of its axes, which the full first row spans as before)
        fig = plt.figure(figsize=figsize)
        gs = fig.add_gridspec(nrows, cols)
        axes = [fig.add_subplot(gs[i // cols, i % cols]) for i in range(len(titles))]
    ims = []
    for ax, title, (dense, k) in zip(axes, titles, mats, strict=False):
        ims.append(_matrix_panel(ax, dense, k, n, gpus_per_node, norm, cmap, True, str(title), node_lines,
                                 **kwargs))
        ax.title.set_fontsize(8)
        ax.xaxis.label.set_fontsize(7)
        ax.yaxis.label.set_fontsize(7)
    for ax in axes[len(titles):]:
        ax.set_visible(False)
    if subplotpars is None:
        fig.tight_layout()
    else:
        fig.subplots_adjust(**subplotpars)
    cb = None
    if ims:
        cb = fig.colorbar(ims[-1], ax=axes, fraction=0.02, pad=0.02)
        cb.set_label(_grid_label(hue, floor, hidden), fontsize=8 if hidden else None)
    return fig, ims, cb


def volume_bars(data: pd.DataFrame, *, x: str = "config", y: str = "bytes", hue: str = "parallelism",
                ax: Axes | None = None, unit: float = 2**30, normalize: bool = False, legend: bool = True,
                title: str | None = None, **kwargs: Any) -> Axes:
    """Stacked bars of ``y`` bytes per ``hue`` value for each ``x``, in GiB (``unit``).

    ``normalize=True`` stacks each bar's shares to 100% (so configurations of very different size stay
    readable) and writes the bar's total above it. ``kwargs`` go to ``DataFrame.plot``."""
    ax = axes_or_new(ax, (6, 4))
    piv = data.pivot_table(index=x, columns=hue, values=y, aggfunc="sum", fill_value=0, sort=False)
    order = [p for p in PARALLELISM_COLORS if p in piv.columns] + \
        [p for p in piv.columns if p not in PARALLELISM_COLORS]
    totals = piv.sum(axis=1)
    shown = piv.div(totals, axis=0) * 100 if normalize else piv / unit
    shown[order].plot(kind="bar", stacked=True, ax=ax, width=0.7,
                      color=[PARALLELISM_COLORS.get(p, "0.5") for p in order], **kwargs)
    ylabel = "share of bytes [%]" if normalize else ("GiB per iteration" if unit == 2**30 else "bytes")
    ax.set(ylabel=ylabel, xlabel="", title=title or "")
    if normalize:
        ax.set_ylim(0, 112)
        for i, tot in enumerate(totals.to_numpy()):
            ax.text(i, 101.5, format_bytes(tot, decimals=1), ha="center", va="bottom", fontsize=7)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
    if not legend:
        shown = ax.get_legend()
        if shown is not None:
            shown.remove()
    else:  # beside the axes: inside, it covers a bar (a single configuration's bar spans the plot)
        ax.legend(title=hue, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return ax


def pair_class_bars(data: pd.DataFrame, *, x: str = "config", y: str = "share",
                    hue: str | Sequence[str] = ("parallelism", "pair_class"), ax: Axes | None = None,
                    **kwargs: Any) -> Axes:
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
                    color=[PARALLELISM_COLORS.get(c.split(" ")[0], "0.5") for c in order], **kwargs)
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
                   caps: Mapping[str, float] | None = None, ylabel: str = "TP share of bytes [%]", **kwargs: Any) -> Axes:
    """TP share ``y`` (a fraction, drawn in %) against the number of micro-batches ``x`` (log-x), one line
    per ``hue`` (and ``style``) value; the ``threshold`` line is labelled, and each asymptotic cap in
    ``caps`` (label -> fraction, e.g. ``t / (t + p)``) is drawn as a dotted line with its value."""
    ax = axes_or_new(ax, (6, 4))
    sns.lineplot(data=data.assign(_pct=100 * data[y]), x=x, y="_pct", hue=hue, style=style, marker="o", ax=ax,
                 **kwargs)
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
                  min_width_s: float = 2e-4, **kwargs: Any) -> Axes:
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
                           label=str(par), **kwargs)  # no white edge: it would hide calls narrower than the edge
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
             n_obs: int | None = None, title: str | None = None, **kwargs: Any) -> Axes:
    """Autocorrelation ``y`` against lag ``x`` in seconds (one lag = ``lag_s``), one line per ``hue`` value
    if given, with the expected periods in ``marks`` (name -> seconds) as dashed lines and, given
    ``n_obs``, the white-noise 95% band ``±1.96/√n``."""
    ax = axes_or_new(ax, (8, 3.2))
    d = data.assign(_lag_s=data[x] * lag_s)
    if hue is None:
        ax.plot(d["_lag_s"], d[y], **{"color": PARALLELISM_COLORS["tp"], "lw": 1.2, **kwargs})
    else:
        sns.lineplot(data=d, x="_lag_s", y=y, hue=hue, ax=ax, **{"lw": 1.2, **kwargs})
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
                         title: str | None = None, **kwargs: Any) -> Axes:
    """Distribution of each ``y`` collective's duration ``x`` (µs, log-x) over all its calls, coloured by
    ``hue`` (e.g. :func:`llmcomm.analysis.repeatability.call_sequence`); the ``top`` collectives with most calls."""
    ax = axes_or_new(ax, (7, 0.45 * top + 1.2))
    order = data[y].value_counts().index[:top].tolist()
    d = data[data[y].isin(order) & (data[x] > 0)]
    pal = {h: PARALLELISM_COLORS.get(str(h), "#8C8C8C") for h in d[hue].unique()}
    sns.boxplot(data=d, y=y, x=x, order=order, hue=hue, palette=pal, dodge=False, whis=(1, 99), fliersize=1.5,
                linewidth=0.8, ax=ax, **kwargs)
    ax.set(xscale="log", xlabel="duration per call [µs]", ylabel="", title=title or "")
    ax.legend(title=hue, fontsize=7, title_fontsize=8, loc="lower right")
    return ax


def busbw_fit(data: pd.DataFrame, *, x: str = "bytes", y: str = "busbw", hue: str = "group_size",
              ax: Axes | None = None, fit: str = "busbw_fit", used: str = "used", title: str | None = None,
              **kwargs: Any) -> Axes:
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
        ax.plot(d[x], d[fit], "-", **{"lw": 1.2, **kwargs}, color=color, label=str(level))
    ax.set(xscale="log", xlabel="message size [bytes]", ylabel="bus bandwidth [GB/s]", title=title or "")
    ax.legend(title=hue.replace("_", " "), fontsize=7, ncol=2)
    return ax


def relative_residuals(data: pd.DataFrame, *, x: str = "bytes", y: str = "rel_err", hue: str = "group_size",
                       ax: Axes | None = None, used: str = "used", title: str | None = None, legend: bool = True,
                       **kwargs: Any) -> Axes:
    """(predicted − measured) / measured ``y`` against message size ``x`` for the rows whose ``used`` is True
    (e.g. :attr:`llmcomm.overhead.Bandwidth.residuals`), one colour per ``hue`` value (named in the legend).
    Above zero the model is slower than the measurement. ``kwargs`` go to ``sns.scatterplot``."""
    ax = axes_or_new(ax, (6.5, 3))
    d = data[data[used]].copy()
    levels = sorted(d[hue].unique())
    d[hue] = d[hue].astype(str)
    sns.scatterplot(data=d, x=x, y=y, hue=hue, hue_order=[str(v) for v in levels], s=8,
                    palette=sns.color_palette("viridis", len(levels)), linewidth=0, ax=ax, legend=legend, **kwargs)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="message size [bytes]", title=title or "",
           ylabel="(predicted − measured) / measured")
    ax.xaxis.set_major_locator(LogLocator(base=2**10, numticks=8))
    ax.xaxis.set_major_formatter(FuncFormatter(byte_ticks))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.annotate("> 0: model too slow", (0.01, 0.98), xycoords="axes fraction", va="top", fontsize=7, color="0.3")
    ax.annotate("< 0: model too fast", (0.01, 0.02), xycoords="axes fraction", va="bottom", fontsize=7, color="0.3")
    if legend:
        ax.legend(title=hue.replace("_", " "), fontsize=6, title_fontsize=7, ncol=1 if len(levels) <= 8 else 2,
                  loc="center left", bbox_to_anchor=(1.01, 0.5), markerscale=1.5)
    return ax


def effective_bandwidth_lines(data: pd.DataFrame, *, x: str = "bytes", y: str = "busbw", hue: str = "label",
                              ax: Axes | None = None, style: str | None = None, title: str | None = None,
                              note: str | None = None, **kwargs: Any) -> Axes:
    """Modelled bus bandwidth ``y`` against message size ``x``, one line per ``hue`` value, in the frame's
    order (e.g. :func:`llmcomm.overhead.effective_bandwidth`); one line style per ``style`` value (e.g. how the
    group is placed on nodes; solid, dashed, dotted in order of appearance). Each line is drawn a little thinner
    than the one before, so that a line lying on an earlier one leaves it visible at its edges. ``note`` is
    written under the axis. ``kwargs`` go to ``ax.plot``."""
    ax = axes_or_new(ax, (6.5, 4))
    order = list(pd.unique(data[hue]))
    colors = sns.color_palette("tab10", len(order))
    styles = {v: ls for v, ls in zip(pd.unique(data[style]), ("-", "--", ":", "-."), strict=False)} if style else {}
    for i, (color, name) in enumerate(zip(colors, order, strict=True)):
        g = data[data[hue] == name].sort_values(x)
        ls = styles.get(g[style].iloc[0], "-") if style else "-"
        ax.plot(g[x], g[y], color=color, label=str(name),
                **{"ls": ls, "lw": max(0.9, 2.6 - 0.25 * i), **kwargs})
    ax.set(xscale="log", xlabel="message size", ylabel="bus bandwidth [GB/s]", title=title or "")
    ax.xaxis.set_major_locator(LogLocator(base=32, numticks=12))
    ax.xaxis.set_major_formatter(FuncFormatter(byte_ticks))
    ax.xaxis.set_minor_formatter(NullFormatter())
    if note:
        ax.text(0.0, -0.2, note, transform=ax.transAxes, ha="left", va="top", fontsize=7, color="0.3")
    ax.legend(fontsize=7, loc="upper left", title=style.replace("_", " ") + ": line style" if style else None,
              title_fontsize=7)
    return ax


def a2a_matrix_heatmap(data: pd.DataFrame, *, x: str = "dst", y: str = "src", hue: str = "bytes",
                       ax: Axes | None = None, unit: float = 2**10, label: str = "KiB",
                       title: str | None = None, **kwargs: Any) -> Axes:
    """A small all-to-all matrix (``y`` sender rows, ``x`` receiver columns) of ``hue`` with its values
    written in ``unit``s."""
    ax = axes_or_new(ax, (5.5, 4.5))
    mat = data.pivot_table(index=y, columns=x, values=hue, aggfunc="sum", fill_value=0) / unit
    sns.heatmap(mat, **{"annot": mat.shape[0] <= 16, "fmt": ".1f", "cmap": "rocket_r", "square": True,
                        "cbar_kws": {"label": label}, "annot_kws": {"fontsize": 7}, **kwargs}, ax=ax)
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
                 title: str | None = None, **kwargs: Any) -> Axes:
    """Bus bandwidth ``y`` (GB/s) against message size ``x`` (bytes, log-x with KiB/MiB/GiB ticks), one line
    per ``hue`` value (GPU count: :func:`node_palette`, blue inside a node, red across) and optionally per
    ``style`` value (e.g. :func:`llmcomm.ingest.ingest_bandwidth`'s table, filtered by the caller).
    ``kwargs`` go to ``sns.lineplot``."""
    ax = axes_or_new(ax, (6.5, 4))
    d = data[data[x] > 0].copy()
    levels = sorted(int(v) for v in d[hue].dropna().unique())
    d[hue] = d[hue].astype(int).astype(str)
    sns.lineplot(data=d, x=x, y=y, hue=hue, hue_order=[str(v) for v in levels], style=style,
                 palette=node_palette(levels, gpus_per_node), legend="full", ax=ax, lw=1.2, **kwargs)
    ax.set(xscale="log", xlabel="message size", ylabel="bus bandwidth [GB/s]", title=title or "")
    ax.xaxis.set_major_locator(LogLocator(base=32, numticks=12))  # 1 KiB, 32 KiB, 1 MiB, ...
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
    ax.xaxis.set_major_formatter(FuncFormatter(byte_ticks))
    inter = [v for v in levels if v > gpus_per_node]
    if style is None or inter:  # with a style, seaborn's legend already names hue and style as sub-headings
        legend_title = f"{hue}" + (f" (red: > {gpus_per_node}, across nodes)" if inter else "")
        ax.legend(fontsize=7, ncol=2, title=legend_title, title_fontsize=7)
    else:
        ax.legend(fontsize=7, ncol=2)
    return ax


def comparison_matrices(data: pd.DataFrame, *, x: str = "dst", y: str = "src", hue: str = "bytes",
                        col: str = "side", world_size: int | None = None, gpus_per_node: int = 8,
                        size: float = 3.4, **kwargs: Any) -> plt.Figure:
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
        im = ax.imshow(np.log10(m), cmap="viridis", vmin=vmin, vmax=vmax, interpolation="nearest", **kwargs)
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
                    ax: Axes | None = None, unit: float = 2**20, title: str | None = None, **kwargs: Any) -> Axes:
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
                palette=dict(zip(sides, sns.color_palette("deep", len(sides)), strict=True)), **kwargs)
    ax.set_yscale("log")
    ax.set(ylabel="MiB per iteration (log)", title=title or "bytes per parallelism")
    ax.legend(title=hue, fontsize=8)
    return ax


def breakdown_bars(data: pd.DataFrame, *, x: str = "seconds", y: str = "config", hue: str = "term",
                   ax: Axes | None = None, title: str | None = None, kind: str | None = "kind",
                   share: bool = True, **kwargs: Any) -> Axes:
    """Horizontal stacked bars of ``x`` (seconds) per ``hue`` (the named terms of an iteration,
    :meth:`llmcomm.overhead.Breakdown.to_frame`) for each ``y`` (a configuration), in the data's order.

    Every term has one colour in every figure (:data:`TERM_COLORS`, in the order of that mapping); the terms
    whose ``kind`` column is ``"comm"`` are hatched, and with ``share`` each bar ends with its exposed
    communication share. ``kwargs`` go to ``ax.barh``."""
    wide = data.pivot_table(index=y, columns=hue, values=x, aggfunc="sum", sort=False).fillna(0.0)
    kinds = (data.drop_duplicates(hue).set_index(hue)[kind] if kind and kind in data.columns
             else pd.Series({t: "comm" for t in wide.columns if str(t).endswith("_comm")}, dtype=object))
    terms = [t for t in TERM_COLORS if t in wide.columns] + [t for t in wide.columns if t not in TERM_COLORS]
    ax = axes_or_new(ax, (8.5, 0.8 + 0.42 * len(wide)))
    left = np.zeros(len(wide))
    for term in terms:
        vals = wide[term].to_numpy()
        ax.barh(range(len(wide)), vals, left=left, color=TERM_COLORS.get(term, "0.5"), label=term,
                hatch="//" if kinds.get(term) == "comm" else None, edgecolor="white", linewidth=0.3,
                **kwargs)
        left += vals
    if share:
        comm = wide[[t for t in terms if kinds.get(t) == "comm"]].sum(axis=1).to_numpy()
        for i, (tot, c) in enumerate(zip(left, comm, strict=True)):
            ax.text(tot, i, f"  {c / tot:.0%} comm", va="center", fontsize=7)
    ax.set_yticks(range(len(wide)), [str(v) for v in wide.index], fontsize=8)
    ax.set_ylim(len(wide) - 0.5, -0.5)
    ax.set(xlabel=f"{x} per iteration", title=title or "", xlim=(0, left.max() * (1.2 if share else 1.05)))
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / max(len(wide), 1)),
              frameon=False, title="term (hatched: communication)", title_fontsize=7)
    return ax


def best_config_shift(data: pd.DataFrame, *, x: str = "gpus", y: str = "tflops_per_gpu", hue: str = "cluster",
                      ax: Axes | None = None, label: str = "config", title: str | None = None,
                      ylabel: str = "predicted model TFLOP/s per GPU", **kwargs: Any) -> Axes:
    """``y`` of the best configuration against ``x`` (log2), one line per ``hue``. Each distinct ``label`` gets a
    letter (in order of appearance) written beside its points; the letters are listed with their labels on the
    right, so that long labels never cross the lines, the title or each other. ``kwargs`` go to
    ``sns.lineplot``."""
    ax = axes_or_new(ax, (10, 4.5))
    sns.lineplot(data=data, x=x, y=y, hue=hue, marker="o", ax=ax, **kwargs)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(data[x].unique()), [plain_number(v) for v in sorted(data[x].unique())])
    ax.xaxis.set_minor_formatter(NullFormatter())
    letters = {v: chr(ord("A") + i) for i, v in enumerate(pd.unique(data[label]))}
    for r in data.itertuples():
        ax.annotate(letters[getattr(r, label)], (getattr(r, x), getattr(r, y)), fontsize=8, fontweight="bold",
                    xytext=(5, 3), textcoords="offset points", color="0.15")
    key = "\n".join(f"{c}  {v}" for v, c in letters.items())
    ax.text(1.02, 0.0, key, transform=ax.transAxes, fontsize=7, family="monospace", va="bottom", ha="left")
    lo, hi = data[y].min(), data[y].max()
    ax.set_ylim(max(0.0, lo - 0.08 * (hi - lo)), hi + 0.1 * (hi - lo))
    ax.set(title=title or "", ylabel=ylabel, xlabel=f"{x.replace('_', ' ')} (log scale)")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, title_fontsize=8)
    return ax


def published_speedups(data: pd.DataFrame, *, x: str = "model", y: Sequence[str] = (
        "predicted_speedup_2021", "predicted_speedup"), hue: str = "features", ax: Axes | None = None,
        labels: Mapping[str, str] | None = None, title: str | None = None, **kwargs: Any) -> Axes:
    """Grouped bars of predicted speed-ups per ``x``, one bar per column in ``y``, with the 1× line. The legend
    (titled ``hue``) names each column by ``labels`` (default: the column name in words, ``_`` as spaces).
    ``kwargs`` go to ``sns.barplot``."""
    ax = axes_or_new(ax, (8, 4))
    names = {c: (labels or {}).get(c, c.replace("_", " ")) for c in y}
    long = data.melt(id_vars=x, value_vars=list(y), var_name=hue, value_name="speed-up")
    long[hue] = long[hue].map(names)
    sns.barplot(data=long, x=x, y="speed-up", hue=hue, hue_order=[names[c] for c in y], ax=ax, **kwargs)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.tick_params(axis="x", rotation=30, labelsize=7)
    ax.set(title=title or "", ylabel="predicted speed-up (×)", xlabel="")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), fontsize=7, title_fontsize=8)
    return ax


def call_sequence(data: pd.DataFrame, *, x: str = "step", y: str = "bytes", hue: str = "parallelism",
                  ax: Axes | None = None, phase: str | None = "phase", title: str | None = None,
                  **kwargs: Any) -> Axes:
    """One bar per call in issue order: position ``x``, height ``y`` bytes (log scale), colour by ``hue``
    (the parallelism colours of every figure); with ``phase``, backward calls are drawn lighter. Bars are one
    line collection, so a stage's hundreds of calls draw at once. ``kwargs`` go to ``ax.vlines``."""
    ax = axes_or_new(ax, (8, 3))
    xs, ys = data[x].to_numpy(), data[y].to_numpy(np.float64)
    back = (data[phase] == "backward").to_numpy() if phase is not None else np.zeros(len(data), bool)
    rgba = np.array([to_rgba(PARALLELISM_COLORS.get(v, "0.5"), 0.45 if b else 1.0)
                     for v, b in zip(data[hue], back, strict=True)]).reshape(-1, 4)
    width_pt = max(0.6, min(8.0, 0.8 * 72 * ax.figure.get_figwidth() * 0.75 / max(len(xs), 1)))  # type: ignore[union-attr]
    floor = float(ys[ys > 0].min()) / 2 if (ys > 0).any() else 0.5
    ax.vlines(xs, floor, ys, colors=rgba, linewidth=width_pt, **kwargs)  # type: ignore[arg-type]  # an (n, 4) RGBA array
    ax.set_yscale("log")
    ax.set_ylim(floor, float(ys.max()) * 1.6 if len(ys) else 1.0)
    ax.yaxis.set_major_formatter(FuncFormatter(byte_ticks))
    ax.yaxis.set_major_locator(LogLocator(base=16))  # a label every 16×: 1 KiB, 16 KiB, 256 KiB, 4 MiB, ...
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


def predicted_vs_measured(data: pd.DataFrame, *, x: str = "time_s", y: str = "predicted_s", hue: str | None = None,
                          ax: Axes | None = None, band: float = 0.1, title: str | None = None,
                          hue_order: Sequence[object] | None = None, unit: str = "s",
                          interval: tuple[str, str] | None = None, **kwargs: Any) -> Axes:
    """Log-log scatter of predicted ``y`` against measured ``x`` coloured by ``hue`` (legend in
    :func:`natural_order` unless ``hue_order``), with the line y = x and the dashed ±``band`` lines (named in the
    legend); the axes are :func:`log_axis` (plain, non-overlapping labels). ``interval``: the columns of each
    prediction's interval (e.g. ``("total_s_lo", "total_s_hi")``), drawn as vertical bars in the point's colour
    and named in the legend. ``kwargs`` go to ``ax.scatter``."""
    ax = axes_or_new(ax, (5.2, 4.6))
    groups = [(None, data)] if hue is None else \
        [(k, data[data[hue] == k]) for k in (hue_order if hue_order is not None else natural_order(data[hue]))]
    for i, (key, g) in enumerate(groups):
        pts = ax.scatter(g[x], g[y], **{"s": 14, "alpha": 0.75, **kwargs}, label=None if key is None else str(key))
        if interval is not None and len(g):
            lo_, hi_ = interval
            rgba = np.asarray(pts.get_facecolor(), dtype=float)[0]
            ax.errorbar(g[x], g[y], yerr=[g[y] - g[lo_], g[hi_] - g[y]], fmt="none", lw=0.8, alpha=0.55,
                        ecolor=(rgba[0], rgba[1], rgba[2], rgba[3]), capsize=1.5,
                        label="90% interval of the prediction" if i == 0 else None)
    cols = [x, y, *(interval or ())]
    lo = min(data[c].min() for c in cols) * 0.8
    hi = max(data[c].max() for c in cols) * 1.25
    xs = np.array([lo, hi])
    ax.plot(xs, xs, color="black", lw=1, label="predicted = measured")
    for i, f in enumerate((1 - band, 1 + band)):
        ax.plot(xs, f * xs, color="grey", lw=0.8, ls="--", label=f"±{band:.0%}" if i == 0 else None)
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel=f"measured iteration time [{unit}]",
           ylabel=f"predicted iteration time [{unit}]", title=title or "")
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.legend(title=hue, fontsize=8, title_fontsize=8, loc="upper left")
    return ax


def utilization_curves(data: pd.DataFrame, *, x: str = "hidden", y: str = "utilization", hue: str = "tp",
                       ax: Axes | None = None, limit: float | None = None, calibrated: tuple[float, float] | None = None,
                       marks: Mapping[str, float] | None = None, title: str | None = None, **kwargs: Any) -> Axes:
    """Lines of ``y`` (achieved FLOP/s of a layer pass / peak) against ``x`` (hidden size, log2 with plain labels at
    powers of two) per ``hue`` (e.g. :func:`llmcomm.overhead.extrapolate.layer_utilization`); the ``limit``
    ``1/θ_gemm`` dashed, the ``calibrated`` range of ``x`` shaded and each of ``marks`` (label -> x) a dotted
    vertical line. ``kwargs`` go to ``ax.plot``."""
    ax = axes_or_new(ax, (5.6, 4))
    for level, g in data.groupby(hue):
        g = g.sort_values(x)
        ax.plot(g[x], g[y], **{"marker": "o", "ms": 3, **kwargs}, label=f"{hue.upper()} {level}")
    if limit is not None:
        ax.axhline(limit, color="black", lw=0.8, ls="--", label=f"limit 1/θ_gemm = {limit:.2f}")
    if calibrated is not None:
        ax.axvspan(*calibrated, color="grey", alpha=0.15, label="hidden sizes of the calibration data")
    ax.set_xscale("log", base=2)
    lo, hi = data[x].min(), data[x].max()
    ticks = [2**k for k in range(int(np.floor(np.log2(lo))), int(np.ceil(np.log2(hi))) + 1)]
    ax.set_xticks(ticks, [plain_number(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    for name, pos in (marks or {}).items():
        ax.axvline(pos, color="0.3", lw=0.8, ls=":")
        ax.annotate(name, (pos, 0.02), xycoords=("data", "axes fraction"), rotation=90, ha="right", va="bottom",
                    fontsize=7, color="0.2", xytext=(-2, 0), textcoords="offset points")
    ax.set(xlabel=f"{'hidden size' if x == 'hidden' else x} (log scale)",
           ylabel="achieved FLOP/s of a layer pass / peak", ylim=(0, 1.05), title=title or "")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, 0.94))  # below the limit line
    return ax


def overhead_surface(data: pd.DataFrame, *, x: str = "utilization", y: str = "comm_overhead",
                     hue: str = "bandwidth_scale", col: str = "case", cols: Sequence[str] | None = None,
                     cluster: str | None = None, **kwargs: Any) -> plt.Figure:
    """One panel per ``col`` value (``cols``, in that order): ``y`` (exposed communication / iteration) against
    ``x`` (achieved utilization), one line per ``hue`` (bandwidth scale, labelled with the median
    ``effective_bandwidth_GBps``), for the rows of ``cluster`` (e.g. :func:`llmcomm.overhead.sweep.sweep`).
    ``kwargs`` go to ``ax.plot``."""
    cols = list(cols) if cols is not None else list(pd.unique(data[col]))
    fig, axes = plt.subplots(1, len(cols), figsize=(4.2 * len(cols), 3.6), sharey=True, squeeze=False)
    p = data[data["cluster"] == cluster] if cluster is not None else data
    for ax, case in zip(axes[0], cols, strict=True):
        g = p[p[col] == case]
        for w, gw in g.groupby(hue):
            gw = gw.sort_values(x)
            ax.plot(gw[x], gw[y], **{"marker": "o", "ms": 3, **kwargs},
                    label=f"{gw['effective_bandwidth_GBps'].median():.0f} GB/s (×{w:g})")
        ax.set(title=case, xlabel="achieved GPU utilization")
        ax.legend(title="effective bandwidth", fontsize=7, title_fontsize=7)
    axes[0][0].set_ylabel("exposed communication / iteration")
    if cluster is not None:
        fig.suptitle(f"cluster {cluster}", fontsize=9)
    fig.tight_layout()
    return fig


def overhead_by_cluster(data: pd.DataFrame, *, x: str = "case", y: str = "comm_overhead", hue: str = "cluster",
                        ax: Axes | None = None, **kwargs: Any) -> Axes:
    """Grouped bars of ``y`` (exposed communication / iteration) per ``x`` (case), one bar per ``hue`` (cluster).
    ``kwargs`` go to ``ax.bar``."""
    wide = data.pivot_table(index=x, columns=hue, values=y, sort=False)
    ax = axes_or_new(ax, (7, 3.6))
    n = len(wide.columns)
    w = 0.8 / n
    for i, c in enumerate(wide.columns):
        ax.bar(np.arange(len(wide)) + (i - (n - 1) / 2) * w, wide[c].to_numpy(), width=w, label=c, **kwargs)
    ax.set_xticks(range(len(wide)), list(wide.index))
    ax.set(ylabel="exposed communication / iteration")
    # below the axes: inside, the legend covered the tallest bars
    ax.legend(fontsize=7, title=hue, title_fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2,
              frameon=False)
    return ax
