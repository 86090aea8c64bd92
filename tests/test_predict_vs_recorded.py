"""Validation target: the predictor reproduces every curated recorded trace.

For each ``data/traces/*.parquet`` (recorded by ``llmcomm.collect`` with torch's own parallel APIs), the
prediction for the trace's own model and parallel config with ``framework="torch"`` gives exactly the
recorded calls: ``llmcomm.compare`` aligns them call by call on every rank, for every recorded iteration, with
the ``setup`` calls set aside; MoE traces are predicted from their recorded routing counts, iteration by
iteration, so their all-to-all matrices match exactly too.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from llmcomm import read_trace
from llmcomm.compare import compare

TRACE_DIR = Path(__file__).resolve().parent.parent / "data" / "traces"
TRACES = sorted(p for p in TRACE_DIR.glob("*.parquet") if not p.name.endswith(".routing.parquet"))


def test_there_are_recorded_traces():
    assert TRACES, f"no recorded traces in {TRACE_DIR}: the validation below has nothing to check"


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_prediction_equals_recording(path: Path):
    rec = read_trace(path)
    work = rec.events[rec.events["phase"] != "setup"]
    assert len(work), f"{path.name}: no non-setup calls"
    for it in sorted(int(i) for i in pd.unique(work["iteration"])):
        c = compare(rec, framework="torch", iteration=it)
        assert c.exact, f"{path.name} iteration {it}: calls on one side only:\n" + "\n".join(c.one_sided["what"])
        assert set(c.verdicts["verdict"]) == {"exact"}
        # stronger than the multiset: every rank issues the same calls in the same order
        assert c.ordered_ranks == len(c.ranks) == c.measured.world_size, f"{path.name} iteration {it}: order"
        assert (c.pairs["diff"] == 0).all(), f"{path.name} iteration {it}: per-pair bytes differ"
        if c.predicted.events["op"].eq("all_to_all").any():
            n = c.measured.world_size
            for phase in ("forward", "backward"):
                a = c.predicted.matrix("direct", world_size=n, op="all_to_all", phase=phase)
                b = c.measured.matrix("direct", world_size=n, op="all_to_all", phase=phase)
                assert abs(a - b).max() == 0, f"{path.name} iteration {it}: {phase} all-to-all matrix differs"
