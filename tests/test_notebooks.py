"""Every notebook runs end to end through papermill in the quick profile and its checks pass."""

from __future__ import annotations

import json

import pytest

from llmcomm.reproduce import NotebookFailed, notebook_parameters, notebook_paths, reproduce

NOTEBOOKS = [p.stem for p in notebook_paths()]


def test_there_are_notebooks() -> None:
    assert "00_models_and_layouts" in NOTEBOOKS


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_quick(name, tmp_path) -> None:
    reproduce("quick", only=[name], out_dir=tmp_path / "figures", build_dir=tmp_path / "build", progress=False)
    res = json.loads((tmp_path / "figures" / "results" / f"{name}.json").read_text())
    assert res["checks"], f"{name} records no numeric check"
    assert all(c["passed"] for c in res["checks"].values())
    assert list((tmp_path / "figures" / name).glob("*.png")), f"{name} wrote no figure"


def test_failing_notebook_is_named(tmp_path, monkeypatch) -> None:
    import nbformat

    import llmcomm.reproduce as r

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell('out_dir = "."')
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p, nbformat.v4.new_code_cell("raise ValueError('the finding did not hold')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, nbdir / "99_broken.ipynb")
    (nbdir / "params.yaml").write_text("99_broken:\n  quick: {}\n")
    monkeypatch.setattr(r, "NOTEBOOKS", nbdir)
    with pytest.raises(NotebookFailed, match="99_broken.ipynb.*ValueError: the finding did not hold"):
        reproduce("quick", out_dir=tmp_path / "f", build_dir=tmp_path / "b", progress=False)


def test_parameters_profiles(tmp_path) -> None:
    f = tmp_path / "params.yaml"
    f.write_text("defaults: {a: 1}\nnb: {b: 2, quick: {b: 3}}\n")
    assert notebook_parameters("nb", "full", f) == {"a": 1, "b": 2}
    assert notebook_parameters("nb", "quick", f) == {"a": 1, "b": 3}
