"""Validation target: the predictor reproduces every curated recorded trace.

For each ``data/traces/*.parquet`` (recorded by ``llmcomm.collect`` with torch's own parallel APIs), the
prediction for the trace's own model and parallel config with ``framework="torch"`` gives exactly the
recorded bytes per (src, dst, parallelism) once the ``setup`` calls are set aside; MoE traces are predicted
from their recorded routing counts, iteration by iteration, so their all-to-all matrices match exactly too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from llmcomm import ModelSpec, ParallelConfig, read_trace
from llmcomm.predict import predict_traffic

TRACE_DIR = Path(__file__).resolve().parent.parent / "data" / "traces"
TRACES = sorted(p for p in TRACE_DIR.glob("*.parquet") if not p.name.endswith(".routing.parquet"))
PHASES = ["forward", "backward", "optimizer"]


def test_there_are_recorded_traces():
    assert TRACES, f"no recorded traces in {TRACE_DIR}: the validation below has nothing to check"


def pair_bytes(flows: pd.DataFrame) -> pd.Series:
    s = flows.groupby(["parallelism", "src", "dst"], observed=True)["bytes"].sum()
    return s[s > 0].sort_index()


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_prediction_equals_recording(path: Path):
    rec = read_trace(path)
    spec = rec.meta["model"] if isinstance(rec.meta["model"], dict) else rec.meta["model_spec"]
    model = ModelSpec.from_dict(spec)
    parallel = ParallelConfig.from_dict(rec.meta["parallel"])
    work = rec.select(phase=PHASES)
    assert len(work), f"{path.name}: no non-setup calls"
    for it in sorted(int(i) for i in pd.unique(work.events["iteration"])):
        got = work.select(iteration=it)
        routing = None
        if model.is_moe:
            assert rec.routing is not None, f"{path.name}: MoE trace without routing counts"
            routing = rec.routing[rec.routing["iteration"] == it].reset_index(drop=True)
        pred = predict_traffic(model, parallel, framework="torch", routing=routing, aggregate=False)
        want, have = pair_bytes(pred.flows("direct")), pair_bytes(got.flows("direct"))
        diff = pd.concat({"predicted": want, "recorded": have}, axis=1).fillna(0)
        bad = diff[~np.isclose(diff["predicted"], diff["recorded"], rtol=1e-12, atol=0)]
        assert bad.empty, f"{path.name} iteration {it}: {len(bad)} (parallelism, src, dst) differ:\n{bad.head(20)}"
        # stronger than the bytes: every rank issues the same calls in the same order
        key = ["microbatch", "parallelism", "op", "bytes"]
        for rank in range(parallel.world_size):
            a = got.events.loc[got.events["rank"] == rank, key].to_numpy().tolist()
            b = pred.events.loc[pred.events["rank"] == rank, key].to_numpy().tolist()
            assert a == b, f"{path.name} iteration {it} rank {rank}: call sequence differs"
        if model.is_moe:
            for phase in ("forward", "backward"):
                a = pred.matrix("direct", world_size=parallel.world_size, op="all_to_all", phase=phase)
                b = got.matrix("direct", world_size=parallel.world_size, op="all_to_all", phase=phase)
                assert abs(a - b).max() == 0, f"{path.name} iteration {it}: {phase} all-to-all matrix differs"
