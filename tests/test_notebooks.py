"""Notebooks: every one has a jupytext source that matches its .ipynb, runs end to end through papermill in
the quick profile from any working directory, and its checks pass; the quick profile never writes into the
committed figures."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import jupytext
import pytest
import yaml

from llmcomm.errors import ConfigError
from llmcomm.reproduce import (
    FIGURES,
    NOTEBOOKS,
    NotebookFailed,
    Outputs,
    default_out_dir,
    notebook_parameters,
    notebook_paths,
    reproduce,
)

NAMES = [p.stem for p in notebook_paths()]
SOURCES = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
HEADER = """# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---
"""


def _cells(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", ()))) for c in nb.cells]


def _parameters(source: Path) -> dict[str, object]:
    """Names assigned in the notebook's ``parameters`` cell (its defaults), with their literal values."""
    nb = jupytext.read(source)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", ())]
    assert len(cells) == 1, f"{source.name}: expected one cell tagged 'parameters', found {len(cells)}"
    tree = ast.parse(cells[0].source)
    return {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Name)}


def test_there_are_notebooks() -> None:
    assert "00_models_and_layouts" in NAMES


def test_every_notebook_has_a_source_and_every_source_a_notebook() -> None:
    ipynb = {p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")}
    py = {p.stem for p in SOURCES}
    assert ipynb - py == set(), f"notebooks without a jupytext .py source: {sorted(ipynb - py)}"
    assert py - ipynb == set(), f"sources without a paired .ipynb (run jupytext --to ipynb --update): {sorted(py - ipynb)}"


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_source_and_notebook_do_not_drift(source: Path) -> None:
    assert source.read_text(encoding="utf-8").startswith(HEADER), f"{source.name}: header is not the convention's"
    nb_py = jupytext.read(source)
    ipynb = source.with_suffix(".ipynb")
    nb_ipynb = jupytext.read(ipynb)
    assert _cells(nb_py) == _cells(nb_ipynb), (
        f"{ipynb.name} differs from {source.name}: run `jupytext --to ipynb --update {source}`")
    assert nb_ipynb.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent"


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_notebook_committed_without_outputs(source: Path) -> None:
    raw = json.loads(source.with_suffix(".ipynb").read_text(encoding="utf-8"))
    code = [c for c in raw["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_defaults_in_the_parameters_cell_and_quick_overrides_exist(source: Path) -> None:
    defaults = _parameters(source)
    assert "out_dir" in defaults and defaults["out_dir"] is None, "out_dir defaults to None (figures/)"
    assert notebook_parameters(source.stem, "full") == {}, "the full profile runs the notebook's own defaults"
    unknown = set(notebook_parameters(source.stem, "quick")) - set(defaults)
    assert not unknown, f"params.yaml overrides {sorted(unknown)}, which {source.name} does not define"


def test_params_yaml_names_only_existing_notebooks() -> None:
    doc = yaml.safe_load((NOTEBOOKS / "params.yaml").read_text(encoding="utf-8"))
    assert set(doc) <= set(NAMES), f"params.yaml sections without a notebook: {sorted(set(doc) - set(NAMES))}"


def test_parameters_profiles(tmp_path) -> None:
    f = tmp_path / "params.yaml"
    f.write_text("nb: {quick: {b: 3}}\n")
    assert notebook_parameters("nb", "full", f) == {}
    assert notebook_parameters("nb", "quick", f) == {"b": 3}
    assert notebook_parameters("other", "quick", f) == {}
    f.write_text("nb: {b: 2, quick: {b: 3}}\n")
    with pytest.raises(ConfigError, match=r"params.yaml: nb: keys \['b'\] are not a profile"):
        notebook_parameters("nb", "quick", f)
    with pytest.raises(ConfigError, match="profile='fast'"):
        notebook_parameters("nb", "fast", f)


def test_quick_profile_never_writes_the_committed_figures(tmp_path, monkeypatch) -> None:
    assert default_out_dir("full") == FIGURES
    quick = default_out_dir("quick").resolve()
    assert FIGURES.resolve() not in (quick, *quick.parents)
    monkeypatch.chdir(tmp_path)  # a notebook's default output folder does not depend on the working directory
    assert Outputs("00_models_and_layouts").figure_dir == FIGURES / "00_models_and_layouts"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_quick_from_another_directory(name, tmp_path, monkeypatch) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the kernel runs here: paths must resolve through the package, not `..`
    reproduce("quick", only=[name], out_dir=tmp_path / "figures", build_dir=tmp_path / "build", progress=False)
    res = json.loads((tmp_path / "figures" / "results" / f"{name}.json").read_text())
    assert res["checks"], f"{name} records no numeric check"
    assert all(c["passed"] for c in res["checks"].values())
    assert list((tmp_path / "figures" / name).glob("*.png")), f"{name} wrote no figure"
    assert list(elsewhere.iterdir()) == [], f"{name} wrote into the working directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build", "elsewhere", "figures"]


def test_failing_notebook_is_named(tmp_path, monkeypatch) -> None:
    import nbformat

    import llmcomm.reproduce as r

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell("out_dir = None")
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p, nbformat.v4.new_code_cell("raise ValueError('the finding did not hold')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, nbdir / "99_broken.ipynb")
    (nbdir / "params.yaml").write_text("99_broken:\n  quick: {}\n")
    monkeypatch.setattr(r, "NOTEBOOKS", nbdir)
    with pytest.raises(NotebookFailed, match="99_broken.ipynb.*ValueError: the finding did not hold"):
        reproduce("quick", out_dir=tmp_path / "f", build_dir=tmp_path / "b", progress=False)


def test_no_matching_notebook_creates_nothing(tmp_path) -> None:
    from llmcomm.errors import LLMCommError

    with pytest.raises(LLMCommError, match="no notebook matches"):
        reproduce("quick", only=["99"], out_dir=tmp_path / "f", build_dir=tmp_path / "b", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_passes_the_output_folder(tmp_path, monkeypatch) -> None:
    import llmcomm.reproduce as r
    from llmcomm.cli import main

    seen = {}
    monkeypatch.setattr(r, "reproduce", lambda **kw: seen.update(kw) or [])
    assert main(["reproduce", "--profile", "quick", "--only", "00", "--out-dir", str(tmp_path)]) == 0
    assert seen["out_dir"] == tmp_path and seen["profile"] == "quick" and seen["only"] == ["00"]
