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
             and name not in ("apply_style", "binary_bytes", "node_palette", "axes_or_new")]
# several panels: a Figure, no ax (as sns.relplot)
FIGURE_LEVEL = {"comm_matrix_grid", "comparison_matrices", "identity_panels"}


@pytest.mark.parametrize("func", FUNCTIONS, ids=[f.__name__ for f in FUNCTIONS])
def test_data_first_then_keyword_only_x_y_hue_ax(func) -> None:
    params = list(inspect.signature(func).parameters.values())
    assert params[0].name == "data" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:]), f"{func.__name__}: keyword-only"
    names = [p.name for p in params[1:]]
    expected = ["x", "y", "hue"] + ([] if func.__name__ in FIGURE_LEVEL else ["ax"])
    assert names[:len(expected)] == expected, f"{func.__name__}: {names[:4]}"
    if "ax" in expected:
        assert inspect.signature(func).parameters["ax"].default is None


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


def test_binary_byte_ticks() -> None:
    assert [plots.binary_bytes(v) for v in (512, 2**10, 32 * 2**20, 2**30, 1.5 * 2**30)] == [
        "512 B", "1 KiB", "32 MiB", "1 GiB", "1.5 GiB"]


def test_node_palette_separates_the_node_boundary() -> None:
    pal = plots.node_palette([2, 4, 8, 16, 32], gpus_per_node=8)
    r, g, b = pal["8"]
    r16, g16, b16 = pal["16"]
    assert b > r and r16 > b16  # 8 GPUs blue (one node), 16 red (two nodes)
