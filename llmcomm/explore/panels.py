"""The explorer's panels as matplotlib figures and HTML tables, drawn from a :class:`~llmcomm.explore.view.View`
with the figure functions of :mod:`llmcomm.plots` (one figure per panel; :data:`PANELS` names them)."""

from __future__ import annotations

import html
import io

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..overhead import interval
from ..plots import breakdown_bars, call_sequence, comm_matrix_images, layout_grid, volume_bars
from ..units import format_bytes
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
    dims = [p for p in ("tp", "cp", "ep", "dp", "pp") if v.layout.size(p) > 1] or ["tp"]
    nodes = int(v.group_table["node"].max()) + 1
    gpn = v.cluster.gpus_per_node
    fig, axes = plt.subplots(1, len(dims), figsize=(0.42 * gpn * len(dims) + 0.8, 0.5 * nodes + 1.3),
                             squeeze=False, dpi=DPI)
    for ax, p in zip(axes[0], dims, strict=True):
        layout_grid(v.group_table, x="rank", y="node", hue=f"{p}_group", ax=ax, gpus_per_node=gpn,
                    title=f"{p.upper()} groups (size {v.layout.size(p)})")
    shown = "" if v.num_nodes <= LAYOUT_NODES else f"; first {LAYOUT_NODES} of {v.num_nodes:,} nodes"
    fig.suptitle(f"{v.choice.label()} on {v.world_size:,} GPUs, {gpn} per node, order {v.parallel.order}"
                 f"{shown}   (cell: r = global rank, g = group id)", fontsize=9)
    fig.tight_layout()
    return fig


def matrix_figure(v: View) -> Figure:
    """:func:`llmcomm.plots.comm_matrix_images`: per parallelism the logical (direct) and the ring matrix, on one
    colour scale; above :data:`~llmcomm.explore.view.GPU_LEVEL_MAX` GPUs in blocks of whole nodes."""
    if not v.matrices:
        fig, ax = plt.subplots(figsize=(4, 1.5), dpi=DPI)
        ax.axis("off")
        ax.text(0.5, 0.5, "no communication: one GPU", ha="center", va="center")
        return fig
    fig = comm_matrix_images(v.matrices, unit=v.unit, world_size=v.world_size, gpus_per_node=v.cluster.gpus_per_node,
                             ncols=4, size=2.9)
    fig.set_dpi(DPI)
    unit = (f"blocks of {v.unit} ranks = {v.unit // v.cluster.gpus_per_node} node(s)" if v.level == "node"
            else f"blocks of {v.unit} ranks" if v.unit > 1 else "one cell per GPU")
    fig.suptitle(f"{v.choice.label()}: bytes per iteration from sender (row) to receiver (column); {unit}; "
                 "dashed: node boundaries", fontsize=9, y=1.02)
    return fig


def bytes_figure(v: View) -> Figure:
    """:func:`llmcomm.plots.volume_bars` of the bytes each parallelism moves in one iteration."""
    fig, ax = plt.subplots(figsize=(4.2, 3.4), dpi=DPI)
    volume_bars(v.volumes.assign(config=v.choice.label()), x="config", y="bytes", hue="parallelism", ax=ax,
                title="all ranks (each send counted once)")
    fig.tight_layout()
    return fig


def calls_figure(v: View) -> Figure:
    """:func:`llmcomm.plots.call_sequence` of the chosen rank's calls for one micro-batch."""
    fig, ax = plt.subplots(figsize=(7.5, 2.8), dpi=DPI)
    call_sequence(v.calls, x="step", y="bytes", hue="parallelism", ax=ax, phase="phase",
                  title=f"rank {v.choice.rank} (stage {v.layout.pp_stage(v.choice.rank)}), micro-batch "
                        f"{v.choice.microbatch} of {v.parallel.num_microbatches}: {len(v.calls)} calls")
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
    """One panel of ``v`` as PNG bytes."""
    return png(FIGURES[panel](v), tight=panel in TIGHT)


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
