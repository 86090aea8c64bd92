"""Communication hidden behind compute, as Megatron-LM schedules it: the DP gradient reduction
(``overlap_grad_reduce``), the interleaved schedule's pipeline send/recv (``overlap_p2p_comm``) and the MoE
expert-parallel all-to-alls of the combined 1F1B schedule (``moe_a2a_overlap``). Each function takes per-row
seconds (numpy arrays) and returns the seconds left exposed; :func:`llmcomm.overhead.iteration.combine` calls
them. Sources are Megatron-LM at d98e8a6 (the commit :mod:`llmcomm.rules` cites).

Gradient reduction (``overlap_grad_reduce``), per pipeline stage ``r`` and model chunk ``c``:

* Every model chunk is its own ``DistributedDataParallel`` with its own buffers (``get_model``,
  megatron/training/training.py ~2504-2514); only stage 0's chunk 0 is split into buckets, every other chunk's
  buffer is one bucket (:func:`llmcomm.predict.dp.chunk_is_bucketed`, the one home of that rule, and
  :func:`llmcomm.predict.dp.bucket_elements` for the size).
* A bucket's reduction is dispatched when every gradient in it is ready in the *last* micro-batch's backward
  (``_make_backward_post_hook`` -> ``register_grad_ready``, distributed_data_parallel.py:553-587,
  param_and_grad_buffer.py:863-884; ``no_sync`` keeps ``is_last_microbatch`` false before, :589-599).
* With ``align_grad_reduce`` (Megatron's default, megatron/training/config/common_config.py:80) training sets
  ``config.grad_sync_func`` to each chunk's ``start_grad_sync`` (training.py:4346-4359), and then:

  - 1F1B (schedules.py:2429-2434, :2455-2461, :2475-2479): stage 0 enables grad sync for its last backward, so
    its buckets go out as they fill; a later stage reduces its (single-bucket) buffer after its cool-down,
    ``r`` backward steps before stage 0 ends ("Other pipeline stages do grad reduction during pipeline bubble").
  - interleaved (schedules.py:1438-1456, :2063-2069): stage ``r`` dispatches chunk ``c``'s whole buffer after
    its backward step ``k_c + r``, ``k_c`` the step of chunk ``c``'s last micro-batch — the moment stage 0
    finishes chunk ``c`` — or after its last step where ``k_c + r`` is past the end. Backward runs the last
    group of ``L`` micro-batches (``microbatch_group_size_per_vp_stage``, default ``pp``) chunk ``v−1`` first,
    chunk 0 last (``get_schedule_table``, schedules.py:989-1016), so after chunk ``c`` stage 0 has ``c·L``
    backward steps left. During a chunk's own last backward ``no_sync`` is on: stage 0's chunk-0 buckets are
    dispatched together after it, so the first layers' reduction hides behind nothing.

* The reductions of a stage run one after another on its DP communicator; ``finish_grad_sync``
  (finalize_model_grads.py:640, param_and_grad_buffer.py:787-840) waits for them, then the SP norm all-reduce
  (:661), the tied-embedding all-reduce (:676) and the step's scalars run exposed. Time 0 is the end of stage 0's
  last backward, ``b`` a backward step of one chunk and one micro-batch::

      launch(r, c)   = −max(c·L, r)·b                     (interleaved;  1F1B: −r·b for r > 0)
      finish(r)      = max_c [launch(r, c) + Σ_{j ≤ c} d(r, j)]        (chunks launched v−1 first, serial)
      stage 0, 1F1B: finish(0) = max_i [B·ready_i + d·(1 − before_i)] − B      (its buckets filling over its
                                last backward B, the embedding's last: first_chunk_exposed)
      exposed_dp     = max(0, max_r [max(finish(r), −lead(r)) + rest(r)])    lead(r) = r·b, rest: the calls
                                                                             after finish_grad_sync

  With ``align_grad_reduce=False`` (``--no-align-grad-reduce``: ``grad_sync_func`` unset) every stage enables
  grad sync before each chunk's last backward (schedules.py:1419-1426): chunk ``c`` goes out when the stage
  itself finishes it, ``launch(r, c) = −(c·L·b + lead(r))``, and stage 0's first chunk fills its buckets under
  its last backward in the interleaved schedule too. Not modelled: idle time inside the cool-down (it would
  only hide more), and the bandwidth the reductions take from the concurrent TP/PP calls.

Pipeline send/recv (``overlap_p2p_comm``, Megatron's ``--overlap-p2p-communication``; the alternative is
``batch_p2p_comm``, one batched ``isend``/``irecv`` that the step waits for, schedules.py:1086-1087): in the
interleaved schedule's 1F1B phase the send of a forward's output and the receive of the next forward's input
are posted asynchronously and waited for just before they are needed, after the backward step in between
(``pp_post_forward`` / ``pp_pre_forward``, schedules.py:1747-1870; ``overlap_p2p_comm=True`` in
``send_forward_recv_forward``, p2p_communication.py), and the backward's symmetrically behind the next
forward. Per micro-batch and chunk, with ``s_f``/``s_b`` the seconds of one forward/backward send::

    pp_exposed = n_f·max(0, s_f − b_chunk) + n_b·max(0, s_b − f_chunk)

``n_f``/``n_b`` the sends per micro-batch (the formulation's counts), ``f_chunk``/``b_chunk`` one chunk's
forward/backward of a micro-batch. Megatron turns the flag off without the interleaved schedule
(megatron/training/arguments.py:1005-1012), so does the kit. The warm-up and cool-down, where a receive is the
pipeline's dependency, are in the bubble term.

MoE all-to-all (``moe_a2a_overlap``, NVIDIA's recipes' name for Megatron-LM's
``overlap_moe_expert_parallel_comm``, model_parallel_config.py:343; the combined 1F1B schedule,
core/pipeline_parallel/combined_1f1b.py, ``TransformerLayerSchedulePlan.run`` in
core/models/common/model_chunk_schedule_plan.py:236-305): one micro-batch's forward of a layer runs with another
micro-batch's backward of the same layer, on two streams::

    comm: combine_bwd       | dispatch_fwd -> dispatch_bwd        | combine_fwd
    comp: pre_dispatch_fwd  | mlp_bwd -> mlp_bwd_dw -> mlp_fwd    | pre_dispatch_bwd

so per MoE layer, with ``D``/``C`` the dispatch/combine seconds of one direction, ``A``/``M`` the forward
seconds of the layer's attention-and-router part and of its MLP (backward ``2×``)::

    a2a_exposed(pair) = max(0, C − A) + max(0, 2·D − 3·M) + max(0, C − 2·A)

in the paired steps. This is the schedule with ``delay_wgrad_compute`` (Megatron-Bridge's perf scripts set it with
the overlap, ``scripts/performance/utils/overrides.py`` ``_set_moe_a2a_overlap_overrides``; Megatron-LM allows it
only with it, ``transformer_config.py:1927-1930`` at 23dd639c): every node of one micro-batch waits for the one
issued before it through the micro-batch's event, but the MLP's weight-gradient node (``backward_dw``,
``models/gpt/fine_grained_callables.py:329-343``) runs on the compute stream without recording it (the others wait
and record in ``ScheduleNode.stream_acquire_context``, ``pipeline_parallel/utils.py:274-300``), so
``dispatch_bwd`` waits only for the MLP's data gradient (``M``, half of its ``2M`` backward) and the weight
gradient runs under it: with ``X = max(A, C)`` the pair ends at ``X + max(max(2M, D) + M, max(M, D) + D) + max(C,
2A)``, i.e. the middle term ``max(0, 2D − 3M)``. Without ``delay_wgrad_compute`` ``dispatch_bwd`` would wait for
the whole ``2M`` (``max(D, 2M) + max(D, M) − 3M``); the kit does not time that variant (no recipe runs the overlap
without it). The ``w`` unpaired warm-up forwards and cool-down backwards of a stage (``pp = 1``: the
first forward and the last backward; interleaved: ``w = min(2(p − r − 1) + (v − 1)·L, m·v)``) keep their
all-to-alls exposed. ``A``/``M`` split the layer's timed pass by FLOPs (:func:`moe_mlp_share`). Megatron's
requirements are rules (:mod:`llmcomm.rules`: ``a2a-overlap-*``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import step
from ..parallel_table import ParallelTable
from ..predict import dp as _dp
from ..predict.calls import Context
from ..specs import ModelSpec, ParallelConfig

if TYPE_CHECKING:
    from .iteration import Stages


def pipelined_exposed(total: np.ndarray, window: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Seconds of ``n`` equal transfers (``total`` in all) not hidden by a ``window`` of compute they follow
    (each transfer ready one ``window/n`` after the previous, the last at the window's end) or precede (the
    mirror case: each needed one ``window/n`` after the previous)::

        exposed = max(total/n, total − window·(n − 1)/n)

    the last (or first) transfer, or the queue that outruns the window."""
    nf = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    return np.maximum(total / nf, total - window * (nf - 1.0) / nf)


# what a model chunk's DDP layout depends on (besides the model): the key of the cache below
BUCKET_KEY = ("tp", "pp", "vpp", "dp", "cp", "ep", "etp", "bucket_size", "ddp_num_buckets", "distributed_optimizer",
              "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
              "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
_PROFILES: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}


def bucket_profile(model: ModelSpec, parallel: ParallelConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(ready, before)`` of each bucket of stage 0's first model chunk under ``overlap_grad_reduce``, in
    dispatch order, from the predictor's own layout (:func:`llmcomm.predict.dp.buckets`, which follows
    :func:`~llmcomm.predict.dp.chunk_is_bucketed` and :func:`~llmcomm.predict.dp.bucket_elements`): ``ready``
    the share of the chunk's last backward done when the bucket's gradients are all there (backward time taken
    proportional to the parameters it passes, the word and position embeddings' lookup as none: a bucket
    holding them is ready at the end), ``before`` the share of the chunk's gradient elements in earlier
    buckets."""
    key = (model,) + tuple(getattr(parallel, k) for k in BUCKET_KEY)
    hit = _PROFILES.get(key)
    if hit is not None:
        return hit
    return _store_profile(key, _profile(model, parallel))


def _store_profile(key: tuple[Any, ...], out: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    if len(_PROFILES) > 65536:
        _PROFILES.clear()
    _PROFILES[key] = out
    return out


def _profile(model: ModelSpec, parallel: ParallelConfig) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bucket_profile` computed (not cached)."""
    ctx = Context(model, dataclasses.replace(parallel, overlap_grad_reduce=True))
    bl = _dp.buckets(ctx, 0, 0)
    sizes = np.array([b.numel for b in bl], dtype=np.float64)
    total = max(float(sizes.sum()), 1.0)
    lookup = sum(t.numel for t in _dp.chunk_tensors(ctx, 0, 0) if t.layer == -1)
    cum = np.cumsum(sizes)
    ready = np.minimum(1.0, cum / max(total - lookup, 1.0))
    ready[-1] = 1.0
    return ready, (cum - sizes) / total


def first_chunk_exposed(d: np.ndarray, window: np.ndarray, ready: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Seconds past the end of stage 0's last backward (``window`` seconds) until its first chunk's buckets
    (:func:`bucket_profile`) are reduced, serially, each dispatched when ready (``d``: the one-call seconds of
    the chunk's whole buffer, shared by the buckets in proportion to their elements; their extra call
    latencies are not counted)::

        exposed = max_i [window·ready_i + d·(1 − before_i)] − window

    ``ready``, ``before``: one profile for every row (1-D) or one per row (2-D, rows × buckets)."""
    return np.max(window[:, None] * ready + d[:, None] * (1.0 - before), axis=1) - window


def first_chunk_buckets(model: ModelSpec, t: ParallelTable, rows: np.ndarray) -> list[tuple[np.ndarray,
                                                                                             np.ndarray, np.ndarray]]:
    """``(row indices, ready, before)`` per distinct DDP layout among ``rows`` of ``t`` (:data:`BUCKET_KEY`)."""
    idx = np.flatnonzero(rows)
    if not len(idx):
        return []
    cols = [np.asarray(getattr(t, k), dtype=np.int64)[idx] for k in BUCKET_KEY]
    inv, first = step.group_rows(cols)  # layouts by hashing, in order of first appearance (disjoint rows)
    out = []
    order = np.argsort(inv, kind="stable")  # the rows of each layout, in row order (as idx[inv == j])
    counts = np.bincount(inv, minlength=len(first))
    starts = np.cumsum(counts) - counts
    # the cache keys of bucket_profile from the table's integers (ParallelConfig's None for an unset one), so
    # that a layout seen before costs no ParallelConfig: each field's values converted once per column
    fields = [_key_values(k, col[first].tolist()) for k, col in zip(BUCKET_KEY, cols, strict=True)]
    for j, u in enumerate(zip(*fields, strict=True)):
        key = (model, *u)
        hit = _PROFILES.get(key)
        ready, before = hit if hit is not None else bucket_profile(model, t.row(int(idx[first[j]])))
        out.append((idx[order[starts[j]:starts[j] + counts[j]]], ready, before))
    return out


_BOOL_KEYS = ("distributed_optimizer", "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
_OPTIONAL_KEYS = ("etp", "bucket_size", "ddp_num_buckets", "num_layers_in_first_pipeline_stage",
                  "num_layers_in_last_pipeline_stage")


def _key_values(field: str, xs: list[int]) -> list[Any]:
    """A :data:`BUCKET_KEY` field's values as ``ParallelConfig`` holds them, from the table's integers."""
    if field in _BOOL_KEYS:
        return [bool(x) for x in xs]
    if field in _OPTIONAL_KEYS:
        return [None if x < 0 else int(x) for x in xs]
    return [int(x) for x in xs]


def vp_last_group(m: np.ndarray, pp: np.ndarray, group: np.ndarray | None = None) -> np.ndarray:
    """Micro-batches in the interleaved schedule's last group, ``L = m − n·floor((m − 1)/n)`` with ``n`` the
    group size (``microbatch_group_size_per_vp_stage``, ``-1``/``None``: ``pp``; ``get_schedule_table``)."""
    n = pp if group is None else np.where(np.asarray(group) > 0, group, pp)
    n = np.maximum(n, 1)
    return m - n * ((m - 1) // n)


def grad_reduce_exposed(d_edge: np.ndarray, d_plain: np.ndarray, edge_chunk: np.ndarray | int, rest: np.ndarray,
                        first: bool, v: np.ndarray, L: np.ndarray, b: np.ndarray, lead: np.ndarray | float,
                        bucketed0: np.ndarray | None = None, align: np.ndarray | bool = True) -> np.ndarray:
    """Seconds after the end of stage 0's last backward until a stage has finished its gradient reduction and
    the calls after it (``rest``), under ``overlap_grad_reduce`` (module docstring; negative: done before stage 0
    ends). Chunk ``edge_chunk`` (``-1``: none) reduces ``d_edge`` seconds, every other chunk ``d_plain``; ``b``:
    stage 0's backward step of one chunk and micro-batch; ``lead``: how much earlier than stage 0 this stage
    ends (``r·b``); ``first``: the stage is stage 0, whose first chunk, when ``v = 1`` or without ``align``,
    fills its buckets over its last backward and finishes ``bucketed0`` after it (:func:`first_chunk_exposed`)::

        launch(c) = −max(c·L·b, lead)   (align; else −(c·L·b + lead))
        finish    = max_c [launch(c) + Σ_{j ≤ c} d_j]     exposed = max(finish, −lead) + rest"""
    vmax = int(np.max(v)) if np.size(v) else 1
    align = np.asarray(align, dtype=bool)
    later = np.full(np.shape(v), -np.inf)  # when the queue of chunks v−1 … 1 is done
    if vmax > 1:  # chunks c = 1 … vmax−1 as the rows of one array (each row's own chunks live: c < v)
        c = np.arange(1, vmax)[:, None]
        live = c < v
        # Σ_{1 ≤ j ≤ c} d_j, summed in the order j = 1, 2, … (add.accumulate is sequential)
        acc = np.add.accumulate(np.where(live, np.where(np.equal(edge_chunk, c), d_edge, d_plain), 0.0), axis=0)
        launch = np.where(align, -np.maximum(c * L * b, lead), -(c * L * b + lead))
        later = np.maximum(later, np.max(np.where(live, launch + acc, -np.inf), axis=0).reshape(np.shape(later)))
    d0 = np.where(np.equal(edge_chunk, 0), d_edge, d_plain)
    finish = np.maximum(later, -np.asarray(lead)) + d0  # chunk 0: after the stage's last backward
    if first and bucketed0 is not None:  # its buckets under that backward (1F1B, or not aligned)
        finish = np.where(align & (v > 1), finish, np.maximum(later + d0, bucketed0))
    return np.maximum(finish, -np.asarray(lead)) + rest


def p2p_exposed(n_f: np.ndarray, s_f: np.ndarray, n_b: np.ndarray, s_b: np.ndarray, f_chunk: np.ndarray,
                b_chunk: np.ndarray) -> np.ndarray:
    """Pipeline seconds per micro-batch left exposed with ``overlap_p2p_comm`` (module docstring)::

        n_f·max(0, s_f − b_chunk) + n_b·max(0, s_b − f_chunk)"""
    return n_f * np.maximum(0.0, s_f - b_chunk) + n_b * np.maximum(0.0, s_b - f_chunk)


def sp_backward_exposed(tp: np.ndarray, bwd: np.ndarray, g_ag: np.ndarray) -> np.ndarray:
    """TP seconds per micro-batch left exposed *without* ``tp_comm_overlap`` under sequence parallelism: the
    backward of a column-parallel linear (qkv, fc1) issues its two SP collectives asynchronously, each under one
    of its GEMMs, in TransformerEngine and in Megatron-LM's own linears alike::

        exposed = tp − min(c, g_ag) − min(c, g_ag),     c = bwd / 3

    ``tp`` the stage's TP seconds, ``bwd`` the blocks' backward SP all-gathers/reduce-scatters of them
    (:func:`llmcomm.overhead.iteration.comm_items`, ``ub`` items: per block the row-parallel grad output's
    all-gather, the column-parallel input's re-gather and its dgrad's reduce-scatter, of equal size: 3 calls,
    ``c`` one of each kind summed over the blocks; a recomputed block's replayed forward calls are apart, ``ub``
    "replay" items, exposed as the forward's are), ``g_ag`` the forward seconds of the qkv and fc1 GEMMs (their dgrad
    and their wgrad each have the forward's FLOPs). The input's all-gather runs while the dgrad GEMM computes and
    the dgrad's reduce-scatter while the wgrad GEMM computes: TransformerEngine v1.8
    transformer_engine/pytorch/module/layernorm_linear.py:444 (``gather_along_first_dim(ln_out, ..., async_op=True)``
    "Overlap input AG with dgrad", waited at :560 before wgrad) and :564-565 (``reduce_scatter_along_first_dim(dgrad,
    ..., async_op=True)``, waited at :660 after wgrad); Megatron-LM d98e8a6 megatron/core/tensor_parallel/layers.py:580
    ``LinearWithGradAccumulationAndAsyncCommunication``, whose backward does the same for its own linears (:675 the
    input's all-gather, :708 the grad input's reduce-scatter, both ``async_op=True``). The row-parallel grad output's all-gather (TE base.py ``grad_output_preprocess``, a blocking
    gather) and every forward collective stay exposed. Not counted: the SMs NCCL's kernels take from the GEMMs
    while they overlap. Zero where nothing is SP-gathered (``bwd`` 0: no SP, or tp = 1)."""
    c = sp_backward_hideable(bwd) / 2.0
    return tp - 2.0 * np.minimum(c, g_ag)


def sp_backward_hideable(bwd: np.ndarray) -> np.ndarray:
    """The most :func:`sp_backward_exposed` can hide, whatever the GEMMs: ``2·bwd / 3`` (the input re-gathers and
    dgrad reduce-scatters; what the tuner's lower bound may not count, :mod:`llmcomm.tune.bound`)."""
    return 2.0 * bwd / 3.0


def a2a_pair_exposed(dispatch: np.ndarray, combine: np.ndarray, attn: np.ndarray, mlp: np.ndarray) -> np.ndarray:
    """All-to-all seconds of one MoE layer left exposed when one micro-batch's forward runs with another's
    backward (module docstring; backward = 2 × forward)::

        max(0, C − A) + max(0, 2·D − 3·M) + max(0, C − 2·A)"""
    return (np.maximum(0.0, combine - attn) + np.maximum(0.0, 2.0 * dispatch - 3.0 * mlp)
            + np.maximum(0.0, combine - 2.0 * attn))


def paired_share(m: np.ndarray, pp: np.ndarray, v: np.ndarray, r: np.ndarray | int, L: np.ndarray) -> np.ndarray:
    """Share of a stage's ``m·v`` forward (and backward) steps that the combined 1F1B schedule pairs: ``pp = 1``:
    ``(m − 1)/m``; otherwise the interleaved steady state, ``1 − w/(m·v)`` with ``w = min(2(p − r − 1) +
    (v − 1)·L, m·v)`` warm-up steps (``get_pp_rank_microbatches``, schedules.py:929)."""
    total = (m * v).astype(np.float64)
    w = np.minimum(2 * (pp - 1 - np.asarray(r)) + (v - 1) * L, m * v)
    return np.where(pp == 1, (m - 1) / np.maximum(m, 1), 1.0 - w / np.maximum(total, 1.0))


def moe_mlp_share(model: ModelSpec, seq: np.ndarray, fused: np.ndarray) -> np.ndarray:
    """Share of an MoE layer's forward FLOPs in its MLP (routed top-k plus shared experts), the rest being the
    attention block and the router (``pre_dispatch_computation``), per token::

        attention = 2h(a·d + 2g·d) + 2a·d·h + 4·s·a·d·(½ if causal fused)     router = 2h·E
        mlp       = 2·k_m·h·f_e·(topk + shared)                              (k_m = 3 gated, else 2)"""
    h, a, g, d = model.hidden_size, model.num_attention_heads, model.query_groups, model.head_dim
    km = 3 if model.gated_mlp else 2
    fe = model.expert_ffn_hidden_size if model.is_moe else model.ffn_hidden_size
    routed = (model.moe_router_topk + model.num_shared_experts) if model.is_moe else 1
    mlp = 2.0 * km * h * fe * routed
    core = 4.0 * np.asarray(seq, dtype=np.float64) * a * d * np.where(np.asarray(fused, dtype=bool), 0.5, 1.0)
    attn = 2.0 * h * (a * d + 2 * g * d) + 2.0 * a * d * h + core + 2.0 * h * (model.num_experts or 0)
    return mlp / (mlp + attn)


# ------------------------------------------------- applied to the stage classes of llmcomm.overhead.iteration
def pipeline_and_moe(st: Stages, cls: str, r: dict[str, Any], q: dict[str, np.ndarray],
                     layer_pass: Callable[[np.ndarray], np.ndarray]) -> None:
    """``q["pp"]`` under ``overlap_p2p_comm`` (interleaved only) and ``q["ep"]`` under ``moe_a2a_overlap``, in place
    (:func:`p2p_exposed`, :func:`a2a_pair_exposed`); ``st``, ``r``, ``q``: :func:`llmcomm.overhead.iteration.combine`'s
    stages, the class's raw and its timed terms."""
    v = st.vpp
    if st.overlap_p2p_comm is not None and np.count_nonzero(st.overlap_p2p_comm):
        on = st.overlap_p2p_comm & (v > 1)  # Megatron turns it off without interleaving (arguments.py:1005-1012)
        ex = p2p_exposed(r["pp_nf"], r["pp_sf"], r["pp_nb"], r["pp_sb"], q["fwd"] / v, (q["bwd"] + q["rec"]) / v)
        q["pp"] = np.where(on, ex, q["pp"])
    if st.moe_a2a_overlap is not None and np.count_nonzero(st.moe_a2a_overlap) and st.mlp_share is not None:
        nm = r["q"]["nm"]
        rank: np.ndarray | int = st.pp - 1 if cls == "last" else (1 if cls == "mid" else 0)
        group = st.vp_last_group if st.vp_last_group is not None else st.pp
        share = paired_share(st.m, st.pp, v, rank, group)
        a2a = r["ep_a2a"]
        one = a2a / (4.0 * np.maximum(nm, 1.0))  # dispatch and combine, forward and backward: a quarter each
        t_layer = layer_pass(r["q"]["Lm"])  # forward of one MoE layer
        pair = a2a_pair_exposed(one, one, (1.0 - st.mlp_share) * t_layer, st.mlp_share * t_layer)
        ex = q["ep"] - a2a + share * nm * pair + (1.0 - share) * a2a
        q["ep"] = np.where(st.moe_a2a_overlap, ex, q["ep"])


def stage_grad_reduce(st: Stages, per: dict[str, dict[str, np.ndarray]], has_mid: np.ndarray,
                      has_last: np.ndarray) -> np.ndarray:
    """The exposed gradient reduction and the calls after it with ``overlap_grad_reduce``: the latest of stage 0,
    stage 1 (the middle stage closest to it) and the last stage (:func:`grad_reduce_exposed`,
    time 0 = stage 0's last backward). A backward step is ``bwd + rec + tp + ep + pp`` of a micro-batch over
    ``v`` chunks; stage ``r`` ends ``r`` steps of the last stage's before stage 0 (as without overlap).

    The chunks' launch times count back from stage 0's end in steps of the cool-down's pace, the slowest live
    stage's backward step ``max(b_first, b_mid, b_last)``, not stage 0's own: in the cool-down only backwards
    are left and each of stage 0's waits for the gradient the next stage sends it (``recv_backward`` before
    ``backward_step`` in the interleaved and 1F1B cool-downs, schedules.py:2063-2069, :2455-2461 at d98e8a6), so a
    stage 0 faster than the pipeline idles between them and its chunk ``c`` ends ``c·L`` paced steps before its
    end. With stage 0's own step a stage 0 made slower (more recomputation) but not critical gained more hiding
    (``c·L·Δb``) than the step grew (``Δb/v`` in the bubble). Stage 0's bucketed first chunk still fills over its
    own last backward (``b_first``, :func:`first_chunk_exposed`)."""
    v, pp = st.vpp, st.pp
    L = st.vp_last_group if st.vp_last_group is not None else pp

    def bstep(q: dict[str, np.ndarray]) -> np.ndarray:
        return q["bwd"] + q["rec"] + q["tp"] + q["ep"] + q["pp"]

    b0, bl = bstep(per["first"]) / v, bstep(per["last"]) / v
    pace = np.maximum(b0, np.maximum(np.where(has_last, bl, 0.0), np.where(has_mid, bstep(per["mid"]) / v, 0.0)))
    f = st.cls["first"]
    d0 = f["g_edge"] + f["g_shared"] + f["g_expert"]
    bucketed0 = d0.copy()  # one bucket: all of it after the backward
    by_count: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for g in st.grad_buckets or []:  # the layouts with as many buckets as one another: one call (rows × buckets)
        by_count.setdefault(len(g[1]), []).append(g)
    for gs in by_count.values():  # its first chunk's last backward: one chunk step
        rows = np.concatenate([g[0] for g in gs])
        sizes = [len(g[0]) for g in gs]
        ready, before = (np.repeat(np.stack([g[i] for g in gs]), sizes, axis=0) for i in (1, 2))
        bucketed0[rows] = first_chunk_exposed(d0[rows], b0[rows], ready, before)
    out = np.zeros(len(pp))
    for cls, edge, lead, live in (("first", 0, 0.0, True), ("mid", -1, bl, has_mid),
                                  ("last", v - 1, (pp - 1) * bl, has_last)):
        r, q = st.cls[cls], per[cls]
        e = grad_reduce_exposed(r["g_edge"] + r["g_shared"] + r["g_expert"], r["g_plain"] + r["g_expert"], edge,
                                q["dp"] - r["g_all"], cls == "first", v, L, pace, lead, bucketed0,
                                st.align_grad_reduce if st.align_grad_reduce is not None else True)
        out = np.maximum(out, np.where(live, e, 0.0))
    return out
