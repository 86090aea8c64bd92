"""The ``llmcomm`` command: models listing, clear one-line errors."""

from __future__ import annotations

import subprocess
import sys

import llmcomm as lc
from llmcomm.cli import main


def test_models_lists_the_catalogue(capsys) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in lc.list_models():
        assert name in out
    assert "175" in out and "published" in out


def test_models_shows_one(capsys) -> None:
    assert main(["models", "mixtral-8x7b"]) == 0
    out = capsys.readouterr().out
    assert "num_experts" in out and "active parameters" in out and "46,70" in out


def test_unknown_model_is_one_clear_line() -> None:
    r = subprocess.run([sys.executable, "-m", "llmcomm", "models", "no-such-model"], capture_output=True, text=True)
    assert r.returncode == 1  # a configuration error (2 is for usage errors)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "no-such-model" in lines[0] and "catalogue" in lines[0]


def test_no_placeholder_subcommands() -> None:
    """Only subcommands whose module exists are offered (none pretends to work)."""
    from llmcomm.cli import SUBCOMMAND_MODULES, build_parser, module_exists

    choices = build_parser()._subparsers._group_actions[0].choices
    for mod in SUBCOMMAND_MODULES:
        name = mod.split(".")[1]
        name = {"overhead": "time"}.get(name, name)  # llmcomm.overhead.cli registers `llmcomm time`
        assert (name in choices) == module_exists(mod)
