"""GPU memory of one training configuration: weights, gradients, optimizer states and activations, per GPU.

Every term is bytes on one GPU of pipeline stage ``r``; the configuration's memory is the largest stage's total.
Parameters a stage holds come from the predictor's one home for them (:func:`llmcomm.predict.dp.stage_parameters`,
built on :meth:`ModelSpec.layer_parameter_split`): ``P_dense`` reduced over DP×CP, ``P_expert`` over the
expert-data-parallel group.

Model states (Megatron-LM's mixed-precision Adam; ``docs/source/api-guide/dist_optimizer.md`` tabulates the
bytes per parameter: 18 for bf16 parameters with fp32 gradients, ``6 + 12/d`` with the distributed optimizer)::

    weights     = (P_dense + P_expert) · bytes(param_dtype)
    gradients   = (P_dense + P_expert) · bytes(grad_reduce_dtype)          (Megatron's main_grad buffer)
    optimizer   = P_dense · o / D + P_expert · o / E_d   with o = 12 (fp32 master, Adam m, v) for 16-bit
                  parameters, 8 for fp32 ones; D = dp·cp, E_d = expert data-parallel size with the distributed
                  optimizer, else D = E_d = 1
    FSDP (ZeRO-3) shards weights and gradients the same way, and holds the units it gathers on top
    (:func:`llmcomm.overhead.fsdp_time.unit_bytes`): weights += 2·P_unit·p (P_stage·p without resharding after
    the forward), gradients += 2·P_unit·g, P_unit the stage's largest unit (the one computing and the one
    prefetched).

For bf16 parameters, fp16 gradients and no sharding this is ZeRO's ``2 + 2 + 12 = 16`` bytes per parameter.

FP8 (``fp8`` set; TransformerEngine's FP8 GEMMs). On Hopper an FP8 GEMM needs its weight in FP8 twice, row-wise
for the forward GEMM and column-wise (transposed) for the data-gradient GEMM (TransformerEngine docs, "Performance
considerations: handling transposes": "for FP8 on Hopper architecture, some tensors need to be physically
transposed in memory"); TransformerEngine keeps both between micro-batches (the weight cast once per iteration,
``is_first_microbatch``). With ``P_lin`` the linear layers' weights a GPU holds (the layers' TP-sharded and
expert parameters)::

    weights += 2 · P_lin                                  (FP8 row-wise + column-wise copies beside the bf16 ones)
    weights  = (P − P_lin)·bytes(param) + 2 · P_lin       with fp8_param_gather: the primary weights are FP8
                                                          (Megatron-LM --fp8-param-gather, fp8_model_init), no bf16
                                                          copy; the fp32 master copy is the optimizer's (unchanged)

Activations under FP8: the linear layers' saved inputs are the FP8 copies quantized for the GEMM, 1 byte per
element (:func:`llmcomm.step.layer_activation_bytes`, ``fp8``).

Context parallelism (``cp > 1``): every activation term above is per CP rank (``s = seq / cp``, Korthikanti's
formula at the local sequence), and the layer that runs holds the attention's communication buffers once::

    p2p (ring, TransformerEngine AttnFuncWithCPAndKVP2P): 2 receive buffers of the local K and V,
                                                     2 · 2·g·d·(s/cp)·b/tp · bytes(act)
    a2a (Ulysses):       the re-sharded Q, K, V,     (a·d + 2·g·d)·(s/cp)·b/tp · bytes(act)
    allgather:           the all-gathered K and V,   2·g·d·s·b/tp · bytes(act)

(``cp_comm_type``; ``p2p`` where ParallelConfig has no such field yet, Megatron-LM's default).

Activations (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys 2023,
Table 2, generalized to grouped-query attention, gated MLPs and MoE), bytes per layer per micro-batch with 16-bit
activations, ``s`` the sequence per CP rank, ``b`` micro-batch, ``t`` tp::

    replicated per token (divided by t only with SP):  4h (2 LayerNorm inputs) + 2h (QKV input)
                                                       + h (attention dropout mask) + 2h (fc1 input) + h (MLP mask)
    sharded per token (divided by t):   2·a·d + 2·g·d (Q, K) + 2·g·d (V) + 2·a·d (projection input)
                                        + 5·a·s (softmax output, its dropout mask and output; not with selective
                                        recompute or flash attention)
                                        + x·(2·f_up + 2·f) MLP activation and fc2 inputs (f_up = 2f gated, f else;
                                        x = top-k + shared experts in an MoE layer, 1 in a dense one)

For GPT (f = 4h, g = a, a·d = h) this is Korthikanti's ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` without SP,
``s·b·h/t·(34 + 5·a·s/h)`` with SP and ``34·s·b·h/t`` with SP and selective recomputation. Full recomputation keeps
only each layer's input, ``2·s·b·h`` (``/t`` with SP). A stage keeps the activations of the micro-batches in
flight: GPipe all ``m``; 1F1B ``min(pp − r, m)``; interleaved ``(pp − r − 1)·2 + (v − 1)·pp + 1`` model chunks of
``L/(pp·v)`` layers (Megatron's warm-up count, which gives Korthikanti's ``L·(1 + (p−1)/(p·v))`` on stage 0).
Stage 0 adds the embedding's dropout mask (``s·b·h`` per micro-batch in flight, ``/t`` with SP); the last stage
adds the output layer and loss, ``4·s·b·h/t·(1 + V/h)`` (Korthikanti §4.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from .. import step
from ..parallel_table import ParallelTable
from ..specs import ModelSpec, ParallelConfig, validate
from ..step import layer_activation_bytes as layer_activation_bytes  # the step description's; public here too
from ..vocab import dtype_bytes

COLUMNS = ("weights", "gradients", "optimizer", "activations")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU of the most loaded pipeline stage, by term."""

    stage: int
    weights: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"term": [*COLUMNS, "total"],
                             "bytes": [self.weights, self.gradients, self.optimizer, self.activations, self.total]})


def optimizer_bytes_per_parameter(param_bytes: np.ndarray | int) -> np.ndarray:
    """Adam's state per parameter: fp32 m and v (8 bytes), plus an fp32 master copy for 16-bit parameters."""
    return np.where(np.asarray(param_bytes) >= 4, 8, 12)


def model_state_bytes(dense: Any, expert: Any, *, dp_cp: Any, expert_dp: Any, param_bytes: Any, grad_bytes: Any,
                      distributed_optimizer: Any, fsdp: Any, fsdp_unit: Any = (0, 0), fsdp_reshard: Any = True
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(weights, gradients, optimizer)`` bytes of ``dense`` + ``expert`` parameters on one GPU (module doc);
    every argument broadcasts (numpy arrays or scalars)."""
    fsdp = np.asarray(fsdp, dtype=bool)
    shard_opt = fsdp | np.asarray(distributed_optimizer, dtype=bool)
    held = np.where(fsdp, dense / dp_cp + expert / expert_dp, dense + expert)
    o = optimizer_bytes_per_parameter(param_bytes)
    optimizer = np.where(shard_opt, dense * o / dp_cp + expert * o / expert_dp, (dense + expert) * o)
    weights, grads = held * param_bytes, held * grad_bytes
    if np.count_nonzero(fsdp):  # FSDP's gathered units (fsdp_unit: the largest layer unit's and the non-layer unit's
        # parameters; llmcomm.overhead.fsdp_time)
        from .fsdp_time import unit_bytes

        uw, ug = unit_bytes(fsdp_unit[0], fsdp_unit[1], dense + expert, param_bytes=param_bytes,
                            grad_bytes=grad_bytes, fsdp=fsdp, reshard=fsdp_reshard,
                            megatron_fsdp=distributed_optimizer)
        weights, grads = weights + uw, grads + ug
    return weights, grads, optimizer


def fp8_weight_bytes(linear: Any, *, fp8: Any, fp8_param_gather: Any, param_bytes: Any, shard: Any = 1
                     ) -> np.ndarray:
    """Bytes FP8 adds to the weights of ``linear`` linear-layer parameters (module doc): ``2·P_lin`` of FP8
    row-wise and column-wise copies; with ``fp8_param_gather`` the FP8 copies replace the ``param_bytes`` ones
    (``(2 − param_bytes)·P_lin``, 0 for bf16). ``shard``: FSDP's sharding of the held weights (1 without)."""
    held = np.asarray(linear, dtype=float) / shard
    return np.where(np.asarray(fp8, dtype=bool),
                    np.where(np.asarray(fp8_param_gather, dtype=bool), (2.0 - param_bytes) * held, 2.0 * held), 0.0)


def cp_buffer_bytes(model: ModelSpec, *, cp: Any, cp_comm_type: Any, seq_local: Any, micro_batch: Any, tp: Any,
                    act_bytes: Any) -> np.ndarray:
    """The attention's context-parallel communication buffers of the layer that runs (module doc), 0 at
    ``cp = 1``; ``seq_local`` is the sequence per CP rank."""
    g, a, d = model.query_groups, model.num_attention_heads, model.head_dim
    tokens = np.asarray(seq_local, dtype=float) * micro_batch
    kv = 2 * g * d * tokens / tp * act_bytes  # the local K and V
    kind = np.asarray(cp_comm_type, dtype=object)
    out = np.where(kind == "a2a", (a * d + 2 * g * d) * tokens / tp * act_bytes,
                   np.where(kind == "allgather", kv * cp, 2 * kv))
    return np.where(np.asarray(cp) > 1, out, 0.0)


def chunks_in_flight(stage: Any, *, pp: Any, vpp: Any, microbatches: Any, gpipe: Any) -> np.ndarray:
    """Model chunks (of ``L/(pp·v)`` layers) whose activations stage ``stage`` holds at its peak."""
    interleaved = np.minimum((pp - stage - 1) * 2 + (vpp - 1) * pp + 1, microbatches * vpp)
    one_f_one_b = np.minimum(pp - stage, microbatches)
    return np.where(np.asarray(gpipe, dtype=bool), microbatches * vpp, np.where(vpp > 1, interleaved, one_f_one_b))


@lru_cache(maxsize=8192)
def _stage_parameters(model: ModelSpec, shape: ParallelConfig) -> np.ndarray:
    """``(pp, 2)`` dense and expert parameters one GPU of each stage holds (the predictor's
    :func:`~llmcomm.predict.dp.stage_parameters`, which depends on :func:`_shape` only; cached, read-only)."""
    from ..predict.calls import Context
    from ..predict.dp import stage_parameters

    ctx = Context(model, shape, "megatron")
    out = np.array([[sp.dense, sp.expert] for sp in (stage_parameters(ctx, r) for r in range(shape.pp))], dtype=float)
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class _StageInfo:
    """What the memory model reads of one stage layout, per stage ``r`` (arrays of length ``pp``)."""

    dense: np.ndarray  # dense parameters one GPU holds (reduced over DP×CP)
    expert: np.ndarray  # routed-expert parameters (reduced over the expert-data-parallel group)
    layers_per_chunk: np.ndarray  # layers held / vpp
    moe_share: np.ndarray  # share of the held layers that are MoE layers
    linear: np.ndarray  # the layers' TP-sharded and expert parameters: the linear layers' weights (and biases)
    #                     TransformerEngine runs in FP8; not norms, router, embedding or output layer


@lru_cache(maxsize=8192)
def _stage_info(model: ModelSpec, shape: ParallelConfig) -> _StageInfo:
    """:class:`_StageInfo` of a :func:`_shape`: parameters from the step description's vectorized
    :func:`llmcomm.step.stage_parameters` (equal to the predictor's, ``tests/test_overhead_memory.py``), layer
    counts from :func:`llmcomm.step.stage_layers`; cached per shape (the tuner asks once per shape, not per row
    and stage)."""
    p = shape.pp
    held = [step.stage_layers(model.num_layers, shape, r) for r in range(p)]
    pattern = np.asarray(model.moe_layer_pattern(), dtype=bool)
    nm = np.array([int(pattern[h].sum()) if h else 0 for h in held], np.int64)
    nd = np.array([len(h) for h in held], np.int64) - nm
    r = np.arange(p)
    ones = np.ones(p, np.int64)
    tp, ep, etp = shape.tp * ones, shape.ep * ones, shape.expert_tp * ones
    dense, expert, _ = step.stage_parameters(model, tp, ep, etp, p * ones, nd, nm, r == 0, r == p - 1)
    lin = np.zeros(p)
    if np.count_nonzero(~pattern):
        sh, _, _ = step.layer_split(model, tp[:1], ep[:1], etp[:1], moe=False)
        lin = lin + nd * float(sh[0])
    if np.count_nonzero(pattern):
        sh, ex, _ = step.layer_split(model, tp[:1], ep[:1], etp[:1], moe=True)
        lin = lin + nm * float(sh[0] + ex[0])
    share = np.where(nd + nm > 0, nm / np.maximum(nd + nm, 1), 0.0)
    out = _StageInfo(dense.astype(float), expert.astype(float), (nd + nm) / shape.vpp, share, lin)
    for a in (out.dense, out.expert, out.layers_per_chunk, out.moe_share, out.linear):
        a.flags.writeable = False
    return out


@lru_cache(maxsize=8192)
def _fsdp_units(model: ModelSpec, shape: ParallelConfig) -> np.ndarray:
    """``(pp, 2)`` parameters of each stage's largest layer unit and of its non-layer unit on one GPU
    (:func:`llmcomm.overhead.fsdp_time.largest_unit`; cached, read-only)."""
    from ..predict.calls import Context
    from .fsdp_time import largest_unit

    ctx = Context(model, shape, "megatron")
    out = np.array([largest_unit(ctx, r) for r in range(shape.pp)], dtype=float).reshape(shape.pp, 2)
    out.flags.writeable = False
    return out


def _or_unset(n: int | None) -> int:
    """A pipeline stage's layer count as :func:`_shape` takes it: -1 for unset."""
    return -1 if n is None else n


@lru_cache(maxsize=8192)
def _shape(tp: int, pp: int, ep: int, vpp: int, etp: int, first: int, last: int, emb: bool, loss: bool
           ) -> ParallelConfig:
    """The smallest configuration with a stage layout and parameter split (tp, pp, ep, vpp, etp, the pipeline
    split) of a row: dp = ep·etp so that every expert grid fits."""
    dp = ep * etp
    return ParallelConfig(tp=tp, pp=pp, ep=ep, dp=dp, vpp=vpp, etp=etp, global_batch=pp * dp,
                          num_layers_in_first_pipeline_stage=None if first < 0 else first,
                          num_layers_in_last_pipeline_stage=None if last < 0 else last,
                          account_for_embedding_in_pipeline_split=emb, account_for_loss_in_pipeline_split=loss)


def memory_table(model: ModelSpec, candidates: pd.DataFrame | ParallelTable, **fixed: object) -> pd.DataFrame:
    """Memory of the most loaded stage for every row of ``candidates`` (columns named as :class:`ParallelConfig`
    fields; ``fixed`` supplies the rest, e.g. ``seq_len=2048``; unset fields take ParallelConfig's defaults).

    Vectorized: the per-stage parameter counts are computed once per distinct (tp, pp, ep, vpp), everything else
    with numpy over the rows. Returns ``weights_bytes, gradients_bytes, optimizer_bytes, activations_bytes,
    total_bytes, stage`` (the stage that sets the peak). Rows are not validated here (the tuner enumerates valid
    ones; :func:`memory` validates)."""
    tab = (candidates if isinstance(candidates, ParallelTable)
         else ParallelTable.from_frame(candidates, model, required=(), **fixed))
    best = memory_rows(model, tab)
    index = candidates.index if isinstance(candidates, pd.DataFrame) else None
    cols: dict[str, np.ndarray] = {f"{c}_bytes": best[:, j] for j, c in enumerate((*COLUMNS, "total"))}
    cols["stage"] = best[:, 5].astype(np.int64)
    return pd.DataFrame(cols, index=index)  # column by column: one 2-D block converted costs more than the rows


def memory_rows(model: ModelSpec, tab: ParallelTable) -> np.ndarray:
    """:func:`memory_table`'s numbers as an ``(n, 6)`` array, columns ``weights, gradients, optimizer,
    activations, total`` (bytes) and the peak ``stage`` (as a float): the table without pandas (what
    :func:`memory` reads for one configuration)."""
    n = len(tab)
    tp, pp, dp, ep, cp, vpp, mb = tab.tp, tab.pp, tab.dp, tab.ep, tab.cp, tab.vpp, tab.micro_batch
    expert_dp = tab.expert_dp  # once, not per shape and stage (a full-table product each time)
    seq = tab.sequence_length(model).astype(float) / cp
    microbatches = tab.num_microbatches
    act, pbytes, gbytes = (tab.dtype_bytes(c).astype(float) for c in ("act_dtype", "param_dtype", "grad_reduce_dtype"))
    sp, recompute = tab.sp, tab.recompute.astype(str)
    gpipe = tab.schedule == "gpipe"
    dist_opt, fsdp = tab.distributed_optimizer, tab.fsdp
    fp8 = np.not_equal(np.asarray(tab.fp8, dtype=object), None).astype(bool)  # type: ignore[call-overload]
    fp8_primary = np.asarray(tab.fp8_param_gather, dtype=bool) & fp8
    layer_kw = dict(seq=seq, micro_batch=mb, tp=tp, sp=sp, recompute=recompute, act_bytes=act,
                    fused_attention=tab.fused_attention, recompute_modules=tab.recompute_modules,
                    fp8=fp8)
    cp_comm = np.asarray(tab.cp_comm_type, dtype=object)
    cp_buffers = cp_buffer_bytes(model, cp=cp, cp_comm_type=cp_comm, seq_local=seq, micro_batch=mb, tp=tp,
                                 act_bytes=act)
    kinds = set(model.moe_layer_pattern())  # a kind no layer has enters mean_layer with weight 0: not computed
    per_layer = {moe: layer_activation_bytes(model, moe, **layer_kw) if moe in kinds else np.zeros(n)
                 for moe in (False, True)}
    # --recompute-method (llmcomm.step.recompute_groups): "block" keeps the first N layers of a chunk as under full
    # recomputation (their input) and the rest as without it; "uniform" keeps one input per group of N layers
    meth = np.asarray(tab.recompute_method, dtype=object)
    blk, uni = meth == "block", meth == "uniform"
    rnl = np.maximum(np.asarray(tab.recompute_num_layers, np.int64), 1).astype(float)
    if np.count_nonzero(blk):
        none_kw = {**layer_kw, "recompute": np.where(blk, "none", recompute)}
        per_none = {moe: layer_activation_bytes(model, moe, **none_kw) if moe in kinds else np.zeros(n)
                    for moe in (False, True)}
    sbh = seq * mb * model.hidden_size
    best = np.empty((n, 6))
    dp_cp = dp * cp
    keys = [tp, pp, ep, vpp, tab.expert_tp, *(np.asarray(getattr(tab, k), np.int64) for k in step.UNEVEN)]
    inv, uniq = step.factorize(keys)
    # one pass per pipeline depth (the stages are the first axis), every layout of that depth at once: each
    # stage array of a layout gathered per row, so every element is the same expression of the same numbers as for
    # its layout alone
    inv = np.asarray(inv)
    shapes = [_shape(*(int(x) for x in key[:7]), bool(key[7]), bool(key[8])) for key in uniq]
    depth = np.array([sh.pp for sh in shapes], np.int64)
    vocab = {t: 1 + model.padded_vocab_size(int(t)) / model.hidden_size for t in {sh.tp for sh in shapes}}
    has_fsdp = np.zeros(len(uniq), bool)
    has_fsdp[inv[fsdp]] = True
    groups: list[tuple[int, Any, Any, np.ndarray | None]] = []  # (depth, its layouts, its rows, row -> layout)
    if n == 1:  # one configuration (memory()): its layout's stage arrays as one column, its row as a slice (views,
        groups.append((int(depth[0]), [0], slice(None), None))  # no gathers): the same numbers, fewer numpy calls
    for p in np.unique(depth).tolist() if n > 1 else ():
        js = np.flatnonzero(depth == p)
        rows = np.flatnonzero(depth[inv] == p)
        local = np.full(len(uniq), -1, np.int64)
        local[js] = np.arange(len(js))
        groups.append((p, js, rows, local[inv[rows]]))  # at: each row's layout among those of depth p
    for p, js, rows, at in groups:
        infos = [_stage_info(model, shapes[j]) for j in js]

        def per_row(name: str, infos: list[_StageInfo] = infos, at: np.ndarray | None = at) -> np.ndarray:
            if at is None:  # the one row
                return getattr(infos[0], name)[:, None]
            return np.stack([getattr(i, name) for i in infos])[at].T  # stages × rows

        def gather(x: np.ndarray, at: np.ndarray | None = at) -> np.ndarray:  # a per-layout array per row
            return x if at is None else x[at]

        share = per_row("moe_share")
        t = gather(np.array([shapes[j].tp for j in js], np.int64))
        v = gather(np.array([shapes[j].vpp for j in js], np.int64))
        r = np.arange(p)[:, None]  # stages × rows below
        mean_layer = (1 - share) * per_layer[False][rows] + share * per_layer[True][rows]
        chunks = chunks_in_flight(r, pp=p, vpp=v, microbatches=microbatches[rows], gpipe=gpipe[rows])
        lpc = per_row("layers_per_chunk")
        activations = chunks * lpc * mean_layer + cp_buffers[rows]
        meth_rows = blk[rows] | uni[rows]
        if np.count_nonzero(meth_rows):  # per chunk: k checkpointed inputs (+ the block's other layers, all kept)
            nl = rnl[rows]
            k = np.where(blk[rows], np.minimum(nl, lpc), np.ceil(lpc / nl))
            rest = 0.0
            if np.count_nonzero(blk):
                mean_none = (1 - share) * per_none[False][rows] + share * per_none[True][rows]
                rest = np.where(blk[rows], lpc - k, 0.0) * mean_none
            activations = np.where(meth_rows, chunks * (k * mean_layer + rest) + cp_buffers[rows], activations)
        activations[0] += -(-chunks[0] // v) * sbh[rows] / np.where(sp[rows], t, 1)
        activations[p - 1] += 4 * sbh[rows] / t * gather(np.array([vocab[shapes[j].tp] for j in js]))
        if np.count_nonzero(fsdp[rows]):  # the FSDP units of the layouts that have FSDP rows (the others' rows add 0)
            units = np.stack([_fsdp_units(model, shapes[j]).T if has_fsdp[j] else np.zeros((2, p)) for j in js])
            fsdp_unit = gather(units).transpose(1, 2, 0)  # (2, stages, rows)
        else:
            fsdp_unit = np.zeros(2)
        w, g, o = model_state_bytes(per_row("dense"), per_row("expert"), dp_cp=dp_cp[rows],
                                    expert_dp=expert_dp[rows], param_bytes=pbytes[rows], grad_bytes=gbytes[rows],
                                    distributed_optimizer=dist_opt[rows], fsdp=fsdp[rows], fsdp_unit=fsdp_unit,
                                    fsdp_reshard=tab.fsdp_reshard_after_forward[rows])
        w = w + fp8_weight_bytes(per_row("linear"), fp8=fp8[rows], fp8_param_gather=fp8_primary[rows],
                                 param_bytes=pbytes[rows], shard=np.where(fsdp[rows], dp_cp[rows], 1))
        total = w + g + o + activations
        peak = np.argmax(total, axis=0)  # the first stage of the largest total
        cols = np.arange(n if at is None else len(rows))
        best[rows] = np.column_stack([w[peak, cols], g[peak, cols], o[peak, cols], activations[peak, cols],
                                      total[peak, cols], peak])
    return best


def model_state(model: ModelSpec, parallel: ParallelConfig) -> tuple[float, float, float]:
    """``(weights, gradients, optimizer)`` bytes per GPU of the pipeline stage that holds the most model state,
    for one configuration (no activations; not validated): :func:`model_state_bytes` over the stages'
    parameters, without the table machinery of :func:`memory_table` (a fast check for one configuration)."""
    shape = _shape(parallel.tp, parallel.pp, parallel.ep, parallel.vpp, parallel.expert_tp,
                   _or_unset(parallel.num_layers_in_first_pipeline_stage),
                   _or_unset(parallel.num_layers_in_last_pipeline_stage),
                   parallel.account_for_embedding_in_pipeline_split, parallel.account_for_loss_in_pipeline_split)
    params = _stage_parameters(model, shape)
    dp_cp = parallel.dp * parallel.cp
    w, g, o = model_state_bytes(params[:, 0], params[:, 1], dp_cp=dp_cp, expert_dp=parallel.expert_dp,
                                param_bytes=dtype_bytes(parallel.param_dtype),
                                grad_bytes=dtype_bytes(parallel.grad_reduce_dtype),
                                distributed_optimizer=parallel.distributed_optimizer, fsdp=parallel.fsdp,
                                fsdp_unit=_fsdp_units(model, shape).T if parallel.fsdp else np.zeros(2),
                                fsdp_reshard=parallel.fsdp_reshard_after_forward)
    if parallel.fp8 is not None:  # the FP8 weight copies (module doc)
        w = w + fp8_weight_bytes(_stage_info(model, shape).linear, fp8=True, fp8_param_gather=parallel.fp8_param_gather,
                                 param_bytes=dtype_bytes(parallel.param_dtype), shard=dp_cp if parallel.fsdp else 1)
    i = int(np.argmax(w + g + o))
    return float(w[i]), float(g[i]), float(o[i])


def memory(model: ModelSpec, parallel: ParallelConfig) -> MemoryBreakdown:
    """The most loaded pipeline stage's memory for one configuration (validated first)."""
    validate(model, parallel)
    w, g, o, a, _, stage = memory_rows(model, ParallelTable.from_parallel(parallel, model))[0]
    return MemoryBreakdown(int(stage), w, g, o, a)
