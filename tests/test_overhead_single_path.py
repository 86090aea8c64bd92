"""iteration_time's single-configuration path: the stage cache and the class stacking equal the uncached
formulation (issue 20, Speed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from llmcomm.overhead import iteration as it
from llmcomm.overhead import iteration_time, sweep
from llmcomm.parallel_table import ParallelTable
from llmcomm.specs import ParallelConfig, load_cluster, load_model

MODEL = load_model("gpt3-175b")
A100 = load_cluster("a100-80g-hdr200")
PAR = ParallelConfig(tp=8, pp=16, dp=8, micro_batch=1, global_batch=1536, recompute="full")


def test_repeated_call_equals_the_uncached_formulation_and_the_cache_is_read_only():
    it._STAGES.clear()
    first = iteration_time(MODEL, PAR, A100)
    assert len(it._STAGES) == 1
    again = iteration_time(MODEL, PAR, A100)
    assert again == first and len(it._STAGES) == 1  # served from the cache
    bw, ut = it._resolve(A100, None, None)
    fresh = it.combine(it.stages(MODEL, ParallelTable.from_parallel(PAR, MODEL), A100, bw), ut)
    assert first.total_s == float(sum(fresh[k][0] for k in it.TERMS))
    st = next(iter(it._STAGES.values()))[3]
    with pytest.raises(ValueError, match="read-only"):
        st.cls["first"]["tp"][0] = 0.0


def test_cache_key_follows_the_bandwidth_model_and_the_configuration():
    it._STAGES.clear()
    bw = it._resolve(A100, None, None)[0].bw
    base = iteration_time(MODEL, PAR, A100)
    half = iteration_time(MODEL, PAR, A100, sweep.ScaledBandwidth(bw, 0.5))
    assert half.exposed_comm_s > base.exposed_comm_s and len(it._STAGES) == 2
    other = iteration_time(MODEL, dataclasses.replace(PAR, dp=4, global_batch=768), A100)
    assert other != base and len(it._STAGES) == 3
    peak = iteration_time(MODEL, PAR, load_cluster("h100-80g-ndr400"), measured_gemms=False)
    measured = iteration_time(MODEL, PAR, load_cluster("h100-80g-ndr400"))
    assert peak.compute_s < measured.compute_s  # FLOPs/peak is faster than the measured GEMMs (below peak)
    it._STAGES.clear()
    assert iteration_time(MODEL, PAR, A100) == base


def test_stack_classes_equals_for_class_concatenated():
    t = ParallelTable.from_frame(
        pd.DataFrame({"tp": [1, 8, 2], "pp": [1, 4, 2], "dp": [2, 1, 4], "sp": [False, True, True],
                                        "global_batch": [8, 8, 16]}), MODEL)
    for table in (t, t.tile(30)):  # a few rows (2-D blocks) and many (one concatenation per key)
        c = it.arrays(MODEL, table, 8)
        got = it.stack_classes(c)
        per = [it.for_class(c, cls) for cls in it.CLASSES]
        want = {k: np.concatenate([p[k] for p in per]) for k in per[0]}
        assert list(got) == list(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k])


def test_with_overlap_sets_what_each_configuration_allows():
    ov = sweep.with_overlap()
    assert set(ov) == set(sweep.CASES)
    for label, (_, kw) in ov.items():
        base = sweep.CASES[label][1]
        assert kw["overlap_grad_reduce"] is True
        assert kw.get("overlap_param_gather", False) == bool(base.get("distributed_optimizer"))
        assert kw.get("tp_comm_overlap", False) == bool(base.get("sp") and base.get("tp", 1) > 1)
        assert {k: v for k, v in kw.items() if k in base} == dict(base)
