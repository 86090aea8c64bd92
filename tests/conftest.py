"""Shared fixtures. ``external(name)`` gives a verified copy of a third-party file through the data
manifest (llmcomm.data); a missing file fails the test loudly, it never skips. ``TINY`` and ``TINY_MOE`` are
the small models the predictor and matrix tests share (fixtures ``tiny``, ``tiny_moe``; a module that needs
them at import time, for a hypothesis strategy or a parametrization, imports them from here and derives its
variants with ``dataclasses.replace``). Every test's matplotlib figures are closed after it."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("MPLBACKEND", "Agg")  # llmcomm.plots leaves the backend to its caller

if "LLMCOMM_EXTERNAL" not in os.environ and (ROOT.parent / "shared" / "external").is_dir():
    os.environ["LLMCOMM_EXTERNAL"] = str(ROOT.parent / "shared" / "external")

from llmcomm.specs import ModelSpec  # noqa: E402 - after the environment above

# a dense GPT: 4 layers, h = 64, 4 heads, FFN 256, vocabulary 1000, sequence 32, tied embeddings
TINY = ModelSpec(name="tiny", num_layers=4, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                 vocab_size=1000, seq_length=32, tied_embeddings=True)
# an MoE GPT: every second layer has 4 experts (top-2, FFN 64) and one shared expert
TINY_MOE = ModelSpec(name="tiny-moe", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                     vocab_size=1000, seq_length=32, num_experts=4, moe_router_topk=2, moe_layer_freq=2,
                     num_shared_experts=1, moe_ffn_hidden_size=64)


@pytest.fixture
def tiny() -> ModelSpec:
    return TINY


@pytest.fixture
def tiny_moe() -> ModelSpec:
    return TINY_MOE


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    """Close every figure a test left open (only when the test imported pyplot)."""
    yield
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close("all")


@pytest.fixture(scope="session")
def external() -> Callable[[str], Path]:
    from llmcomm import data

    return data.path


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT
