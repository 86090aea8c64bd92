"""Expert-parallel all-to-alls of the predictor: uniform expectation, exact routing matrices, bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import TINY_MOE
from hypothesis import given, settings
from hypothesis import strategies as st

from llmcomm import ConfigError, ParallelConfig
from llmcomm.predict import predict_traffic

MOE = TINY_MOE
H, S, E, K = 64, 32, 4, 2


def pc(**kw) -> ParallelConfig:
    kw.setdefault("seq_len", S)
    return ParallelConfig(**kw)


def test_four_all_to_alls_per_moe_layer_uniform():
    t = predict_traffic(MOE, pc(dp=4, ep=2, global_batch=8))  # m = 2, MoE layers 0 and 2
    every = t.select(rank=0, op="all_to_all").events
    a = every[every["bytes"] == S * K * H * 2]  # the token all-to-alls
    assert len(a) == 2 * 2 * 4
    assert list(a["phase"][:2]) == ["forward", "forward"] and list(a["phase"][2:4]) == ["forward", "forward"]
    per_peer = S * K * H * 2 // 2  # T·k·h·act / ep
    assert all(list(s) == [per_peer, per_peer] for s in a["split_bytes"])
    assert list(a["group"].iat[0]) == [0, 1]
    # token_dispatcher.py MoEAlltoAllTokenDispatcher.token_dispatch: the probabilities' all-to-all beside the
    # tokens (T·k bf16), and its backward; nothing else is an all-to-all
    probs = every[every["bytes"] != S * K * H * 2]
    assert len(probs) == 2 * 2 * 2 and (probs["bytes"] == S * K * 2).all()
    assert list(every["bytes"][:3]) == [S * K * H * 2, S * K * 2, S * K * H * 2]  # dispatch, probs, combine
    # preprocess: all-gather of the E int64 token counts over the tp_ep group (etp·ep = 2 ranks)
    counts = t.select(rank=0, op="all_gather").events
    assert len(counts) == 2 * 2 and (counts["bytes"] == 2 * E * 8).all() and (counts["dtype"] == "int64").all()


def test_expert_params_reduce_over_expert_data_parallel_group():
    t = predict_traffic(MOE, pc(dp=4, ep=2, global_batch=4))
    dp = t.select(rank=0, parallelism="dp").events
    dp = dp[dp["bytes"] > 8]  # without the 8-byte loss report
    groups = [list(g) for g in dp["group"]]
    assert groups == [[0, 1, 2, 3], [0, 2]]
    expert = dp["bytes"].iat[1] // 4
    assert expert == 2 * (E // 2) * 2 * H * 64  # 2 MoE layers × 2 local experts × 2 matrices × h × f_e


def uniform_routing(world: int, m: int) -> np.ndarray:
    arr = np.zeros((MOE.num_layers, m, world, E), dtype=np.int64)
    arr[[0, 2]] = S * K // E
    return arr


def test_uniform_routing_matrix_equals_uniform_expectation():
    p = pc(dp=4, ep=2, global_batch=8)
    u = predict_traffic(MOE, p)
    r = predict_traffic(MOE, p, routing=uniform_routing(4, 2))
    assert abs(u.matrix("direct", parallelism="ep") - r.matrix("direct", parallelism="ep")).max() == 0
    assert u.volumes().equals(r.volumes())


def test_routing_counts_give_exact_splits_and_transposes():
    p = pc(dp=2, ep=2, global_batch=2)  # m = 1, world 2, expert 0,1 on rank 0; 2,3 on rank 1
    arr = np.zeros((4, 1, 2, E), dtype=np.int64)
    arr[0, 0, 0] = [10, 20, 30, 4]  # rank 0 -> rank0: 30 tokens, rank1: 34
    arr[0, 0, 1] = [1, 2, 3, 50]  # rank 1 -> rank0: 3, rank1: 53
    df = pd.DataFrame([(0, 0, la, s, e, int(arr[la, 0, s, e])) for la in range(4) for s in range(2)
                       for e in range(E) if arr[la, 0, s, e]],
                      columns=["iteration", "microbatch", "layer", "src_rank", "expert", "tokens"])
    for routing in (arr, df):
        t = predict_traffic(MOE, p, routing=routing)
        a0 = t.select(rank=0, op="all_to_all", layer=0).events
        hb, pb = H * 2, 2
        # forward: tokens dispatch, probabilities dispatch, tokens combine; backward: the combine's
        # (dispatch-shaped), the probabilities' (combine-shaped), the dispatch's (combine-shaped)
        assert [list(s) for s in a0["split_bytes"]] == [
            [30 * hb, 34 * hb], [30 * pb, 34 * pb], [30 * hb, 3 * hb],
            [30 * hb, 34 * hb], [30 * pb, 3 * pb], [30 * hb, 3 * hb]]
        assert list(a0["phase"]) == ["forward"] * 3 + ["backward"] * 3
        m_disp = t.matrix("direct", op="all_to_all", layer=0, phase="forward").toarray()
        assert m_disp[0, 1] == (34 + 3) * hb + 34 * pb and m_disp[1, 0] == (3 + 34) * hb + 3 * pb
        assert len(t.select(op="all_to_all", layer=2)) == 12 and vol_zero(t.select(op="all_to_all", layer=2))


def vol_zero(t) -> bool:
    return int(t.events["bytes"].sum()) == 0


def test_bad_routing_is_refused_with_shapes():
    p = pc(dp=2, ep=2, global_batch=2)
    with pytest.raises(ConfigError, match=r"shape \(4, 2, 2, 4\); expected \(4, 1, 2, 4\)"):
        predict_traffic(MOE, p, routing=np.zeros((4, 2, 2, 4)))
    neg = np.zeros((4, 1, 2, 4), dtype=np.int64)
    neg[0, 0, 0, 0] = -1
    with pytest.raises(ConfigError, match="negative"):
        predict_traffic(MOE, p, routing=neg)
    with pytest.raises(ConfigError, match="lacks column"):
        predict_traffic(MOE, p, routing=pd.DataFrame({"layer": [0]}))


def test_moe_with_tp_needs_sp_and_adds_expert_tp_calls():
    with pytest.raises(ConfigError, match="sequence parallelism"):
        predict_traffic(MOE, pc(tp=2, dp=2, ep=2, global_batch=2))
    t = predict_traffic(MOE, pc(tp=2, dp=2, ep=2, sp=True, global_batch=2))
    a = t.select(rank=0, op="all_to_all").events
    # SP: each TP rank dispatches its s/tp tokens (and their probabilities)
    assert set(a["bytes"]) == {(S // 2) * K * H * 2, (S // 2) * K * 2}
    # dispatch_postprocess / combine_preprocess over the expert-TP group (etp = tp = 2), per MoE layer:
    # forward AG tokens, AG probabilities, RS output; backward AG, RS probabilities, RS tokens
    x = t.select(rank=0, layer=0, microbatch=0, parallelism="sp").events
    tok, prb = 2 * (S // 2) * K * H * 2, 2 * (S // 2) * K * 2
    moe = x[x["bytes"].isin([tok, prb])]
    assert list(zip(moe["phase"], moe["op"], moe["bytes"], strict=True)) == [
        ("forward", "all_gather", tok), ("forward", "all_gather", prb), ("forward", "reduce_scatter", tok),
        ("backward", "all_gather", tok), ("backward", "reduce_scatter", prb), ("backward", "reduce_scatter", tok)]


@given(ep=st.sampled_from([2, 4]), edp=st.sampled_from([1, 2]), m=st.sampled_from([1, 2]),
       topk=st.sampled_from([1, 2, 4]))
@settings(max_examples=12, deadline=None)
def test_uniform_routing_volume_property(ep, edp, m, topk):
    import dataclasses

    model = dataclasses.replace(MOE, moe_router_topk=topk)
    dp = ep * edp
    p = pc(dp=dp, ep=ep, global_batch=m * dp)
    arr = np.zeros((model.num_layers, m, dp, E), dtype=np.int64)
    arr[[0, 2]] = S * topk // E  # every source spreads its s·k assignments evenly over the experts
    u, r = predict_traffic(model, p), predict_traffic(model, p, routing=arr)
    assert u.volumes(["parallelism", "op"]).equals(r.volumes(["parallelism", "op"]))
    assert abs(u.matrix("direct") - r.matrix("direct")).max() == 0


def test_routing_with_several_iterations_is_refused():
    df = pd.DataFrame({"iteration": [0, 1], "microbatch": [0, 0], "layer": [0, 0], "src_rank": [0, 0],
                       "expert": [0, 1], "tokens": [1, 1]})
    with pytest.raises(ConfigError, match="iterations"):
        predict_traffic(MOE, pc(dp=2, ep=2, global_batch=2), routing=df)
