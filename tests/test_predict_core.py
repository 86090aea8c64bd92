"""Hand-computed bytes of the analytical predictor on small configurations (llmcomm.predict)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import TINY

from llmcomm import ConfigError, ParallelConfig
from llmcomm.predict import predict_traffic
from llmcomm.predict.schedule import interleaved, one_f_one_b

H, S = 64, 32
A = 1 * S * H * 2  # b·s·h·bf16 = 4096
CE = S * 4  # b·s fp32
VPAD = 1024  # 1000 padded to a multiple of 128 (tp=1) or 256 (tp=2)


def pc(**kw) -> ParallelConfig:
    kw.setdefault("seq_len", S)
    return ParallelConfig(**kw)


def vol(t, **filters) -> int:
    t = t.select(**filters) if filters else t
    return int((t.events["bytes"] * t.events["count"]).sum())


def calls(t, **filters) -> int:
    return int(t.select(**filters).events["count"].sum())


MODEL_OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv"]
# get_batch_on_this_tp_rank with pp = 1: tokens, labels (int64), loss_mask (fp32), position_ids (int64),
# the (b, 1, s, s) bool attention mask — per micro-batch, over TP
BATCH = 8 * S + 8 * S + 4 * S + 8 * S + S * S


def model(t):
    """The model's calls: no batch broadcast, no per-iteration scalars (tagged ``other``/4-8 byte dp)."""
    t = t.select(op=MODEL_OPS)
    ev = t.events
    keep = ~((ev["parallelism"] == "other") | ((ev["parallelism"] == "dp") & (ev["bytes"] <= 8)))
    return type(t)(ev[keep].reset_index(drop=True), t.meta)


def test_tp_without_sp_exact():
    t = predict_traffic(TINY, pc(tp=2, global_batch=2))  # m = 2 micro-batches
    r0 = t.select(rank=0)
    # per micro-batch: forward emb AR + 2 per layer + 3 CE fp32 AR; backward output AR + 2 per layer
    assert calls(r0, phase="forward", op="all_reduce") == 2 * (1 + 8 + 3)
    assert calls(r0, phase="backward", op="all_reduce") == 2 * (1 + 8)
    assert vol(model(r0)) == 2 * ((1 + 8) * A + 3 * CE + (1 + 8) * A)
    # plus the batch broadcast (5 tensors per micro-batch) and the three 4-byte scalars over tp x pp
    assert calls(r0, op="broadcast") == 2 * 5 and vol(r0, op="broadcast") == 2 * BATCH
    # + the rerun state machine's int32 over the world (rerun_state_machine.py _reduce_any)
    assert calls(r0, parallelism="other", op="all_reduce") == 4 and vol(r0, parallelism="other", op="all_reduce") == 16
    assert set(r0.select(op="broadcast").events["parallelism"]) == {"other"}
    assert set(r0.events["op"]) == {"all_reduce", "broadcast"}
    ce = model(r0).select(dtype="fp32").events
    assert len(ce) == 6 and (ce["bytes"] == CE).all()


def test_tp_with_sp_exact():
    t = predict_traffic(TINY, pc(tp=2, sp=True, global_batch=1))
    r0 = model(t.select(rank=0, phase=["forward", "backward"]))
    fwd = r0.select(phase="forward").events
    # emb RS, 4 layers × (AG RS AG RS), output AG, 3 CE all-reduces
    assert list(fwd["op"][:5]) == ["reduce_scatter", "all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]
    assert calls(r0, phase="forward", op="all_gather") == 4 * 2 + 1
    assert calls(r0, phase="forward", op="reduce_scatter") == 4 * 2 + 1
    # backward: output AG RS (layers.py LinearWithGradAccumulationAndAsyncCommunication.backward: re-gather
    # of the input, reduce-scatter of its gradient), per block AG AG RS (8 blocks), embedding AG
    assert calls(r0, phase="backward", op="all_gather") == 1 + 16 + 1
    assert calls(r0, phase="backward", op="reduce_scatter") == 1 + 8
    assert vol(r0) == (18 * A + 3 * CE) + (2 + 24 + 1) * A
    # SP all-reduces the replicated norm gradients once (fp32): 2 LayerNorms/layer × 4 + final, 2h each
    norms = t.select(rank=0, phase="optimizer", parallelism="tp").events
    assert len(norms) == 1 and norms["bytes"].iat[0] == (4 * 2 + 1) * 2 * H * 4


def test_pp_send_recv_peers_and_tied_embedding():
    t = predict_traffic(TINY, pc(pp=2, global_batch=4))
    m = t.matrix("direct", parallelism="pp").toarray()
    emb = VPAD * H * 4  # tied-embedding fp32 all-reduce, 2/n·S each way for n = 2
    assert m[0, 1] == 4 * A + emb and m[1, 0] == 4 * A + emb
    sends0 = t.select(rank=0, op="send").events
    assert (sends0["peer"] == 1).all() and (sends0["phase"] == "forward").all() and len(sends0) == 4
    recvs0 = t.select(rank=0, op="recv").events
    assert (recvs0["phase"] == "backward").all() and (recvs0["peer"] == 1).all()
    assert calls(t, op="all_reduce", parallelism="pp") == 2


def test_pp_sp_p2p_is_divided_by_tp():
    t = predict_traffic(TINY, pc(tp=2, pp=2, sp=True, global_batch=2))
    assert set(t.select(op="send").events["bytes"]) == {A // 2}


def test_interleaved_wraps_last_stage_to_first():
    t = predict_traffic(TINY, pc(pp=2, vpp=2, global_batch=2))
    s1 = t.select(rank=1, op="send", phase="forward").events
    assert len(s1) == 2 and (s1["peer"] == 0).all()  # chunk 0 of stage 1 feeds chunk 1 of stage 0
    s0 = t.select(rank=0, op="send", phase="forward").events
    assert len(s0) == 4  # both chunks of stage 0 send forward
    b0 = t.select(rank=0, op="send", phase="backward").events
    assert len(b0) == 2 and (b0["peer"] == 1).all()  # only chunk 1 (virtual stage 2) sends back


def test_schedules_cover_every_step_once():
    for p in (2, 4):
        for r in range(p):
            s = one_f_one_b(8, p, r)
            assert sorted(s) == sorted([("F", i, 0) for i in range(8)] + [("B", i, 0) for i in range(8)])
            assert s[: p - r - 1] == [("F", i, 0) for i in range(p - r - 1)]
            si = interleaved(4, p, r, 2)
            assert sorted(si) == sorted([(k, i, c) for k in "FB" for i in range(4) for c in range(2)])


def test_one_f_one_b_is_warm_up_pairs_and_cool_down():
    """Megatron's non-interleaved order (``forward_backward_pipelining_without_interleaving``): ``w`` warm-up
    forwards, one forward and the oldest backward per step of the steady state, then the ``w`` cool-down
    backwards, with ``w = min(p - r - 1, m)``; each call a fresh list (the steps are shared tuples)."""
    for m in (0, 1, 3, 8, 33):
        for p in (1, 2, 5, 32):
            for r in range(p):
                s = one_f_one_b(m, p, r)
                w = min(p - r - 1, m)
                issued, oldest = 0, 0  # next forward to issue, oldest backward not yet run
                expect = []
                for _ in range(w):
                    expect.append(("F", issued, 0))
                    issued += 1
                while issued < m:
                    expect += [("F", issued, 0), ("B", oldest, 0)]
                    issued, oldest = issued + 1, oldest + 1
                expect += [("B", i, 0) for i in range(oldest, m)]
                assert s == expect and s is not one_f_one_b(m, p, r)


def test_dp_allreduce_is_the_model_gradient():
    t = predict_traffic(TINY, pc(dp=2, global_batch=4))
    n_params = TINY.num_parameters() + (VPAD - TINY.vocab_size) * H
    dp = t.select(rank=0, parallelism="dp").events
    # the gradient all-reduce, then train_step's loss report ([loss, tokens], 2 fp32) over DP
    assert list(dp["op"]) == ["all_reduce", "all_reduce"] and list(dp["bytes"]) == [n_params * 4, 8]
    assert list(dp["group"].iat[0]) == [0, 1]


def test_dp_tp_shards_sum_to_the_model():
    t = predict_traffic(TINY, pc(tp=2, dp=2, global_batch=2))
    per_rank = t.select(rank=0, parallelism="dp").events["bytes"].iat[0] // 4
    # replicated per TP rank: 2 norms/layer + final norm (2h each), learned nothing; biases none
    repl = (4 * 2 + 1) * 2 * H
    assert 2 * (per_rank - repl) + repl == TINY.num_parameters() + (VPAD - TINY.vocab_size) * H


def test_distributed_optimizer_and_fsdp():
    n_params = TINY.num_parameters() + (VPAD - TINY.vocab_size) * H
    t = predict_traffic(TINY, pc(dp=2, global_batch=2, distributed_optimizer=True))
    d = model(t.select(rank=0, parallelism="dp")).events
    assert list(d["op"]) == ["reduce_scatter", "all_gather"]
    assert list(d["bytes"]) == [n_params * 4, n_params * 2]
    # the gradient norm is all-reduced over every rank with the distributed optimizer
    norm = t.select(rank=0, parallelism="other").events
    # the rerun state machine's int32, then the fp32 norm: both over the world
    assert len(norm) == 2 and all(list(g) == [0, 1] for g in norm["group"]) and list(norm["bytes"]) == [4, 4]
    assert list(norm["dtype"]) == ["int32", "fp32"]
    f = predict_traffic(TINY, pc(dp=2, global_batch=4, fsdp=True))  # m = 2
    r0 = model(f.select(rank=0, parallelism="dp"))
    assert calls(r0, op="all_gather", phase="forward") == 2 * (4 + 1)  # 4 layers + the edge unit
    assert calls(r0, op="all_gather", phase="backward") == 2 * (4 + 1)
    assert calls(r0, op="reduce_scatter") == 2 * (4 + 1)
    assert vol(r0, op="reduce_scatter") == 2 * n_params * 4
    assert vol(r0, op="all_gather") == 2 * 2 * n_params * 2


def test_recompute_full_repeats_forward_tp_calls():
    base = predict_traffic(TINY, pc(tp=2, global_batch=2))
    sel = predict_traffic(TINY, pc(tp=2, global_batch=2, recompute="selective"))
    full = predict_traffic(TINY, pc(tp=2, global_batch=2, recompute="full"))
    assert vol(sel) == vol(base)
    extra = vol(full) - vol(base)
    assert extra == 2 * 2 * 8 * A  # 2 ranks × 2 micro-batches × 8 layer all-reduces repeated
    assert calls(full, rank=0, phase="backward") == calls(base, rank=0, phase="backward") + 2 * 8


def test_bad_configs_name_the_rule():
    with pytest.raises(ConfigError, match="does not divide num_attention_heads"):
        predict_traffic(TINY, pc(tp=8, global_batch=1))
    with pytest.raises(ConfigError, match="does not divide num_layers"):
        predict_traffic(TINY, pc(pp=3, global_batch=3))
    with pytest.raises(ConfigError, match="needs an MoE model"):
        predict_traffic(TINY, pc(dp=2, ep=2, global_batch=2))
    with pytest.raises(ConfigError, match="framework"):
        predict_traffic(TINY, pc(), framework="jax")


def test_aggregated_equals_expanded():
    p = pc(tp=2, pp=2, dp=2, sp=True, global_batch=8, distributed_optimizer=True)
    e = predict_traffic(TINY, p, aggregate=False)
    a = predict_traffic(TINY, p, aggregate=True)
    assert len(a) < len(e) and (a.events["count"] > 1).any()
    for alg in ("direct", "ring"):
        assert abs(e.matrix(alg) - a.matrix(alg)).max() == 0
    by = ["parallelism", "phase", "op"]
    assert e.volumes(by).equals(a.volumes(by))
    assert a.expand().volumes(by).equals(e.volumes(by))


def test_events_are_in_schedule_order():
    t = predict_traffic(TINY, pc(pp=2, global_batch=4))
    ev = t.select(rank=1, parallelism="pp").events  # last stage of 1F1B: recv F0, send B0, recv F1, ...
    assert list(zip(ev["op"], ev["microbatch"], strict=True))[:4] == [("recv", 0), ("send", 0), ("recv", 1), ("send", 1)]
    assert np.all(np.diff(t.events["rank"].to_numpy()) >= 0)


def test_cli_prints_summary_and_refuses_bad_config(tmp_path, capsys):
    from llmcomm.cli import main

    out = tmp_path / "t.parquet"
    assert main(["predict", "gpt3-125m", "--tp", "2", "--pp", "2", "--dp", "2", "--global-batch", "8",
                 "--seq-len", "128", "--sp", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for needle in ("message bytes per parallelism", "per phase", "intra-node", "TP share"):
        assert needle in text
    from llmcomm import read_trace

    assert read_trace(out).meta["source"] == "predicted"
    assert main(["predict", "gpt3-125m", "--tp", "5"]) == 1  # a configuration error (2 is for usage errors)
    assert "does not divide num_attention_heads" in capsys.readouterr().err


def test_context_parallel_ring_and_dp_cp_group():
    t = predict_traffic(TINY, pc(cp=2, dp=2, global_batch=2))  # order tp-cp-ep-dp-pp: CP pairs (0,1), (2,3)
    kv = 2 * (S // 2) * (4 * 16) * 2  # K and V: 2 · b·s/cp · g·d · bf16
    r0 = t.select(rank=0, parallelism="cp").events
    # 4 layers × (fwd: cp-1 = 1 step; bwd: cp = 2 steps, TE AttnFuncWithCPAndKVP2P.backward), send+recv each
    assert len(r0) == 4 * (1 + 2) * 2
    assert set(r0.loc[r0["phase"] == "forward", "bytes"]) == {kv}
    assert list(r0.loc[r0["phase"] == "backward", "bytes"][:4]) == [kv] * 4  # K,V at step 0, dK,dV at the last
    assert set(r0["peer"]) == {1}
    dp = t.select(rank=0, parallelism="dp").events
    assert [list(g) for g in dp["group"]] == [[0, 1, 2, 3]] * 2  # gradients and loss over DP × CP
    tp2 = predict_traffic(TINY, pc(cp=2, tp=2, global_batch=1))
    assert set(tp2.select(op="all_reduce", dtype="bf16").events["bytes"]) == {1 * (S // 2) * H * 2}


def test_valid_cases_name_the_broken_rule():
    from llmcomm.analysis.sweeps import valid_cases

    cases = {"fits": (TINY, {"tp": 2, "global_batch": 2}), "tp8": (TINY, {"tp": 8, "global_batch": 2}),
             "tp2 of 1.3b": ("gpt3-1.3b", {"tp": 2, "global_batch": 2})}
    valid, skipped = valid_cases(cases)
    assert list(valid) == ["fits", "tp2 of 1.3b"] and valid["fits"] == cases["fits"]
    assert skipped == {"tp8": "tiny: tp=8 does not divide num_attention_heads=4"}


def test_tp_closed_form_by_hand_and_against_the_prediction():
    from llmcomm.analysis.sweeps import tp_closed_form

    par = pc(tp=2, pp=2, global_batch=2)   # L = 4, m = 2, world 4
    c = tp_closed_form(TINY, par)
    assert c.activation_bytes == A == 4096 and c.cross_entropy_bytes == 3 * CE == 384
    assert c.tp_bytes == 18 * 4096 + 384 == 74112          # 4·L·A + 2·A + CE
    assert c.tp_sp_bytes == 45 * 4096 + 384 == 184704      # 10·L·A + 5·A + CE
    assert c.cap == 74112 / (74112 + 2 * 4096)               # one boundary: two sends of A
    assert c.cap_sp == 184704 / (184704 + 4096)              # ... of A/tp
    assert c.iteration_tp_bytes == 2 * 2 * 74112 and c.iteration_tp_sp_bytes == 2 * 2 * 184704
    # the predictor agrees: TP bytes of the iteration, and SP's per-micro-batch TP+SP bytes
    assert vol(predict_traffic(TINY, par), parallelism="tp") == c.iteration_tp_bytes
    from llmcomm.analysis.api import tp_microbatch_bytes

    assert tp_microbatch_bytes(predict_traffic(TINY, pc(tp=2, pp=2, sp=True, global_batch=2))) == \
        c.iteration_tp_sp_bytes
    assert tp_closed_form(TINY, pc(tp=2, global_batch=2)).cap == 1.0   # no pipeline, no cap


def test_tp_share_sweeps_skip_tp1_and_keep_interleaved_multiples():
    from llmcomm.analysis.sweeps import tp_share_sweeps

    cases = {"tp2": (TINY, {"tp": 2, "global_batch": 1}), "dp2": (TINY, {"dp": 2, "global_batch": 2}),
             "tp2 vpp +SP": (TINY, {"tp": 2, "pp": 2, "vpp": 2, "sp": True, "global_batch": 2})}
    curves = tp_share_sweeps(cases, [1, 2, 3, 4])
    assert list(pd.unique(curves["configuration"])) == ["tp2", "tp2 vpp +SP"]   # tp 1 has no TP bytes
    by = curves.set_index(["configuration", "microbatches"])
    assert by.loc["tp2 vpp +SP"].index.tolist() == [2, 4]                    # m a multiple of pp = 2
    assert set(by.loc["tp2", "sp"]) == {"without SP"} and set(by.loc["tp2 vpp +SP", "sp"]) == {"with SP"}
    # tp2 alone: two ranks, each 18·A + 3·CE per micro-batch
    assert by.loc["tp2", "tp"].tolist() == [m * 2 * 74112 for m in (1, 2, 3, 4)]
