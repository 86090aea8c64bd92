"""The predictor against Megatron-LM call by call (issue 12): each test states the calls the cited Megatron-LM
(NVIDIA/Megatron-LM ``megatron/core``) or TransformerEngine lines issue, on a configuration small enough to
count by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import TINY, TINY_MOE

from llmcomm import ConfigError, Layout, ModelSpec, ParallelConfig
from llmcomm.predict import Context, predict_traffic
from llmcomm.predict import dp as dpmod
from llmcomm.predict.schedule import interleaved, schedule_table

H, S = 64, 32
A = S * H * 2  # b·s·h·bf16
GPT = dataclasses.replace(TINY, name="tiny-gpt", add_bias_linear=True, position_embedding_type="learned_absolute",
                          max_position_embeddings=S)
ROPE = dataclasses.replace(GPT, name="tiny-rope", position_embedding_type="rope", max_position_embeddings=None,
                           add_bias_linear=False, normalization="RMSNorm")
E, K = 4, 2
MOE = dataclasses.replace(TINY_MOE, moe_layer_freq=1, num_shared_experts=0, gated_mlp=True, tied_embeddings=False)
assert (GPT.hidden_size, GPT.seq_length, MOE.num_experts, MOE.moe_router_topk) == (H, S, E, K)


def pc(**kw) -> ParallelConfig:
    kw.setdefault("seq_len", S)
    return ParallelConfig(**kw)


def ops(t, **f) -> list[tuple[str, int]]:
    ev = t.select(**f).events
    return list(zip(ev["op"], ev["bytes"].astype(int), strict=True))


# 1 ---------------------------------------------------------------------------------------------------------
def test_embedding_with_sp_and_learned_positions_all_reduces():
    """language_model_embedding.py: reduce_scatter_embeddings = not add_position_embedding and ... and
    sequence_parallel -> False for learned_absolute, so VocabParallelEmbedding.forward all-reduces
    (reduce_from_tensor_model_parallel_region) and scatter_to_sequence_parallel_region is a local split whose
    backward is one all-gather. Rotary models reduce-scatter."""
    t = predict_traffic(GPT, pc(tp=2, sp=True))
    assert ops(t, rank=0, layer=-1, phase="forward", op=["all_reduce", "reduce_scatter"]) == [("all_reduce", A)]
    assert ops(t, rank=0, layer=-1, phase="backward") == [("all_gather", A)]
    r = predict_traffic(ROPE, pc(tp=2, sp=True))
    assert ops(r, rank=0, layer=-1, phase="forward", op=["all_reduce", "reduce_scatter"]) == [("reduce_scatter", A)]
    assert ops(r, rank=0, layer=-1, phase="backward") == [("all_gather", A)]
    # without SP both all-reduce and the backward is silent
    n = predict_traffic(ROPE, pc(tp=2))
    assert ops(n, rank=0, layer=-1, phase="forward", op="all_reduce") == [("all_reduce", A)]
    assert ops(n, rank=0, layer=-1, phase="backward") == []


# 2 ---------------------------------------------------------------------------------------------------------
def test_output_layer_backward_with_sp_is_two_calls():
    """layers.py LinearWithGradAccumulationAndAsyncCommunication.backward: with sequence parallelism one
    all-gather (dist_all_gather_func: the saved input for the weight gradient) and one reduce-scatter
    (dist_reduce_scatter_func: the input gradient)."""
    t = predict_traffic(ROPE, pc(tp=2, sp=True))
    assert ops(t, rank=0, layer=ROPE.num_layers, phase="backward") == [("all_gather", A), ("reduce_scatter", A)]
    # a transformer block keeps three: the row-parallel reduce-scatter's backward gathers the gradient first
    assert [o for o, _ in ops(t, rank=0, layer=0, phase="backward")] == ["all_gather", "all_gather",
                                                                         "reduce_scatter"] * 2


# 3 ---------------------------------------------------------------------------------------------------------
def test_interleaved_stage_reduces_each_chunk_apart():
    """finalize_model_grads.py: for model_chunk in model: model_chunk.finish_grad_sync() — each chunk has its
    own DDP buffers, so a stage with vpp = 2 issues two gradient reductions of the same total size, and the
    distributed optimizer two parameter all-gathers."""
    untied = dataclasses.replace(ROPE, tied_embeddings=False)  # tied + pp > 1 + DistOpt: see test_predict_megatron2
    p = pc(pp=2, vpp=2, dp=2, global_batch=4, distributed_optimizer=True)
    t = predict_traffic(untied, p)
    ctx = Context(untied, p)
    for stage, rank in ((0, 0), (1, 2)):
        ev = t.select(rank=rank, parallelism="dp", op=["reduce_scatter", "all_gather"]).events
        assert list(ev["op"]) == ["reduce_scatter", "reduce_scatter", "all_gather", "all_gather"]
        chunks = [dpmod.chunk_parameters(ctx, stage, c).dense for c in range(2)]
        assert list(ev["bytes"][:2]) == [4 * n for n in chunks] and list(ev["bytes"][2:]) == [2 * n for n in chunks]
        assert sum(chunks) == dpmod.stage_parameters(ctx, stage).dense


# 4 ---------------------------------------------------------------------------------------------------------
def test_cp_backward_ring_runs_cp_steps_towards_the_previous_rank():
    """TransformerEngine AttnFuncWithCPAndKVP2P: forward cp-1 steps to (rank + 1) % cp; backward cp steps with
    send_dst = cp_global_ranks[(rank - 1) % cp], sending K,V only at i == 0 and dK,dV only at i == cp - 1."""
    cp = 4
    t = predict_traffic(ROPE, pc(cp=cp))
    kv = 2 * (S // cp) * (4 * 16) * 2
    fwd = t.select(rank=0, layer=0, op="send", phase="forward").events
    assert list(fwd["bytes"]) == [kv] * (cp - 1) and set(fwd["peer"]) == {1}
    bwd = t.select(rank=0, layer=0, op="send", phase="backward").events
    assert list(bwd["bytes"]) == [kv, 2 * kv, 2 * kv, kv] and set(bwd["peer"]) == {cp - 1}
    rcv = t.select(rank=0, layer=0, op="recv", phase="backward").events
    assert set(rcv["peer"]) == {1}
    # bytes agree with the old (cp - 1) x 2KV, and the backward matrix is the transpose of the forward one
    assert bwd["bytes"].sum() == (cp - 1) * 2 * kv
    f = t.matrix("direct", parallelism="cp", phase="forward", layer=0).toarray()
    b = t.matrix("direct", parallelism="cp", phase="backward", layer=0).toarray()
    assert (np.sign(b) == np.sign(f.T)).all()


# 5 ---------------------------------------------------------------------------------------------------------
def test_alltoall_dispatcher_calls():
    """token_dispatcher.py MoEAlltoAllTokenDispatcher: preprocess all-gathers num_local_tokens_per_expert over
    tp_ep_group; token_dispatch all-to-alls the tokens and then the probabilities over ep_group;
    dispatch_postprocess (tp_size > 1) all-gathers tokens and probabilities over the expert-TP group;
    combine_preprocess reduce-scatters; token_combine all-to-alls back. router.py _apply_aux_loss all-reduces
    the token counts over tp_cp_group (get_tokens_per_expert_and_token_count)."""
    p = pc(tp=2, dp=2, ep=2, sp=True, moe_aux_loss_coeff=0.01)
    t = predict_traffic(MOE, p)
    T = S // 2  # tokens per rank under SP
    tok, prb = T * K * H * 2, T * K * 2
    fwd = ops(t, rank=0, layer=0, microbatch=0, phase="forward")
    assert fwd[:2] == [("all_gather", A), ("reduce_scatter", A)]  # the attention block (SP)
    assert fwd[2:] == [("all_reduce", 8 * E),  # aux loss over tp x cp
                   ("all_gather", 2 * 2 * E * 8),  # counts over tp_ep (etp·ep = 4 ranks)
                   ("all_to_all", tok), ("all_to_all", prb),  # tokens, probabilities over EP
                   ("all_gather", 2 * tok), ("all_gather", 2 * prb),  # expert TP (etp = 2)
                   ("reduce_scatter", 2 * tok), ("all_to_all", tok)]
    groups = t.select(rank=0, layer=0, microbatch=0, phase="forward", op="all_gather").events["group"]
    assert len(groups.iat[1]) == 4  # the counts gather spans etp·ep
    bwd = ops(t, rank=0, layer=0, microbatch=0, phase="backward")
    assert bwd[:6] == [("all_to_all", tok), ("all_gather", 2 * tok), ("reduce_scatter", 2 * prb),
                       ("reduce_scatter", 2 * tok), ("all_to_all", prb), ("all_to_all", tok)]


def test_allgather_dispatcher_moves_n_over_k_times_the_bytes():
    """MoEAllGatherTokenDispatcher.token_dispatch: all-gathers of the routing map, the probabilities and the
    hidden states over tp_ep_group; token_combine: reduce-scatter over it (backward: the transposes)."""
    base = pc(dp=4, ep=4, global_batch=4)
    t = predict_traffic(MOE, dataclasses.replace(base, moe_token_dispatcher_type="allgather"))
    n = 4  # etp·ep
    assert ops(t, rank=0, layer=0, phase="forward") == [
        ("all_gather", n * S * E), ("all_gather", n * S * E * 2), ("all_gather", n * S * H * 2),
        ("reduce_scatter", n * S * H * 2)]
    assert ops(t, rank=0, layer=0, phase="backward") == [
        ("all_gather", n * S * H * 2), ("reduce_scatter", n * S * H * 2), ("reduce_scatter", n * S * E * 2)]
    a2a = predict_traffic(MOE, base)
    hidden_ag = sum(b for o, b in ops(t, rank=0, layer=0, phase="forward") if b == n * S * H * 2) // 2
    hidden_a2a = ops(a2a, rank=0, layer=0, phase="forward", op="all_to_all")[0][1]
    assert hidden_ag / hidden_a2a == n / K
    with pytest.raises(ConfigError, match="flex"):
        predict_traffic(MOE, dataclasses.replace(base, moe_token_dispatcher_type="flex"))
    with pytest.raises(ConfigError, match="moe_token_dispatcher_type"):
        pc(moe_token_dispatcher_type="deepep")


# 6 ---------------------------------------------------------------------------------------------------------
def test_expert_tensor_parallel_grid_sizes_and_rule():
    """parallel_state.initialize_model_parallel: world_size must be divisible by expert_tensor_parallel_size *
    expert_model_parallel_size * pipeline_model_parallel_size; the expert rank generator numbers ranks
    etp-ep-edp-pp (cp dropped)."""
    p = pc(tp=2, dp=2, ep=4, etp=1, sp=True)  # refused before: (cp·dp) % ep = 2 % 4
    assert p.expert_dp == 1
    lay = Layout(p)
    assert lay.groups("ep").tolist() == [[0, 1, 2, 3]] and lay.groups("etp").tolist() == [[0], [1], [2], [3]]
    t = predict_traffic(MOE, p)
    a2a = t.select(rank=0, op="all_to_all").events
    assert {tuple(g) for g in a2a["group"]} == {(0, 1, 2, 3)}
    assert not len(t.select(rank=0, layer=0, parallelism="sp", op="all_gather").events.query("bytes > @A"))
    # expert weights split over etp, not tp: E/ep = 1 local expert, 3 matrices h x f_e, whole
    split = MOE.layer_parameter_split(0, tp=2, ep=4, etp=1)
    assert split.expert == 3 * H * 64 == 2 * MOE.layer_parameter_split(0, tp=2, ep=4).expert
    big = Layout(pc(tp=4, dp=4, pp=2, ep=4, etp=2))  # world 32: rank = etp + 2·(ep + 4·(edp + 2·pp))
    assert big.groups("ep")[0].tolist() == [0, 2, 4, 6] and big.groups("edp")[0].tolist() == [0, 8]
    assert big.groups("tpep")[0].tolist() == list(range(8))
    with pytest.raises(ConfigError, match=r"etp\*ep\*pp"):
        pc(tp=2, dp=3, ep=4, etp=1)


# 7 ---------------------------------------------------------------------------------------------------------
def test_batch_broadcast_per_microbatch_on_first_and_last_stage():
    """core/utils.py get_batch_on_this_tp_rank: first stage broadcasts tokens, position_ids and the attention
    mask; last stage labels, loss_mask and the mask; middle stages return early (pretrain_gpt.get_batch)."""
    p = pc(tp=2, pp=4, global_batch=2, seq_len=2048)
    m = ModelSpec(name="t8", num_layers=4, hidden_size=H, ffn_hidden_size=256, num_attention_heads=4,
                  vocab_size=1000, seq_length=2048)
    t = predict_traffic(m, p)
    lay = Layout(p)
    first, mid, last = (lay.rank_of(pp=s) for s in (0, 1, 3))
    mask = 2048 * 2048  # (1, 1, s, s) bool: 4 MiB
    assert mask == 4 * 2**20
    assert ops(t, rank=first, microbatch=0, op="broadcast") == [("broadcast", 8 * 2048)] * 2 + [("broadcast", mask)]
    assert ops(t, rank=last, microbatch=0, op="broadcast") == [("broadcast", 8 * 2048), ("broadcast", 4 * 2048),
                                                               ("broadcast", mask)]
    assert ops(t, rank=mid, op="broadcast") == []
    assert len(t.select(rank=first, op="broadcast")) == 2 * 3  # every micro-batch
    assert ParallelConfig(seq_len=8192).sequence_length() ** 2 == 64 * 2**20
    no_mask = predict_traffic(m, dataclasses.replace(p, create_attention_mask_in_dataloader=False))
    assert len(no_mask.select(rank=first, op="broadcast")) == 2 * 2
    assert len(predict_traffic(m, pc(pp=4, global_batch=2)).select(op="broadcast")) == 0  # tp = 1


# 8 ---------------------------------------------------------------------------------------------------------
def test_per_iteration_scalars():
    """clip_grads.py get_grad_norm_fp32: one fp32 all-reduce over the grad-stats group (model-parallel group,
    or the world with the distributed optimizer); training.py train_step: logical_and and reduce_max over the
    model-parallel group, then the [loss, tokens] all-reduce over dp_cp on the last stage."""
    p = pc(tp=2, pp=2, dp=2, global_batch=2)
    t = predict_traffic(ROPE, p)
    lay = Layout(p)
    mp = sorted(lay.rank_of(tp=a, pp=b) for a in (0, 1) for b in (0, 1))
    first = t.select(rank=0, phase="optimizer", parallelism=["other", "dp"]).events
    scal = first[first["bytes"] <= 8]
    # the rerun state machine's int32 over the world first (rerun_state_machine.py _reduce_any)
    assert list(zip(scal["op"], scal["bytes"], scal["dtype"], strict=True)) == [
        ("all_reduce", 4, "int32"), ("all_reduce", 4, "fp32"), ("all_reduce", 4, "int32"), ("all_reduce", 4, "fp32")]
    assert len(scal["group"].iat[0]) == p.world_size
    assert all(sorted(g) == mp for g in scal["group"].iloc[1:])
    last = lay.rank_of(pp=1)
    loss = t.select(rank=last, parallelism="dp").events
    assert list(loss["bytes"])[-1] == 8 and sorted(loss["group"].iat[-1]) == sorted(lay.group_of(last, "dp"))
    d = predict_traffic(ROPE, dataclasses.replace(p, distributed_optimizer=True))
    norm = d.select(rank=0, parallelism="other", phase="optimizer").events
    assert len(norm["group"].iat[0]) == p.world_size and len(norm) == 4  # rerun, norm, train_step's two
    f16 = predict_traffic(ROPE, dataclasses.replace(p, act_dtype="fp16"))
    assert len(f16.select(rank=0, parallelism="other", phase="optimizer")) == 5  # the grad scaler's found_inf
    # MoE: moe_logging.py MoEMetricsTracker._sync_metrics, once per step: num_layers fp32 over pp, the
    # router's tp_cp group (aux loss on), then the DP average
    moe = predict_traffic(MOE, pc(tp=2, pp=2, dp=2, ep=2, sp=True, global_batch=2, moe_aux_loss_coeff=0.01))
    tail = moe.select(rank=0, phase="optimizer", parallelism="other").events.iloc[-3:]
    assert list(tail["bytes"]) == [4 * MOE.num_layers] * 3
    assert [len(g) for g in tail["group"]] == [2, 2, 2]
    lay = Layout(pc(tp=2, pp=2, dp=2, ep=2, global_batch=2))
    assert [sorted(g) for g in tail["group"]] == [sorted(lay.group_of(0, k)) for k in ("pp", "tp", "dp")]


# 9 ---------------------------------------------------------------------------------------------------------
def test_interleaved_schedule_table_and_validity():
    """schedules.py get_schedule_table's own example (PP2 N3M5 VP2): micro-batch 0 1 2 0 1 2 3 4 3 4, chunk
    0 0 0 1 1 1 0 0 1 1; forward_backward_pipelining_with_interleaving allows m % pp != 0 when
    pp <= N <= m and m % N is 0 or >= pp."""
    table = schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    for r in (0, 1):
        steps = interleaved(5, 2, r, 2, 3)
        assert sorted(steps) == sorted([(k, i, c) for k in "FB" for i in range(5) for c in range(2)])
        w = (2 - r - 1) * 2 + (2 - 1) * 3
        assert all(s.kind == "F" for s in steps[:w]) and steps[w + 1].kind == "B"
    p = pc(pp=2, vpp=2, global_batch=5, microbatch_group_size_per_vp_stage=3)
    t = predict_traffic(ROPE, p)
    assert set(t.select(op="send").events["microbatch"]) == set(range(5))
    with pytest.raises(ConfigError, match="must be 0 or >= pp"):
        pc(pp=2, vpp=2, global_batch=5)  # N = pp = 2: 5 % 2 = 1
    with pytest.raises(ConfigError, match=r"must lie in \[pp=2"):
        pc(pp=2, vpp=2, global_batch=1)


# 10 --------------------------------------------------------------------------------------------------------
def test_overlapped_dp_buckets():
    """param_and_grad_buffer.py _compute_default_per_buffer_param_layout: tensors in reverse order, a bucket
    closes once it holds >= bucket_size elements; each bucket is its own group (partition_buckets), reduced
    when its gradients are ready in the last micro-batch's backward; finish_grad_sync then only waits."""
    p = pc(dp=2, global_batch=4, overlap_grad_reduce=True, bucket_size=30_000)
    ctx = Context(ROPE, p)
    t = predict_traffic(ROPE, p)
    g = t.select(rank=0, parallelism="dp", op="all_reduce").events
    g = g[g["bytes"] > 8]
    bl = dpmod.buckets(ctx, 0, 0)
    assert len(g) == len(bl) > 2
    assert (g["phase"] == "backward").all() and (g["microbatch"] == 1).all()
    assert list(g["bytes"]) == [4 * b.numel for b in bl]
    assert sum(b.numel for b in bl) == dpmod.stage_parameters(ctx, 0).dense
    assert list(g["layer"]) == sorted(g["layer"], reverse=True)  # end of the model first
    # hand-computed: reverse tensor order, close at >= 30,000 elements
    sizes = [t.numel for t in dpmod.chunk_tensors(ctx, 0, 0)][::-1]
    expect, acc = [], 0
    for n in sizes:
        acc += n
        if acc >= 30_000:
            expect.append(acc)
            acc = 0
    expect += [acc] if acc else []
    assert [b.numel for b in bl] == expect
    # default bucket size: max(40M, 1M·dp)
    assert dpmod.bucket_size(Context(ROPE, pc(dp=64, global_batch=64))) == 64_000_000
    assert dpmod.bucket_size(Context(ROPE, pc(dp=2, global_batch=2))) == 40_000_000
    assert dpmod.bucket_size(Context(ROPE, pc(dp=32, cp=2, global_batch=32))) == 64_000_000  # dp·cp
    # distributed optimizer: reduce-scatter per bucket in the backward, all-gather per bucket after the step
    d = predict_traffic(ROPE, dataclasses.replace(p, distributed_optimizer=True))
    ev = d.select(rank=0, parallelism="dp").events
    ev = ev[ev["bytes"] > 8]
    assert list(ev["op"]) == ["reduce_scatter"] * len(bl) + ["all_gather"] * len(bl)
    assert list(ev["bytes"][len(bl):]) == [2 * b.numel for b in bl]


def test_torch_framework_refuses_the_megatron_only_options():
    for kw in (dict(overlap_grad_reduce=True), dict(moe_token_dispatcher_type="allgather"),
               dict(moe_aux_loss_coeff=0.01), dict(etp=1, tp=2, sp=True)):
        with pytest.raises(ConfigError, match="framework='torch'"):
            predict_traffic(MOE, pc(**{"dp": 2, "ep": 2, "global_batch": 2, **kw}), framework="torch")


# DeepSpeed ---------------------------------------------------------------------------------------------------
def test_deepspeed_pipe_partitioned_splits_p2p_and_gathers_on_arrival():
    """Megatron-DeepSpeed runs GPT on DeepSpeed's PipelineEngine (deepspeed/runtime/pipe/engine.py): with
    pipe_partitioned/grad_partitioned (both on by default) the activation and its gradient cross a stage
    boundary as 1/tp partitions (_exec_send_activations / _exec_send_grads) and are rebuilt by a TP all-gather
    (PartitionedTensor.full) on receiving the activation, on receiving the gradient and, before the backward
    pass, on the stage's own output, which it kept only as its partition."""
    m = 3
    base = pc(tp=2, pp=4, dp=1, global_batch=m)
    part = dataclasses.replace(base, pipe_partitioned=True)
    plain, ds = predict_traffic(GPT, base), predict_traffic(GPT, part)
    lay = Layout(base)
    first, mid, last = (lay.rank_of(pp=s) for s in (0, 1, 3))
    assert set(ops(plain, rank=mid, op="send")) == {("send", A)}
    assert set(ops(ds, rank=mid, op="send")) == {("send", A // 2)}
    assert set(ops(ds, rank=mid, op="recv")) == {("recv", A // 2)}
    gathers = {r: ds.select(rank=r, parallelism="pp", op="all_gather") for r in (first, mid, last)}
    assert all(set(g.events["bytes"]) == {A} for g in gathers.values())
    assert len(gathers[first].select(phase="forward")) == 0 and len(gathers[first].select(phase="backward")) == 2 * m
    assert len(gathers[mid].select(phase="forward")) == m and len(gathers[mid].select(phase="backward")) == 2 * m
    assert len(gathers[last].select(phase="forward")) == m and len(gathers[last].select(phase="backward")) == 0
    tp_group = set(Layout(base).group_of(mid, "tp"))
    assert all(set(g) == tp_group for g in gathers[mid].events["group"])
    # the same, and nothing else, when there is no TP to split over
    assert predict_traffic(GPT, pc(pp=4, global_batch=m, pipe_partitioned=True)).to_table().equals(
        predict_traffic(GPT, pc(pp=4, global_batch=m)).to_table())
    with pytest.raises(ConfigError, match="pipe_partitioned .* sp=True is not modelled"):
        pc(tp=2, pp=2, sp=True, pipe_partitioned=True)
    with pytest.raises(ConfigError, match="framework='torch': pipe_partitioned"):
        predict_traffic(GPT, part, framework="torch")
