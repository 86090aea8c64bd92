"""Public names a user can find: lazy submodules after ``import llmcomm``, no function standing in for its own
module, keyword-only options, the trace's own metadata decoders, one report builder."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
import types

import pytest

import llmcomm as lc
from llmcomm.errors import ConfigError


def test_submodules_load_on_first_use() -> None:
    code = ("import sys, llmcomm; assert 'llmcomm.overhead' not in sys.modules; "
            "print(llmcomm.overhead.iteration_time.__name__, llmcomm.analysis.TraceAnalysis.__name__, "
            "llmcomm.predict.predict_traffic.__name__, llmcomm.analysis.volumes.tp_share.__name__, "
            "type(llmcomm.tune).__name__, type(llmcomm.compare).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["iteration_time", "TraceAnalysis", "predict_traffic", "tp_share", "module", "module"]
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        lc.nonesuch  # noqa: B018


def _shadowed(package: types.ModuleType) -> list[str]:
    """Submodules of ``package`` (recursively) whose name on their parent is not the module."""
    bad = []
    for info in pkgutil.iter_modules(package.__path__):
        full = f"{package.__name__}.{info.name}"
        if info.name == "__main__" or full.startswith("llmcomm.collect."):  # collect's modules import torch
            continue
        sub = importlib.import_module(full)
        if getattr(package, info.name) is not sub:
            bad.append(full)
        if info.ispkg:
            bad += _shadowed(sub)
    return bad


def test_no_function_shadows_its_module() -> None:
    assert _shadowed(lc) == []
    from llmcomm.overhead import memory

    assert isinstance(memory, types.ModuleType) and lc.overhead.memory_per_gpu is memory.memory
    import llmcomm.tune as tune_module

    assert isinstance(tune_module, types.ModuleType) and callable(tune_module.tune)


def test_predict_traffic_options_are_keyword_only() -> None:
    params = inspect.signature(lc.predict_traffic).parameters
    assert [p for p, v in params.items() if v.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD] == ["model", "parallel"]
    with pytest.raises(TypeError):
        lc.predict_traffic("tiny-gpt", lc.ParallelConfig(tp=2), None)  # type: ignore[misc]


def test_trace_decodes_its_own_metadata() -> None:
    par = lc.ParallelConfig(tp=2, pp=2, global_batch=4)
    t = lc.predict_traffic("tiny-gpt", par)
    assert t.model_spec() == lc.load_model("tiny-gpt") and t.parallel_config() == par
    recorded = lc.open_trace("moe_ep2tp2")  # a curated recorded run: meta['model_spec'] from its manifest
    assert recorded.model_spec().num_experts > 1 and recorded.parallel_config().ep == 2
    bare = lc.Trace(t.events, {})
    with pytest.raises(ConfigError, match="names no model"):
        bare.model_spec()
    with pytest.raises(ConfigError, match="no 'parallel'"):
        bare.parallel_config()
    with pytest.raises(ConfigError, match=r"meta\['parallel'\]"):
        lc.Trace(t.events, {"parallel": {"tp": 0}}).parallel_config()


def test_reports_come_from_one_builder() -> None:
    from llmcomm.compare import compare, load_measured, report

    c = compare(load_measured("gpt_tp2pp2dp2"), framework="torch")
    md, html = c.to_markdown(), c.to_html()
    for s in report.sections(c):
        assert f"## {s.title}" in md and f"<h2>{s.title}</h2>" in html
    assert "<th>diff</th>" in html  # the per-pair differences, which the HTML report once lacked
