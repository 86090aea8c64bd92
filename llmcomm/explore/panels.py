"""The explorer's panels as matplotlib figures and HTML tables, drawn from a :class:`~llmcomm.explore.view.View`
with the figure functions of :mod:`llmcomm.plots` (one figure per panel; :data:`PANELS` names them)."""

from __future__ import annotations

import html
import io
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import Locator, MaxNLocator
from PIL import Image

from ..overhead import interval
from ..plots import (
    MatrixImages,
    breakdown_bars,
    call_sequence,
    layout_cells,
    layout_grid,
    subplot_params,
    volume_bars,
)
from ..units import format_bytes
from .canvas import TextCache, attach
from .view import LAYOUT_NODES, View

PANELS = ("layout", "matrix", "bytes", "calls", "time")
ROWS = (("layout", "bytes"), ("matrix",), ("calls", "time"))  # how the explorer arranges them on screen
PANEL_TITLES = {"layout": "Rank layout", "matrix": "Communication matrix per parallelism",
                "bytes": "Bytes per parallelism per iteration", "calls": "Call sequence of one rank",
                "time": "Iteration time"}
DPI = 80  # screen figures: small PNGs, quick to draw
CALL_ROWS = 12  # calls listed under the call-sequence figure


def layout_figure(v: View) -> Figure:
    """One :func:`llmcomm.plots.layout_grid` per parallelism of size > 1: GPUs as cells, one row per node."""
    dims = _layout_dims(v)
    nodes = int(v.group_table["node"].max()) + 1
    gpn = v.cluster.gpus_per_node
    fig, axes = plt.subplots(1, len(dims), figsize=(0.42 * gpn * len(dims) + 0.8, 0.5 * nodes + 1.3),
                             squeeze=False, dpi=DPI)
    for ax, p in zip(axes[0], dims, strict=True):
        layout_grid(v.group_table, x="rank", y="node", hue=f"{p}_group", ax=ax, gpus_per_node=gpn,
                    title=_layout_title(v, p))
    _layout_suptitle(fig, v)
    fig.tight_layout()
    return fig


def _layout_dims(v: View) -> list[str]:
    return [p for p in ("tp", "cp", "ep", "dp", "pp") if v.layout.size(p) > 1] or ["tp"]


def _layout_title(v: View, p: str) -> str:
    return f"{p.upper()} groups (size {v.layout.size(p)})"


def _layout_suptitle(fig: Figure, v: View) -> None:
    shown = "" if v.num_nodes <= LAYOUT_NODES else f"; first {LAYOUT_NODES} of {v.num_nodes:,} nodes"
    fig.suptitle(f"{v.choice.label()} on {v.world_size:,} GPUs, {v.cluster.gpus_per_node} per node, order "
                 f"{v.parallel.order}{shown}   (cell: r = global rank, g = group id)", fontsize=9)


def _layout_key(v: View) -> tuple:
    """What a kept layout figure must share with ``v`` to be redrawn for it by :func:`_update_layout`: as many
    panels (their titles, colours and labels are set again), cells, nodes and GPUs per node."""
    return (len(_layout_dims(v)), len(v.group_table), int(v.group_table["node"].max()) + 1,
            v.cluster.gpus_per_node)


def _update_layout(fig: Figure, v: View) -> None:
    """Recolour and relabel the cells of a :func:`layout_figure` of the same :func:`_layout_key` for ``v``."""
    for ax, p in zip(fig.axes, _layout_dims(v), strict=True):
        _, _, colors, labels = layout_cells(v.group_table, x="rank", y="node", hue=f"{p}_group",
                                            gpus_per_node=v.cluster.gpus_per_node)
        first = ax is fig.axes[0]
        for patch, text, color, label in zip(ax.patches, ax.texts, colors, labels, strict=True):
            patch.set_color(color)
            text.set_text(label if first else _group_line(label))
        ax.set_title(_layout_title(v, p))
    _layout_suptitle(fig, v)


def matrix_figure(v: View) -> Figure:
    """:class:`llmcomm.plots.MatrixImages`: per parallelism the logical (direct) and the ring matrix, on one
    colour scale; above :data:`~llmcomm.explore.view.GPU_LEVEL_MAX` GPUs in blocks of whole nodes."""
    if not v.matrices:
        fig, ax = plt.subplots(figsize=(4, 1.5), dpi=DPI)
        ax.axis("off")
        ax.text(0.5, 0.5, "no communication: one GPU", ha="center", va="center")
        return fig
    return _matrix_images(v).fig


def _matrix_images(v: View, subplotpars: dict[str, float] | None = None) -> MatrixImages:
    m = MatrixImages(v.matrices, unit=v.unit, world_size=v.world_size, gpus_per_node=v.cluster.gpus_per_node,
                     ncols=4, size=2.9, subplotpars=subplotpars)
    m.fig.set_dpi(DPI)
    _matrix_title(m.fig, v)
    return m


def _cell_unit(v: View) -> str:
    """What one cell of the matrix panel stands for (the title of both the saved and the screen figure)."""
    if v.level == "node":
        return f"blocks of {v.unit} ranks = {v.unit // v.cluster.gpus_per_node} node(s)"
    return f"blocks of {v.unit} ranks" if v.unit > 1 else "one cell per GPU"


def _matrix_title(fig: Figure, v: View) -> None:
    unit = _cell_unit(v)
    fig.suptitle(f"{v.choice.label()}: bytes per iteration from sender (row) to receiver (column); {unit}; "
                 "dashed: node boundaries", fontsize=9, y=1.02)


def bytes_figure(v: View, tight: bool = True, ax: Axes | None = None) -> Figure:
    """:func:`llmcomm.plots.volume_bars` of the bytes each parallelism moves in one iteration (on ``ax``, emptied
    by :func:`clear_axes`, to redraw a kept figure)."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(5.0, 3.4), dpi=DPI)
    fig = ax.figure  # type: ignore[assignment]  # a top-level figure
    volume_bars(v.volumes.assign(config=v.choice.label()), x="config", y="bytes", hue="parallelism", ax=ax,
                title="all ranks (each send counted once)")
    if tight:
        fig.tight_layout()
    return fig


def calls_figure(v: View, tight: bool = True, ax: Axes | None = None) -> Figure:
    """:func:`llmcomm.plots.call_sequence` of the chosen rank's calls for one micro-batch (on ``ax`` as in
    :func:`bytes_figure`)."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(7.5, 2.8), dpi=DPI)
    fig = ax.figure  # type: ignore[assignment]  # a top-level figure
    call_sequence(v.calls, x="step", y="bytes", hue="parallelism", ax=ax, phase="phase",
                  title=f"rank {v.choice.rank} (stage {v.layout.pp_stage(v.choice.rank)}), micro-batch "
                        f"{v.choice.microbatch} of {v.parallel.num_microbatches}: {len(v.calls)} calls")
    if tight:
        fig.tight_layout()
    return fig


def time_figure(v: View) -> Figure:
    """:func:`llmcomm.plots.breakdown_bars` of the :class:`~llmcomm.overhead.iteration.Breakdown` (on axes it
    sizes itself)."""
    if v.breakdown is None:
        fig, ax = plt.subplots(figsize=(7.0, 1.6), dpi=DPI)
        ax.axis("off")
        ax.text(0.5, 0.5, f"iteration time not available:\n{v.time_error}", ha="center", va="center",
                wrap=True, fontsize=9)
        return fig
    b = v.breakdown
    ax = breakdown_bars(b.to_frame().assign(config=v.choice.label()), x="seconds", y="config", hue="term",
                        title=f"{b.total_s:.3f} s per iteration on {v.cluster.name}, exposed communication "
                              f"{100 * b.comm_overhead:.1f}%\n{_interval_text(b.total_s)}")
    fig = ax.figure  # type: ignore[assignment]  # the Axes of breakdown_bars sits on a Figure
    fig.set_dpi(DPI)
    return fig


FIGURES = {"layout": layout_figure, "matrix": matrix_figure, "bytes": bytes_figure, "calls": calls_figure,
           "time": time_figure}


TIGHT = {"matrix", "time"}  # panels with labels outside their axes (colour bar, wide title): a tight box


def png(fig: Figure, tight: bool = False) -> bytes:
    """The figure as PNG bytes (then closed). Figures laid out by ``tight_layout`` are saved as they are: a
    ``"tight"`` bounding box (``tight=True``) draws a figure twice."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight" if tight else None)
    plt.close(fig)
    return buf.getvalue()


def render(v: View, panel: str) -> bytes:
    """One panel of ``v`` as PNG bytes (a new figure)."""
    return png(FIGURES[panel](v), tight=panel in TIGHT)


def fast_png(fig: Figure, text: TextCache | None = None) -> bytes:
    """The figure as it lies on its canvas (no bounding-box adjustment), drawn once and encoded by Pillow with
    light compression: what ``savefig`` gives for a figure laid out inside its canvas, at about half the cost.
    With ``text``, drawn on a :class:`~llmcomm.explore.canvas.CachedTextCanvas` sharing that cache (the same
    pixels; texts drawn before at the same place are not rasterized again)."""
    if text is not None:
        attach(fig, text)
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())  # type: ignore[attr-defined]  # the Agg canvas
    buf = io.BytesIO()
    Image.fromarray(rgba).save(buf, format="png", compress_level=1)
    return buf.getvalue()


# -- screen figures: laid out in inches once, redrawn in place ---------------------------------------------------
MATRIX_SIDE = 2.4  # inches per matrix panel (square)
MATRIX_MARGINS = {"left": 0.62, "right": 1.05, "bottom": 0.55, "top": 0.78, "wgap": 0.22, "hgap": 0.5}  # inches
MATRIX_TICKS = 4  # at most this many tick intervals per matrix axis
LAYOUT_MARGINS = {"left": 0.62, "right": 0.15, "bottom": 0.5, "top": 0.72, "wgap": 0.22}  # inches


def _fractions(width: float, height: float, left: float, right: float, bottom: float, top: float
               ) -> dict[str, float]:
    """Subplot edges as fractions of a ``width`` × ``height`` inch figure from margins in inches."""
    return {"left": left / width, "right": 1 - right / width, "bottom": bottom / height, "top": 1 - top / height}


def _screen_matrix(v: View) -> MatrixImages:
    """:class:`llmcomm.plots.MatrixImages` laid out for the screen without measuring anything: square panels of
    :data:`MATRIX_SIDE` inches and margins of :data:`MATRIX_MARGINS` (room for 3-digit tick labels, two-line
    panel titles, the colour bar and its label), tick labels and axis labels only on the outer panels (every
    panel spans the same cells), at most :data:`MATRIX_TICKS` ticks per axis, the title inside the canvas."""
    n = len(v.matrices)
    cols = min(4, n)
    rows = -(-n // cols)
    mm = MATRIX_MARGINS
    width = mm["left"] + cols * MATRIX_SIDE + (cols - 1) * mm["wgap"] + mm["right"]
    height = mm["bottom"] + rows * MATRIX_SIDE + (rows - 1) * mm["hgap"] + mm["top"]
    pars = {**_fractions(width, height, mm["left"], mm["right"], mm["bottom"], mm["top"]),
            "wspace": mm["wgap"] / MATRIX_SIDE, "hspace": mm["hgap"] / MATRIX_SIDE}
    m = MatrixImages(v.matrices, unit=v.unit, world_size=v.world_size, gpus_per_node=v.cluster.gpus_per_node,
                     ncols=4, size=2.9, subplotpars=pars, node_lines="collection")
    m.fig.set_size_inches(width, height)
    m.fig.set_dpi(DPI)
    cbar = m.colorbar.ax if m.colorbar is not None else None
    for ax in m.fig.axes:
        if ax is cbar or not ax.get_visible():
            continue
        ax.xaxis.set_major_locator(_InViewLocator(MATRIX_TICKS, integer=True))
        ax.yaxis.set_major_locator(_InViewLocator(MATRIX_TICKS, integer=True))
        ax.label_outer()
        _fixed_title(ax, fontsize=8)
    _screen_matrix_title(m.fig, v)
    return m


class _InViewLocator(MaxNLocator):
    """:class:`MaxNLocator`'s ticks on a linear axis without those outside the view, which an axis makes (a tick
    costs more to make than to draw: lines, labels, markers) but never draws: it draws a tick within 1e-10 of the
    view's span of its edges (``Axis._update_ticks``, ``transforms._interval_contains_close``); the ticks kept
    are those within 1e-6 of it, so the ticks drawn are the same. When fewer than two would be left, all are
    kept: ``ScalarFormatter`` then pads the ticks with the view's ends to choose its number format."""

    def __call__(self) -> Any:
        locs = np.asarray(super().__call__())
        lo, hi = sorted(self.axis.get_view_interval()) if self.axis is not None else (-np.inf, np.inf)
        tol = 1e-6 * (hi - lo)
        inside = locs[(locs >= lo - tol) & (locs <= hi + tol)]
        return inside if len(inside) >= 2 else locs


class _InViewMinor(Locator):
    """The minor ticks of ``inner`` (the locator an axis's scale set: ``LogLocator(10, 'auto')`` on the
    call-sequence panel's log axis, ``LogScale.set_default_locators_and_formatters``) without those outside the
    view, which the axis would make but never draw: it draws a tick whose place, in the scale's transformed
    coordinates, lies within 1e-10 of the view's span of its edges (``Axis._update_ticks``,
    ``transforms._interval_contains_close``); the ticks kept are those within 1e-6 of it, so the ticks drawn
    are the same, in the same order. Their labels are the same: a log formatter labels a tick from its place
    and the view alone (``LogFormatter.set_locs`` ignores the other ticks). A log axis spanning a few decades
    has three times as many minor ticks made as drawn (each made costs about half a millisecond)."""

    def __init__(self, inner: Locator) -> None:
        self.inner = inner

    def set_axis(self, axis: Any) -> None:
        super().set_axis(axis)
        self.inner.set_axis(axis)

    def __call__(self) -> Any:
        locs = np.asarray(self.inner())
        axis: Any = self.axis  # an Axis once set_axis ran (the locator is only ever set on one)
        if axis is None or not len(locs):
            return locs
        transform = axis.get_transform()
        lo, hi = sorted(transform.transform(axis.get_view_interval()))
        tol = 1e-6 * (hi - lo)
        with np.errstate(invalid="ignore", divide="ignore"):
            t = transform.transform(locs)
        return locs[(t >= lo - tol) & (t <= hi + tol)]

    def tick_values(self, vmin: float, vmax: float) -> Any:
        return self.inner.tick_values(vmin, vmax)


def _fixed_title(ax: Axes, **kw: Any) -> None:
    """Keep ``ax``'s title at ``y = 1``, where matplotlib's automatic placement (``Axes._update_title_position``)
    puts it on axes whose ticks are at the bottom and whose y axis shows no offset text (the matrix, layout and
    call-sequence panels), without that placement's measuring of every tick label at each drawing; titles set
    later keep the place (``set_title`` without ``y``)."""
    ax.set_title(ax.get_title(), y=1.0, **kw)


def _screen_matrix_title(fig: Figure, v: View) -> None:
    unit = _cell_unit(v)
    fig.suptitle(f"{v.choice.label()}: bytes per iteration from sender (row) to receiver (column)\n{unit}; "
                 "dashed: node boundaries", fontsize=9, y=1 - 0.06 / fig.get_figheight(), va="top")


def _screen_layout(v: View) -> Figure:
    """:func:`llmcomm.plots.layout_grid` per parallelism (as :func:`layout_figure`) with margins in inches
    (:data:`LAYOUT_MARGINS`) instead of a tight layout, node names and ranks only in the first
    panel (the other panels show the same cells)."""
    dims = _layout_dims(v)
    nodes = int(v.group_table["node"].max()) + 1
    gpn = v.cluster.gpus_per_node
    lm = LAYOUT_MARGINS
    side = 0.42 * gpn
    width = max(lm["left"] + len(dims) * side + (len(dims) - 1) * lm["wgap"] + lm["right"], 6.4)
    height = lm["bottom"] + 0.5 * nodes + lm["top"]
    fig, axes = plt.subplots(1, len(dims), figsize=(width, height), squeeze=False, dpi=DPI, sharey=True)
    right = width - lm["left"] - len(dims) * side - (len(dims) - 1) * lm["wgap"]
    fig.subplots_adjust(**_fractions(width, height, lm["left"], right, lm["bottom"], lm["top"]),
                        wspace=lm["wgap"] / side)
    for ax, p in zip(axes[0], dims, strict=True):
        layout_grid(v.group_table, x="rank", y="node", hue=f"{p}_group", ax=ax, gpus_per_node=gpn,
                    title=_layout_title(v, p))
        _fixed_title(ax)
        if ax is not axes[0][0]:  # the same cells as the first panel: its node names and ranks hold here too
            ax.tick_params(labelleft=False)
            for t in ax.texts:
                t.set_text(_group_line(t.get_text()))
    _screen_layout_title(fig, v)
    return fig


def _group_line(label: str) -> str:
    """The group line of a :func:`llmcomm.plots.layout_cells` label (``"r5\\ng1"`` -> ``"g1"``)."""
    return label.rsplit("\n", 1)[-1]


def _screen_layout_title(fig: Figure, v: View) -> None:
    shown = "" if v.num_nodes <= LAYOUT_NODES else f"; first {LAYOUT_NODES} of {v.num_nodes:,} nodes"
    fig.suptitle(f"{v.choice.label()} on {v.world_size:,} GPUs, {v.cluster.gpus_per_node} per node, order "
                 f"{v.parallel.order}{shown}\n(cell: r = global rank, in the first panel; g = group id)", fontsize=9,
                 y=1 - 0.05 / fig.get_figheight(), va="top")


TIME_SIZE = (10.0, 2.9)  # inches: a two-line title, one bar, the legend of up to three rows below


def _screen_time(v: View, ax: Axes | None = None, text: TextCache | None = None) -> Figure:
    """:func:`llmcomm.plots.breakdown_bars` on axes placed in inches: the bar's label measured (one text), the
    two-line title above, the legend below (on ``ax`` as in :func:`bytes_figure`; a new figure on a canvas
    sharing ``text``, so that the label measured here is measured once)."""
    if ax is None:
        fig, ax = plt.subplots(figsize=TIME_SIZE, dpi=DPI)
        if text is not None:
            attach(fig, text)
    fig = ax.figure  # type: ignore[assignment]  # a top-level figure
    for t in list(fig.texts):
        t.remove()
    b = v.breakdown
    assert b is not None
    breakdown_bars(b.to_frame().assign(config=v.choice.label()), x="seconds", y="config", hue="term", ax=ax,
                   title=f"{b.total_s:.3f} s per iteration on {v.cluster.name}, exposed communication "
                         f"{100 * b.comm_overhead:.1f}%\n{_interval_text(b.total_s)}")
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # the Agg canvas
    label = max((t.get_window_extent(renderer).width for t in ax.get_yticklabels()), default=0.0) / DPI
    w, h = TIME_SIZE
    fig.subplots_adjust(**_fractions(w, h, label + 0.2, 0.3, 1.45, 0.5))
    fig.text(0.1 / w, 1 - 0.06 / h, ax.get_title(), ha="left", va="top", fontsize=8)  # from the left edge:
    ax.set_title("")  # the interval's long line fits the canvas whatever the bar's label
    return fig


def clear_axes(ax: Axes) -> None:
    """Remove what a figure function drew on ``ax`` (bars, lines, collections, texts, the legend) but keep the
    axes and their ticks, so that the function can draw a new view on them: a new figure's axes and ticks cost
    more than drawing them (each tick is built, then copied for the next)."""
    for c in list(ax.containers):
        c.remove()
    for a in [*ax.patches, *ax.collections, *ax.lines, *ax.texts, *ax.images]:
        a.remove()
    legend = ax.get_legend()
    if legend is not None:
        legend.remove()


class Painter:
    """Draws the panels of one view after another, as the explorer does, at a small fixed cost per panel. No
    figure is measured (``tight_layout``, a tight bounding box: each costs as much as a drawing): the screen
    figures are laid out in inches (:func:`_screen_matrix`, :func:`_screen_layout`, :func:`_screen_time`), the
    bytes and call-sequence figures with the subplot parameters a ``tight_layout`` found for the first figure of
    their kind (:func:`llmcomm.plots.subplot_params`). A matrix figure (up to a dozen images, a colour bar) is
    kept per number of panels and redrawn in place (:meth:`llmcomm.plots.MatrixImages.update`, or
    :meth:`~llmcomm.plots.MatrixImages.reshape` for other titles, cells or world); a layout figure is kept per
    number of panels and cells and recoloured and relabelled in place (:func:`llmcomm.plots.layout_cells`); at
    most :data:`KEPT` of each. The time panel without a breakdown (only its reason) is drawn once per reason.
    Every figure is drawn on a canvas that keeps the glyph images of its texts (:class:`~.canvas.TextCache`) and
    encoded from it (:func:`fast_png`): the same pixels as a new figure's, which the tests check."""

    def __init__(self) -> None:
        self.matrix: MatrixImages | None = None  # the matrix figure drawn last
        self.layout: tuple[tuple, Figure] | None = None  # the layout figure drawn last, with its _layout_key
        self.matrices: dict[int, MatrixImages] = {}  # kept matrix figures per number of panels
        self.layouts: dict[tuple, Figure] = {}  # kept layout figures per _layout_key
        self.pars: dict[tuple, dict[str, float]] = {}  # subplot parameters per panel shape
        self.kept: dict[tuple, Figure] = {}  # the bytes, call-sequence and time figures, redrawn on their axes
        self.notime: dict[str, bytes] = {}  # the time panel's PNG per reason the time is not available
        self.reused = {"matrix": 0, "layout": 0, "pars": 0, "axes": 0}  # what was reused (tests, the benchmark)
        self.text = TextCache()  # glyph images of the texts drawn, shared by the panels' canvases

    def render(self, v: View, panel: str) -> bytes:
        """One panel of ``v`` as PNG bytes."""
        if panel == "matrix" and v.matrices:
            return self._matrix(v)
        if panel == "layout":
            return self._layout(v)
        if panel in ("bytes", "calls") or (panel == "time" and v.breakdown is not None):
            key = (panel, len(v.calls) > 0) if panel == "calls" else (panel,)
            kept = self.kept.get(key)
            draw = {"bytes": bytes_figure, "calls": calls_figure, "time": None}[panel]
            if kept is not None:
                clear_axes(kept.axes[0])
                self.reused["axes"] += 1
            if panel == "time":
                fig = _screen_time(v, None if kept is None else kept.axes[0], self.text)
            else:
                assert draw is not None
                fig = draw(v, tight=False, ax=None if kept is None else kept.axes[0])
                if panel == "calls":  # the log scale's minor locator, set again by each drawing
                    yaxis = fig.axes[0].yaxis
                    yaxis.set_minor_locator(_InViewMinor(yaxis.get_minor_locator()))
                if kept is None and panel == "calls":  # byte ticks on a log axis: no offset text
                    _fixed_title(fig.axes[0])
                if kept is None:  # texts measured by the first tight_layout are kept for its drawing
                    attach(fig, self.text)
                if kept is not None and panel == "bytes":  # the only one whose limits come from its data
                    fig.axes[0].relim()
                    fig.axes[0].autoscale_view()
                self._lay_out(fig, key)
            self.kept[key] = fig
            return fast_png(fig, self.text)
        if panel == "time":  # no breakdown: the figure is the reason alone, drawn once per reason
            if v.time_error not in self.notime:
                _bounded(self.notime, KEPT)
                # saved as render() saves it, on a canvas sharing the text cache (the reason is wrapped:
                # many lengths of its words measured, in both passes of the tight bounding box)
                self.notime[v.time_error] = png(attach(time_figure(v), self.text), tight=True)
            return self.notime[v.time_error]
        return render(v, panel)

    def _lay_out(self, fig: Figure, key: tuple) -> None:
        pars = self.pars.get(key)
        if pars is None:
            fig.tight_layout()
            self.pars[key] = subplot_params(fig)
        else:
            fig.subplots_adjust(**pars)
            self.reused["pars"] += 1

    def _layout(self, v: View) -> bytes:
        key = _layout_key(v)
        fig = self.layouts.pop(key, None)
        if fig is not None:
            _update_layout(fig, v)
            _screen_layout_title(fig, v)
            self.reused["layout"] += 1
        else:
            for old in _bounded(self.layouts, KEPT):
                plt.close(old)
            fig = _screen_layout(v)
        self.layouts[key] = fig  # the most recent last
        self.layout = (key, fig)
        return fast_png(fig, self.text)

    def _matrix(self, v: View) -> bytes:
        gpn = v.cluster.gpus_per_node
        m = self.matrices.pop(len(v.matrices), None)
        if m is not None and m.fits(v.matrices, unit=v.unit, world_size=v.world_size, gpus_per_node=gpn):
            m.update(v.matrices)
            _screen_matrix_title(m.fig, v)
            self.reused["matrix"] += 1
        elif m is not None:  # as many panels: other titles, size or world
            m.reshape(v.matrices, unit=v.unit, world_size=v.world_size, gpus_per_node=gpn)
            _screen_matrix_title(m.fig, v)
            self.reused["matrix"] += 1
        else:
            for old in _bounded(self.matrices, KEPT):
                plt.close(old.fig)
            m = _screen_matrix(v)
        self.matrices[len(v.matrices)] = m  # the most recent last
        self.matrix = m
        return fast_png(m.fig, self.text)

    def close(self) -> None:
        """Close the kept figures."""
        for m in self.matrices.values():
            plt.close(m.fig)
        for fig in [*self.layouts.values(), *self.kept.values()]:
            plt.close(fig)
        self.matrix, self.layout, self.matrices, self.layouts, self.kept = None, None, {}, {}, {}


KEPT = 16  # figures (or PNGs) of each kind a Painter keeps: one per shape met recently (a layout figure: 0.5 MB)


def _bounded(kept: dict, size: int) -> list:
    """Drop the oldest entries of ``kept`` (insertion order) so that one more fits in ``size``; returns them."""
    out = []
    while len(kept) >= size:
        out.append(kept.pop(next(iter(kept))))
    return out


def _table(df: pd.DataFrame, css: str) -> str:
    return df.to_html(index=False, border=0, classes=css, escape=True)


def summary_html(v: View, panel: str) -> str:
    """The numbers beside a panel's figure, as an HTML fragment."""
    if panel == "layout":
        s = v.group_summary.assign(first_group=v.group_summary["first_group"].map(
            lambda g: ", ".join(map(str, g))))
        crosses = [r.parallelism.upper() for r in v.group_summary.itertuples() if r.nodes_per_group > 1]
        note = (f"<p>{', '.join(crosses)} groups cross a node boundary.</p>" if crosses
                else "<p>No group crosses a node boundary.</p>")
        return note + (_table(s, "llmcomm-table") if len(s) else "<p>one GPU: no groups</p>")
    if panel == "bytes":
        t = v.volumes.assign(bytes=v.volumes["bytes"].map(format_bytes),
                             share=(100 * v.volumes["share"]).map(lambda x: f"{x:.2f}%"))
        return _table(t[["parallelism", "bytes", "calls", "share"]], "llmcomm-table")
    if panel == "calls":
        head = v.calls.head(CALL_ROWS).assign(bytes=v.calls["bytes"].head(CALL_ROWS).map(format_bytes))
        more = f"<p>… and {len(v.calls) - CALL_ROWS} more calls</p>" if len(v.calls) > CALL_ROWS else ""
        return _table(head, "llmcomm-table") + more
    if panel == "time":
        if v.breakdown is None:
            return f"<p class='llmcomm-time-error'>{html.escape(v.time_error)}</p>"
        f = v.breakdown.to_frame()
        f = f.assign(seconds=f["seconds"].map(lambda x: f"{x:.4f}"), share=(100 * f["share"]).map(
            lambda x: f"{x:.1f}%"))
        return (f"<p>critical stage: {html.escape(v.breakdown.critical_stage)}; total "
                f"{v.breakdown.total_s:.4f} s; {html.escape(_interval_text(v.breakdown.total_s))}</p>"
                + _table(f, "llmcomm-table"))
    return ""


def _interval_text(total_s: float) -> str:
    """The cost model's 90 % interval (:func:`llmcomm.overhead.interval.apply`) as a phrase."""
    iv = interval.apply(np.array([total_s]))
    if iv is None:
        return "(a point estimate: no interval file shipped)"
    return (f"90% interval {float(iv[0][0]):.3f}–{float(iv[1][0]):.3f} s (single-node calibration residuals; "
            "multi-node coverage is lower, see notebook 07)")
