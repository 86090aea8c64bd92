"""The H200 kernel benchmark refuses to run without CUDA (it never measures the CPU) and writes nothing."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("bench_h200_kernels", ROOT / "benchmarks" / "bench_h200_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_without_cuda_it_fails_clearly(tmp_path, monkeypatch, capsys):
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake)
    out = tmp_path / "k.csv"
    assert _load().main(["--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not out.exists()


def test_budget_is_bounded(tmp_path, capsys):
    assert _load().main(["--out", str(tmp_path / "k.csv"), "--budget-s", "900"]) == 2
    assert "8 minutes" in capsys.readouterr().err


def test_shapes_are_the_llm_layers():
    b = _load()
    assert (16384, 2 * 53248 // 8, 16384) in b.GEMM_SHAPES  # Llama-3 405B gated FFN up-projection at TP 8
    assert (4096, 4096, 4096) in b.GEMM_SHAPES and len(b.GEMM_SHAPES) < 250
    assert {"gpu", "gpu_sm", "driver", "cuda", "torch", "date_utc"} <= set(b.COLUMNS)
