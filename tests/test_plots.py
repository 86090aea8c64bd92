"""llmcomm.plots and llmcomm.plots_moe follow seaborn's calling convention and leaves global state (the backend) alone."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from llmcomm import plots, plots_moe

FUNCTIONS = [f for module in (plots, plots_moe) for name, f in inspect.getmembers(module, inspect.isfunction)
             if f.__module__ == module.__name__ and not name.startswith("_")
             and name not in ("apply_style", "byte_ticks", "plain_number", "log_axis", "natural_order", "node_palette",
                              "axes_or_new", "layout_cells", "subplot_params")]  # helpers, not figures
# several panels: a Figure, no ax (as sns.relplot)
FIGURE_LEVEL = {"comm_matrix_grid", "comparison_matrices", "identity_panels", "overhead_surface",
                "exact_bounded_bars"}


@pytest.mark.parametrize("func", FUNCTIONS, ids=[f.__name__ for f in FUNCTIONS])
def test_data_first_then_keyword_only_x_y_hue_ax(func) -> None:
    params = list(inspect.signature(func).parameters.values())
    assert params[0].name == "data" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:-1]), f"{func.__name__}: keyword-only"
    names = [p.name for p in params[1:]]
    expected = ["x", "y", "hue"] + ([] if func.__name__ in FIGURE_LEVEL else ["ax"])
    assert names[:len(expected)] == expected, f"{func.__name__}: {names[:4]}"
    if "ax" in expected:
        assert inspect.signature(func).parameters["ax"].default is None
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD, f"{func.__name__}: **kwargs passed on"


def test_figures_of_the_overhead_notebooks_live_in_plots() -> None:
    import importlib.util

    assert importlib.util.find_spec("llmcomm.overhead.figures") is None
    for name in ("predicted_vs_measured", "utilization_curves", "overhead_surface", "overhead_by_cluster",
                 "breakdown_bars"):
        assert callable(getattr(plots, name))


def test_import_leaves_the_backend_alone() -> None:
    env = {**os.environ, "MPLBACKEND": "svg"}
    code = "import llmcomm.plots, matplotlib; print(matplotlib.get_backend())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "svg"


def test_matrix_grid_shares_one_colour_scale() -> None:
    flows = pd.DataFrame({"src": [0, 1, 0, 8], "dst": [1, 0, 9, 0], "bytes": [10.0, 10.0, 1e6, 1e6],
                          "panel": ["small", "small", "large", "large"]})
    fig = plots.comm_matrix_grid(flows, x="dst", y="src", hue="bytes", col="panel", world_size=16, ncols=2)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2
    assert {(im.norm.vmin, im.norm.vmax) for im in images} == {(1.0, 6.0)}
    # node boundary (8 GPUs per node) drawn on the sparse panel too
    assert any(np.allclose(line.get_ydata(), 7.5) for line in fig.axes[0].lines)


def test_byte_ticks_are_the_one_byte_formatter() -> None:
    from llmcomm.units import format_bytes

    assert [plots.byte_ticks(v) for v in (512, 2**10, 32 * 2**20, 2**30, 1.5 * 2**30)] == [
        "512 B", "1 KiB", "32 MiB", "1 GiB", "1.5 GiB"]
    assert plots.byte_ticks(3 * 2**40) == format_bytes(3 * 2**40, compact=True, sep=" ") == "3 TiB"
    assert format_bytes(1.25 * 2**40, decimals=1) == "1.2 TiB"


def test_node_palette_separates_the_node_boundary() -> None:
    pal = plots.node_palette([2, 4, 8, 16, 32], gpus_per_node=8)
    r, g, b = pal["8"]
    r16, g16, b16 = pal["16"]
    assert b > r and r16 > b16  # 8 GPUs blue (one node), 16 red (two nodes)


# ----------------------------------------------------------------------------- readability (issue 23 item 17)
def _overlaps(labels) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty tick labels whose drawn boxes intersect."""
    boxes = [(t.get_text(), t.get_window_extent()) for t in labels if t.get_visible() and t.get_text()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


@pytest.mark.parametrize("lo,hi", [(3.0, 80.0), (0.05, 2.0), (8.0, 12.0), (1e-3, 1e3)])
def test_log_axes_tick_labels_do_not_overlap(lo, hi) -> None:
    """notebook 07's validation figure printed "3×10⁰4×10⁰6×10⁰" under its x axis (minor labels of a short log
    axis); predicted_vs_measured's axes label plain numbers that never collide."""
    import matplotlib.pyplot as plt

    t = np.geomspace(lo, hi, 60)
    data = pd.DataFrame({"time_s": t, "predicted_s": t * 1.05, "model": ["3.6B", "18.4B", "175B"] * 20})
    ax = plots.predicted_vs_measured(data, x="time_s", y="predicted_s", hue="model")
    ax.figure.canvas.draw()
    for axis in (ax.xaxis, ax.yaxis):
        labels = axis.get_ticklabels(minor=False) + axis.get_ticklabels(minor=True)
        assert not _overlaps(labels), _overlaps(labels)
        shown = [t.get_text() for t in labels if t.get_text()]
        assert len(shown) >= 2 and not any("times" in s or "×" in s for s in shown), shown
    plt.close("all")


def test_scatter_legend_in_natural_order_and_names_the_band() -> None:
    data = pd.DataFrame({"time_s": [1.0, 2, 3, 4], "predicted_s": [1.0, 2, 3, 4],
                         "model": ["175B", "18.4B", "3.6B", "39.1B"]})
    ax = plots.predicted_vs_measured(data, x="time_s", y="predicted_s", hue="model", band=0.1)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts == ["3.6B", "18.4B", "39.1B", "175B", "predicted = measured", "±10%"]
    assert plots.natural_order(["b", "a"]) == ["b", "a"]


def test_matrix_floor_hides_scalar_calls_and_says_so() -> None:
    """A 4-byte all-reduce over 32 ranks must not paint solid blocks over 4.3 GB PP pairs."""
    pp = pd.DataFrame({"src": np.arange(31), "dst": np.arange(1, 32), "bytes": 4.3e9})
    src, dst = np.meshgrid(np.arange(32), np.arange(32))
    scalar = pd.DataFrame({"src": src.ravel(), "dst": dst.ravel(), "bytes": 0.25})
    flows = pd.concat([pp, scalar[scalar["src"] != scalar["dst"]]]).assign(panel="PP-only")
    fig = plots.comm_matrix_grid(flows, col="panel", world_size=32)
    img = fig.axes[0].images[0].get_array()
    assert int(np.isfinite(img).sum()) == 31  # only the PP pairs are drawn
    assert "× the largest (≤ 0.25 B)" in fig.axes[-1].get_ylabel()
    full = plots.comm_matrix_grid(flows, col="panel", world_size=32, floor=None)
    assert int(np.isfinite(full.axes[0].images[0].get_array()).sum()) == 32 * 31
    ax = plots.comm_matrix(pp, world_size=32)  # nothing below the floor: no note
    assert "largest" not in ax.figure.axes[-1].get_ylabel()


def test_published_speedup_legend_names_no_raw_column() -> None:
    pub = pd.DataFrame({"model": ["a", "b"], "predicted_speedup_2021": [1.2, 1.0], "predicted_speedup": [1.4, 1.5]})
    ax = plots.published_speedups(pub, labels={"predicted_speedup_2021": "2021's features"})
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts == ["2021's features", "predicted speedup"]
    assert not set(texts) & set(pub.columns)


def test_breakdown_terms_keep_their_colour_across_figures() -> None:
    """breakdown_per_case (07) and breakdown_vs_rule_of_thumb (08) used two palettes for the same terms."""
    def frame(terms):
        return pd.DataFrame([{"config": c, "term": t, "seconds": 1.0, "kind": "comm" if t.endswith("_comm") else
                              "compute"} for c in ("a", "b") for t in terms])

    colours = []
    for terms in (["forward", "backward", "tp_comm", "bubble"], ["backward", "dp_comm", "tp_comm", "optimizer"]):
        ax = plots.breakdown_bars(frame(terms), x="seconds", y="config", hue="term")
        colours.append({c.get_label(): c.patches[0].get_facecolor() for c in ax.containers})
    for term in set(colours[0]) & set(colours[1]):
        assert colours[0][term] == colours[1][term], term
    assert colours[0]["tp_comm"][:3] == pytest.approx(tuple(int(plots.TERM_COLORS["tp_comm"][i:i + 2], 16) / 255
                                                             for i in (1, 3, 5)))


def test_panel_titles_inside_the_figure() -> None:
    """four_all_to_alls.png clipped its panel titles."""
    from llmcomm import plots_moe

    cells = pd.DataFrame([{"panel": p, "src": s, "dst": d, "value": 1000.0 * (s + d)}
                          for p in ("forward: dispatch (call 0)", "backward: combine's grad (call 2)")
                          for s in range(4) for d in range(4)])
    fig = plots_moe.identity_panels(cells, title="iteration 1, micro-batch 0")
    fig.canvas.draw()
    box = fig.bbox
    for ax in fig.axes[:2]:
        tb = ax.title.get_window_extent()
        assert box.x0 <= tb.x0 and tb.x1 <= box.x1 and tb.y1 <= box.y1
    others = [a.title.get_window_extent() for a in fig.axes[:2]]
    assert not others[0].overlaps(others[1])


def test_envelope_bars_start_at_zero() -> None:
    from llmcomm import plots_moe

    env = pd.DataFrame({"src": [0, 0], "dst": [0, 1], "min_bytes": [0.0, 2048.0], "expected_bytes": [1024.0, 4096.0],
                        "max_bytes": [4096.0, 8192.0], "source": "s", "uniform_bytes": 4096.0,
                        "hard_max_bytes": 16384.0})
    ax = plots_moe.envelope_ranges(env)
    assert ax.get_ylim()[0] == 0.0


def test_zero_bars_are_labelled() -> None:
    from llmcomm import plots_moe

    data = pd.DataFrame({"metric": ["m", "m"], "value": [0.0, 1.0], "trace": ["dense", "moe"]})
    ax = plots_moe.metric_bars(data, fmt="{:.0%}")
    assert [t.get_text() for t in ax.texts] == ["0%", "100%"]
