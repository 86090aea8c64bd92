"""The explorer's panels as matplotlib figures and HTML tables, drawn from a :class:`~llmcomm.explore.view.View`
with the figure functions of :mod:`llmcomm.plots` (one figure per panel; :data:`PANELS` names them)."""

from __future__ import annotations

import html
import io

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib._tight_bbox import adjust_bbox  # the step of savefig(bbox_inches=...), kept
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox
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
from .view import LAYOUT_NODES, View

PANELS = ("layout", "matrix", "bytes", "calls", "time")
ROWS = (("layout", "bytes"), ("matrix",), ("calls", "time"))  # how the explorer arranges them on screen
PANEL_TITLES = {"layout": "Rank layout", "matrix": "Communication matrix per parallelism",
                "bytes": "Bytes per parallelism per iteration", "calls": "Call sequence of one rank",
                "time": "Iteration time"}
DPI = 80  # screen figures: small PNGs, quick to draw
CALL_ROWS = 12  # calls listed under the call-sequence figure
BBOX_PAD = 0.35  # inches kept right of a kept matrix figure's measured box (its colour-bar label may grow)


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
    return (tuple(_layout_dims(v)), len(v.group_table), int(v.group_table["node"].max()) + 1,
            v.cluster.gpus_per_node)


def _update_layout(fig: Figure, v: View) -> None:
    """Recolour and relabel the cells of a :func:`layout_figure` of the same :func:`_layout_key` for ``v``."""
    for ax, p in zip(fig.axes, _layout_dims(v), strict=True):
        _, _, colors, labels = layout_cells(v.group_table, x="rank", y="node", hue=f"{p}_group",
                                            gpus_per_node=v.cluster.gpus_per_node)
        for patch, text, color, label in zip(ax.patches, ax.texts, colors, labels, strict=True):
            patch.set_color(color)
            text.set_text(label)
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


def _matrix_title(fig: Figure, v: View) -> None:
    unit = (f"blocks of {v.unit} ranks = {v.unit // v.cluster.gpus_per_node} node(s)" if v.level == "node"
            else f"blocks of {v.unit} ranks" if v.unit > 1 else "one cell per GPU")
    fig.suptitle(f"{v.choice.label()}: bytes per iteration from sender (row) to receiver (column); {unit}; "
                 "dashed: node boundaries", fontsize=9, y=1.02)


def bytes_figure(v: View, tight: bool = True) -> Figure:
    """:func:`llmcomm.plots.volume_bars` of the bytes each parallelism moves in one iteration."""
    fig, ax = plt.subplots(figsize=(4.2, 3.4), dpi=DPI)
    volume_bars(v.volumes.assign(config=v.choice.label()), x="config", y="bytes", hue="parallelism", ax=ax,
                title="all ranks (each send counted once)")
    if tight:
        fig.tight_layout()
    return fig


def calls_figure(v: View, tight: bool = True) -> Figure:
    """:func:`llmcomm.plots.call_sequence` of the chosen rank's calls for one micro-batch."""
    fig, ax = plt.subplots(figsize=(7.5, 2.8), dpi=DPI)
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


def fast_png(fig: Figure) -> bytes:
    """The figure as it lies on its canvas (no bounding-box adjustment), drawn once and encoded by Pillow with
    light compression: what ``savefig`` gives for a figure laid out inside its canvas, at about half the cost."""
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())  # type: ignore[attr-defined]  # the Agg canvas
    buf = io.BytesIO()
    Image.fromarray(rgba).save(buf, format="png", compress_level=1)
    return buf.getvalue()


class Painter:
    """Draws the panels of one view after another, as the explorer does, without the costs that do not depend on
    the view. The matrix figure (up to a dozen images, a colour bar) is redrawn in place
    (:meth:`llmcomm.plots.MatrixImages.update`) while the matrices keep their titles, shape and world; the layout
    figure is recoloured and relabelled in place while its parallelisms and nodes stay
    (:func:`llmcomm.plots.layout_cells`). A new figure (another world, other parallelisms; the bytes and
    call-sequence panels every time) is laid out with the subplot parameters a ``tight_layout`` found for the first
    figure of its shape (:func:`llmcomm.plots.subplot_params`; a tight layout costs as much as a drawing), and a
    matrix canvas is cut to the bounding box measured for the first of its shape, padded by :data:`BBOX_PAD`
    inches. Every figure is encoded from its canvas (:func:`fast_png`); the time panel, whose legend and title lie
    outside its axes, as :func:`render` draws it."""

    def __init__(self) -> None:
        self.matrix: MatrixImages | None = None
        self.layout: tuple[tuple, Figure] | None = None
        self.pars: dict[tuple, dict[str, float]] = {}  # subplot parameters per panel shape
        self.boxes: dict[tuple, Bbox] = {}  # matrix canvases per shape
        self.reused = {"matrix": 0, "layout": 0, "pars": 0}  # what was reused (for tests and the benchmark)

    def render(self, v: View, panel: str) -> bytes:
        """One panel of ``v`` as PNG bytes."""
        if panel == "matrix" and v.matrices:
            return self._matrix(v)
        if panel == "layout":
            return self._layout(v)
        if panel in ("bytes", "calls"):
            fig = {"bytes": bytes_figure, "calls": calls_figure}[panel](v, tight=False)
            self._lay_out(fig, (panel, len(v.calls) > 0))
            try:
                return fast_png(fig)
            finally:
                plt.close(fig)
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
        if self.layout is not None and self.layout[0] == key:
            _update_layout(self.layout[1], v)
            self.reused["layout"] += 1
        else:
            if self.layout is not None:
                plt.close(self.layout[1])
            self.layout = (key, layout_figure(v))
        return fast_png(self.layout[1])

    def _matrix(self, v: View) -> bytes:
        gpn = v.cluster.gpus_per_node
        if self.matrix is not None and self.matrix.fits(v.matrices, unit=v.unit, world_size=v.world_size,
                                                        gpus_per_node=gpn):
            self.matrix.update(v.matrices)
            _matrix_title(self.matrix.fig, v)
            self.reused["matrix"] += 1
            return fast_png(self.matrix.fig)
        if self.matrix is not None:
            plt.close(self.matrix.fig)
        shape = (len(v.matrices), v.cells, v.level, v.unit > 1)  # what sets the layout: panels, tick labels
        pars = self.pars.get(("matrix", *shape))
        self.matrix = _matrix_images(v, pars)
        fig = self.matrix.fig
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # the Agg canvas
        if pars is None:
            self.pars[("matrix", *shape)] = subplot_params(fig)
        else:
            self.reused["pars"] += 1
        box = self.boxes.get(shape)
        if box is None:
            b = fig.get_tightbbox(renderer)
            box = self.boxes[shape] = Bbox.from_extents(b.x0 - 0.05, b.y0 - 0.05, b.x1 + BBOX_PAD, b.y1 + 0.05)
        # the canvas becomes the box (matplotlib's own savefig(bbox_inches=...) step, kept rather than undone
        # after one save), so that every redraw is one canvas draw
        adjust_bbox(fig, box, renderer)
        return fast_png(fig)

    def close(self) -> None:
        """Close the kept figures."""
        if self.matrix is not None:
            plt.close(self.matrix.fig)
        if self.layout is not None:
            plt.close(self.layout[1])
        self.matrix, self.layout = None, None


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
