"""Every number in the README's findings comes from the results the notebooks wrote (issue 23 item 18).

``tests/readme_numbers.yaml`` ties README phrases to named keys of ``figures/results/*.json``: each entry is a
phrase with ``{name}`` placeholders, and each name a reference ``"NN > key > key | op | format"`` (the notebook's
number, a path of keys into its results file, optional operations, a Python format spec). The test renders every
phrase from the JSON and requires it verbatim in README.md, so a number that drifts from its result fails. A
second test scans the checked sections (the findings table and "The figures") for numbers that no phrase
covers and that are not listed under ``inputs`` (numbers a notebook is given, not one it finds) or
``unrecorded`` (results the notebooks print but do not yet write: the known gap, listed), so a new number cannot
enter the prose untied.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SPEC = yaml.safe_load((ROOT / "tests" / "readme_numbers.yaml").read_text(encoding="utf-8"))
README = (ROOT / "README.md").read_text(encoding="utf-8")
# (start, ends): the section runs to the first of its end markers found. Notebook 11's section (network) is not
# tied yet: its numbers come from another branch's notebook and are left to it.
SECTIONS = [("## What reproduces which finding", ("## The figures",)), ("## The figures", ("### 11 ", "## Data"))]
# a number standing alone: not part of a name (GPT-3, tp8, 175B, 8x7B, file names) and not glued to a letter
NUMBER = re.compile(r"(?<![\w.\-/·⁻^'])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w]|\.\d|,\d)")
OPS = {"min": lambda v: min(_values(v)), "max": lambda v: max(_values(v)), "neg": lambda v: -v, "abs": abs}


def _op(name: str):
    """``min``, ``max``, ``neg``, ``abs``, or ``*N`` / ``/N`` (a unit change: ``*1000`` s to ms, ``/1024`` B to KiB)."""
    if name[:1] in "*/":
        k = float(name[1:])
        return (lambda v: v * k) if name[0] == "*" else (lambda v: v / k)
    return OPS[name]


def _values(v):
    return list(v.values()) if isinstance(v, dict) else list(v)


def _results(notebook: str) -> dict:
    (path,) = (ROOT / "figures" / "results").glob(f"{notebook}_*.json")
    return json.loads(path.read_text(encoding="utf-8"))


def resolve(ref: str) -> str:
    """The text of ``"NN > key > ... | op | ... | format"`` from the results JSON."""
    path, *ops = [p.strip() for p in ref.split("|")]
    fmt = ops.pop() if ops and ops[-1] not in OPS and ops[-1][:1] not in "*/" else ""
    notebook, *keys = [k.strip() for k in path.split(">")]
    v = _results(notebook)
    for k in keys:
        v = v[int(k)] if isinstance(v, list) else v[k]
    for op in ops:
        v = _op(op)(v)
    return format(v, fmt)


def rendered(entry: dict) -> str:
    names = {k: resolve(r) for k, r in entry.items() if k != "phrase"}
    return entry["phrase"].format(**names)


def checked_text() -> str:
    parts = []
    for start, ends in SECTIONS:
        i = README.index(start)
        stop = min(j for j in (README.find(e, i + len(start)) for e in ends) if j >= 0)
        block = README[i:stop]
        parts.append("\n".join(line for line in block.splitlines()  # headings and notebook 11's table rows out
                                if not line.startswith("#") and "11_what_the_network_sees" not in line))
    return "\n".join(parts)


@pytest.mark.parametrize("entry", SPEC["phrases"], ids=[e["phrase"][:40] for e in SPEC["phrases"]])
def test_readme_phrase_matches_its_result(entry: dict) -> None:
    text = rendered(entry)
    flat = " ".join(README.split())
    assert text in flat, f"README.md should say {text!r} (from {entry}); the results JSON and the prose disagree"


def test_inputs_and_unrecorded_occur_in_the_readme() -> None:
    flat = " ".join(README.split())
    missing = [p for p in SPEC["inputs"] + SPEC["unrecorded"] if p not in flat]
    assert not missing, f"tests/readme_numbers.yaml lists phrases the README no longer says: {missing}"


def test_every_number_in_the_findings_is_tied_to_a_result() -> None:
    text = " ".join(checked_text().split())
    covered = [rendered(e) for e in SPEC["phrases"]] + list(SPEC["inputs"]) + list(SPEC["unrecorded"])
    for phrase in sorted(covered, key=len, reverse=True):
        text = text.replace(phrase, " ")
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", text)  # image links
    text = re.sub(r"`[^`]*`", " ", text)  # code: names, not findings
    loose = [m.group(0) for m in NUMBER.finditer(text)]
    context = {n: text[max(0, m.start() - 40):m.end() + 20] for m in NUMBER.finditer(text) for n in [m.group(0)]}
    assert not loose, ("README numbers tied to no results key (add a phrase with its key to "
                       f"tests/readme_numbers.yaml, or list a given parameter under inputs): "
                       f"{[context[n] for n in dict.fromkeys(loose)]}")


def test_a_drifted_number_fails() -> None:
    entry = next(e for e in SPEC["phrases"] if "multi_mape" in " ".join(e.values()))
    good = rendered(entry)
    assert good in " ".join(README.split())
    drifted = {**entry, **{k: v.replace("multi_mape", "multi_worst_ape") for k, v in entry.items() if k != "phrase"}}
    assert rendered(drifted) not in " ".join(README.split())
