"""The combined 1F1B pair's exposed all-to-all (llmcomm.overhead.overlap.a2a_pair_exposed) is the schedule with
``delay_wgrad_compute``, checked against a two-stream replay of Megatron-LM's issue order and event rule; and the
NeMo rows' ``delay_wgrad_compute`` (set with ``moe_a2a_overlap`` by the perf scripts) read as that schedule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from llmcomm.overhead import nemo_rows
from llmcomm.overhead.overlap import a2a_pair_exposed


def _replay(A: float, M: float, D: float, C: float, delay: bool) -> float:
    """Seconds of one paired layer step, ``TransformerLayerSchedulePlan.run`` (model_chunk_schedule_plan.py:189-251 at
    23dd639c) in issue order: a node starts when its stream is free and, unless it is the MLP's delayed weight
    gradient, when the last node of its micro-batch issued before it has finished (ScheduleNode's event); forward f,
    backward b (2x the forward; the MLP's split into data and weight gradient under ``delay``)."""
    nodes = [("comm", "b", C, True), ("comp", "f", A, True),
             ("comp", "b", M if delay else 2 * M, True), ("comm", "f", D, True)]
    if delay:
        nodes.append(("comp", "b", M, False))  # backward_dw: its stream only, no event
    nodes += [("comm", "b", D, True), ("comp", "f", M, True), ("comm", "f", C, True), ("comp", "b", 2 * A, True)]
    free = {"comp": 0.0, "comm": 0.0}
    event = {"f": 0.0, "b": 0.0}
    end = 0.0
    for stream, mb, dur, evented in nodes:
        start = max(free[stream], event[mb] if evented else 0.0)
        free[stream] = start + dur
        if evented:
            event[mb] = start + dur
        end = max(end, start + dur)
    return end


@pytest.mark.parametrize("A,M,D,C", list(itertools.product((0.5, 1.0, 2.0), (0.7, 1.3), (0.2, 1.0, 1.6, 3.0),
                                                         (0.3, 1.5, 4.0))))
def test_pair_exposed_is_the_delayed_wgrad_schedule(A, M, D, C):
    want = _replay(A, M, D, C, delay=True) - 3 * (A + M)
    got = float(a2a_pair_exposed(np.array(D), np.array(C), np.array(A), np.array(M)))
    assert got == pytest.approx(want, abs=1e-12)
    # without delay_wgrad_compute dispatch_bwd waits for the MLP's whole backward (the docstring's variant)
    undelayed = max(0, C - A) + max(D, 2 * M) + max(D, M) - 3 * M + max(0, C - 2 * A)
    assert _replay(A, M, D, C, delay=False) - 3 * (A + M) == pytest.approx(undelayed, abs=1e-12)


def test_the_two_schedules_differ_where_dispatch_outlasts_the_mlp():
    # A = 1, M = 1, D = 1.5, C = 0.5: delayed 0 exposed in the middle, undelayed 1.5 + ... : max(1.5, 2) + 1.5 - 3 = 0.5
    assert _replay(1, 1, 1.5, 0.5, True) - 6 == pytest.approx(0.0)
    assert _replay(1, 1, 1.5, 0.5, False) - 6 == pytest.approx(0.5)


def test_nemo_rows_read_delay_wgrad_compute_as_the_timed_schedule():
    rows = nemo_rows.read()
    row = rows[(rows["container"] == "26.02") & (rows["model"] == "Qwen3_235B_a22B")].iloc[0]
    rec = nemo_rows.recipes()[(str(row["container"]), str(row["model"]), int(row["source_line"]))]
    assert rec["settings"]["delay_wgrad_compute"]["value"] is True
    assert "_set_moe_a2a_overlap_overrides" in rec["settings"]["delay_wgrad_compute"]["cite"]
    st = nemo_rows.settings(row)
    assert st.columns["moe_a2a_overlap"] is True
    assert "delay_wgrad_compute" in st.ignored and "delay_wgrad_compute" not in st.setting
