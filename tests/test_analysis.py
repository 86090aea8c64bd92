"""llmcomm.analysis: one input convention (a Trace or its events), the library's errors, one call numbering."""

from __future__ import annotations

import pandas as pd
import pytest

import llmcomm.analysis.api as A
from llmcomm import ParallelConfig, Trace, load_model, predict_traffic
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


def _records(rows: list[tuple[int, int, str, int]]) -> Trace:
    """Sends ``(src, dst, parallelism, bytes)`` with their receives, as a Trace."""
    records = []
    for src, dst, par, nbytes in rows:
        base = dict(phase="forward", parallelism=par, group=[], bytes=nbytes, dtype="bf16", source="test")
        records += [dict(rank=src, op="send", peer=dst, **base), dict(rank=dst, op="recv", peer=src, **base)]
    return Trace.from_records(records)


def test_diagonals_and_asymmetry_of_the_matrix() -> None:
    t = _records([(0, 1, "pp", 64), (1, 0, "pp", 32), (1, 2, "pp", 8), (0, 2, "tp", 5), (2, 0, "tp", 5)])
    assert A.diagonal_offsets(t, parallelism="pp") == [-1, 1]
    assert A.diagonal_offsets(t) == [-2, -1, 1, 2]
    assert A.matrix_asymmetry(t, parallelism="pp") == 32.0   # |M[0,1] − M[1,0]| = 64 − 32; |M[1,2] − 0| = 8
    assert A.matrix_asymmetry(t, parallelism="tp") == 0.0


def test_volume_helpers_by_hand() -> None:
    vol = pd.DataFrame({"config": ["a", "a", "b", "b"], "parallelism": ["tp", "pp", "tp", "dp"],
                        "bytes": [3, 1, 1, 3], "share": [0.75, 0.25, 0.25, 0.75]})
    top = A.largest_parallelism(vol)
    assert top["parallelism"].to_dict() == {"a": "tp", "b": "dp"} and top.loc["b", "share"] == 0.75
    sweeps = pd.DataFrame({"configuration": ["x", "x", "x", "y", "y"], "microbatches": [1, 2, 4, 1, 2],
                           "tp_share": [0.5, 0.99, 0.995, 0.1, 0.2]})
    assert A.first_crossings(sweeps, 0.99) == {"x": 2, "y": None}
    assert A.describe_crossing(2048, 4096) == "from 2,048 micro-batches on"
    assert A.describe_crossing(None, 2048) == "at none of up to 2,048 micro-batches"
    events = pd.DataFrame({"parallelism": ["tp", "sp", "sp", "pp"], "phase": ["forward", "backward", "optimizer",
                                                                                 "forward"],
                           "bytes": [10, 7, 1000, 500], "count": [3, 2, 1, 1]})
    assert A.tp_microbatch_bytes(events) == 3 * 10 + 2 * 7   # the optimizer's SP call and PP are left out


def test_on_off_share_and_pipeline_stage() -> None:
    events = _replay()  # calls start every 100 µs, last ends at 510,002 ns; all-to-alls at 100, 300, 500 µs
    # 50 µs bins over [0, 510,002): 11 bins, the odd ones (5) silent
    assert A.silent_share(events, 50e-6, rank=0) == 5 / 11
    # the all-to-alls alone: 9 bins from 100 µs, busy 0, 4, 8
    assert A.silent_share(events, 50e-6, rank=0, parallelism="ep") == 6 / 9
    ranks = pd.DataFrame({"rank": [7, 0, 3, 4]})
    staged = A.with_pipeline_stage(ranks, ParallelConfig(tp=2, pp=2, dp=2).to_dict())  # rank = tp + 2·dp + 4·pp
    assert staged["stage"].tolist() == [1, 0, 0, 1]
    assert A.with_pipeline_stage(ranks, ParallelConfig(tp=4, pp=2))["stage"].tolist() == [1, 0, 0, 1]


def test_repeatability_and_time_summaries_by_hand() -> None:
    seq = A.call_sequence(_replay())  # iterations 1, 2: 5 µs + 10.001 µs, 5 µs + 10.002 µs
    per_iteration = A.comm_time_per_iteration(seq)
    assert per_iteration.index.tolist() == [1, 2]
    assert per_iteration.tolist() == pytest.approx([0.015001, 0.015002], rel=1e-12)
    spread = pd.DataFrame({"calls": [20, 40, 3], "min_us": [10.0, 4.0, 1.0], "max_us": [12.0, 10.0, 1.0]})
    assert A.smallest_duration_ratio(spread, min_calls=20) == 1.2   # 12/10 < 10/4; the 3-call row is left out
    rows = pd.DataFrame({"trace": ["a", "a", "a", "b"], "rank": [0, 1, 0, 0], "iteration": [1, 1, 2, 1],
                         "calls": [4, 6, 4, 9], "identical": [True, True, False, True]})
    summary = A.repeatability_summary(rows)
    assert summary.loc["a"].to_dict() == {"iterations": 2, "ranks": 2, "calls_per_iteration": 4.0,
                                          "identical": 2 / 3}
    assert summary.loc["b", "calls_per_iteration"] == 9.0


def test_bandwidth_summaries_by_hand() -> None:
    # one sweep of 2 ranks in one node, one of 16 ranks across 2 nodes; GB/s
    bw = pd.DataFrame({"source": ["s2"] * 5 + ["s16"] * 4, "device": "a100", "op": "all_reduce",
                       "ranks": [2] * 5 + [16] * 4, "nodes": [1] * 5 + [2] * 4,
                       "placement": ["out-of-place"] * 4 + ["in-place"] + ["out-of-place"] * 4,
                       "bytes": [1024, 65536, 2**19, 2**20, 2**20, 1024, 65536, 2**20, 2**24],
                       "busbw": [5.0, 20.0, 81.0, 90.0, 100.0, 1.0, 4.0, 30.0, 40.0], "algbw": 0.0})
    # 2 ranks: best small 20 of peak 100 (the in-place row); 16 ranks: 4 of 40
    assert A.small_message_fraction(bw, max_bytes=65536) == 0.2
    oop = bw[bw["placement"] == "out-of-place"]
    # 90% of 90 GB/s (81, reaching counts) is first reached at 512 KiB; 90% of 40 (36) only at 16 MiB
    assert A.saturation_bytes(oop, fraction=0.9).to_dict() == {2: 2**19, 16: 2**24}
    intra, inter = A.node_peaks(A.bandwidth_summary(oop))
    assert intra.to_dict() == {"s2": 90.0} and inter.to_dict() == {"s16": 40.0}
