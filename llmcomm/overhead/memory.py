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
    if np.any(fsdp):  # FSDP's gathered units (fsdp_unit: the largest layer unit's and the non-layer unit's
        # parameters; llmcomm.overhead.fsdp_time)
        from .fsdp_time import unit_bytes

        uw, ug = unit_bytes(fsdp_unit[0], fsdp_unit[1], dense + expert, param_bytes=param_bytes,
                            grad_bytes=grad_bytes, fsdp=fsdp, reshard=fsdp_reshard,
                            megatron_fsdp=distributed_optimizer)
        weights, grads = weights + uw, grads + ug
    return weights, grads, optimizer


def chunks_in_flight(stage: Any, *, pp: Any, vpp: Any, microbatches: Any, gpipe: Any) -> np.ndarray:
    """Model chunks (of ``L/(pp·v)`` layers) whose activations stage ``stage`` holds at its peak."""
    interleaved = np.minimum((pp - stage - 1) * 2 + (vpp - 1) * pp + 1, microbatches * vpp)
    one_f_one_b = np.minimum(pp - stage, microbatches)
    return np.where(np.asarray(gpipe, dtype=bool), microbatches * vpp, np.where(vpp > 1, interleaved, one_f_one_b))


@lru_cache(maxsize=256)
def _stage_parameters(model: ModelSpec, shape: ParallelConfig) -> np.ndarray:
    """``(pp, 2)`` dense and expert parameters one GPU of each stage holds (the predictor's
    :func:`~llmcomm.predict.dp.stage_parameters`, which depends on :func:`_shape` only; cached, read-only)."""
    from ..predict.calls import Context
    from ..predict.dp import stage_parameters

    ctx = Context(model, shape, "megatron")
    out = np.array([[sp.dense, sp.expert] for sp in (stage_parameters(ctx, r) for r in range(shape.pp))], dtype=float)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=256)
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
    n = len(tab)
    tp, pp, dp, ep, cp, vpp, mb = tab.tp, tab.pp, tab.dp, tab.ep, tab.cp, tab.vpp, tab.micro_batch
    expert_dp = tab.expert_dp  # once, not per shape and stage (a full-table product each time)
    seq = tab.sequence_length(model).astype(float) / cp
    microbatches = tab.num_microbatches
    act, pbytes, gbytes = (tab.dtype_bytes(c).astype(float) for c in ("act_dtype", "param_dtype", "grad_reduce_dtype"))
    sp, recompute = tab.sp, tab.recompute.astype(str)
    gpipe = tab.schedule == "gpipe"
    dist_opt, fsdp = tab.distributed_optimizer, tab.fsdp
    layer_kw = dict(seq=seq, micro_batch=mb, tp=tp, sp=sp, recompute=recompute, act_bytes=act,
                    fused_attention=tab.fused_attention, recompute_modules=tab.recompute_modules)
    per_layer = {moe: layer_activation_bytes(model, moe, **layer_kw) for moe in (False, True)}
    sbh = seq * mb * model.hidden_size
    best = np.full((n, 6), -np.inf)
    keys = [tp, pp, ep, vpp, tab.expert_tp, *(np.asarray(getattr(tab, k), np.int64) for k in step.UNEVEN)]
    inv, uniq = step.factorize(keys)
    pattern = np.asarray(model.moe_layer_pattern())
    for j, key in enumerate(uniq):
        rows = np.flatnonzero(inv == j)
        shape = _shape(*(int(x) for x in key[:7]), bool(key[7]), bool(key[8]))  # type: ignore[arg-type, call-arg]
        t, p, v = shape.tp, shape.pp, shape.vpp
        params = _stage_parameters(model, shape)
        for r in range(p):
            held = step.stage_layers(model.num_layers, shape, r)
            layers_per_chunk = len(held) / v  # chunks of a stage hold equal layers but for the embedding/loss slots
            moe_share = pattern[held].mean() if held else 0.0
            mean_layer = (1 - moe_share) * per_layer[False][rows] + moe_share * per_layer[True][rows]
            chunks = chunks_in_flight(r, pp=p, vpp=v, microbatches=microbatches[rows], gpipe=gpipe[rows])
            activations = chunks * layers_per_chunk * mean_layer
            if r == 0:
                activations = activations + -(-chunks // v) * sbh[rows] / np.where(sp[rows], t, 1)
            if r == p - 1:
                activations = activations + 4 * sbh[rows] / t * (1 + model.padded_vocab_size(int(t)) / model.hidden_size)
            w, g, o = model_state_bytes(params[r, 0], params[r, 1], dp_cp=dp[rows] * cp[rows],
                                        expert_dp=expert_dp[rows], param_bytes=pbytes[rows],
                                        grad_bytes=gbytes[rows], distributed_optimizer=dist_opt[rows],
                                        fsdp=fsdp[rows], fsdp_unit=_fsdp_units(model, shape)[r] if fsdp[rows].any()
                                        else np.zeros(2), fsdp_reshard=tab.fsdp_reshard_after_forward[rows])
            total = w + g + o + activations
            better = total > best[rows, 4]
            idx = rows[better]
            best[idx] = np.column_stack([w, g, o, activations, total, np.full(len(rows), r)])[better]
    index = candidates.index if isinstance(candidates, pd.DataFrame) else None
    out = pd.DataFrame(best, columns=[f"{c}_bytes" for c in (*COLUMNS, "total")] + ["stage"], index=index)
    out["stage"] = out["stage"].astype(np.int64)
    return out


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
    i = int(np.argmax(w + g + o))
    return float(w[i]), float(g[i]), float(o[i])


def memory(model: ModelSpec, parallel: ParallelConfig) -> MemoryBreakdown:
    """The most loaded pipeline stage's memory for one configuration (validated first)."""
    validate(model, parallel)
    row = memory_table(model, ParallelTable.from_parallel(parallel, model)).iloc[0]
    return MemoryBreakdown(int(row["stage"]), row["weights_bytes"], row["gradients_bytes"], row["optimizer_bytes"],
                           row["activations_bytes"])
