"""What Outputs writes does not depend on the last bits of the numbers (issue 23 item 16): a figure or a results
file computed on another machine, whose floats differ at ~1e-13 relative, gives the same bytes."""

from __future__ import annotations

import io
import json

import matplotlib.pyplot as plt
import numpy as np
import pytest

from llmcomm.reproduce import Outputs
from llmcomm.stable_bytes import figure_bytes, json_bytes, pdf_decimals, rounded


def _scatter_figure(scale: float):
    rng = np.random.default_rng(0)
    x, y = rng.lognormal(size=(2, 2000))
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.scatter(x * scale, y * scale, s=5)  # markers: placed with pdfRepr floats
    ax.plot(np.sort(x) * scale, np.sort(y) * scale)  # a path: written by _path.convert_to_string
    ax.set(xscale="log", yscale="log", xlim=(0.01, 100), ylim=(0.01, 100))
    return fig


def test_pdf_identical_when_data_differ_in_the_last_bits() -> None:
    a, b = _scatter_figure(1.0), _scatter_figure(1.0 + 3e-13)
    # full precision: the drift shows (this is what a fresh clone saw in single_node_fit.pdf)
    raw_a, raw_b = io.BytesIO(), io.BytesIO()
    a.savefig(raw_a, format="pdf", metadata={"CreationDate": None})
    b.savefig(raw_b, format="pdf", metadata={"CreationDate": None})
    assert raw_a.getvalue() != raw_b.getvalue()
    assert figure_bytes(a, "pdf") == figure_bytes(b, "pdf")
    assert figure_bytes(a, "png") == figure_bytes(b, "png")
    plt.close("all")


def test_pdf_carries_no_date_or_version_and_backend_is_restored() -> None:
    from matplotlib.backends import backend_pdf as bp

    before = (bp.pdfRepr, bp._path)
    data = figure_bytes(_scatter_figure(1.0), "pdf")
    assert (bp.pdfRepr, bp._path) == before
    assert b"CreationDate" not in data and b"Producer" not in data
    with pytest.raises(ZeroDivisionError), pdf_decimals():
        raise ZeroDivisionError
    assert (bp.pdfRepr, bp._path) == before
    plt.close("all")


def test_rounding_rule() -> None:
    assert rounded(0.06128680665019641) == rounded(0.06128680665019407) == 0.0612868
    assert rounded(4294967296.0) == 4294967296.0  # whole numbers (bytes, counts) exact
    assert rounded(float("inf")) == float("inf") and np.isnan(rounded(float("nan")))
    doc = {"a": np.float64(1.413647502500912), "b": [np.float32(0.5), 3, True], "c": {1: np.int64(7)}}
    assert json.loads(json_bytes(doc)) == {"a": 1.41365, "b": [0.5, 3, True], "c": {"1": 7}}


def test_outputs_writes_rounded_results(tmp_path) -> None:
    runs = []
    for eps in (0.0, 4e-13):
        out = Outputs("nb", out_dir=tmp_path / f"run{eps}")
        out.value("mape", 0.4108252753620116 * (1 + eps))
        out.check("bound", True, value=[1.4136475025009132 * (1 + eps)], expect="-")
        runs.append(out.save().read_bytes())
    assert runs[0] == runs[1]
    assert json.loads(runs[0])["values"]["mape"] == 0.410825
