"""The audit table (calls per micro-batch and per iteration by Megatron-LM code origin) is the predictor."""

from __future__ import annotations

import dataclasses

import conftest
import pytest

from llmcomm import Layout, ParallelConfig, load_model
from llmcomm.predict import audit_table, predict_traffic

TINY_MOE = dataclasses.replace(conftest.TINY_MOE, gated_mlp=True, tied_embeddings=True,
                              position_embedding_type="learned_absolute", max_position_embeddings=32)

CONFIGS = [
    ("gpt3-125m", ParallelConfig(tp=2, pp=2, dp=2, sp=True, vpp=2, global_batch=8, seq_len=128,
                                 distributed_optimizer=True)),
    ("gpt3-125m", ParallelConfig(tp=2, pp=2, cp=2, global_batch=2, seq_len=128, recompute="full")),
    ("gpt3-125m", ParallelConfig(tp=2, dp=2, global_batch=4, seq_len=128, fsdp=True)),
    ("gpt3-125m", ParallelConfig(pp=2, dp=2, global_batch=8, seq_len=128, fsdp=True, distributed_optimizer=True,
                                 overlap_grad_reduce=True, fsdp_reshard_after_forward=True)),  # Megatron-FSDP
    ("gpt3-125m", ParallelConfig(pp=2, dp=2, global_batch=4, seq_len=128, overlap_grad_reduce=True,
                                 distributed_optimizer=True, bucket_size=2_000_000)),
    (TINY_MOE, ParallelConfig(tp=2, dp=4, ep=2, sp=True, pp=2, global_batch=8, moe_aux_loss_coeff=0.01)),
    (TINY_MOE, ParallelConfig(tp=2, dp=2, ep=4, etp=1, sp=True, moe_token_dispatcher_type="allgather")),
    ("gpt3-125m", ParallelConfig(tp=2, pp=4, dp=2, global_batch=8, seq_len=128, pipe_partitioned=True)),
]


@pytest.mark.parametrize(("model", "parallel"), CONFIGS)
def test_audit_totals_equal_the_prediction(model, parallel):
    m = load_model(model) if isinstance(model, str) else model
    a = audit_table(m, parallel)
    t = predict_traffic(m, parallel, aggregate=False)
    ev = t.events
    for stage in range(parallel.pp):
        rank = Layout(parallel).rank_of(pp=stage)
        mine = ev[ev["rank"] == rank]
        s = a[a["stage"] == stage]
        assert s["calls_per_iteration"].sum() == len(mine)
        assert s["bytes_per_iteration"].sum() == mine["bytes"].sum()
        by = ["parallelism", "op", "phase"]
        assert (s.groupby(by)["bytes_per_iteration"].sum().sort_index()
                == mine.groupby(by, observed=True)["bytes"].sum().sort_index()).all()


def test_audit_of_gpt3_175b_lists_origins():
    """GPT-3 175B, tp 8 · pp 16 · dp 8 with SP and the distributed optimizer: per micro-batch the first stage
    broadcasts the batch (tokens, position ids, 4 MiB mask at s = 2,048), all-reduces the embedding (learned
    positions) and runs 6 layers x (attention AG RS, MLP AG RS) forward."""
    p = ParallelConfig(tp=8, pp=16, dp=8, sp=True, micro_batch=1, global_batch=128, seq_len=2048,
                       distributed_optimizer=True)
    a = audit_table("gpt3-175b", p, stages=[0])
    mb = a[a["scope"] == "micro-batch"]
    batch = mb[mb["origin"].str.contains("get_batch")]
    # tokens and position ids (int64, merged: same size), the (1, 1, s, s) bool mask
    assert dict(zip(batch["bytes"], batch["calls_per_microbatch"], strict=True)) == {8 * 2048: 2, 2048 * 2048: 1}
    emb = mb[mb["origin"].str.contains("VocabParallelEmbedding") & (mb["phase"] == "forward")]
    assert list(emb["op"]) == ["all_reduce"]
    att = mb[mb["origin"].str.contains("linear_qkv") & (mb["phase"] == "forward")]
    assert dict(zip(att["op"], att["calls_per_microbatch"], strict=True)) == {"all_gather": 6, "reduce_scatter": 6}
    it = a[a["scope"] == "iteration"]
    assert set(it["op"]) == {"reduce_scatter", "all_gather", "all_reduce"}
    assert (a["calls_per_iteration"] == a["calls_per_microbatch"] * p.num_microbatches)[a["scope"] == "micro-batch"].all()
