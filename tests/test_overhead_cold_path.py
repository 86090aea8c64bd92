"""The speed work on iteration_time / iteration_times / the memory model changes no number (issue 20, Speed).

A spread of catalogue configurations (dense, GQA, MoE with EP, CP of every kind, FSDP, interleaved and uneven
pipelines, FP8, every overlap flag, GPipe, DeepSpeed's partitioned pipe, five clusters) is evaluated three ways:
``iteration_time`` on a configuration not seen before (every cache emptied), the same call again (the stage
cache), and a row of the vectorized ``iteration_times``; all three must equal, bit for bit, the values recorded
in ``tests/data/iteration_golden.json`` by the code without the speed-up (main at 2b2c033). The memory model
(``memory``, ``model_state``, ``memory_table``) and two grids through ``iteration_times`` / ``memory_table``
(their columns' bytes hashed) are held to the same record.

Regenerate the record only when a formula changes on purpose::

    python tests/test_overhead_cold_path.py --write
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from llmcomm.overhead import capacity
from llmcomm.overhead import iteration as it
from llmcomm.overhead import memory as mem
from llmcomm.overhead.capacity import MemoryWarning
from llmcomm.specs import ParallelConfig, load_cluster, load_model

GOLDEN = Path(__file__).parent / "data" / "iteration_golden.json"
H100, A100 = "h100-80g-ndr400", "a100-80g-hdr200"

CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("gpt3-175b", A100, dict(tp=8, pp=16, dp=8, micro_batch=1, global_batch=1536, recompute="full")),
    ("gpt3-175b", A100, dict(tp=8, pp=8, dp=16, micro_batch=2, global_batch=1536, recompute="selective", sp=True,
                             distributed_optimizer=True)),
    ("gpt3-175b", H100, dict(tp=8, pp=8, vpp=6, dp=4, micro_batch=1, global_batch=512, sp=True, recompute="full",
                             overlap_grad_reduce=True, distributed_optimizer=True)),
    ("gpt3-175b", H100, dict(tp=8, pp=8, vpp=4, dp=8, micro_batch=1, global_batch=512, sp=True,
                             distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
                             tp_comm_overlap=True, fp8="hybrid", overlap_p2p_comm=True)),
    ("llama3-70b", H100, dict(tp=4, pp=4, vpp=5, dp=8, sp=True, micro_batch=1, global_batch=512, seq_len=8192,
                              distributed_optimizer=True, recompute="selective")),
    ("llama3-70b", H100, dict(tp=4, pp=4, vpp=5, dp=8, sp=True, micro_batch=1, global_batch=512, seq_len=8192,
                              distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
                              tp_comm_overlap=True, fp8="hybrid", fp8_param_gather=True)),
    ("llama3-70b", H100, dict(tp=4, pp=4, vpp=5, dp=4, cp=2, sp=True, micro_batch=1, global_batch=256,
                              seq_len=8192, distributed_optimizer=True, overlap_grad_reduce=True,
                              tp_comm_overlap=True)),
    ("llama3-8b", H100, dict(tp=1, pp=1, dp=8, cp=2, micro_batch=1, global_batch=128, seq_len=8192,
                             distributed_optimizer=True, cp_comm_type="a2a")),
    ("llama3-8b", H100, dict(tp=2, pp=1, dp=4, cp=2, sp=True, micro_batch=1, global_batch=128, seq_len=8192,
                             distributed_optimizer=True, cp_comm_type="all_gather")),
    ("llama3-8b", H100, dict(tp=1, pp=1, dp=16, micro_batch=1, global_batch=128, fsdp=True,
                             distributed_optimizer=True, overlap_grad_reduce=True)),
    ("llama3-8b", H100, dict(tp=2, pp=1, dp=32, sp=True, micro_batch=1, global_batch=128, fsdp=True,
                             fsdp_reshard_after_forward=False, recompute="full")),
    ("llama2-70b", A100, dict(tp=8, pp=4, dp=4, micro_batch=1, global_batch=512, sp=True, recompute="selective",
                              recompute_modules=("core_attn", "mlp"))),
    ("mixtral-8x7b", H100, dict(tp=1, pp=4, dp=16, ep=8, micro_batch=1, global_batch=256, seq_len=4096,
                                distributed_optimizer=True, recompute="selective")),
    ("mixtral-8x7b", H100, dict(tp=2, pp=2, dp=8, ep=4, sp=True, micro_batch=1, global_batch=256, seq_len=4096,
                                distributed_optimizer=True, overlap_grad_reduce=True, moe_aux_loss_coeff=0.01)),
    ("mixtral-8x22b", H100, dict(tp=2, pp=8, vpp=7, dp=8, ep=8, sp=True, micro_batch=1, global_batch=256,
                                 distributed_optimizer=True, overlap_grad_reduce=True)),
    ("qwen3-235b-a22b", H100, dict(tp=2, pp=2, dp=32, ep=8, sp=True, micro_batch=1, global_batch=512,
                                   seq_len=4096, distributed_optimizer=True, recompute="full")),
    ("qwen3-235b-a22b", H100, dict(tp=4, pp=2, vpp=47, dp=16, ep=8, sp=True, micro_batch=1, global_batch=512,
                                   seq_len=4096, distributed_optimizer=True, overlap_grad_reduce=True,
                                   moe_a2a_overlap=True, recompute="selective")),
    ("qwen3-30b-a3b", H100, dict(tp=1, pp=1, dp=16, ep=8, micro_batch=2, global_batch=256,
                                 distributed_optimizer=True, fp8="e4m3")),
    ("deepseek-v3", "h200-141g-ndr400", dict(tp=2, pp=1, dp=512, ep=64, sp=True, micro_batch=1, global_batch=1024,
                                             distributed_optimizer=True, recompute="full")),
    ("llama3.1-405b", H100, dict(tp=8, pp=8, vpp=8, cp=2, dp=8, sp=True, micro_batch=1, global_batch=512,
                                 distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
                                 tp_comm_overlap=True, account_for_embedding_in_pipeline_split=True,
                                 account_for_loss_in_pipeline_split=True)),
    ("llama3-405b", H100, dict(tp=8, pp=16, dp=4, sp=True, micro_batch=1, global_batch=256,
                               distributed_optimizer=True, num_layers_in_first_pipeline_stage=7,
                               num_layers_in_last_pipeline_stage=7)),
    ("gpt3-13b", "a100-40g-hdr200", dict(tp=4, pp=2, dp=8, micro_batch=4, global_batch=256, schedule="gpipe",
                                         order="pp-dp-tp", recompute="full")),
    ("gpt3-13b", "vtrain-a100", dict(tp=4, pp=2, dp=4, micro_batch=2, global_batch=128, pipe_partitioned=True)),
    ("gpt3-1.3b", "b200-180g-ndr400", dict(tp=1, pp=1, dp=8, micro_batch=8, global_batch=512,
                                           attention_backend="unfused", act_dtype="fp16")),
    ("nemotron4-340b", "h200-141g-ndr400", dict(tp=8, pp=12, vpp=8, dp=4, sp=True, micro_batch=1,
                                                global_batch=384, distributed_optimizer=True,
                                                overlap_grad_reduce=True, overlap_param_gather=True,
                                                tp_comm_overlap=True, fp8="hybrid")),
    ("gpt-oss-120b", H100, dict(tp=1, pp=4, dp=16, ep=8, micro_batch=1, global_batch=512,
                                distributed_optimizer=True, recompute="full")),
    ("deepseek-moe-16b", A100, dict(tp=2, pp=2, dp=8, ep=4, sp=True, micro_batch=1, global_batch=128,
                                    recompute="full")),
]
FIELDS = (*it.TERMS, "dp_comm_total_s", "comm_bus_bytes")
FRAME_COLUMNS = (*FIELDS, "total_s", "exposed_comm_s", "comm_overhead", "total_s_lo", "total_s_hi")


def _hex(x: float) -> str:
    return float(x).hex()


def _clear_caches() -> None:
    it._STAGES.clear()
    it._TIMERS.clear()  # the regimes and calls each timer keeps
    capacity._memory.cache_clear()
    for f in (mem._stage_parameters, mem._stage_info, mem._fsdp_units):
        f.cache_clear()


def _cold(model: str, cluster: str, kw: dict[str, Any]) -> dict[str, Any]:
    _clear_caches()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemoryWarning)
        b = it.iteration_time(load_model(model), ParallelConfig(**kw), load_cluster(cluster))
    return {**{k: _hex(getattr(b, k)) for k in FIELDS}, "critical_stage": b.critical_stage}


def _memory(model: str, kw: dict[str, Any]) -> dict[str, Any]:
    m, p = load_model(model), ParallelConfig(**kw)
    b = mem.memory(m, p)
    return {"stage": b.stage, **{k: _hex(getattr(b, k)) for k in mem.COLUMNS},
            "model_state": [_hex(x) for x in mem.model_state(m, p)]}


def _frame(cases: list[tuple[str, str, dict[str, Any]]]) -> pd.DataFrame:
    """The cases of one (model, cluster) as a candidates frame (absent fields: ParallelConfig's defaults)."""
    defaults = ParallelConfig()
    cols = sorted({k for _, _, kw in cases for k in kw})
    values = {k: [kw.get(k, getattr(defaults, k)) for _, _, kw in cases] for k in cols}
    return pd.DataFrame({k: pd.Series(v, dtype=object) if any(x is None or isinstance(x, (str, tuple)) for x in v)
                         else v for k, v in values.items()})  # None stays None (not pandas' missing string)


def _grid() -> pd.DataFrame:
    rows = []
    for tp, pp, dp, mb, rec, sp, dist, vpp in itertools.product(
            (1, 2, 8), (1, 4, 8), (1, 4, 16), (1, 2), ("none", "selective", "full"), (False, True), (False, True),
            (1, 2)):
        if (sp and tp == 1) or (vpp > 1 and pp == 1):
            continue
        rows.append({"tp": tp, "pp": pp, "dp": dp, "micro_batch": mb, "global_batch": 16 * mb * dp,
                     "recompute": rec, "sp": sp, "distributed_optimizer": dist, "vpp": vpp})
    return pd.DataFrame(rows)


def _digest(df: pd.DataFrame, columns: tuple[str, ...] | list[str]) -> dict[str, str]:
    def data(a: np.ndarray) -> bytes:
        return "\n".join(map(str, a)).encode() if a.dtype == object else np.ascontiguousarray(a).tobytes()

    return {c: hashlib.sha256(data(df[c].to_numpy())).hexdigest()[:32] for c in columns if c in df}


def snapshot() -> dict[str, Any]:
    """Everything the record holds, computed by the code at hand."""
    out: dict[str, Any] = {"cases": [], "grid": {}}
    for model, cluster, kw in CASES:
        out["cases"].append({"model": model, "cluster": cluster, "config": kw, "cold": _cold(model, cluster, kw),
                             "memory": _memory(model, kw)})
    g = _grid()
    gpt = load_model("gpt3-175b")
    out["grid"]["iteration_times"] = _digest(it.iteration_times(gpt, g, load_cluster(A100)),
                                             [*FRAME_COLUMNS, "critical", "num_microbatches"])
    out["grid"]["memory_table"] = _digest(mem.memory_table(gpt, g), [f"{c}_bytes" for c in (*mem.COLUMNS, "total")]
                                          + ["stage"])
    return out


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{m}-{j}" for j, (m, _, _) in enumerate(CASES)])
def test_cold_warm_and_vectorized_equal_the_record(golden: dict[str, Any], i: int) -> None:
    model, cluster, kw = CASES[i]
    rec = golden["cases"][i]
    assert (rec["model"], rec["cluster"], rec["config"]) == (model, cluster, json.loads(json.dumps(kw)))
    assert _cold(model, cluster, kw) == rec["cold"]  # first seen: every cache empty
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemoryWarning)
        warm = it.iteration_time(load_model(model), ParallelConfig(**kw), load_cluster(cluster))  # stage cache
    assert {k: _hex(getattr(warm, k)) for k in FIELDS} == {k: v for k, v in rec["cold"].items() if k in FIELDS}
    assert _memory(model, kw) == rec["memory"]


def test_vectorized_rows_equal_the_single_configuration_path(golden: dict[str, Any]) -> None:
    by: dict[tuple[str, str], list[int]] = {}
    for i, (model, cluster, _) in enumerate(CASES):
        by.setdefault((model, cluster), []).append(i)
    for (model, cluster), idx in by.items():
        out = it.iteration_times(load_model(model), _frame([CASES[i] for i in idx]), load_cluster(cluster))
        for row, i in enumerate(idx):
            want = golden["cases"][i]["cold"]
            assert {k: _hex(out[k].iloc[row]) for k in FIELDS} == {k: want[k] for k in FIELDS}, CASES[i]
            assert out["critical"].iloc[row] == want["critical_stage"]


def test_grids_equal_the_record(golden: dict[str, Any]) -> None:
    g = _grid()
    gpt = load_model("gpt3-175b")
    got = _digest(it.iteration_times(gpt, g, load_cluster(A100)), [*FRAME_COLUMNS, "critical", "num_microbatches"])
    assert got == golden["grid"]["iteration_times"]
    assert _digest(mem.memory_table(gpt, g), [f"{c}_bytes" for c in (*mem.COLUMNS, "total")] + ["stage"]) == \
        golden["grid"]["memory_table"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_overhead_cold_path.py --write")
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(snapshot(), indent=1) + "\n")
