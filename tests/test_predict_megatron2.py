"""The predictor against Megatron-LM, round two (issue 24): the per-iteration calls, the bucketing, the options
recipes use. Megatron-LM is NVIDIA/Megatron-LM at HEAD d98e8a6 (``megatron/core`` unless a path says otherwise),
TransformerEngine ``transformer_engine/pytorch``. Each hand table below is written from the cited lines with the
model's sizes, independently of the predictor's generators, and compared with :func:`audit_table`.

The five cases of the issue:

1. LLaMA-3 405B, tp 8 · cp 2 · pp 16 · dp 2, SP, distributed optimizer (126 layers: the embedding and the loss
   counted in the pipeline split, ``--account-for-embedding/loss-in-pipeline-split``: 7 + 14 x 8 + 7 layers);
2. DeepSeek-MoE-16B, tp 2 · etp 1 · ep 8 · dp 8, SP, distributed optimizer, both dispatchers;
3. Qwen2-57B-A14B, tp 4 · etp 2 · ep 8 · dp 4, SP, both dispatchers;
4. Mixtral 8x7B, tp 2 · ep 4 · pp 2 · dp 4, SP;
5. GPT-3 6.7B (tied embeddings), pp 2 · dp 4, ``overlap_grad_reduce`` and the distributed optimizer.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from llmcomm import ConfigError, Layout, ModelSpec, ParallelConfig, load_model
from llmcomm.predict import Context, audit_table, predict_traffic
from llmcomm.predict import dp as dpmod
from llmcomm.predict.audit import ORIGINS
from llmcomm.predict.ep import expert_tp_ops

F32, BF16 = 4, 2

CASES = {
    "llama3-405b": ("llama3-405b", ParallelConfig(
        tp=8, cp=2, pp=16, dp=2, sp=True, distributed_optimizer=True, global_batch=16,
        account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)),
    "deepseek-moe-16b": ("deepseek-moe-16b", ParallelConfig(tp=2, etp=1, ep=8, dp=8, sp=True, global_batch=16,
                                                            distributed_optimizer=True)),
    "qwen2-57b-a14b": ("qwen2-57b-a14b", ParallelConfig(tp=4, etp=2, ep=8, dp=4, sp=True, global_batch=8)),
    "mixtral-8x7b": ("mixtral-8x7b", ParallelConfig(tp=2, ep=4, pp=2, dp=4, sp=True, global_batch=8)),
    "gpt3-6.7b": ("gpt3-6.7b", ParallelConfig(pp=2, dp=4, global_batch=8, overlap_grad_reduce=True,
                                              distributed_optimizer=True)),
}


def iteration_rows(a: pd.DataFrame, stage: int) -> list[tuple[str, str, str, int, str, int]]:
    """``(origin key, op, group, bytes, dtype, calls)`` of a stage's once-per-iteration rows, in table order."""
    key = {v: k for k, v in ORIGINS.items()}
    it = a[(a["stage"] == stage) & (a["scope"] == "iteration")]
    return [(key[o], op, g, int(b), dt, int(n)) for o, op, g, b, dt, n in
            zip(it["origin"], it["op"], it["group"], it["bytes"], it["dtype"], it["calls_per_iteration"], strict=True)]


def totals(a: pd.DataFrame, stage: int) -> dict[str, int]:
    s = a[a["stage"] == stage]
    return {k: int(v) for k, v in s.groupby("parallelism")["bytes_per_iteration"].sum().items() if v}


# -------------------------------------------------------------------------------------------- hand arithmetic
def llama405_hand() -> dict:
    """Stage 0 and 15 of case 1. ``get_num_layers_to_build`` (transformer/transformer_block.py ~150-200):
    (126 + 1 + 1) / 16 = 8 per stage, one fewer on the first and the last. Padded vocabulary: a multiple of
    128·tp = 1,024 (128,256 -> 129,024)."""
    h, a, g, d, f, m, s, cp, tp = 16384, 128, 8, 128, 53248, 8, 8192, 2, 8
    layer = (2 * h * a * d + 2 * h * g * d) // tp + 3 * h * f // tp + 2 * h  # sharded + 2 RMSNorms
    vh = 129024 * h // tp
    n0, n15 = 7 * layer + vh, 7 * layer + h + vh  # + word embedding / final norm + output layer (untied)
    T = s // cp  # tokens of a micro-batch on one CP rank
    A = T * h * BF16
    kv = T * (g // tp) * 2 * d * BF16  # TE AttnFuncWithCPAndKVP2P: cat(k, v) per ring step
    mask, tok = s * s, 8 * s
    it0 = [("grad_sync", "reduce_scatter", "dpcp", F32 * n0, "fp32", 1),
           ("norm_grads", "all_reduce", "tp", F32 * 7 * 2 * h, "fp32", 1),
           ("rerun", "all_reduce", "world", 4, "int32", 1),
           ("grad_norm", "all_reduce", "world", 4, "fp32", 1),
           ("param_gather", "all_gather", "dpcp", BF16 * n0, "bf16", 1),
           ("train_step", "all_reduce", "mp", 4, "int32", 1), ("train_step", "all_reduce", "mp", 4, "fp32", 1)]
    it15 = [("grad_sync", "reduce_scatter", "dpcp", F32 * n15, "fp32", 1),
            ("norm_grads", "all_reduce", "tp", F32 * (7 * 2 * h + h), "fp32", 1),
            ("rerun", "all_reduce", "world", 4, "int32", 1),
            ("grad_norm", "all_reduce", "world", 4, "fp32", 1),
            ("param_gather", "all_gather", "dpcp", BF16 * n15, "bf16", 1),
            ("train_step", "all_reduce", "mp", 4, "int32", 1), ("train_step", "all_reduce", "mp", 4, "fp32", 1),
            ("train_step", "all_reduce", "dpcp", 8, "fp32", 1)]
    # per micro-batch: 10 A of SP calls per layer (AG RS + AG RS forward, AG AG RS twice backward), the
    # embedding's RS + AG (rotary: reduce_scatter_embeddings), the output layer's AG, AG + RS; 6 KV of ring
    # traffic per layer (send + recv: 1 step forward, 2 backward); p2p (s/cp/tp)·h per boundary crossing
    p2p = T // tp * h * BF16
    scal = 4 * 4
    t0 = {"sp": m * (7 * 10 * A + 2 * A), "cp": m * 7 * 6 * kv, "pp": m * 2 * p2p,
          "dp": (F32 + BF16) * n0, "tp": F32 * 7 * 2 * h,
          "other": m * (2 * tok + mask) + scal}
    t15 = {"sp": m * (7 * 10 * A + 3 * A), "cp": m * 7 * 6 * kv, "pp": m * 2 * p2p,
           "dp": (F32 + BF16) * n15 + 8, "tp": F32 * (7 * 2 * h + h) + m * 3 * T * F32,
           "other": m * (tok + 4 * s + mask) + scal}
    return {"it": {0: it0, 15: it15}, "totals": {0: t0, 15: t15}}


def deepseek_moe_hand(dispatcher: str) -> dict:
    """Case 2 (pp = 1, one stage). Layer 0 dense, 27 MoE layers of 64 experts (8 local), 2 shared experts of
    1,408. Experts in their own buffer (ep > 1), reduced over edp = 16 / (etp·ep) = 2; the chained dense and
    expert distributed optimizers share the chunk, so every bucket is all-gathered twice
    (optimizer/distrib_optimizer.py ~3139-3195, optimizer.py ~1667-1675); both gradient-statistics groups are
    the world, so one norm (optimizer.py ~1795-1801)."""
    h, a, d, f, fe, E, k, V, s, tp, ep, m = 2048, 16, 128, 10944, 1408, 64, 6, 102400, 4096, 2, 8, 2
    att = 4 * h * a * d // tp
    repl = 2 * h
    dense0 = att + repl + 3 * h * f // tp
    moe = att + repl + h * E + 3 * h * 2 * fe // tp  # + router (replicated) + shared experts (TP-split)
    vh = V * h // tp  # 102,400 is a multiple of 256
    dense = dense0 + 27 * moe + 2 * vh + h
    expert = 27 * (E // ep) * 3 * h * fe  # etp = 1: whole experts
    norms = 28 * repl + 27 * h * E + h
    it = [("grad_sync", "reduce_scatter", "dp", F32 * dense, "fp32", 1),
          ("grad_sync", "reduce_scatter", "edp", F32 * expert, "fp32", 1),
          ("norm_grads", "all_reduce", "tp", F32 * norms, "fp32", 1),
          ("rerun", "all_reduce", "world", 4, "int32", 1),
          ("grad_norm", "all_reduce", "world", 4, "fp32", 1),
          ("param_gather", "all_gather", "dp", BF16 * dense, "bf16", 2),
          ("param_gather", "all_gather", "edp", BF16 * expert, "bf16", 2),
          ("train_step", "all_reduce", "mp", 4, "int32", 1), ("train_step", "all_reduce", "mp", 4, "fp32", 1),
          ("train_step", "all_reduce", "dp", 8, "fp32", 1),
          ("moe_metrics", "all_reduce", "dp", 4 * 28, "fp32", 1)]
    T = s // tp  # tokens per rank under SP
    A = s * h * BF16
    if dispatcher == "alltoall":  # counts AG over tp_ep (etp·ep·E int64); tokens, probs, tokens fwd and bwd
        moe_ep = 8 * E * 8 + 2 * (2 * T * k * h * BF16 + T * k * BF16)
    else:  # allgather: n = etp·ep; routing map (bool), probs, hidden AG, output RS; bwd AG, RS, RS probs
        n = ep
        moe_ep = n * T * E + 2 * n * T * E * BF16 + 4 * n * T * h * BF16
    return {"it": {0: it}, "totals": {0: {
        "sp": m * (28 * 10 * A + 2 * A + 3 * A), "ep": m * 27 * moe_ep,
        "dp": (F32 + 2 * BF16) * (dense + expert) + 8, "tp": F32 * norms + m * 3 * s * F32,
        "other": m * (3 * 8 * s + 4 * s + s * s) + 4 * 4 + 4 * 28}}}


def qwen2_hand(dispatcher: str) -> dict:
    """Case 3 (pp = 1). All 28 layers MoE, shared expert 20,480 with its gate (1 x h, replicated,
    ``sequence_parallel``: transformer/moe/shared_experts.py ~136-143), Q/K/V biases; padded vocabulary a
    multiple of 512 (151,936 -> 152,064). Expert grid etp·ep = 16 = world: edp = 1, no expert DP call; no
    distributed optimizer, so the expert optimizer's norm goes over the expert tp-ep-pp group after the dense
    one over mp (optimizer.py ~1803-1807; its group: optimizer/__init__.py ~1242)."""
    h, a, g, d, sf, E, k, s, tp, etp, ep, m = 3584, 28, 4, 128, 20480, 64, 8, 4096, 4, 2, 8, 2
    att = (2 * h * a * d + 2 * h * g * d) // tp + (a * d + 2 * g * d) // tp
    repl = 2 * h + h * E + h  # norms, router, shared-expert gate
    layer = att + repl + 3 * h * sf // tp
    vh = 152064 * h // tp
    dense = 28 * layer + 2 * vh + h
    norms = 28 * repl + h
    it = [("grad_sync", "all_reduce", "dp", F32 * dense, "fp32", 1),
          ("norm_grads", "all_reduce", "tp", F32 * norms, "fp32", 1),
          ("rerun", "all_reduce", "world", 4, "int32", 1),
          ("grad_norm", "all_reduce", "mp", 4, "fp32", 1), ("grad_norm", "all_reduce", "tpeppp", 4, "fp32", 1),
          ("train_step", "all_reduce", "mp", 4, "int32", 1), ("train_step", "all_reduce", "mp", 4, "fp32", 1),
          ("train_step", "all_reduce", "dp", 8, "fp32", 1),
          ("moe_metrics", "all_reduce", "dp", 4 * 28, "fp32", 1)]
    T = s // tp
    A = s * h * BF16
    if dispatcher == "alltoall":
        rows = T * etp * k  # tokens gathered over expert TP (uniform routing)
        moe_ep = 8 * etp * ep * E + 2 * (2 * T * k * h * BF16 + T * k * BF16)
        moe_sp = 2 * (2 * rows * h * BF16 + rows * BF16)  # AG tokens, AG probs, RS out; and their backward
    else:
        n = etp * ep
        moe_ep = n * T * E + 2 * n * T * E * BF16 + 4 * n * T * h * BF16
        moe_sp = 0
    return {"it": {0: it}, "totals": {0: {
        "sp": m * (28 * (10 * A + moe_sp) + 2 * A + 3 * A), "ep": m * 28 * moe_ep,
        "dp": F32 * dense + 8, "tp": F32 * norms + m * 3 * s * F32,
        "other": m * (3 * 8 * s + 4 * s + s * s) + 5 * 4 + 4 * 28}}}


def mixtral_hand() -> dict:
    """Case 4. Expert grid etp·ep·pp = 16 = world: edp = 1; the expert buffer exists (ep > 1), so the
    chained expert optimizer adds its norm over tp-ep-pp; MoE metrics over pp and dp."""
    h, a, g, d, E, k, V, s, tp, ep, m = 4096, 32, 8, 128, 8, 2, 32000, 4096, 2, 4, 2
    repl = 2 * h + h * E
    layer = (2 * h * a * d + 2 * h * g * d) // tp + repl
    vh = V * h // tp  # 32,000 is a multiple of 256
    n0, n1 = 16 * layer + vh, 16 * layer + h + vh
    it0 = [("grad_sync", "all_reduce", "dp", F32 * n0, "fp32", 1),
           ("norm_grads", "all_reduce", "tp", F32 * 16 * repl, "fp32", 1),
           ("rerun", "all_reduce", "world", 4, "int32", 1),
           ("grad_norm", "all_reduce", "mp", 4, "fp32", 1), ("grad_norm", "all_reduce", "tpeppp", 4, "fp32", 1),
           ("train_step", "all_reduce", "mp", 4, "int32", 1), ("train_step", "all_reduce", "mp", 4, "fp32", 1),
           ("moe_metrics", "all_reduce", "pp", 4 * 32, "fp32", 1), ("moe_metrics", "all_reduce", "dp", 4 * 32, "fp32", 1)]
    it1 = [("grad_sync", "all_reduce", "dp", F32 * n1, "fp32", 1),
           ("norm_grads", "all_reduce", "tp", F32 * (16 * repl + h), "fp32", 1),
           *it0[2:7], ("train_step", "all_reduce", "dp", 8, "fp32", 1), *it0[7:]]
    T = s // tp
    A = s * h * BF16
    rows = T * tp * k  # etp = tp = 2
    moe_sp = 2 * (2 * rows * h * BF16 + rows * BF16)
    moe_ep = 8 * tp * ep * E + 2 * (2 * T * k * h * BF16 + T * k * BF16)
    p2p = T * h * BF16
    return {"it": {0: it0, 1: it1}, "totals": {
        0: {"sp": m * (16 * (5 * A + moe_sp) + 2 * A), "ep": m * 16 * moe_ep, "pp": m * 2 * p2p,
            "dp": F32 * n0, "tp": F32 * 16 * repl, "other": m * (2 * 8 * s + s * s) + 5 * 4 + 2 * 4 * 32},
        1: {"sp": m * (16 * (5 * A + moe_sp) + 3 * A), "ep": m * 16 * moe_ep, "pp": m * 2 * p2p,
            "dp": F32 * n1 + 8, "tp": F32 * (16 * repl + h) + m * 3 * s * F32,
            "other": m * (8 * s + 4 * s + s * s) + 5 * 4 + 2 * 4 * 32}}}


def gpt67_hand() -> dict:
    """Case 5. Stage 0, chunk 0 buckets at max(40M, 1M·dp·cp) = 40,000,000 elements (training.py ~2179-2194)
    over the tensors in reverse order (distrib_optimizer.py ~505-575): per layer fc2 bias + weight (67,112,960,
    closes), fc1 bias + weight (67,125,248, closes), fc1 norm + qkv bias + weight (50,352,128, closes); the rest
    of the attention (16,789,504) joins the next layer's fc2 (83,902,464); after layer 0 the position
    embedding joins that rest (25,178,112), and the shared word embedding closes it and is a bucket of its own.
    Stage 1 does not bucket (training.py ~2504-2514, distributed_data_parallel.py ~160-171): the output-layer
    copy (``shared_embedding``, language_module.py ~276-290) alone, then one bucket of 3.2 G elements."""
    h, V, P = 4096, 50304, 2048  # padded vocabulary (tp = 1: a multiple of 128)
    layer = 12 * h * h + 13 * h
    fc2, fc1, qkv, rest = h + 4 * h * h, 4 * h + 4 * h * h, 2 * h + 3 * h + 3 * h * h, 2 * h + h + h * h
    assert fc2 + fc1 + qkv + rest == layer
    vh = V * h
    b0 = [(fc2, 1), (fc1, 16), (qkv, 16), (rest + fc2, 15), (rest + P * h, 1), (vh, 1)]
    b1 = [(vh, 1), (16 * layer + 2 * h, 1)]
    assert sum(n * c for n, c in b0) == 16 * layer + P * h + vh
    emb = ("tied_embedding", "all_reduce", "emb", F32 * vh, "fp32", 1)
    tail = [("rerun", "all_reduce", "world", 4, "int32", 1), ("grad_norm", "all_reduce", "world", 4, "fp32", 1)]
    ts = [("train_step", "all_reduce", "mp", 4, "int32", 1), ("train_step", "all_reduce", "mp", 4, "fp32", 1)]

    def rows(b: list[tuple[int, int]], extra: list) -> list:
        return ([("buckets", "reduce_scatter", "dp", F32 * n, "fp32", c) for n, c in b] + [emb] + tail
                + [("param_gather", "all_gather", "dp", BF16 * n, "bf16", c) for n, c in b] + ts + extra)

    n0, n1 = sum(n * c for n, c in b0), sum(n * c for n, c in b1)
    p2p = 2048 * h * BF16
    return {"it": {0: rows(b0, []), 1: rows(b1, [("train_step", "all_reduce", "dp", 8, "fp32", 1)])},
            "totals": {0: {"dp": (F32 + BF16) * n0, "pp": 2 * 2 * p2p + F32 * vh, "other": 16},
                       1: {"dp": (F32 + BF16) * n1 + 8, "pp": 2 * 2 * p2p + F32 * vh, "other": 16}},
            "buckets": {0: b0, 1: b1}}


def gpt67_plain_hand() -> dict:
    """Case 5 without the distributed optimizer: the default layout (param_and_grad_buffer.py ~954-1000) does
    not split the shared embedding, so stage 0's last bucket is the attention rest + positions + the word
    embedding, and stage 1 is one bucket; all-reduces, no parameter all-gather, the norm over mp."""
    h, V, P = 4096, 50304, 2048
    layer = 12 * h * h + 13 * h
    fc2, fc1, qkv, rest = h + 4 * h * h, 4 * h + 4 * h * h, 2 * h + 3 * h + 3 * h * h, 2 * h + h + h * h
    vh = V * h
    b0 = [(fc2, 1), (fc1, 16), (qkv, 16), (rest + fc2, 15), (rest + P * h + vh, 1)]
    b1 = [(16 * layer + 2 * h + vh, 1)]
    emb = ("tied_embedding", "all_reduce", "emb", F32 * vh, "fp32", 1)
    tail = [("rerun", "all_reduce", "world", 4, "int32", 1), ("grad_norm", "all_reduce", "mp", 4, "fp32", 1),
            ("train_step", "all_reduce", "mp", 4, "int32", 1), ("train_step", "all_reduce", "mp", 4, "fp32", 1)]

    def rows(b: list[tuple[int, int]]) -> list:
        return [("buckets", "all_reduce", "dp", F32 * n, "fp32", c) for n, c in b] + [emb] + tail

    return {"it": {0: rows(b0), 1: rows(b1) + [("train_step", "all_reduce", "dp", 8, "fp32", 1)]}, "totals": {}}


HAND = {
    "llama3-405b": (CASES["llama3-405b"], llama405_hand()),
    "deepseek-moe-16b": (CASES["deepseek-moe-16b"], deepseek_moe_hand("alltoall")),
    "deepseek-moe-16b/allgather": ((CASES["deepseek-moe-16b"][0], dataclasses.replace(
        CASES["deepseek-moe-16b"][1], moe_token_dispatcher_type="allgather")), deepseek_moe_hand("allgather")),
    "qwen2-57b-a14b": (CASES["qwen2-57b-a14b"], qwen2_hand("alltoall")),
    "qwen2-57b-a14b/allgather": ((CASES["qwen2-57b-a14b"][0], dataclasses.replace(
        CASES["qwen2-57b-a14b"][1], moe_token_dispatcher_type="allgather")), qwen2_hand("allgather")),
    "mixtral-8x7b": (CASES["mixtral-8x7b"], mixtral_hand()),
    "gpt3-6.7b": (CASES["gpt3-6.7b"], gpt67_hand()),
    "gpt3-6.7b/no-distopt": ((CASES["gpt3-6.7b"][0], dataclasses.replace(
        CASES["gpt3-6.7b"][1], distributed_optimizer=False)), gpt67_plain_hand()),
}


@pytest.fixture(scope="module")
def audits() -> dict[str, pd.DataFrame]:
    out = {}
    for name, ((model, parallel), hand) in HAND.items():
        out[name] = audit_table(model, parallel, stages=sorted(hand["it"]))
    return out


@pytest.mark.parametrize("name", list(HAND))
def test_iteration_rows_equal_the_hand_table(name, audits):
    hand = HAND[name][1]
    for stage, rows in hand["it"].items():
        assert iteration_rows(audits[name], stage) == rows, (name, stage)


@pytest.mark.parametrize("name", list(HAND))
def test_totals_by_parallelism_equal_megatrons_arithmetic(name, audits):
    hand = HAND[name][1]
    for stage, want in hand["totals"].items():
        assert totals(audits[name], stage) == want, (name, stage)


def test_print_per_iteration_totals_by_parallelism(audits, capsys):
    """The per-iteration bytes by parallelism of one rank per stage (``pytest -s`` shows them)."""
    rows = []
    for name, ((_, parallel), hand) in HAND.items():
        for stage in sorted(hand["totals"]) or sorted(hand["it"]):
            rows.append({"case": name, "stage": stage, "microbatches": parallel.num_microbatches,
                         **totals(audits[name], stage)})
    table = pd.DataFrame(rows).fillna(0).set_index(["case", "stage"])
    with capsys.disabled():
        print("\nper-iteration bytes on one rank, by parallelism (issue 24's five cases)")
        print(table.astype("int64").to_string())
    assert (table.drop(columns="microbatches").sum(axis=1) > 0).all()


def test_audit_totals_equal_the_prediction_for_the_cases():
    """The audit table is the predictor: its per-stage totals equal one rank's events (smaller copies of the
    cases so the expanded prediction stays small)."""
    small = {
        "moe": (load_model("tiny-moe"), ParallelConfig(tp=2, etp=1, ep=4, dp=4, sp=True, pp=2, global_batch=8,
                                                       distributed_optimizer=True, overlap_grad_reduce=True,
                                                       bucket_size=20_000)),
        "gpt": (load_model("tiny-gpt"), ParallelConfig(pp=2, vpp=2, dp=2, global_batch=4, overlap_grad_reduce=True,
                                                       distributed_optimizer=True, bucket_size=5_000)),
    }
    for model, parallel in small.values():
        a = audit_table(model, parallel)
        ev = predict_traffic(model, parallel, aggregate=False).events
        for stage in range(parallel.pp):
            mine = ev[ev["rank"] == Layout(parallel).rank_of(pp=stage)]
            s = a[a["stage"] == stage]
            assert s["calls_per_iteration"].sum() == len(mine)
            assert s["bytes_per_iteration"].sum() == mine["bytes"].sum()


# ------------------------------------------------------------------------------- 1: overlap_grad_reduce buckets
def test_only_the_first_stage_first_chunk_buckets():
    """training.py ~2504-2514: per_chunk_bucket_sizes = None for chunk_idx > 0 or pp_rank > 0, and
    disable_bucketing for chunk_idx > 0, whose buffer's buckets form one group (partition_buckets case 1,
    param_and_grad_buffer.py ~1715-1730) issued once the whole buffer is ready (at its first layer)."""
    gpt = load_model("tiny-gpt")
    p = ParallelConfig(pp=2, vpp=2, dp=2, global_batch=4, overlap_grad_reduce=True, bucket_size=5_000)
    ctx = Context(gpt, p)
    assert len(dpmod.buckets(ctx, 0, 0)) > 3
    for stage, chunk in ((0, 1), (1, 0), (1, 1)):
        (b,) = dpmod.buckets(ctx, stage, chunk)  # one bucket per buffer
        assert b.numel == dpmod.chunk_parameters(ctx, stage, chunk).dense
        first = ctx.chunk_layers(stage, chunk)[0]
        assert b.layer == (-1 if ctx.virtual_stage(stage, chunk) == 0 else first)  # ready when the chunk is done
    t = predict_traffic(gpt, p, aggregate=False)
    stage1 = t.select(rank=Layout(p).rank_of(pp=1), parallelism="dp", op="all_reduce").events
    stage1 = stage1[stage1["bytes"] > 8]
    assert len(stage1) == 2 and (stage1["phase"] == "backward").all()  # one per chunk, in the backward


def test_default_bucket_size_uses_dp_times_cp_and_ddp_num_buckets():
    """training.py resolve_ddp_bucket_size ~2179-2194: num_parameters // ddp_num_buckets, else bucket_size,
    else max(40M, 1M·|dp_cp|)."""
    gpt = load_model("gpt3-6.7b")
    assert dpmod.bucket_size(Context(gpt, ParallelConfig(dp=32, cp=2, global_batch=32))) == 64_000_000
    assert dpmod.bucket_size(Context(gpt, ParallelConfig(dp=32, global_batch=32))) == 40_000_000
    p = ParallelConfig(pp=2, dp=2, global_batch=2, overlap_grad_reduce=True, ddp_num_buckets=4)
    ctx = Context(gpt, p)
    n = dpmod.num_parameters(ctx, 0)
    assert dpmod.bucket_size(ctx) == n // 4
    assert 4 <= len(dpmod.buckets(ctx, 0, 0)) <= 6  # ~n/4 each, the tied embedding apart only with DistOpt
    with pytest.raises(ConfigError, match="ddp_num_buckets or bucket_size"):
        ParallelConfig(dp=2, global_batch=2, ddp_num_buckets=4, bucket_size=10)


# ----------------------------------------------------------------------- 2: DistOpt + tied embeddings + pp > 1
def test_shared_embedding_gets_its_own_bucket_only_with_the_distributed_optimizer():
    """distrib_optimizer.py ~530-575 (_does_param_require_new_bucket: shared_embedding) vs the default layout
    (param_and_grad_buffer.py ~954-1000), which does not split."""
    gpt = load_model("gpt3-6.7b")
    base = ParallelConfig(pp=2, dp=4, global_batch=8)
    vh = gpt.padded_vocab_size(1) * gpt.hidden_size
    for stage in (0, 1):
        plain = dpmod.buckets(Context(gpt, base), stage, 0)
        dist = dpmod.buckets(Context(gpt, dataclasses.replace(base, distributed_optimizer=True)), stage, 0)
        assert len(plain) == 1 and len(dist) == 2
        assert sum(b.numel for b in dist) == plain[0].numel
        assert dist[0 if stage == 1 else 1].numel == vh  # the output copy closes first, the embedding last
    # pp = 1: no copy, no split; untied: no shared_embedding attribute
    assert len(dpmod.buckets(Context(gpt, ParallelConfig(dp=4, global_batch=4, distributed_optimizer=True)), 0, 0)) == 1
    untied = dataclasses.replace(gpt, tied_embeddings=False)
    assert len(dpmod.buckets(Context(untied, dataclasses.replace(base, distributed_optimizer=True)), 0, 0)) == 1


# --------------------------------------------------------------------------------- 3: MoE + DistOpt double gather
def test_moe_distributed_optimizer_gathers_every_bucket_twice():
    """Each chained DistributedOptimizer's step_with_ready_grads walks bucket_groups +
    expert_parallel_bucket_groups of all its chunks (distrib_optimizer.py ~3139-3195); the expert optimizer
    holds the same chunks (optimizer/__init__.py ~1220-1240), nothing de-duplicates
    (param_and_grad_buffer.py start_param_sync never reads param_gather_dispatched)."""
    moe = load_model("tiny-moe")
    p = ParallelConfig(dp=4, ep=2, global_batch=4, distributed_optimizer=True)
    ev = predict_traffic(moe, p).select(rank=0, op="all_gather", phase="optimizer").events
    assert list(ev["group"].map(len)) == [4, 2] * 2  # dense over dp, expert over edp; then again
    # ep = 1 (etp = tp): the experts share the dense buffer, there is no expert optimizer, one pass
    one = predict_traffic(moe, dataclasses.replace(p, ep=1)).select(rank=0, op="all_gather", phase="optimizer")
    assert len(one) == 1


# -------------------------------------------------------------------------------------------- 5: small calls
def test_rerun_state_and_the_expert_grad_norm():
    """rerun_state_machine.py ~325-329 -> _reduce_any ~263-270: one int32 over the world per iteration unless
    --rerun-mode disabled; optimizer.py ~1795-1807: without DistOpt the dense and expert optimizers' groups
    differ (mp vs tp-ep-pp), so two norms."""
    moe = load_model("tiny-moe")
    p = ParallelConfig(tp=2, pp=2, dp=4, ep=4, sp=True, global_batch=4)
    t = predict_traffic(moe, p)
    lay = Layout(p)
    other = t.select(rank=0, phase="optimizer", parallelism="other", op="all_reduce").events
    assert list(other["dtype"])[:3] == ["int32", "fp32", "fp32"]
    assert [len(g) for g in other["group"].iloc[:3]] == [16, 4, 16]  # world, mp (tp·pp), tp·ep·pp
    assert sorted(other["group"].iat[2]) == sorted(lay.group_of(0, "tpeppp"))
    off = predict_traffic(moe, dataclasses.replace(p, rerun_mode="disabled"))
    assert len(off.select(rank=0, phase="optimizer", parallelism="other", op="all_reduce")) == len(other) - 1
    with pytest.raises(ConfigError, match="rerun_mode"):
        ParallelConfig(rerun_mode="off")


# ------------------------------------------------------------------------------------------ 6: shared experts
def test_shared_experts_run_before_routing_and_after_the_routed_backward():
    """moe_layer.py ~660-662: shared_experts_compute before route; backward: autograd runs the later-recorded
    routed path first."""
    moe = dataclasses.replace(load_model("tiny-moe"), num_shared_experts=1)
    p = ParallelConfig(tp=2, dp=2, ep=2, sp=True, global_batch=2, moe_aux_loss_coeff=0.01)
    t = predict_traffic(moe, p)
    layer = moe.moe_layer_pattern().index(True)
    A = moe.seq_length * moe.hidden_size * 2
    fwd = t.select(rank=0, microbatch=0, layer=layer, phase="forward").events
    ops = list(zip(fwd["op"], fwd["bytes"], strict=True))
    assert ops[2:4] == [("all_gather", A), ("reduce_scatter", A)]  # after the attention block: shared experts
    assert ops[4][0] == "all_reduce" and fwd["group"].map(len).iat[4] == 2  # then the router's aux-loss counts
    bwd = t.select(rank=0, microbatch=0, layer=layer, phase="backward").events
    first_a2a = list(bwd["op"]).index("all_to_all")
    assert first_a2a == 0
    assert list(zip(bwd["op"], bwd["bytes"], strict=True))[-6:-3] == [
        ("all_gather", A), ("all_gather", A), ("reduce_scatter", A)]  # shared experts, then attention


# ------------------------------------------------------------------------------------------------ 7: refusal
def test_moe_with_tp_needs_sp_and_the_message_cites_moe_layer():
    """moe_layer.py ~636-640 raises in training for attention TP > 1 without SP, whatever ep."""
    moe = load_model("tiny-moe")
    for ep in (1, 2):
        with pytest.raises(ConfigError, match=r"moe_layer\.py ~636-640"):
            predict_traffic(moe, ParallelConfig(tp=2, dp=2, ep=ep, global_batch=2))


# ----------------------------------------------------------------------- 4: expert-TP gathers with split sizes
def test_expert_tp_gather_with_unequal_splits_is_broadcasts():
    """mappings.py ~147-154 / ~187-196 call all_gather / reduce_scatter with tensor lists; ProcessGroupNCCL
    runs one collective for equal sizes, else one broadcast (reduce) per rank rooted at it, coalesced."""
    assert expert_tp_ops([5, 5], 8, "forward") == [("all_gather", 80, -1)]
    assert expert_tp_ops([5, 5], 8, "backward") == [("reduce_scatter", 80, -1)]
    assert expert_tp_ops([3, 7], 8, "forward") == [("broadcast", 24, 0), ("broadcast", 56, 1)]
    assert expert_tp_ops([3, 7, 0], 8, "backward") == [("reduce", 24, 0), ("reduce", 56, 1), ("reduce", 0, 2)]


# -------------------------------------------------------------------------------------------------- 8: options
def test_router_dtype_fp32_doubles_the_probabilities_and_the_combine_reduce_scatter():
    """token_dispatcher.py: probs in the router dtype (router.py); combine_preprocess reduce-scatters
    hidden_states.to(self.probs.dtype) (~824-833), so its bytes double in fp32, and its backward all-gather."""
    moe = load_model("tiny-moe")
    p = ParallelConfig(tp=2, dp=2, ep=2, sp=True, global_batch=2)
    layer = moe.moe_layer_pattern().index(True)
    base = predict_traffic(moe, p).select(rank=0, layer=layer, microbatch=0).events
    f32 = predict_traffic(moe, dataclasses.replace(p, moe_router_dtype="fp32")).select(
        rank=0, layer=layer, microbatch=0).events
    b_a2a, f_a2a = (x[x["op"] == "all_to_all"]["bytes"].tolist() for x in (base, f32))
    assert f_a2a[1] == 2 * b_a2a[1] and f_a2a[0] == b_a2a[0]  # probs doubled, tokens unchanged
    b_rs = base[(base["parallelism"] == "sp") & (base["op"] == "reduce_scatter") & (base["phase"] == "forward")]
    f_rs = f32[(f32["parallelism"] == "sp") & (f32["op"] == "reduce_scatter") & (f32["phase"] == "forward")]
    assert f_rs["bytes"].iat[-1] == 2 * b_rs["bytes"].iat[-1] and f_rs["dtype"].iat[-1] == "fp32"


def test_load_balancing_types_and_expert_bias():
    """router.py ~805-833: aux_loss (E over tp·cp), seq_aux_loss (b·E over tp·cp), global_aux_loss (E over
    tp·dp·cp); finalize_model_grads.py ~334-371: the expert-bias update all-reduces n·E fp32 over tp·dp·cp;
    training.py ~3456-3462 tracks "load_balancing_loss" for any type containing "aux_loss"."""
    moe = load_model("tiny-moe")
    E = moe.num_experts
    p = ParallelConfig(tp=2, dp=2, ep=2, sp=True, micro_batch=2, global_batch=4, moe_aux_loss_coeff=0.01,
                       moe_router_load_balancing_type=("aux_loss", "seq_aux_loss", "global_aux_loss"))
    layer = moe.moe_layer_pattern().index(True)
    t = predict_traffic(moe, p)
    ar = t.select(rank=0, layer=layer, microbatch=0, phase="forward", op="all_reduce", parallelism="ep").events
    assert list(zip(ar["bytes"], ar["group"].map(len), strict=True)) == [(8 * E, 2), (8 * 2 * E, 2), (8 * E, 4)]
    bias = predict_traffic(moe, dataclasses.replace(p, moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                                                    moe_router_enable_expert_bias=True))
    ev = bias.select(rank=0, phase="optimizer", parallelism="ep").events
    assert list(ev["bytes"]) == [4 * moe.num_moe_layers * E] and len(ev["group"].iat[0]) == 4
    # rerun, the two norms (mp, tp-ep-pp), train_step's two; no metric is tracked for "none"
    assert len(bias.select(rank=0, parallelism="other", op="all_reduce", phase="optimizer").events) == 5
    seq = predict_traffic(moe, dataclasses.replace(p, moe_router_load_balancing_type="seq_aux_loss"))
    metrics = seq.select(rank=0, phase="optimizer", parallelism="other").events
    # "aux_loss" in "seq_aux_loss": load_balancing_loss is tracked too (zeros, dp average only), then the
    # recorded seq_load_balancing_loss over tp·cp and dp
    assert list(metrics["bytes"][metrics["bytes"] == 4 * moe.num_layers].index.map(
        lambda i: len(metrics["group"][i]))) == [2, 2, 2]
    assert (metrics["bytes"] == 4 * moe.num_layers).sum() == 3


def test_cross_entropy_fusion_and_per_token_loss():
    """fusions/fused_cross_entropy.py ~87-122: max, then cat(predicted, sum_exp) in one all-reduce;
    finalize_model_grads.py ~694-706: num_tokens (int32) broadcast from the last stage over pp, then all-reduced
    over dp·cp."""
    gpt = load_model("tiny-gpt")
    p = ParallelConfig(tp=2, pp=2, dp=2, global_batch=2)
    T = gpt.seq_length
    last = Layout(p).rank_of(pp=1)
    fused = predict_traffic(gpt, dataclasses.replace(p, cross_entropy_loss_fusion=True))
    ce = fused.select(rank=last, microbatch=0, dtype="fp32", op="all_reduce", phase="forward").events
    assert list(ce["bytes"]) == [4 * T, 8 * T]
    tok = predict_traffic(gpt, dataclasses.replace(p, calculate_per_token_loss=True))
    ev = tok.select(rank=0, phase="optimizer", dtype="int32").events
    assert list(zip(ev["op"], ev["bytes"], strict=True))[:2] == [("broadcast", 4), ("all_reduce", 4)]
    assert ev["peer"].iat[0] == last  # the root is the last stage
    with pytest.raises(ConfigError, match="num_distributed_optimizer_instances"):
        predict_traffic(gpt, ParallelConfig(dp=4, global_batch=4, distributed_optimizer=True,
                                            num_distributed_optimizer_instances=2))


def test_uneven_pipeline_split():
    """transformer_block.py get_num_layers_to_build ~76-205."""
    p = CASES["llama3-405b"][1]
    assert p.virtual_stage_layers(126) == [7] + [8] * 14 + [7]
    u = ParallelConfig(pp=4, num_layers_in_first_pipeline_stage=2, num_layers_in_last_pipeline_stage=4)
    assert u.virtual_stage_layers(12) == [2, 3, 3, 4]
    with pytest.raises(ConfigError, match="pp=16 does not divide num_layers=126"):
        ParallelConfig(pp=16).virtual_stage_layers(126)
    ctx = Context(load_model("llama3-405b"), p)
    assert list(ctx.chunk_layers(0, 0)) == list(range(7)) and list(ctx.chunk_layers(15, 0)) == list(range(119, 126))


def test_qk_layernorm_is_all_reduced_over_tp_without_sp():
    """finalize_model_grads.py ~459-461: q_layernorm / k_layernorm grads are summed over TP even without SP."""
    m = ModelSpec(name="qk", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                  vocab_size=1000, seq_length=32, qk_layernorm=True, normalization="RMSNorm")
    t = predict_traffic(m, ParallelConfig(tp=2, global_batch=1))
    ev = t.select(rank=0, phase="optimizer", parallelism="tp").events
    assert list(ev["bytes"]) == [4 * 2 * 2 * 16]  # fp32 · layers · (q, k) · head_dim


# ------------------------------------------------------------------------------------ 9: today's architectures
def test_deepseek_v3_parameters_by_hand():
    """DeepSeek-V3 (arXiv:2412.19437 Sec. 4.2) in Megatron-LM's MLA layout (multi_latent_attention.py
    ~505-630): 671B in the main model, 11.6B in the MTP layer (its embedding and head shared), 37B activated."""
    m = load_model("deepseek-v3")
    h, a, ql, kvl, dq, dr, dv = 7168, 128, 1536, 512, 128, 64, 128
    att = h * ql + ql + ql * a * (dq + dr) + h * (kvl + dr) + kvl + kvl * a * (dq + dv) + a * dv * h
    assert m.attention_parameter_split(1) == (att - h * ql - ql - h * (kvl + dr) - kvl,
                                              h * ql + ql + h * (kvl + dr) + kvl)
    expert = 3 * h * 2048
    dense_layer = att + 2 * h + 3 * h * 18432
    moe_layer = att + 2 * h + 256 * expert + expert + h * 256
    main = 3 * dense_layer + 58 * moe_layer + 2 * 129280 * h + h
    mtp = 3 * h + 2 * h * h + moe_layer
    assert m.num_parameters() == main + mtp
    assert round(main / 1e9) == 671 and round(mtp / 1e9, 1) == 11.6
    active = 3 * dense_layer + 58 * (moe_layer - 248 * expert) + 2 * 129280 * h + h
    assert m.num_active_parameters() == active and abs(active / 37e9 - 1) < 0.02


def test_mla_changes_tp_and_cp_bytes():
    """With SP the MLA block gathers its compressed activations (T·(d_rope + q_lora + kv_lora)) instead of A
    (multi_latent_attention.py ~645-875); the CP ring carries the up-projected K and V of every head:
    T_cp·(a/tp)·(d_qk + d_rope + d_v) per step (TE context_parallel.py ~1690)."""
    m = dataclasses.replace(load_model("deepseek-v3"), mtp_num_layers=0)
    p = ParallelConfig(tp=2, cp=2, ep=8, dp=8, sp=True, global_batch=8)
    a = audit_table(m, p)
    T = 4096 // 2
    att = a[(a["scope"] == "micro-batch") & a["origin"].str.contains("linear_qkv")]
    fwd = att[att["phase"] == "forward"]
    assert list(zip(fwd["op"], fwd["bytes"], strict=True)) == [
        ("all_gather", T * 64 * 2), ("all_gather", T * 1536 * 2), ("all_gather", T * 512 * 2),
        ("reduce_scatter", T * 7168 * 2)]
    bwd = att[att["phase"] == "backward"]
    assert list(zip(bwd["op"], bwd["bytes"], strict=True)) == [
        ("all_gather", T * 7168 * 2), ("all_gather", T * 512 * 2), ("reduce_scatter", T * 512 * 2),
        ("all_gather", T * 1536 * 2), ("reduce_scatter", T * 1536 * 2), ("reduce_scatter", T * 64 * 2)]
    ring = a[a["parallelism"] == "cp"]
    assert set(ring["bytes"]) == {T * (128 // 2) * (128 + 64 + 128) * 2}
    with pytest.raises(ConfigError, match="mtp_num_layers"):
        audit_table("deepseek-v3", p)
    with pytest.raises(ConfigError, match="multi_latent_attention with tp>1 and sp=False"):
        audit_table(dataclasses.replace(m, num_experts=0, moe_router_topk=0, num_shared_experts=0,
                                        moe_layer_freq=1), ParallelConfig(tp=2, dp=2, global_batch=2))


def test_moe_parallel_folding_ep_spans_tp_and_dp():
    """Megatron-Core's parallel folding: the expert grid (etp-ep-edp-pp, parallel_state.py
    expert_decoder_rank_generator) is laid out apart from the attention grid, so with etp = 1 the EP group
    of Qwen3-235B's published ep 32 with tp 4 · dp 16 · pp 2 spans 4 TP x 8 DP ranks."""
    p = ParallelConfig(tp=4, etp=1, ep=32, dp=16, pp=2, sp=True, global_batch=32)
    lay = Layout(p)
    ep0 = set(lay.group_of(0, "ep"))
    assert ep0 == set(range(32)) and set(lay.group_of(0, "tp")) <= ep0 and len(ep0 & set(lay.group_of(0, "dp"))) == 8
    a = audit_table("qwen3-235b-a22b", p, stages=[0])
    a2a = a[a["op"] == "all_to_all"]
    assert len(a2a) and (a2a["group"] == "ep").all()


def test_gpt_oss_and_qwen3_attention_options():
    """GPT-OSS: TE takes sliding windows under cp_comm_type a2a / all_gather only and sinks under a2a only
    (context_parallel.py:5057-5067);
    the sinks are one TP-split logit per head. Qwen3: q/k norms of d each per layer, all-reduced over TP."""
    oss = load_model("gpt-oss-120b")
    assert oss.attention_parameter_split(4)[0] - dataclasses.replace(
        oss, softmax_type="vanilla").attention_parameter_split(4)[0] == 64 // 4
    with pytest.raises(ConfigError, match="sliding-window attention needs cp_comm_type"):
        audit_table(oss, ParallelConfig(tp=4, cp=2, ep=8, dp=8, sp=True, global_batch=8))
    with pytest.raises(ConfigError, match="attention sinks .* needs cp_comm_type='a2a'"):
        audit_table(oss, ParallelConfig(tp=4, cp=2, ep=8, dp=8, sp=True, global_batch=8, cp_comm_type="all_gather"))
    a = audit_table(oss, ParallelConfig(tp=4, cp=2, ep=8, dp=8, sp=True, global_batch=8, cp_comm_type="a2a"),
                    stages=[0])
    assert set(a.loc[a["parallelism"] == "cp", "op"]) == {"all_to_all"}
    q3 = load_model("qwen3-30b-a3b")
    assert q3.attention_parameter_split(2)[1] == 2 * 128
    with pytest.raises(ConfigError, match="hybrid Mamba"):
        audit_table(dataclasses.replace(q3, hybrid_override_pattern="M-M-"), ParallelConfig(tp=2, sp=True,
                                                                                           global_batch=1))
