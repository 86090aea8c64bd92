"""llmcomm.analysis: one input convention (a Trace or its events), the library's errors, one call numbering."""

from __future__ import annotations

import pandas as pd
import pytest

from llmcomm import ParallelConfig, Trace, load_model, predict_traffic
from llmcomm import analysis as A
from llmcomm.errors import AnalysisError, LLMCommError


def _replay(iterations: int = 3) -> pd.DataFrame:
    """One rank, each iteration: an all-reduce of 1 KiB, then an all-to-all of 32 MiB taking 10 + i µs."""
    rows = []
    t = 0
    for it in range(iterations):
        for op, par, nbytes, dur in (("all_reduce", "tp", 1024, 5_000), ("all_to_all", "ep", 32 << 20, 10_000 + it)):
            rows.append(dict(rank=0, iteration=it, microbatch=0, layer=0, phase="forward", parallelism=par, op=op,
                             peer=-1, bytes=nbytes, t_start_ns=t, t_end_ns=t + dur))
            t += 100_000
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def predicted() -> Trace:
    return predict_traffic(load_model("gpt3-1.3b"), ParallelConfig(tp=2, pp=2, dp=2, global_batch=8))


def test_untimed_trace_is_refused_with_the_librarys_error(predicted: Trace) -> None:
    with pytest.raises(AnalysisError, match="t_start_ns"):
        A.periods(predicted, rank=0)
    with pytest.raises(LLMCommError):
        A.comm_time_series(predicted.events, 0.001)
    with pytest.raises(AnalysisError, match="'bytes' or 'busy'"):
        A.comm_time_series(_replay(), 0.001, value="watts")


def test_trace_and_its_events_give_the_same_answer(predicted: Trace) -> None:
    pd.testing.assert_frame_equal(A.repeatability(predicted), A.repeatability(predicted.events))
    for algorithm in (None, "ring"):
        pd.testing.assert_frame_equal(A.bytes_by(predicted, ["phase"], algorithm),
                                      A.bytes_by(predicted.events, ["phase"], algorithm))
    pd.testing.assert_frame_equal(A.pair_classes(predicted), A.pair_classes(predicted.events))
    with pytest.raises(AnalysisError, match="Trace or its events"):
        A.tp_share([1, 2, 3])
    assert A.repeatability(predicted, reference_iteration=0)["identical"].all()


def test_one_numbering_serves_sizes_and_durations() -> None:
    events = _replay()
    seq = A.call_sequence(events)  # iterations 1 and 2
    assert seq["iteration"].tolist() == [1, 1, 2, 2] and seq["seq"].tolist() == [0, 1, 0, 1]
    assert seq["collective"].tolist()[:2] == ["all_reduce/tp/1KiB", "all_to_all/ep/32MiB"]
    sizes = A.size_repeatability(events)
    assert (sizes["iterations"] == 2).all() and (sizes["sizes"] == 1).all()
    pd.testing.assert_frame_equal(sizes, A.size_repeatability(seq))  # a numbered table numbers the same
    spread = A.duration_spread(events).set_index("collective")
    assert spread.loc["all_to_all/ep/32MiB", "min_us"] == 10.001 and spread.loc["all_to_all/ep/32MiB", "max_us"] == 10.002
    events.loc[5, "bytes"] = 16 << 20  # iteration 2's all-to-all shrinks: call 1 now takes two sizes
    changed = A.size_repeatability(events).set_index("seq")
    assert changed.loc[1, "sizes"] == 2 and changed.loc[0, "sizes"] == 1
    rep = A.repeatability(events, reference_iteration=1).set_index("iteration")
    assert rep.loc[0, "identical"] and not rep.loc[2, "identical"] and rep.loc[2, "position_match"] == 0.5


def test_support_needs_the_layout(predicted: Trace) -> None:
    assert A.support_violations(predicted).empty
    with pytest.raises(AnalysisError, match="'parallel'"):
        A.support_violations(Trace(predicted.events, {}))


def test_one_byte_formatter_for_reports_and_labels() -> None:
    from llmcomm.units import format_bytes

    assert format_bytes(24.5 * 2**30) == "24.50 GiB" and format_bytes(512) == "512 B"
    assert format_bytes(32 * 2**20, compact=True) == "32MiB" and format_bytes(1536, compact=True) == "1.5KiB"
    assert format_bytes(96, compact=True) == "96B" and format_bytes(3 * 2**40) == "3.00 TiB"
