"""Iteration time of one training configuration, as named terms (the analytical formulation, finding F6).

One iteration of a pipeline stage ``r`` runs ``m`` micro-batches; per micro-batch it spends ``c_r``::

    c_r = compute_r + tp_r + ep_r + pp_r
    compute_r = Σ_layers (1 + 2 + ρ)·t_pass(layer)       forward 1 pass, backward 2, recompute ρ (full: 1;
              + [r = 0]·3·t_pass(embedding)             selective: the attention core only; none: 0)
              + [r = p-1]·3·t_pass(output + loss)        (not recomputed)
    tp_r, ep_r = Σ over the TP/SP and EP calls the stage issues per micro-batch of ``bw.time(call)``
    pp_r       = (number of sends per micro-batch)·bw.time(send, p2p bytes)
                 (``pipe_partitioned``, DeepSpeed's PipelineEngine: p2p bytes / tp, plus TP all-gathers of the
                 activation, timed in tp_r: 1 forward on a stage that receives, 2 backward on one that sends;
                 its blocking p2p also makes a stage wait for each receive: :mod:`llmcomm.overhead.blocking_p2p`)

Each call is timed for its group as the configuration's ``order`` places it (:func:`llmcomm.step.placement`, read
from :class:`llmcomm.layout.Layout`, nodes of ``gpus_per_node`` consecutive ranks): the group's size and its ranks
per node, ``ceil(size / nodes spanned)`` — a TP group larger than a node (TP 16 on 8-GPU nodes) or spread over
nodes by the order (``pp-dp-tp``) is timed as an inter-node collective; a pipeline send is inter-node as soon as
a pipeline group spans nodes.

The pipeline (1F1B, GPipe and interleaved 1F1B with ``v`` chunks; Narayanan et al. 2021)::

    T_pipe = m·c_crit + bubble,   c_crit = max_r c_r,   bubble = (Σ_r c_r − c_crit) / v

which for equal stages is Megatron-LM's ``(m + (p − 1)/v)·c``; unequal stages (the first holds the embedding,
the last the output layer and the loss) make the slowest stage set the pace. Then, once per iteration::

    T = T_pipe + dp_exposed + optimizer
    dp_exposed = max over stages of the gradient reduction (all-reduce, or reduce-scatter + parameter
                 all-gather with the distributed optimizer) + SP norm all-reduce + tied-embedding all-reduce,
                 minus, for the last stage, the (p − 1) backward steps it finishes ahead of stage 0; with
                 ``overlap_grad_reduce`` Megatron-LM's buckets and schedule decide what hides behind the
                 backward still to run (:func:`llmcomm.overhead.overlap.grad_reduce_exposed`)
    optimizer  = bytes_per_param · params_on_gpu / HBM bandwidth      (Adam, :data:`ADAM_BYTES_PER_PARAM`)

``exposed_comm_s = tp + ep + pp (each m·on the critical stage) + dp_exposed``; ``comm_overhead =
exposed_comm_s / total_s``. The pipeline bubble is reported on its own (idle, not communication).

What is sent is the predictor's (:mod:`llmcomm.predict`): :func:`comm_items` writes its per-stage calls in
closed form for speed, and ``tests/test_overhead_bytes.py`` checks them equal, byte for byte and call for
call, on groups of the same size and ranks per node, to the predictor's stage programs over many configurations
and orders. The layers of each stage, their parameters and the validity rules come from the step description
(:mod:`llmcomm.step`), the configuration table (:mod:`llmcomm.parallel_table`) and :mod:`llmcomm.rules`. Times come from a
:class:`~llmcomm.overhead.bandwidth.Bandwidth` (``time(op, bytes, group_size, ranks_per_node)``) and a
:class:`~llmcomm.overhead.utilization.Utilization`; both default to the kit's shipped calibration.

Overlap and precision (issue 20; each a :class:`ParallelConfig` field with Megatron-LM's name)::

    tp_comm_overlap:      tp_r = tp_overlap_exposed(...)  (TE userbuffers: each block's SP all-gather /
                          reduce-scatter under the GEMM it feeds, less one of ``num_splits`` chunks, in the
                          forward and in a recomputed block's replayed forward alike);
                          without it, under SP, tp_r = overlap.sp_backward_exposed (the column-parallel
                          backward's input re-gather and dgrad reduce-scatter, issued async, under its dgrad and
                          wgrad GEMMs, as TE and Megatron-LM's own linears do)
    overlap_param_gather: dp_exposed = [gradient reduction as above, without the parameter all-gather]
                          + param_gather_exposed(AG of stage 0, its forward, its DDP buckets: the
                          predictor's first-chunk layout, one bucket per later chunk)
    overlap_grad_reduce:  the keyword or the column (either turns it on): each stage's and chunk's buffers
                          reduced as Megatron dispatches them (only stage 0's first chunk bucketed; interleaved
                          chunks aligned to stage 0, the first layers' reduction exposed), then finish_grad_sync
                          and the calls after it (:mod:`llmcomm.overhead.overlap`); with the distributed optimizer
                          only the reduce-scatter hides: the parameter all-gather follows the optimizer step
                          (exposed in full unless overlap_param_gather)
    overlap_p2p_comm:     interleaved only: pp_r = overlap.p2p_exposed (each send behind the other direction's
                          compute step of one chunk)
    moe_a2a_overlap:      ep_r: the all-to-alls of the paired steps of the combined 1F1B schedule behind the
                          other micro-batch's attention and MLP (overlap.a2a_pair_exposed); the flex dispatcher
                          (moe_flex_dispatcher_backend) is refused, rule 'cost-dispatcher'
    fp8:                  the linear layers' GEMMs at the FP8 peak (or the measured GEMM model's FP8 rule),
                          quantization casts as element-wise bytes (:func:`_compute`; ``fp8_recipe='delayed'``
                          per GEMM operand as TE 1.x runs it, :mod:`llmcomm.overhead.fp8_casts`); the blocks'
                          SP collectives in TE's wire bytes (:mod:`llmcomm.predict.fp8_wire`: all-gathers in
                          FP8, reduce-scatters BF16 unless userbuffers' fp8_buf, tensorwise's amax all-reduces);
                          DP bytes unchanged

On a cluster whose GPU has a measured GEMM model (:func:`measured_gemm`: H100, H200 at their datasheet peak)
the linear GEMMs and the output layer's logits GEMM are timed by it, and a fused attention core runs at
cuDNN's measured rate with sliding windows counted (:mod:`llmcomm.overhead.attention_time`)::

    backward = 2·forward + Σ_layers (t_bwd − 2·t_fwd)(attention core)     t_fwd = F/R_fwd, t_bwd = 2.5·F/R_bwd

A100 clusters keep the utilization fit's ``FLOPs/peak`` (byte-identical).

FSDP (``fsdp``, ``fsdp_reshard_after_forward``; :mod:`llmcomm.overhead.fsdp_time`): per micro-batch the units'
parameter all-gathers and gradient reduce-scatters, exposed as prefetching leaves them (its equations), join the
stage time and ``dp_comm_s``; no DDP bucket reduction. ``recompute_modules`` (selective recomputation by module,
:func:`recompute_module_features`): the modules' forward work in ``recompute_s``, their TP/EP calls again in the
backward (:func:`comm_items`).

Context parallelism (``cp``, ``cp_comm_type``; :mod:`llmcomm.overhead.cp_time`)::

    compute on b·s/cp tokens per rank, attention core F_attn(b, s)/cp (causal load balance, two chunks per rank)
    cp_r = exposed CP seconds per micro-batch: the p2p ring's steps under each step's attention kernel; the
           all_gather and a2a calls in full; DP calls over dp·cp (Megatron's data_parallel_group_with_cp)
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from dataclasses import asdict, dataclass
from functools import lru_cache
from itertools import chain
from typing import Any

import numpy as np
import pandas as pd

from .. import rules, step, vocab
from ..errors import ConfigError, DataError
from ..parallel_table import ParallelTable
from ..paths import data_stamp
from ..predict import fp8_wire
from ..specs import Cluster, ModelSpec, ParallelConfig
from ..step import CLASSES
from . import attention_time, cp_time, eager_ops, fp8_casts, fsdp_time, layer_kernels, moe_fold, moe_time
from . import blocking_p2p as _blocking_p2p
from . import interval as _interval
from . import overlap as _overlap
from . import utilization as U
from .bandwidth import Bandwidth, bus_factor, eval_pieces, piece_floor, piece_of, piece_time
from .capacity import check_fits
from .memory import model_state

UNMODELLED_FIELDS = rules.COST_UNMODELLED_FIELDS  # refused at a non-default value (rule "cost-unmodelled")

ADAM_BYTES_PER_PARAM = 40  # read fp32 grad, master, m, v (16) + write master, m, v, half copy (14)
#                           + fp16->fp32 gradient copy (6) + gradient-norm read (4)
TERMS = ("forward_s", "backward_s", "recompute_s", "tp_comm_s", "ep_comm_s", "pp_comm_s", "bubble_s",
         "dp_comm_s", "optimizer_s", "cp_comm_s")
COMM_TERMS = ("tp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s", "cp_comm_s")
@dataclass(frozen=True)
class Breakdown:
    """Seconds per iteration by named term (:data:`TERMS`); see the module docstring for each formula."""

    forward_s: float
    backward_s: float
    recompute_s: float
    tp_comm_s: float
    ep_comm_s: float
    pp_comm_s: float
    bubble_s: float
    dp_comm_s: float
    optimizer_s: float
    dp_comm_total_s: float = 0.0  # the gradient reduction before overlap
    critical_stage: str = ""
    comm_bus_bytes: float = 0.0  # nccl-tests bus bytes: m × the critical stage's per-micro-batch calls + DP reduction
    cp_comm_s: float = 0.0  # exposed context-parallel communication (llmcomm.overhead.cp_time)

    @property
    def total_s(self) -> float:
        return float(sum(getattr(self, t) for t in TERMS))

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s

    @property
    def exposed_comm_s(self) -> float:
        return float(sum(getattr(self, t) for t in COMM_TERMS))

    @property
    def comm_overhead(self) -> float:
        return self.exposed_comm_s / self.total_s

    def to_frame(self) -> pd.DataFrame:
        """One row per term: ``term``, ``seconds``, ``share`` of the total, ``kind`` (compute, comm, idle); the
        ``cp`` row only where context parallelism exposes time."""
        kind = {t: "comm" for t in COMM_TERMS} | {"bubble_s": "idle", "optimizer_s": "compute"}
        rows = [(t.removesuffix("_s"), getattr(self, t), kind.get(t, "compute")) for t in TERMS
                if t != "cp_comm_s" or self.cp_comm_s]
        df = pd.DataFrame(rows, columns=["term", "seconds", "kind"])
        df["share"] = df["seconds"] / self.total_s
        return df

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(total_s=self.total_s, exposed_comm_s=self.exposed_comm_s, comm_overhead=self.comm_overhead)
        return d


# --------------------------------------------------------------------------------------------- input
SCOPES = ("config", "job", "megatron", "cost")  # the rules of llmcomm.rules a candidate must satisfy


def candidate_table(model: ModelSpec, candidates: pd.DataFrame | ParallelTable) -> ParallelTable:
    """``candidates`` (columns named as :class:`ParallelConfig` fields; ``tp, pp, dp`` required) as a
    :class:`~llmcomm.parallel_table.ParallelTable`, checked against every rule of :data:`SCOPES`
    (:mod:`llmcomm.rules`); the first broken rule is raised with its row."""
    t = candidates if isinstance(candidates, ParallelTable) else ParallelTable.from_frame(candidates, model)
    rules.check_table(model, t, SCOPES)
    return t


def arrays(model: ModelSpec, t: ParallelTable, gpus_per_node: int) -> dict[str, np.ndarray]:
    """The arrays the formulas compute with: sizes, dtype bytes, the recompute code, flags, and per group kind
    its size ``n_<kind>`` and ranks per node ``k_<kind>`` under each row's ``order``
    (:func:`llmcomm.step.placement`)."""
    c: dict[str, np.ndarray] = {k: getattr(t, k) for k in ("tp", "pp", "dp", "ep", "vpp", "micro_batch",
                                                           "global_batch")}
    c["etp"] = t.expert_tp
    c["seq_len"] = t.sequence_length(model)
    c["sp"], c["distributed_optimizer"], c["pipe_partitioned"] = t.sp, t.distributed_optimizer, t.pipe_partitioned
    c["attention_mask"] = t.create_attention_mask_in_dataloader.astype(np.int64)
    c["moe_aux_loss_coeff"] = t.moe_aux_loss_coeff
    c["act_is_fp16"] = (t.act_dtype == "fp16").astype(np.int64)
    c["recompute"] = t.recompute_code
    meth = np.asarray(t.recompute_method, dtype=object)
    if np.count_nonzero(meth == "block"):  # --recompute-method block: only the first N layers of each chunk (stages())
        c["rblock"] = meth == "block"
        c["rblock_n"] = np.where(c["rblock"], np.asarray(t.recompute_num_layers, np.int64), -1)
    c["fused_attention"] = t.fused_attention
    c["flash_attention"] = np.asarray(t.attention_backend, dtype=object) == "flash"  # FlashAttention-2 (attention_time)
    c["fp8"] = np.not_equal(t.fp8, None).astype(bool)  # type: ignore[call-overload]  # object array vs None
    c["fp8_tensorwise"] = c["fp8"] & (np.asarray(t.fp8_recipe, dtype=object) == "tensorwise")
    c["fp8_param_gather"] = np.asarray(t.fp8_param_gather, dtype=bool)
    c["fp8_recipe"] = np.asarray(t.fp8_recipe, dtype=object)  # the SP collectives' bytes (sp_wire_bytes)
    c["fp8_buf_proj"], c["fp8_buf_fc2"] = (np.zeros(len(t), bool) for _ in vocab.FP8_BUF_LAYERS)
    ub8 = np.flatnonzero(c["fp8"] & np.asarray(t.tp_comm_overlap, dtype=bool))  # where userbuffers' fp8_buf counts
    for key, n in zip(("fp8_buf_proj", "fp8_buf_fc2"), vocab.FP8_BUF_LAYERS, strict=True):
        c[key][ub8] = [isinstance(x, (tuple, list)) and n in x for x in np.asarray(t.tp_comm_overlap_fp8_buf,
                                                                                  dtype=object)[ub8]]
    c["tp_comm_overlap"] = np.asarray(t.tp_comm_overlap, dtype=bool)
    c["overlap_param_gather"] = np.asarray(t.overlap_param_gather, dtype=bool)
    c["overlap_grad_reduce"] = np.asarray(t.overlap_grad_reduce, dtype=bool)
    c["cp"] = t.cp
    c["cp_comm_type"] = np.asarray(t.cp_comm_type, dtype=object)  # llmcomm.overhead.cp_time
    c["bucket_size"] = t.bucket_size
    c["fsdp"], c["fsdp_reshard"] = t.fsdp, t.fsdp_reshard_after_forward  # FSDP (llmcomm.overhead.fsdp_time)
    if t.recompute_modules.tolist().count(None) != len(t):  # --recompute-modules (absent: core_attn only)
        for name, on in step.recompute_flags(t.recompute, t.recompute_modules).items():
            c["rm_" + name] = np.broadcast_to(np.asarray(on, dtype=bool), (len(t),))
    for k in step.UNEVEN:  # the pipeline split (llmcomm.stage_split.pipeline_split)
        c[k] = np.asarray(getattr(t, k), np.int64)
    for name in ("act_dtype", "grad_reduce_dtype", "param_dtype"):
        c[name] = t.dtype_bytes(name)
    for kind, (_, per_node) in step.placement(t, gpus_per_node).items():
        c["k_" + kind] = per_node  # k_<kind>@<class>: ranks per node of the class's groups (for_class picks them)
    cross = _tp_spans_nodes(c["tp_comm_overlap"], c["k_tp@first"], t.tp)
    if np.count_nonzero(cross):
        i = int(np.flatnonzero(cross)[0])
        raise ConfigError(f"tp_comm_overlap with tp={int(t.tp[i])} on nodes of {gpus_per_node} GPUs: the TP group "
                          f"spans nodes (rule tp-comm-overlap-intra-node: {USERBUFFERS_RULE})")
    return c


USERBUFFERS_RULE = ("TransformerEngine's userbuffers need the tensor-parallel GPUs on one node, over NVLink/NVSwitch: "
                    "TransformerEngine examples/pytorch/comm_gemm_overlap/README.md, Requirements")


def userbuffers_unavailable(t: ParallelTable, gpus_per_node: int) -> np.ndarray:
    """Rows whose ``tp_comm_overlap`` cannot run: the TP group spans nodes (:data:`USERBUFFERS_RULE`; the ranks
    per node of the TP group from :func:`llmcomm.step.placement`, the one home of the rank layout)."""
    return _tp_spans_nodes(t.tp_comm_overlap, step.placement(t, gpus_per_node)["tp@first"][1], t.tp)


def _tp_spans_nodes(tp_comm_overlap: np.ndarray, tp_per_node: np.ndarray, tp: np.ndarray) -> np.ndarray:
    """Rule ``tp-comm-overlap-intra-node``: ``tp_comm_overlap`` where fewer than ``tp`` of the TP group's ranks
    share a node."""
    return np.asarray(tp_comm_overlap, dtype=bool) & (tp_per_node < tp)


def for_class(c: dict[str, np.ndarray], cls: str) -> dict[str, np.ndarray]:
    """:func:`arrays` with the ranks per node of stage class ``cls`` as ``k_<kind>`` (what :func:`comm_items`
    reads)."""
    out = {k: v for k, v in c.items() if "@" not in k}
    out.update({k.split("@")[0]: v for k, v in c.items() if k.endswith("@" + cls)})
    return out


_DTYPE_SHAPE = operator.attrgetter("dtype", "shape")
_CLASS_KEYS: dict[tuple[str, ...], list[tuple[str, tuple[str, str, str]]]] = {}
# stack_classes' split of the keys into 2-D blocks, per key set, row count, dtypes and shapes
_BLOCKS: dict[tuple[Any, ...], tuple[dict[Any, tuple[list[str], list[str]]],
                                     list[tuple[str, tuple[str, str, str]]]]] = {}


def stack_classes(c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``for_class(c, cls)`` of the classes of :data:`~llmcomm.step.CLASSES`, concatenated row-wise (rows
    ``0..n-1`` first, then mid, then last): the ``3n`` rows :func:`stages` computes on. Equal, key for key and
    value for value, to ``{k: concatenate([for_class(c, cls)[k] for cls in CLASSES])}``; the key mapping is
    cached per key set; for a few rows the arrays of one dtype are copied as one 2-D block (row views of it),
    since for one configuration the per-key calls, not the copying, cost the time."""
    keys = tuple(c)
    plan = _CLASS_KEYS.get(keys)
    if plan is None:
        src = [{k: k for k in keys if "@" not in k} for _ in CLASSES]
        for s_, cls in zip(src, CLASSES, strict=True):
            s_.update({k.split("@")[0]: k for k in keys if k.endswith("@" + cls)})
        plan = _CLASS_KEYS[keys] = [(k, (src[0][k], src[1][k], src[2][k])) for k in src[0]]
    n = len(c["tp"])
    if n > 64:  # many rows: the copying costs the time, one concatenation per key copies once
        return {k: np.concatenate([c[a] for a in trio]) for k, trio in plan}
    sig = (keys, n, tuple(map(_DTYPE_SHAPE, c.values())))
    split = _BLOCKS.get(sig)
    if split is None:  # which keys go into one 2-D block per dtype (1-D, n rows, one dtype for the three classes)
        blocks: dict[Any, list[tuple[str, tuple[str, str, str]]]] = {}
        alone = []
        for k, trio in plan:
            arrs = [c[a] for a in trio]
            if all(a.ndim == 1 and len(a) == n for a in arrs) and len({a.dtype for a in arrs}) == 1:
                blocks.setdefault(arrs[0].dtype, []).append((k, trio))
            else:
                alone.append((k, trio))
        if len(_BLOCKS) > 256:
            _BLOCKS.clear()
        split = _BLOCKS[sig] = ({dt: ([k for k, _ in items], [a for _, trio in items for a in trio])
                                 for dt, items in blocks.items()}, alone)
    groups, alone = split
    out: dict[str, np.ndarray] = {k: np.concatenate([c[a] for a in trio]) for k, trio in alone}
    for names, sources in groups.values():  # key j's three classes side by side: row j of a (keys, 3n) block
        block = np.concatenate(operator.itemgetter(*sources)(c)).reshape(len(names), 3 * n)
        out.update(zip(names, block, strict=True))
    return {k: out[k] for k, _ in plan}


@dataclass(slots=True)
class CommItem:
    """Calls of one kind a stage class issues: ``count`` calls (per micro-batch or per iteration) of
    ``nbytes`` each, on a group of ``size`` ranks with ``rpn`` of them per node."""

    term: str  # tp, ep, pp, dp
    parallelism: str
    op: str
    phase: str
    nbytes: np.ndarray
    count: np.ndarray
    size: np.ndarray
    rpn: np.ndarray
    per: str  # "microbatch" or "iteration"
    # a transformer block's SP all-gather / reduce-scatter (TransformerEngine userbuffers): "block" in the phase
    # it names, "replay" a recomputed block's forward call again in the backward (replayed_blocks)
    ub: str = ""
    unit: str = ""  # FSDP: "<ag_f|ag_b|rs_b>:<unit>" (llmcomm.overhead.fsdp_time), timed per unit
    grad: str = ""  # a gradient-buffer reduction: "plain" / "edge" / "shared" chunk bucket or "expert" (overlap)
    tag: str = ""  # CP calls: how their time is exposed (llmcomm.overhead.cp_time.exposed)


def sp_wire_bytes(c: dict[str, np.ndarray], elements: np.ndarray, act: np.ndarray) -> dict[str, np.ndarray]:
    """The blocks' SP collective bytes per row under FP8 (:func:`llmcomm.predict.fp8_wire.block_bytes`, the rule's
    one home; ``elements·act`` without FP8)."""
    return fp8_wire.block_bytes(elements, act, c.get("fp8"), c.get("fp8_recipe"), c.get("tp_comm_overlap"),
                                c.get("fp8_buf_proj"), c.get("fp8_buf_fc2"))


def replayed_blocks(model: ModelSpec, c: dict[str, np.ndarray], nd: np.ndarray, nm: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What of a stage runs its forward again in the backward phase, per micro-batch: ``(rec_d, rec_m, mlp,
    shared)``, the recomputed dense and MoE layers (every layer under full recomputation, the checkpointed ones
    under ``recompute_method="block"``, :func:`llmcomm.step.recomputed_stage_classes`) and, beside them, the
    blocks ``--recompute-modules`` replays (selective)::

        mlp    = nd·[mlp]                                  the dense layers' MLP blocks (fc1, fc2)
        shared = [S > 0]·nm·max([moe], [shared_experts])   the MoE layers' shared-expert blocks (moe replays the
                                                           whole MoE layer, its shared experts with it)

    The one home of which blocks :func:`comm_items` replays the SP calls of and :func:`_compute` counts the
    forward passes of (``ub_n``, what :func:`tp_overlap_exposed` times those calls by)."""
    full = c["recompute"] == 2
    if "rblock" in c:  # recompute_method="block": the checkpointed layers are counted apart (rec_d, rec_m)
        full = full & ~c["rblock"]
    fr = full.astype(np.int64)
    rec_d, rec_m = nd * fr, nm * fr
    if "rec_d" in c:
        rec_d, rec_m = rec_d + c["rec_d"], rec_m + c["rec_m"]
    if "rm_mlp" not in c:  # no --recompute-modules: none but core_attn
        zero = np.zeros(len(fr), np.int64)
        return rec_d, rec_m, zero, zero
    rm = {k: c["rm_" + k].astype(np.int64) for k in ("mlp", "moe", "shared_experts")}
    shared = nm * int(bool(model.num_shared_experts)) * np.maximum(rm["moe"], rm["shared_experts"])
    return rec_d, rec_m, nd * rm["mlp"], shared


def comm_items(model: ModelSpec, c: dict[str, np.ndarray], cls: str | tuple[np.ndarray, np.ndarray],
               layers: tuple[np.ndarray, np.ndarray],
               params: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
               terms: frozenset[str] | None = None) -> list[CommItem]:
    """Every communication call of stage class ``cls`` (``first``, ``mid``, ``last``) in closed form, equal to
    the predictor's stage program (:mod:`llmcomm.predict.program`) aggregated by ``count`` (``terms``: only the
    calls of those terms, in the same order, e.g. ``{"tp", "ep", "pp"}`` for :func:`stage_compute`; the others
    are then not built)::

        per dense layer and micro-batch (A = b·s·h·act):  no SP: fwd 2 AR(A), bwd 2 AR(A)
                                                          SP:    fwd 2 AG(A) + 2 RS(A), bwd 4 AG(A) + 2 RS(A)
        FP8 (llmcomm.predict.fp8_wire): those SP AGs T·h bytes (TE gathers FP8), the RSs A unless userbuffers'
                       fp8_buf; tensorwise: + a 4-byte amax AR before each forward and grad-output AG
        per MoE layer: attention half of the above; ep > 1: 2 all-to-alls fwd and 2 bwd of
                       T_local·topk·h·act; etp > 1: AG + RS of etp·T_local·topk·h·act fwd and bwd on the
                       expert-TP group (llmcomm.overhead.moe_fold); shared experts a dense block's calls
        full recomputation: each layer's forward calls again in the backward phase
        first stage: embedding fwd AR(A) (SP: RS(A)); SP: bwd AG(A)
        last stage:  output fwd (SP: AG(A)) + 3 fp32 AR(4·b·s); bwd AR(A) (SP: 2 AG(A) + RS(A))
        pipeline: sends fwd = v − [last], bwd = v − [first] (and as many receives), p2p bytes A (/tp with SP)
        per iteration: DP gradient AR (dist. optimizer: RS + param AG) of the stage's dense and expert
                       parameters, SP norm-gradient AR over TP, tied-embedding AR (pp > 1) on first/last
    """
    h = model.hidden_size
    tp, pp, dp, ep, v = c["tp"], c["pp"], c["dp"], c["ep"], c["vpp"]
    n = len(tp)
    sp = c["sp"]
    act, gby, pby = c["act_dtype"], c["grad_reduce_dtype"], c["param_dtype"]
    # fp8_param_gather: the DistOpt all-gathers FP8 weights, 1 byte each (biases and norms, a small share, are
    # counted at 1 byte too); the predictor does not carry this option yet (its bytes are param_dtype's)
    pby = np.where(c["fp8_param_gather"], 1, pby) if "fp8_param_gather" in c else pby
    cp = c["cp"]
    T = c["micro_batch"] * c["seq_len"] // cp  # tokens per CP rank (get_batch_on_this_cp_rank)
    Tb = c["micro_batch"] * c["seq_len"]  # the batch broadcast precedes the CP split
    A = T * h * act
    one = np.ones(n, np.int64)
    holds_first, holds_last = step.holds_edges(cls, pp) if isinstance(cls, str) else cls
    nd, nm = layers
    tpon = (tp > 1).astype(np.int64)
    rpn_tp = c["k_tp"]
    items: list[CommItem] = []

    def tpc(op: str, phase: str, nbytes: np.ndarray, count: np.ndarray, par: str | None = None,
            ub: str = "") -> None:
        par = par or ("sp" if op in ("all_gather", "reduce_scatter") else "tp")
        items.append(CommItem("tp", par, op, phase, nbytes, count * tpon, tp, rpn_tp, "microbatch", ub))

    nsp, ysp = (~sp).astype(np.int64), sp.astype(np.int64)
    # transformer blocks: dense layers have 2 blocks (attention, MLP), MoE layers 1 (+1 with shared experts)
    per_moe = 2 if model.num_shared_experts else 1
    blocks = 2 * nd + nm * per_moe
    # recomputed layers (their forward calls again in the backward phase) and the blocks --recompute-modules
    # replays (replayed_blocks)
    rec_d, rec_m, re_mlp, re_shared = replayed_blocks(model, c, nd, nm)
    rb = 2 * rec_d + rec_m * per_moe
    tpc("all_reduce", "forward", A, blocks * nsp)
    tpc("all_reduce", "backward", A, blocks * nsp + rb * nsp)
    # the blocks' SP collectives in the bytes TransformerEngine sends under each row's FP8 recipe (A without FP8;
    # llmcomm.predict.fp8_wire, the predictor's tp.block_forward / block_backward): parts of equal bytes on
    # every row are one call item, so a BF16 table's items are those of before
    w = sp_wire_bytes(c, T * h, act)
    attn, mlp = nd + nm, nd + nm * (per_moe - 1)  # blocks by their row-parallel layer: proj_fprop, fc2_fprop
    rb_attn, rb_mlp = rec_d + rec_m, rec_d + rec_m * (per_moe - 1)

    def tpw(op: str, phase: str, parts: list[tuple[np.ndarray, np.ndarray]], ub: str = "block") -> None:
        while parts:
            nb, cnt = parts.pop(0)
            while parts and np.array_equal(parts[0][0], nb):
                cnt = cnt + parts.pop(0)[1]
            tpc(op, phase, nb, cnt * ysp, ub=ub)

    tpw("all_gather", "forward", [(w["fwd_ag"], blocks)])
    # the forward reduce-scatters by the GEMM they follow (tp_overlap_exposed reads one call of each)
    tpw("reduce_scatter", "forward", [(w["fwd_rs_proj"], attn)], "proj")
    tpw("reduce_scatter", "forward", [(w["fwd_rs_fc2"], mlp)], "fc2")
    tpw("all_gather", "backward", [(w["bwd_ag_grad"], blocks), (w["bwd_ag_input"], blocks)])
    tpw("reduce_scatter", "backward", [(w["bwd_rs"], blocks)])
    # the recomputed blocks' forward SP calls, replayed in the backward phase (ub "replay": tp_overlap_exposed
    # times them as the forward's, under the replayed GEMMs)
    tpw("all_gather", "backward", [(w["fwd_ag"], rb)], "replay")
    tpw("reduce_scatter", "backward", [(w["fwd_rs_proj"], rb_attn), (w["fwd_rs_fc2"], rb_mlp)], "replay")
    amax = w.get("amax")  # current scaling: an amax all-reduce before every gathered FP8 cast
    # --recompute-modules mlp / moe / shared_experts: the recomputed blocks' forward calls again in the backward
    # (llmcomm.predict.program.recompute_replay); moe replays the MoE layer's calls below (frm)
    zero = np.zeros(n, np.int64)  # a module not recomputed (no --recompute-modules: none but core_attn)
    rm = {k: c["rm_" + k].astype(np.int64) if "rm_" + k in c else zero for k in ("mlp", "moe", "shared_experts")}
    if "rm_mlp" in c:
        reblocks = re_mlp + re_shared
        tpc("all_reduce", "backward", A, reblocks * nsp)
        tpw("all_gather", "backward", [(w["fwd_ag"], reblocks)], "replay")
        tpw("reduce_scatter", "backward", [(w["fwd_rs_fc2"], reblocks)], "replay")
        if amax is not None:
            tpc("all_reduce", "backward", amax, reblocks * ysp * (amax > 0))
    if amax is not None:  # the current-scaling rows only (amax 0 elsewhere)
        tpc("all_reduce", "forward", amax, blocks * ysp * (amax > 0))
        tpc("all_reduce", "backward", amax, (blocks + rb) * ysp * (amax > 0))
    if terms is None or "cp" in terms:
        items += _cp_items(model, c, T, nd + nm, rec_d + rec_m)
    etp = c["etp"]
    if model.is_moe:  # Megatron-LM's alltoall token dispatcher on the expert grid (llmcomm.predict.ep, moe_fold)
        k, E = model.moe_router_topk, model.num_experts
        local = np.where(sp, T // tp, T)
        # the MoE layers whose forward calls run again in the backward phase: full recomputation (or block's
        # checkpointed ones) or recompute "moe"
        mf = np.maximum(rec_m, nm * rm["moe"])
        tpep = etp * ep  # Megatron's tp_ep group: expert TP x EP (parallel_state.py:1388)
        cnt_on = (tpep > 1).astype(np.int64)
        rpn_tpep = c["k_tpep"]
        items.append(CommItem("ep", "ep", "all_gather", "forward", tpep * E * 8, nm * cnt_on, tpep, rpn_tpep,
                              "microbatch"))
        items.append(CommItem("ep", "ep", "all_gather", "backward", tpep * E * 8, mf * cnt_on, tpep,
                              rpn_tpep, "microbatch"))
        tpcp, rpn_tpcp = tp * cp, np.where(cp > 1, c["k_tpcp"], rpn_tp)  # the router's tp x cp group
        aux_on = (c["moe_aux_loss_coeff"] > 0).astype(np.int64) * (tpcp > 1)  # router token-count all-reduce
        items.append(CommItem("ep", "ep", "all_reduce", "forward", 8 * E * one, nm * aux_on, tpcp, rpn_tpcp,
                              "microbatch"))
        items.append(CommItem("ep", "ep", "all_reduce", "backward", 8 * E * one, mf * aux_on, tpcp, rpn_tpcp,
                              "microbatch"))
        # expert TP: forward AG tokens, AG probabilities, RS output; backward AG output, RS probs, RS tokens, on
        # the expert-TP group (moe_fold.expert_tp_items: the TP group itself where etp = tp)
        items += moe_fold.expert_tp_items(c, local, k, h, act, nm, mf)
        split = np.rint(local * k * h * act / ep).astype(np.int64)
        psplit = np.rint(local * k * act / ep).astype(np.int64)
        epon = (ep > 1).astype(np.int64)
        rpn_ep = c["k_ep"]
        for nb, n_calls in ((split * ep, 2), (psplit * ep, 1)):
            items.append(CommItem("ep", "ep", "all_to_all", "forward", nb, n_calls * nm * epon, ep, rpn_ep,
                                  "microbatch"))
            items.append(CommItem("ep", "ep", "all_to_all", "backward", nb, n_calls * (nm + mf) * epon, ep, rpn_ep,
                                  "microbatch"))
    f, la = holds_first.astype(np.int64), holds_last.astype(np.int64)
    # embedding: SP reduce-scatters only without learned positions (LanguageModelEmbedding), else all-reduce
    rs_emb = ysp * int(model.position_embedding_type != "learned_absolute")
    tpc("all_reduce", "forward", A, f * (1 - rs_emb))
    tpc("reduce_scatter", "forward", A, f * rs_emb)
    tpc("all_gather", "backward", A, f * ysp)
    tpc("all_gather", "forward", A, la * ysp)
    tpc("all_reduce", "forward", T * 4, 3 * la)
    tpc("all_reduce", "backward", A, la * nsp)
    tpc("all_gather", "backward", A, la * ysp)
    tpc("reduce_scatter", "backward", A, la * ysp)
    # batch broadcast over TP (get_batch_on_this_tp_rank) on the first and last virtual stage: int64 tokens,
    # labels, positions (8·b·s each), fp32 loss mask (4·b·s), the bool attention mask (b·s·s) by default
    both = holds_first & holds_last
    n8 = 3 * both + 2 * (holds_first & ~holds_last) + 1 * (holds_last & ~holds_first)
    tpc("broadcast", "forward", 8 * Tb, n8.astype(np.int64), "other")
    tpc("broadcast", "forward", 4 * Tb, la, "other")
    tpc("broadcast", "forward", Tb * c["seq_len"], (f | la) * c["attention_mask"], "other")
    # pipeline
    # DeepSpeed's PipelineEngine (``pipe_partitioned``; Megatron-DeepSpeed's GPTModelPipe) sends the activation
    # and its gradient split over the TP group (PartitionedTensor over the slice-parallel group) and rebuilds the
    # full tensor with a TP all-gather: on receiving the activation (forward), on restoring its own output and
    # on receiving the gradient (backward)
    part = c["pipe_partitioned"] & ~sp & (tp > 1)
    p2p = np.where(sp | part, T // tp, T) * h * act
    rpn_pp = c["k_p2p"]
    ppon = (pp > 1).astype(np.int64)
    for op, phase, cnt in (("send", "forward", v - la), ("recv", "forward", v - f),
                           ("send", "backward", v - f), ("recv", "backward", v - la)):
        items.append(CommItem("pp", "pp", op, phase, p2p, cnt * ppon, 2 * one, rpn_pp, "microbatch"))
    pon = part.astype(np.int64) * ppon
    tpc("all_gather", "forward", A, (v - f) * pon, "pp")
    tpc("all_gather", "backward", A, 2 * (v - la) * pon, "pp")
    if terms is not None and not terms & {"dp", "fsdp"}:  # nothing per iteration asked for
        return [it for it in items if it.term in terms]
    # once per iteration
    dense, expert, repl = params or _stage_params(model, c, nd, nm, holds_first, holds_last)
    # experts share the dense buffer unless ep > 1 or etp != tp (llmcomm.predict.dp.experts_in_own_buffer)
    own = moe_fold.experts_in_own_buffer(model, c)
    dense, expert = np.where(own, dense, dense + expert), np.where(own, expert, 0)
    eopt = (own & (expert > 0)).astype(np.int64)  # the stage has an expert optimizer (chained)
    dpon = (dp > 1).astype(np.int64)  # the MoE metrics' DP average (scalars.moe_metrics) stays on dp
    dp_only, rpn_dp_only = dp, c["k_dp"]
    # gradients, parameters and the loss report go over dp x cp (Megatron's data_parallel_group_with_cp)
    dp, rpn_dp = dp * cp, np.where(cp > 1, c["k_dpcp"], c["k_dp"])
    dpcpon = (dp > 1).astype(np.int64)
    edp = moe_fold.expert_dp(c)  # world / (etp·ep·pp): EP may span dp·cp·tp (MoE parallel folding)
    edpon = ((edp > 1) & (expert > 0)).astype(np.int64)
    rpn_edp = c["k_edp"]
    dist = c["distributed_optimizer"].astype(np.int64)
    nf = 1 - c["fsdp"].astype(np.int64) if "fsdp" in c else 1  # FSDP: no DDP buckets (llmcomm.overhead.fsdp_time)
    # one gradient buffer per model chunk (finish_grad_sync per chunk): v - 1 chunks of layers only, one with
    # the stage's embedding / output layer when it holds them
    vh = step.embedding_shard(model, tp)
    edge = step.edge_parameters(model, tp, pp, holds_first, holds_last)[0]
    has_edge = (holds_first | holds_last).astype(np.int64)
    chunk_layers = (dense - edge) // v
    # account_for_embedding/loss_in_pipeline_split with vpp > 1: the edge chunk gives its embedding / loss slot
    # up, so it holds one layer fewer than the stage's other chunks (llmcomm.stage_split; layers of one kind:
    # rule cost-account-interleaved refuses models mixing dense and MoE layers there)
    nl = nd + nm
    short = ((nl % v) != 0) & (has_edge > 0)
    full = -(-nl // v)
    chunk_layers = np.where(short, (dense - edge) // np.maximum(nl, 1) * full, chunk_layers)
    edge_layers = np.where(short, dense - edge - (v - 1) * chunk_layers, chunk_layers)
    e_plain = np.where(short, expert // np.maximum(nl, 1) * full, expert // v)
    e_edge = np.where(short, expert - (v - 1) * e_plain, e_plain)
    ush = short.astype(np.int64)
    # DistOpt + tied embeddings + pp > 1: the shared embedding (first stage) and its copy (last) are a bucket of
    # their own (llmcomm.predict.dp.buckets); the rest of that chunk is another
    shared = (c["distributed_optimizer"] & model.tied_embeddings & (pp > 1) & (holds_first | holds_last))
    sh = shared.astype(np.int64)
    chunk_sizes = ((chunk_layers, v - has_edge), (edge_layers + edge - sh * vh, has_edge), (vh, has_edge * sh))
    expert_chunks = ((e_plain, v - ush), (e_edge, ush))
    for op, cnt in (("all_reduce", (1 - dist) * nf), ("reduce_scatter", dist * nf)):
        for (nb, k_), tag in zip(chunk_sizes, ("plain", "edge", "shared"), strict=True):
            items.append(CommItem("dp", "dp", op, "optimizer", nb * gby, k_ * cnt * dpcpon, dp, rpn_dp, "iteration",
                                  grad=tag))
        for nb, k_ in expert_chunks:
            items.append(CommItem("dp", "dp", op, "optimizer", nb * gby, k_ * cnt * edpon, edp, rpn_edp,
                                  "iteration", grad="expert"))
    items.append(CommItem("dp", "tp", "all_reduce", "optimizer", repl * gby, tpon * ysp * (repl > 0), tp, rpn_tp,
                          "iteration"))
    tied = (pp > 1) & model.tied_embeddings & (holds_first | holds_last)
    items.append(CommItem("dp", "pp", "all_reduce", "optimizer", vh * gby, tied.astype(np.int64), 2 * one,
                          c["k_emb"], "iteration"))
    passes = (1 + eopt) * nf  # each chained DistOpt all-gathers every bucket (llmcomm.predict.dp.param_gather_passes)
    for nb, k_ in chunk_sizes:
        items.append(CommItem("dp", "dp", "all_gather", "optimizer", nb * pby, k_ * dist * dpcpon * passes, dp,
                              rpn_dp, "iteration"))
    for nb, k_ in expert_chunks:
        items.append(CommItem("dp", "dp", "all_gather", "optimizer", nb * pby, k_ * dist * edpon * passes, edp,
                              rpn_edp, "iteration"))
    # per-iteration scalars (llmcomm.predict.scalars): fp16 found_inf + gradient norm over the gradient-statistics
    # group (world with the distributed optimizer, else tp·pp), train_step's two over tp·pp, the loss report over
    # DP on the last stage, MoE load-balancing metrics over pp, [tp], dp
    world, mp = tp * pp * dp, tp * pp  # dp here is dp·cp
    gs = np.where(dist > 0, world, mp)
    rpn_mp = c["k_mp"]
    rpn_gs = np.where(dist > 0, c["k_world"], rpn_mp)
    fp16 = (act == 2) & (c["act_is_fp16"] > 0)
    # fp16 found_inf per chained optimizer; the norm once over a shared group (DistOpt: the world), else once
    # per optimizer (the expert one over etp·ep·pp); the rerun state machine's int32 over the world
    items.append(CommItem("dp", "other", "all_reduce", "optimizer", 4 * one,
                          (gs > 1) * (1 + fp16 * (1 + eopt * dist)), gs, rpn_gs, "iteration"))
    eg = etp * ep * pp
    rpn_eg = c["k_tpeppp"]  # the expert optimizer's gradient-statistics group etp·ep·pp
    items.append(CommItem("dp", "other", "all_reduce", "optimizer", 4 * one, (eg > 1) * eopt * (1 - dist) * (1 + fp16),
                          eg, rpn_eg, "iteration"))
    rpn_w = c["k_world"]
    items.append(CommItem("dp", "other", "all_reduce", "optimizer", 4 * one, (world > 1).astype(np.int64), world,
                          rpn_w, "iteration"))
    items.append(CommItem("dp", "other", "all_reduce", "optimizer", 4 * one, 2 * (mp > 1), mp, rpn_mp, "iteration"))
    items.append(CommItem("dp", "dp", "all_reduce", "optimizer", 8 * one, la * dpcpon, dp, rpn_dp, "iteration"))
    if model.is_moe:
        nl = 4 * model.num_layers * one
        rpn_pg = c["k_pp"]
        items.append(CommItem("dp", "other", "all_reduce", "optimizer", nl, ppon, pp, rpn_pg, "iteration"))
        items.append(CommItem("dp", "other", "all_reduce", "optimizer", nl,
                              (c["moe_aux_loss_coeff"] > 0) * (tpcp > 1), tpcp, rpn_tpcp, "iteration"))
        items.append(CommItem("dp", "other", "all_reduce", "optimizer", nl, dpon, dp_only, rpn_dp_only, "iteration"))
    items += fsdp_time.comm_items(model, c, holds_first, holds_last, nd, nm)
    return items if terms is None else [it for it in items if it.term in terms]


def _cp_items(model: ModelSpec, c: dict[str, np.ndarray], tokens: np.ndarray, layers: np.ndarray,
              recomputed: np.ndarray) -> list[CommItem]:
    """The CP calls of a stage per micro-batch (:func:`llmcomm.overhead.cp_time.cp_calls` per layer, times its
    ``layers``; the forward's again in the backward phase for its ``recomputed`` layers: all under full
    recomputation, the checkpointed ones under ``recompute_method="block"``), each ring send with its receive,
    on the CP group as the layout places it."""
    cp, tp = c["cp"], c["tp"]
    if not np.count_nonzero(cp > 1):
        return []
    k_cp = c["k_cp"]
    ring = cp_time.ring_ranks_per_node(cp, k_cp)
    two = np.full(len(cp), 2, np.int64)
    out: list[CommItem] = []
    for cc in cp_time.cp_calls(model, cp, c["cp_comm_type"], tokens, tp, c["act_dtype"]):
        per_phase = [(cc.phase, cc.per_layer * layers)]
        if cc.fwd_kind:
            per_phase.append(("backward", cc.per_layer * recomputed))
        for phase, count in per_phase:
            if cc.op == "send":
                for op in ("send", "recv"):
                    out.append(CommItem("cp", "cp", op, phase, cc.nbytes, count, two, ring, "microbatch", tag=cc.tag))
            else:
                out.append(CommItem("cp", "cp", cc.op, phase, cc.nbytes, count, cp, k_cp, "microbatch", tag=cc.tag))
    return out


def _stage_params(model: ModelSpec, c: dict[str, np.ndarray], nd: np.ndarray, nm: np.ndarray,
                  holds_first: np.ndarray, holds_last: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dense, expert, replicated)`` parameters of one TP rank of a stage (:func:`llmcomm.step.stage_parameters`,
    the predictor's :func:`llmcomm.predict.dp.stage_parameters` vectorized)."""
    return step.stage_parameters(model, c["tp"], c["ep"], c["etp"], c["pp"], nd, nm, holds_first, holds_last)


# ----------------------------------------------------------------------------------------- compute
def measured_gemm(cluster: Cluster) -> Any:
    """The cluster's measured GEMM model (:func:`llmcomm.overhead.gemm.load_gemm_model`: H100, H200), or
    ``None`` where there is none (A100: the utilization fit's term is kept; B200: no table) or where the
    cluster's ``peak_bf16_flops`` is not the datasheet figure the model was fitted with (within 0.1 %: another
    part, e.g. H100 PCIe, or a hypothetical GPU; the fit belongs to its figures, :func:`load_gemm_model`)."""
    from .gemm import CALIBRATION, fp8_factor

    return _measured_gemm(cluster, *data_stamp(CALIBRATION), fp8_factor())


@lru_cache(maxsize=64)
def _measured_gemm(cluster: Cluster, path: str, stamp: int, fp8: float) -> Any:
    """:func:`measured_gemm`, once per cluster, GEMM calibration file (``path`` at ``stamp``) and FP8 factor
    (``fp8``: the shipped one, or a trial value while :mod:`llmcomm.overhead.fp8_fit` fits it — a model cached
    across trial values would make the fit's objective flat)."""
    from ..errors import DataError
    from .gemm import GemmModel, load_gemm_model

    try:
        g = load_gemm_model(cluster)
    except DataError:
        return None
    if not isinstance(g, GemmModel) or not np.isclose(g.peak.get("bf16", 0.0), cluster.peak_bf16_flops, rtol=1e-3):
        return None
    return g


def layer_gemm_shapes(model: ModelSpec, T: np.ndarray, tp: np.ndarray, etp: np.ndarray, ep: np.ndarray
                      ) -> dict[str, tuple[np.ndarray, ...]]:
    """``name -> (m, n, k, batch)`` of one layer's forward linear GEMMs on one rank, the step description's
    :func:`llmcomm.step.layer_gemms` over arrays (``T = b·s/cp`` tokens; tested equal to it): ``qkv``, ``proj``,
    ``fc1``, ``fc2`` of a dense layer; ``expert_fc1``/``expert_fc2`` (``E/ep`` experts of ``T·topk·ep·etp/(tp·E)`` rows
    each, balanced routing) and ``shared_fc1``/``shared_fc2`` of an MoE layer (zero-sized where absent)."""
    h, a, g, d = model.hidden_size, model.num_attention_heads, model.query_groups, model.head_dim
    km = 3 if model.gated_mlp else 2
    f = model.ffn_hidden_size
    one = np.ones_like(T)
    out: dict[str, tuple[np.ndarray, ...]] = {"qkv": (T, (a * d + 2 * g * d) // tp, h * one, one), "proj": (T, h * one, a * d // tp, one),
           "fc1": (T, (km - 1) * f // tp, h * one, one), "fc2": (T, h * one, f // tp, one)}
    if model.is_moe:
        E, fe = model.num_experts, model.expert_ffn_hidden_size
        et = np.where(etp > 0, etp, tp)
        rows = moe_fold.expert_rows(T, tp, et, ep, model.moe_router_topk, E)
        out["expert_fc1"] = (rows, (km - 1) * fe // et, h * one, E // ep)
        out["expert_fc2"] = (rows, h * one, fe // et, E // ep)
        if model.num_shared_experts:
            sf = model.num_shared_experts * fe
            out["shared_fc1"] = (T, (km - 1) * sf // tp, h * one, one)
            out["shared_fc2"] = (T, h * one, sf // tp, one)
    return out


def _compute(model: ModelSpec, c: dict[str, np.ndarray], layers: tuple[np.ndarray, np.ndarray],
             holds_first: np.ndarray, holds_last: np.ndarray, peak: float, hbm: float,
             peak_fp8: float | None = None, gemm_model: Any = None) -> dict[str, np.ndarray]:
    """Utilization features of one stage class per micro-batch: one pass of a dense layer (``Ld``) and of an
    MoE layer (``Lm``), their attention cores (``Cd``, ``Cm``; selective recomputation), the embedding and
    output layer's forward pass (``E``), the layer counts ``nd``, ``nm`` and the recompute flags; ``Gag`` and
    ``Grs``: the GEMM features of the stage's TransformerEngine linears whose input is SP-all-gathered (``qkv``,
    ``fc1``) and whose output is SP-reduce-scattered (``proj``, ``fc2``), what ``tp_comm_overlap`` hides them under;
    ``ub_gag``, ``ub_grs`` (``(n, 3)``) the same of one block of each kind (attention, dense MLP, shared experts)
    and ``ub_n`` each kind's forward passes, the forward's and those replayed in the backward (:func:`replayed_blocks`).

    FP8 (``fp8`` rows, TransformerEngine's ``fp8_autocast`` around the transformer layers): the linear layers'
    GEMMs (qkv, proj, fc1, fc2, the experts') run at ``peak_fp8`` instead of the BF16 peak, with the same
    efficiency rule (the utilization fit's ``θ_gemm``; :mod:`llmcomm.overhead.gemm` states the FP8 rule of the
    measured model); the attention core (``fp8_dot_product_attention`` off, Megatron's default), the router and
    the output layer (Megatron's ``output_layer`` is ``tensor_parallel.ColumnParallelLinear``, gpt_model.py, not a TE module)
    stay BF16. Casts are element-wise bytes at HBM bandwidth. ``fp8_recipe='delayed'`` (TE's DelayedScaling):
    every GEMM operand's cast and transpose as TransformerEngine 1.x runs them, weights once per iteration
    included, the backward's own (:func:`llmcomm.overhead.fp8_casts.delayed_cast_bytes`; beyond twice the forward
    in ``Bd``/``Bm``). ``'tensorwise'`` keeps this rule: the inputs of ``proj`` and ``fc2`` are quantized
    (read 2 + write 1 bytes per element: ``3·T·(a·d + f)/tp``); with ``fp8_recipe='delayed'`` the
    ``qkv``/``fc1`` inputs come out of TE's fused LayerNorm already in FP8 (``LayerNormLinear``, the scale is
    last step's); with ``'tensorwise'`` (current scaling: the scale is this tensor's amax) each cast first reads
    its tensor for the amax (``+2·T·(a·d + f)/tp``) and the two LayerNorm outputs are quantized apart
    (``+2·5·T·h/w``, ``w = tp`` with SP else 1); weights are cast once per iteration and cached
    across micro-batches (``is_first_microbatch``), not counted; the backward's grad-output casts follow the
    ``backward = 2·forward`` rule of :func:`class_times`. The amax-history reduction (delayed scaling: one
    small MAX all-reduce of the autocast region's concatenated amaxes over the amax group at each fp8_autocast
    exit and one per backward, i.e. per model chunk and micro-batch; TransformerEngine v1.8 fp8.py:316-345,
    419-426) is not counted; current scaling's per-cast TP amax all-reduces are (:mod:`llmcomm.predict.fp8_wire`).

    Measured GEMMs (``gemm_model``, a :class:`~llmcomm.overhead.gemm.GemmModel`: H100, H200): the linear layers'
    GEMMs of :func:`layer_gemm_shapes` (the step description's, :func:`llmcomm.step.layer_gemms`) are timed by it
    one by one (``bf16``, or ``fp8`` by its stated FP8 rule) and that time, in seconds, replaces their
    ``FLOPs / peak`` in the gemm feature; the utilization fit's ``θ_gemm`` (the A100 matmul efficiency of
    ``FLOPs/peak``, fitted on vTrain's single-node runs) is then taken as 1 (:func:`combine`): measured time is
    left as measured. The backward is ``2·forward``
    (dgrad and wgrad have the forward's FLOPs; their shapes are not timed apart). A100 (no GEMM table) keeps the
    ``FLOPs/peak`` features byte for byte.

    With a measured GEMM model, also: the fused attention core (``Cd``/``Cm``, rows with ``fused_attention``)
    in seconds at cuDNN's measured H100 rate, its FLOPs shortened by a sliding window on the windowed share of
    the layers, and its backward beyond ``2·forward`` as ``Bd``/``Bm`` (gemm feature, seconds;
    :func:`llmcomm.overhead.attention_time.core_seconds`, read by :func:`class_times`); the output layer's
    logits GEMM (``T × V'/tp × h``, BF16: Megatron's ``output_layer`` is not a TE module) by the measured model
    instead of ``FLOPs/peak`` (its cross-entropy bytes unchanged); an unfused attention core's two matmuls
    (``baddbmm`` Q·Kᵀ and ``bmm`` scores·V, ``b·a/tp`` batched GEMMs of ``s×s×d`` and ``s×d×s``) by the measured
    model too, its score traffic unchanged.

    MoE layers (:mod:`llmcomm.overhead.moe_time`): the experts' GEMMs as TE's grouped linear runs them (one cuBLAS
    GEMM per local expert, in rounds of TE's four compute streams; FP8 rows padded to 16); the alltoall dispatcher's
    permute, chunk sorts and unpermute, the router's element-wise work, the experts' bias (``add_bias_linear``) and
    the FP8 casts of the dispatched tokens as bytes in the memory feature (also replayed by recompute ``moe``).
    """
    b, s, tp = c["micro_batch"], c["seq_len"] // c["cp"], c["tp"]  # s: tokens of one CP rank (cp_time)
    h, a, g, d = model.hidden_size, model.num_attention_heads, model.query_groups, model.head_dim
    k = 3 if model.gated_mlp else 2
    nd, nm = layers
    fw = np.where(c["sp"], tp, 1)
    fz = c["fused_attention"]
    Ld, Cd = cp_time.attention_per_rank(*U.layer_features(b, s, tp, h, a, g, d, model.ffn_hidden_size, k, peak,
                                                          hbm, fw, fz, model.activation_kind), c["cp"])
    Lm, Cm = np.zeros_like(Ld), np.zeros_like(Cd)
    fe = (model.moe_router_topk + model.num_shared_experts) * model.expert_ffn_hidden_size if model.is_moe else 0
    if model.is_moe:
        Lm, Cm = cp_time.attention_per_rank(*U.layer_features(b, s, tp, h, a, g, d, fe, k, peak, hbm, fw, fz,
                                                              model.activation_kind), c["cp"])
    T = (b * s).astype(np.float64)
    tpf = tp.astype(np.float64)
    f8 = c["fp8"]
    lin_peak = np.full(len(tp), peak)
    if np.count_nonzero(f8):
        if not peak_fp8:
            raise ConfigError("fp8 is set but the cluster states no peak_fp8_flops (no FP8 tensor cores, e.g. "
                              "A100, or not in the cluster file)")
        lin_peak = np.where(f8, peak_fp8, peak)
        r = peak / lin_peak  # the linear GEMMs' share of the gemm feature, moved to the FP8 peak
        for L, C, ff in ((Ld, Cd, model.ffn_hidden_size), (Lm, Cm, fe)):
            L[:, U.I["gemm"]] = C[:, U.I["gemm"]] + (L[:, U.I["gemm"]] - C[:, U.I["gemm"]]) * r
            # delayed scaling: fp8_casts.delayed_cast_bytes below, per GEMM operand as TE 1.x runs it
            L[:, U.I["mem"]] += c["fp8_tensorwise"] * 3.0 * T * (a * d + ff) / tpf / hbm
            # tensorwise (current scaling): an amax pass (read 2 bytes) before every cast, and the LayerNorm
            # output of qkv/fc1 quantized apart from the norm (amax + cast, 2 + 3 bytes, full width without SP)
            L[:, U.I["mem"]] += c["fp8_tensorwise"] * (2.0 * T * (a * d + ff) / tpf + 2 * 5.0 * T * h / fw) / hbm
    rmods = {k: c.get("rm_" + k, np.zeros(len(tp), bool)) for k in ("mlp", "moe", "shared_experts", "layernorm",
                                                                      "moe_act")}
    delayed = f8 & ~c["fp8_tensorwise"]  # fp8_recipe 'delayed' (TE DelayedScaling): fp8_casts
    # the per-GEMM terms cost time: only when used
    need = (gemm_model is not None or np.count_nonzero(c["tp_comm_overlap"]) or np.count_nonzero(delayed)
            or np.count_nonzero(c["sp"]) or any(np.count_nonzero(rmods[k]) for k in ("mlp", "moe", "shared_experts")))
    shapes = layer_gemm_shapes(model, T.astype(np.int64), tp, c["etp"], c["ep"]) if need else {}
    xb = {}  # the fused attention core's backward beyond 2·forward, per layer (attention_time; measured GPUs)
    if gemm_model is not None:  # measured GEMM seconds in place of FLOPs / peak (docstring)
        if np.count_nonzero(fz):  # the fused core at cuDNN's rate (flash: FlashAttention-2's), windows (attention_time)
            share = attention_time.windowed_share(model.num_layers, model.window_size, model.window_attn_skip_freq)
            # the dense and the MoE layer's cores as the two rows of one call (element-wise: each row as alone)
            tf2, tb2 = attention_time.core_seconds(np.stack([Cd[:, U.I["gemm"]], Cm[:, U.I["gemm"]]]) * peak, d, s,
                                                   c["seq_len"], model.window_size, share, c["flash_attention"])
            for key, C, t_f, t_b in (("Bd", Cd, tf2[0], tb2[0]), ("Bm", Cm, tf2[1], tb2[1])):
                C[:, U.I["gemm"]] = np.where(fz, t_f, C[:, U.I["gemm"]])
                B = np.zeros_like(C)
                B[:, U.I["gemm"]] = np.where(fz, t_b - 2.0 * t_f, 0.0)
                xb[key] = B
        if np.count_nonzero(~fz):  # unfused: Q·Kᵀ (s×s×d) and scores·V (s×d×s), b·a/tp batched GEMMs, by the measured model
            bh = (b * a // tp).astype(np.int64)
            sq = s.astype(np.int64)
            t_un = gemm_model.time(sq, sq, d, bh, "bf16") + gemm_model.time(sq, d, sq, bh, "bf16")
            for C in (Cd, Cm):
                C[:, U.I["gemm"]] = np.where(fz | (C[:, U.I["gemm"]] == 0), C[:, U.I["gemm"]], t_un)
        sec = {}
        for name, (m_, n_, k_, bt) in shapes.items():
            if name.startswith("expert_"):  # TE's grouped linear: one GEMM per local expert (moe_time)
                t16 = moe_time.grouped_gemm_seconds(gemm_model, m_, n_, k_, bt, "bf16")
                sec[name] = np.where(f8, moe_time.grouped_gemm_seconds(
                    gemm_model, moe_time.padded_rows(m_, f8), n_, k_, bt, "fp8"), t16) if np.count_nonzero(f8) else t16
                continue
            t16 = gemm_model.time(m_, n_, k_, bt, "bf16")
            sec[name] = np.where(f8, gemm_model.time(m_, n_, k_, bt, "fp8"), t16) if np.count_nonzero(f8) else t16
        dense = sec["qkv"] + sec["proj"] + sec["fc1"] + sec["fc2"]
        Ld[:, U.I["gemm"]] = Cd[:, U.I["gemm"]] + dense
        if model.is_moe:
            moe = (sec["qkv"] + sec["proj"] + sec["expert_fc1"] + sec["expert_fc2"] + sec.get("shared_fc1", 0.0)
                   + sec.get("shared_fc2", 0.0))
            Lm[:, U.I["gemm"]] = Cm[:, U.I["gemm"]] + moe
    else:
        sec = {name: 2.0 * m_ * n_ * k_ * bt / lin_peak for name, (m_, n_, k_, bt) in shapes.items()}
    if np.count_nonzero(delayed):  # the casts and transposes per GEMM operand (fp8_casts), backward beyond 2·forward in Bd/Bm
        _delayed_casts(model, c, shapes, delayed, Ld, Lm, xb, hbm)
    z = np.zeros(len(tp))
    moe_work = (z, z)  # the MoE layer's router seconds and extra bytes, for the layer pass and recompute "moe"
    if model.is_moe:
        router = 2.0 * T * h * model.num_experts / peak  # the router GEMM (replicated over TP, BF16)
        # the dispatcher's permutations, router element-wise work, expert bias, FP8 expert-input casts (moe_time)
        moe_work = (router, moe_time.dispatch_bytes(model, c, T) + moe_time.expert_input_cast_bytes(model, c, T))
        Lm[:, U.I["gemm"]] += router
        Lm[:, U.I["mem"]] += moe_work[1] / hbm
    Gag = nd * (sec.get("qkv", z) + sec.get("fc1", z)) + nm * (sec.get("qkv", z) + sec.get("shared_fc1", 0.0))
    Grs = nd * (sec.get("proj", z) + sec.get("fc2", z)) + nm * (sec.get("proj", z) + sec.get("shared_fc2", 0.0))
    # tp_comm_overlap, per block kind (attention, dense MLP, shared experts): one block's GEMMs its forward SP
    # all-gather / reduce-scatter overlap with, and the block's forward passes, the forward's and those replayed
    # in the backward (replayed_blocks)
    ub_gag = np.stack([sec.get("qkv", z), sec.get("fc1", z), sec.get("shared_fc1", z)], axis=1)
    ub_grs = np.stack([sec.get("proj", z), sec.get("fc2", z), sec.get("shared_fc2", z)], axis=1)
    rec_d, rec_m, re_mlp, re_shared = replayed_blocks(model, c, nd, nm)
    sh = int(bool(model.num_shared_experts))
    ub_n = np.stack([nd + nm + rec_d + rec_m, nd + rec_d + re_mlp, sh * (nm + rec_m) + re_shared], axis=1)
    vp = model.padded_vocab_size(tp)
    out_x = U.output_features(b, s, tp, h, vp, peak, hbm)
    if gemm_model is not None and np.count_nonzero(holds_last):  # the logits GEMM (BF16: not a TE module) by the measured model
        out_x[:, U.I["gemm"]] = gemm_model.time(T.astype(np.int64), vp // tp, h * np.ones_like(tp), 1, "bf16")
    E = holds_first[:, None] * U.embedding_features(b, s, h, hbm) + holds_last[:, None] * out_x
    core = c.get("rm_core_attn", c["recompute"] == 1)  # selective recomputation of the attention core
    out = {"Ld": Ld, "Lm": Lm, "Cd": Cd, "Cm": Cm, "E": E, "nd": nd.astype(np.float64),
           "nm": nm.astype(np.float64), "full": (c["recompute"] == 2).astype(np.float64),
           "sel": np.asarray(core, dtype=np.float64), "Gag": Gag, "Grs": Grs,
           "ub_gag": ub_gag, "ub_grs": ub_grs, "ub_n": ub_n.astype(np.float64)}
    if "rec_d" in c:  # recompute_method="block": the checkpointed layers only (llmcomm.step.recomputed_stage_classes)
        out["full"] = np.where(c["rblock"], 0.0, out["full"])
        out["rec_d"], out["rec_m"] = c["rec_d"].astype(np.float64), c["rec_m"].astype(np.float64)
    if "rm_mlp" in c:  # --recompute-modules given (arrays() sets the flags then)
        out["Rd"], out["Rm"] = recompute_module_features(model, c, rmods, sec, T, fw, hbm, moe_work)
    out.update(xb)
    eager_ops.add_layer_work(model, c, T, out, hbm)  # YaRN's unfused RoPE, the experts' activation clamps
    layer_kernels.add_layer_work(model, c, T, out, hbm)  # the gated activation's backward, the q/k norms
    return out


def _delayed_casts(model: ModelSpec, c: dict[str, np.ndarray], shapes: dict[str, tuple[np.ndarray, ...]],
                   delayed: np.ndarray, Ld: np.ndarray, Lm: np.ndarray, xb: dict[str, np.ndarray], hbm: float) -> None:
    """Adds the FP8 casts of the ``delayed`` rows (:func:`llmcomm.overhead.fp8_casts.delayed_cast_bytes`) to one
    dense (``Ld``) and MoE (``Lm``) layer's memory feature, forward bytes in the layer pass and the backward's
    beyond twice them as ``Bd``/``Bm`` (:func:`class_times`: ``backward = 2·forward + extra``), in place."""
    mb = c["global_batch"] // np.maximum(c["micro_batch"] * c["dp"], 1)
    on = delayed.astype(np.float64)
    for key, L, moe in (("Bd", Ld, False), ("Bm", Lm, True)):
        if moe and not model.is_moe:
            continue
        fb, bb = fp8_casts.delayed_cast_bytes(shapes, c["sp"], c["tp"], mb, moe=moe)
        L[:, U.I["mem"]] += on * fb / hbm
        xb.setdefault(key, np.zeros_like(L))[:, U.I["mem"]] += on * (bb - 2.0 * fb) / hbm
    for key, L in (("Bd", Ld), ("Bm", Lm)):
        xb.setdefault(key, np.zeros_like(L))


def recompute_module_features(model: ModelSpec, c: dict[str, np.ndarray], rm: dict[str, np.ndarray],
                              sec: dict[str, np.ndarray], T: np.ndarray, fw: np.ndarray, hbm: float,
                              moe_work: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Features (:data:`llmcomm.overhead.utilization.FEATURES`) of the forward work ``--recompute-modules``
    recomputes in the backward, per dense (``Rd``) and MoE (``Rm``) layer and micro-batch, beside the attention core
    (``core_attn``: ``Cd``/``Cm``). From the step description's layer (:func:`llmcomm.step.layer_gemms`, the GEMM
    seconds ``sec`` of :func:`layer_gemm_shapes`, measured or ``FLOPs/peak``) and its element-wise bytes at HBM
    bandwidth, as in :func:`llmcomm.overhead.utilization.layer_features` (2 bytes per element and access; ``F``
    the FFN activation's forward count, :func:`llmcomm.step.ffn_activation_bytes`: 4 the bias-GeLU, 6 SwiGLU)::

        mlp (dense)      fc1 + fc2 GEMMs; F·T·f/tp activation; 2·2·T·h/w the fused pre-MLP LayerNorm
        moe (MoE)        the experts' and shared experts' GEMMs, the router 2·T·h·E/peak; F·T·f_eff/tp activation
        moe_act          F·T·topk·f_e/tp (the routed experts' activation)            [not with moe]
        shared_experts   shared fc1 + fc2 GEMMs; F·T·S·f_e/tp                          [not with moe]
        layernorm (MoE)  2·2·T·h/w the pre-MLP norm (a dense layer's norms are fused into TE's LayerNormLinear:
                         nothing to recompute, gpt_layer_specs.py:318-336, transformer_layer.py:475-527)

    with ``w = tp`` under SP, else 1; ``moe_work``: the MoE layer's router seconds and its bytes beyond the GEMMs
    and activation (:mod:`llmcomm.overhead.moe_time`), as :func:`_compute` adds them to its pass. Their communication (the recomputed blocks' TP and EP calls) is in
    :func:`comm_items`."""
    n = len(T)
    z = np.zeros(n)
    tpf = c["tp"].astype(np.float64)
    g, mm = U.I["gemm"], U.I["mem"]
    Rd, Rm = np.zeros((n, U.K)), np.zeros((n, U.K))
    mlp = rm["mlp"].astype(np.float64)
    Rd[:, g] = mlp * (sec.get("fc1", z) + sec.get("fc2", z))
    F = float(step.ffn_activation_bytes(model.activation_kind)[0])  # the FFN activation's forward bytes per element
    Rd[:, mm] = mlp * (F * T * model.ffn_hidden_size / tpf + 4.0 * T * model.hidden_size / fw) / hbm
    if model.is_moe:
        fe, k_, S = model.expert_ffn_hidden_size, model.moe_router_topk, model.num_shared_experts
        moe = rm["moe"].astype(np.float64)
        act = rm["moe_act"] * (1.0 - moe)
        sh = rm["shared_experts"] * (1.0 - moe)
        shared = sec.get("shared_fc1", z) + sec.get("shared_fc2", z)
        Rm[:, g] = (moe * (sec.get("expert_fc1", z) + sec.get("expert_fc2", z) + shared + moe_work[0])
                    + sh * shared)
        Rm[:, mm] = (moe * F * T * (k_ + S) * fe / tpf + act * F * T * k_ * fe / tpf + sh * F * T * S * fe / tpf
                     + rm["layernorm"] * 4.0 * T * model.hidden_size / fw) / hbm
        # recompute "moe" replays the dispatcher's permutations and the expert-input casts too (moe_time)
        Rm[:, mm] += moe * moe_work[1] / hbm
    return Rd, Rm


def class_times(q: dict[str, np.ndarray], util: U.Utilization) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(forward, backward, recompute)`` seconds per micro-batch of one stage class::

        forward   = nd·t_pass(dense) + nm·t_pass(MoE) + work(embedding, output)
        backward  = 2·forward                                  (twice the FLOPs, bytes and kernels)
                  + nd·extra(Ld, Bd) + nm·extra(Lm, Bm)        (measured GPUs: the fused attention core's
                                                                backward beyond twice its forward, attention_time;
                                                                extra: backward_beyond_twice)
        recompute = full·(nd·t_pass(dense) + nm·t_pass(MoE)) + selective·work(attention cores)
    """
    layers = q["nd"] * util.layer_pass(q["Ld"]) + q["nm"] * util.layer_pass(q["Lm"])
    fwd = layers + util.work(q["E"])
    rec = q["full"] * layers + q["sel"] * (q["nd"] * util.work(q["Cd"]) + q["nm"] * util.work(q["Cm"]))
    if "Rd" in q:  # --recompute-modules beside the attention core (recompute_module_features)
        rec = rec + q["nd"] * util.work(q["Rd"]) + q["nm"] * util.work(q["Rm"])
    if "rec_d" in q:  # recompute_method="block": one more forward pass of each checkpointed layer
        rec = rec + q["rec_d"] * util.layer_pass(q["Ld"]) + q["rec_m"] * util.layer_pass(q["Lm"])
    bwd = 2.0 * fwd
    if "Bd" in q:  # the fused attention core's backward at its measured rate (llmcomm.overhead.attention_time)
        bwd = bwd + q["nd"] * backward_beyond_twice(util, q["Ld"], q["Bd"]) \
            + q["nm"] * backward_beyond_twice(util, q["Lm"], q["Bm"])
    return fwd, bwd, rec


def backward_beyond_twice(util: U.Utilization, L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Seconds a layer's backward pass takes beyond twice its forward when its features are ``2·L + B``
    (``B``: the fused attention core's measured backward beyond twice its forward, gemm feature)::

        extra = layer_pass(2·L + B) − 2·layer_pass(L)

    The extra matmul time enters the backward pass's ``max(θ_Lg, θ_gemm·X_gemm)`` like every other matmul of
    the pass (a launch-bound pass hides it, as it hides an unfused core's batched GEMMs), not beside it: adding
    ``work(B)`` outside the ``max`` made a fused core slower than the unfused one on launch-bound FP8 layers
    (``tests/test_tune.py::test_unfused_rule_is_safe_in_the_formulation``). Exactly 0 where ``B`` is 0
    (``layer_pass(2·L) = 2·layer_pass(L)`` in floating point: doubling is exact)."""
    return util.layer_pass(2.0 * L + B) - 2.0 * util.layer_pass(L)


def layer_times(q: dict[str, np.ndarray], util: U.Utilization
                ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Seconds of one dense and one MoE layer per micro-batch, ``((forward_d, forward_m), (backward_d,
    backward_m))``, the backward with its recomputation: the per-layer terms of :func:`class_times` (what FSDP's
    prefetch hides a unit's communication under, :mod:`llmcomm.overhead.fsdp_time`)."""
    fd, fm = util.layer_pass(q["Ld"]), util.layer_pass(q["Lm"])
    rd = q["full"] * fd + q["sel"] * util.work(q["Cd"]) + (util.work(q["Rd"]) if "Rd" in q else 0.0)
    rm = q["full"] * fm + q["sel"] * util.work(q["Cm"]) + (util.work(q["Rm"]) if "Rm" in q else 0.0)
    if "rec_d" in q:  # recompute_method="block": a layer's recompute averaged over the stage's layers of its kind
        rd = rd + q["rec_d"] / np.maximum(q["nd"], 1.0) * fd
        rm = rm + q["rec_m"] / np.maximum(q["nm"], 1.0) * fm
    if "Bd" in q:  # the fused attention core's measured backward (class_times)
        rd = rd + backward_beyond_twice(util, q["Ld"], q["Bd"])
        rm = rm + backward_beyond_twice(util, q["Lm"], q["Bm"])
    return (fd, fm), (2.0 * fd + rd, 2.0 * fm + rm)


def class_design(q: dict[str, np.ndarray], util: U.Utilization) -> np.ndarray:
    """The linear design (``(n, K)``) of forward + backward + recompute of one stage class per micro-batch,
    each layer on the side of ``max`` that ``util`` puts it (for the fit)."""
    Dd = U.Utilization.design(q["Ld"], util.launch_bound(q["Ld"]))
    Dm = U.Utilization.design(q["Lm"], util.launch_bound(q["Lm"]))
    layers = q["nd"][:, None] * Dd + q["nm"][:, None] * Dm
    w = np.zeros(U.K)
    w[[U.I["gemm"], U.I["mem"]]] = 1.0
    core = q["sel"][:, None] * (q["nd"][:, None] * q["Cd"] + q["nm"][:, None] * q["Cm"]) * w
    if "Rd" in q:  # --recompute-modules
        core = core + (q["nd"][:, None] * q["Rd"] + q["nm"][:, None] * q["Rm"]) * w
    if "Bd" in q:  # the fused attention core's measured backward (class_times)
        core = core + (q["nd"][:, None] * q["Bd"] + q["nm"][:, None] * q["Bm"]) * w
    out = (3.0 + q["full"][:, None]) * layers + 3.0 * q["E"] * w + core
    if "rec_d" in q:  # recompute_method="block": the checkpointed layers' forward once more
        out = out + q["rec_d"][:, None] * Dd + q["rec_m"][:, None] * Dm
    return out


# ----------------------------------------------------------------------------------------- evaluate
_LOOK_UP: Any = object()  # stages(gemm=...): not given, look the GEMM model up


@dataclass
class Stages:
    """What does not depend on the utilization model: per stage class (``first``, ``mid``, ``last``) the
    utilization features of one micro-batch (``q``, see :func:`_compute`) and
    the communication seconds per micro-batch (``tp``, ``ep``, ``pp``) and per iteration (``dp``); plus the
    optimizer's bytes, the micro-batch count ``m``, ``pp`` and ``vpp``."""

    cls: dict[str, dict[str, Any]]
    m: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    optimizer_bytes: np.ndarray
    hbm: float
    tp_comm_overlap: np.ndarray | None = None
    overlap_param_gather: np.ndarray | None = None
    overlap_grad_reduce: np.ndarray | None = None
    buckets: np.ndarray | None = None  # DDP buckets of the first stage (overlap_param_gather)
    # pipeline / MoE overlap and the gradient buckets of stage 0's first chunk (llmcomm.overhead.overlap)
    overlap_p2p_comm: np.ndarray | None = None
    moe_a2a_overlap: np.ndarray | None = None
    grad_buckets: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None  # overlap.first_chunk_buckets
    vp_last_group: np.ndarray | None = None
    mlp_share: np.ndarray | None = None
    align_grad_reduce: np.ndarray | None = None
    fsdp: np.ndarray | None = None  # FSDP rows (llmcomm.overhead.fsdp_time)
    cp: np.ndarray | None = None  # context-parallel size (cp_time.exposed)
    measured_gemm: bool = False  # the linear GEMMs' gemm feature is measured seconds (combine: θ_gemm = 1)
    # the three classes' features as the 3n rows they were computed as, and the per-class dicts that are their
    # slices (combine times the 3n rows in one class_times call while cls still holds those very dicts)
    stacked: tuple[dict[str, np.ndarray], tuple[Any, ...]] | None = None  # (q3, each class's q dict)


def _stacked_features(model: ModelSpec, t: ParallelTable, cluster: Cluster, bandwidth: Any, measured_gemms: bool,
                      gemm: Any, keep: Any = None
                      ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], tuple[np.ndarray, np.ndarray],
                                 np.ndarray, np.ndarray, dict[str, np.ndarray], Any]:
    """``(c, c3, layers3, holds_first3, holds_last3, q3, gemm model)``: the arrays of ``t`` (:func:`arrays`), the
    three stage classes stacked as ``3n`` rows (:func:`stack_classes`), their layer counts and edges, and their
    utilization features (:func:`_compute`): what :func:`stages` and :func:`stage_compute` share. ``keep``: a
    function of ``pp`` giving the stacked rows to keep (indices into the ``3n``; the formulas are element-wise,
    so each kept row's numbers are those of all ``3n``), or ``None``: all of them."""
    c = arrays(model, t, cluster.gpus_per_node)
    peak, hbm = cluster.peak_bf16_flops, U.hbm_bandwidth(cluster)
    pp = c["pp"]
    layers = step.stage_classes(model, pp, c["vpp"], {k: c[k] for k in step.UNEVEN})
    if isinstance(bandwidth, _Timer):
        bandwidth.reset()
    # the three stage classes stacked as 3n rows: one pass over the formulas instead of three
    c3 = stack_classes(c)
    edges = [step.holds_edges(cls, pp) for cls in CLASSES]
    hf3 = np.concatenate([e[0] for e in edges])
    hl3 = np.concatenate([e[1] for e in edges])
    layers3 = (np.concatenate([layers[cls][0] for cls in CLASSES]),
               np.concatenate([layers[cls][1] for cls in CLASSES]))
    if "rblock" in c:  # recompute_method="block": the layers each stage class recomputes
        rec = step.recomputed_stage_classes(model, pp, c["vpp"], c["rblock_n"], {k: c[k] for k in step.UNEVEN})
        c3["rec_d"] = np.concatenate([rec[cls][0] for cls in CLASSES])
        c3["rec_m"] = np.concatenate([rec[cls][1] for cls in CLASSES])
    if keep is not None:
        rows = keep(pp)
        n3 = 3 * len(pp)
        c3 = {k: v[rows] if v.shape == (n3,) else v for k, v in c3.items()}
        hf3, hl3, layers3 = hf3[rows], hl3[rows], (layers3[0][rows], layers3[1][rows])
    gm = (measured_gemm(cluster) if measured_gemms else None) if gemm is _LOOK_UP else gemm
    q3 = _compute(model, c3, layers3, hf3, hl3, peak, hbm, cluster.peak_fp8_flops, gm)
    return c, c3, layers3, hf3, hl3, q3, gm


def stages(model: ModelSpec, t: ParallelTable, cluster: Cluster, bandwidth: Any, measured_gemms: bool = True, *,
           gemm: Any = _LOOK_UP) -> Stages:
    """Features and communication times of every stage class (see :class:`Stages`) of the configurations of
    ``t`` (checked: :func:`candidate_table`); ``measured_gemms=False`` times the linear GEMMs by ``FLOPs/peak``
    even where the cluster's GPU has a measured GEMM model (:func:`measured_gemm`; the ablation's baseline).
    ``gemm``: that lookup's result where the caller already holds it (:func:`_one_stages`)."""
    c, c3, layers3, hf3, hl3, q3, gm = _stacked_features(model, t, cluster, bandwidth, measured_gemms, gemm)
    n, pp, hbm = len(c["tp"]), c["pp"], U.hbm_bandwidth(cluster)
    params3 = _stage_params(model, c3, *layers3, hf3, hl3)
    tot, cp_calls = _comm_sums(model, c3, hf3, hl3, layers3, params3, bandwidth)
    per_class: dict[str, dict[str, np.ndarray]] = {}
    params = np.zeros(n)
    shard = np.where(c["distributed_optimizer"], c["dp"] * c["cp"], 1)  # DistOpt shards over dp x cp
    shard = np.where(c["fsdp"], c["dp"] * c["cp"], shard)  # FSDP shards the optimizer state over dp·cp
    # the optimizer's bytes per rank, the dense parameters sharded over dp·cp, the experts' over edp (moe_time)
    dn3 = moe_time.optimizer_bytes(params3[0], params3[1], np.tile(shard, 3), np.tile(
        np.where(c["distributed_optimizer"] & ~c["fsdp"], moe_fold.expert_dp(c), shard), 3), ADAM_BYTES_PER_PARAM)
    for i, cls in enumerate(CLASSES):
        sl = slice(i * n, (i + 1) * n)
        r: dict[str, Any] = {"q": {k: v[sl] for k, v in q3.items()}}
        r.update({k: v[sl] for k, v in tot.items()})
        r["cp_calls"] = [(tag, tt[sl], cnt[sl]) for tag, tt, cnt in cp_calls]
        r["tp_size"] = c["tp"]
        per_class[cls] = r
        exists = np.ones(n, bool) if cls == "first" else (pp >= 3) if cls == "mid" else (pp >= 2)
        params = np.maximum(params, np.where(exists, dn3[sl], 0))
    m = c["global_batch"] // (c["micro_batch"] * c["dp"])
    # DDP buckets of stage 0: its first chunk split into buckets by the predictor's layout (the one rule:
    # llmcomm.predict.dp.chunk_is_bucketed, bucket_elements; overlap.bucket_profile), each later chunk one
    v = c["vpp"]
    profiles = _overlap.first_chunk_buckets(model, t, c["overlap_grad_reduce"] | c["overlap_param_gather"])
    nb0 = np.ones(n, np.int64)
    for rows, ready, _ in profiles:
        nb0[rows] = len(ready)
    mlp = _overlap.moe_mlp_share(model, c["seq_len"], c["fused_attention"]) if model.is_moe else None
    return Stages(per_class, m, pp, v, params, hbm, c["tp_comm_overlap"],
                  c["overlap_param_gather"], c["overlap_grad_reduce"], nb0 + v - 1,
                  np.asarray(t.overlap_p2p_comm, dtype=bool), np.asarray(t.moe_a2a_overlap, dtype=bool), profiles,
                  _overlap.vp_last_group(m, pp, np.asarray(t.microbatch_group_size_per_vp_stage)), mlp,
                  np.asarray(t.align_grad_reduce, dtype=bool), fsdp=c["fsdp"], cp=c["cp"], measured_gemm=gm is not None,
                  stacked=(q3, tuple(per_class[k]["q"] for k in CLASSES)))


def _comm_sums(model: ModelSpec, c3: dict[str, np.ndarray], hf3: np.ndarray, hl3: np.ndarray,
               layers3: tuple[np.ndarray, np.ndarray], params3: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
               bandwidth: Any, terms: frozenset[str] | None = None
               ) -> tuple[dict[str, np.ndarray], list[tuple[str, np.ndarray, np.ndarray]]]:
    """``(sums, cp_calls)`` of the ``3n`` stacked rows of :func:`stages`: each sum of :func:`_item_sums` over the
    calls of :func:`comm_items` (``terms``: only those terms' calls; every sum of another term stays 0), and the
    CP calls (tag, seconds per call, calls) for :func:`llmcomm.overhead.cp_time.exposed`."""
    n3 = len(c3["tp"])
    sums: tuple[str, ...] = ("tp", "ep", "pp", "dp", "tp_bus", "ep_bus", "pp_bus", "dp_bus", "ub_ag_f", "ub_rs_f", "ub_b", "dp_ag", "cp",
            "cp_bus")
    sums += ("fsdp", "fsdp_bus")  # FSDP per micro-batch (fsdp_time)
    # the recomputed blocks' replayed forward SP calls, one forward call of each kind (tp_overlap_exposed)
    sums += ("ub_ag_r", "ub_rs_r", "ub_t_ag", "ub_t_proj", "ub_t_fc2")
    # for llmcomm.overhead.overlap: one call's seconds of each gradient bucket kind, all of them, the sends
    # (seconds of one, count per micro-batch) and the all-to-alls
    sums += ("g_plain", "g_edge", "g_shared", "g_expert", "g_all", "pp_sf", "pp_nf", "pp_sb", "pp_nb", "ep_a2a")
    # a few rows: the sums as rows of one array (one allocation, not one per sum)
    tot = dict(zip(sums, np.zeros((len(sums), n3)), strict=True)) if n3 <= 192 else {t: np.zeros(n3) for t in sums}
    cp_calls: list[tuple[str, np.ndarray, np.ndarray]] = []  # (tag, seconds per call, calls): cp_time.exposed
    # a receive is the peer's send, timed once on the sender, except DeepSpeed's blocking pipeline receives
    calls = _blocking_p2p.timed_calls(comm_items(model, c3, (hf3, hl3), layers3, params3, terms), c3["pipe_partitioned"])
    small = n3 <= 192
    items: list[tuple[CommItem, Any]]
    if small:  # a few rows: which rows call, read as Python values (one comparison and conversion of all counts)
        counts = np.array([it.count for it in calls]) if calls else np.zeros((0, n3))
        if counts.shape != (len(calls), n3) or counts.dtype == object:  # counts of other shapes: item by item
            counts = np.array([np.broadcast_to(it.count, (n3,)) for it in calls]).reshape(len(calls), n3)
        live_rows = (counts > 0).tolist()
        keep = [j for j, live in enumerate(live_rows) if any(live)]
        items = [(calls[j], live_rows[j]) for j in keep]
    else:
        items = [(it, it.count > 0) for it in calls]
        items = [(it, live) for it, live in items if np.count_nonzero(live)]
    times, xs = _batched_times(bandwidth, items) if small else (None, None)
    fast = isinstance(bandwidth, _Timer) and bandwidth.fast
    factors: dict[tuple[str, int], np.ndarray] = {}  # bus_factor per op and group-size array (items share them)
    units: list[tuple[CommItem, np.ndarray, np.ndarray]] = []  # FSDP's per-unit calls: (item, seconds, bus bytes)
    if times is not None and xs is not None:  # a few rows: every sum at once (_sums_at_once)
        plain = [j for j, (it, _) in enumerate(items) if not it.unit]
        units = [(items[j][0], times[j], xs[j]) for j, (it, _) in enumerate(items) if it.unit]
        if plain:
            cnt = counts[[keep[j] for j in plain]]
            tt, x = times[plain], xs[plain]
            tot.update(_sums_at_once([items[j][0] for j in plain], cnt * tt, tt, cnt, cnt * x))  # tot: zeros
        cp_calls = [(it.tag, times[j], it.count) for j, (it, _) in enumerate(items) if it.term == "cp" and not it.unit]
    shared = _shared_calls(items) if fast and times is None else {}
    for it, live in (items if times is None else ()):  # many rows: item by item
        # nccl-tests bus bytes of one call (0 where the item issues none: it.count is 0 there)
        f_op = factors.get((it.op, id(it.size)))
        if f_op is None:
            f_op = factors[(it.op, id(it.size))] = bus_factor(it.op, it.size)
        same = shared.get(_call_key(it))
        if same is not None:  # the call of an earlier item (same op, bytes and group arrays): timed once
            x, tt = _shared_time(bandwidth, it, f_op, live, same)
        elif fast:  # the bus bytes once, the rows grouped once per (size, ranks per node) arrays
            x = f_op * it.nbytes
            tt = bandwidth.time_rows(it.op, x, it.size, it.rpn, live)
        elif live.all():
            x = f_op * it.nbytes
            tt = bandwidth.time(it.op, it.nbytes, it.size, it.rpn)
        else:
            x = f_op * it.nbytes
            tt = np.zeros(n3)
            tt[live] = bandwidth.time(it.op, it.nbytes[live], it.size[live], it.rpn[live])
        if it.unit:
            units.append((it, tt, x))
            continue
        ctt = it.count * tt  # the item's seconds (per micro-batch or per iteration)
        what: tuple[np.ndarray, ...] = (ctt, tt, it.count)
        for key, kind in _item_sums(it):
            tot[key] += what[kind] if kind < 3 else it.count * x
        if it.term == "cp":
            cp_calls.append((it.tag, tt, it.count))
    for it, tt, x in units:  # FSDP: one unit's call, timed per call (fsdp_time.exposed), per micro-batch
        per_mb = 1.0 if it.per == "microbatch" else 1.0 / (c3["global_batch"] // (c3["micro_batch"] * c3["dp"]))
        if it.per == "iteration":  # a call once per iteration, spread over its micro-batches
            tt = tt * it.count * per_mb
        tot["fsdp:" + it.unit] = tot.get("fsdp:" + it.unit, np.zeros(n3)) + tt
        tot["fsdp"] += tt if it.per == "iteration" else it.count * tt
        tot["fsdp_bus"] += it.count * per_mb * x
    return tot, cp_calls


@dataclass
class StageCompute:
    """The utilization features of one micro-batch (``q``) and the TP, EP and pipeline seconds per micro-batch
    before any overlap (``sums``: ``tp``, ``ep``, ``pp``; ``ub_b``: the blocks' backward SP collectives among
    ``tp``) of the stage classes that exist (``rows``: their positions among :func:`stack_classes`' ``3n``:
    every ``first``, ``mid`` where ``pp ≥ 3``, ``last`` where ``pp ≥ 2``), as :func:`stages` has them, without the
    DP, CP and FSDP calls or the optimizer's state (:func:`stage_compute`); ``measured_gemm`` as
    :class:`Stages`'."""

    q: dict[str, np.ndarray]
    sums: dict[str, np.ndarray]
    rows: np.ndarray
    n: int
    measured_gemm: bool = False

    def by_class(self, v: np.ndarray) -> dict[str, np.ndarray]:
        """``{class: values of its n rows}`` of ``v`` (one value per kept row), 0 where the class does not exist."""
        out = {}
        for i, cls in enumerate(CLASSES):
            sel = (self.rows >= i * self.n) & (self.rows < (i + 1) * self.n)
            out[cls] = np.zeros(self.n, v.dtype)
            out[cls][self.rows[sel] - i * self.n] = v[sel]
        return out


COMPUTE_TERMS = frozenset({"tp", "ep", "pp"})  # the communication terms StageCompute holds


def stage_compute(model: ModelSpec, t: ParallelTable, cluster: Cluster, bandwidth: Any) -> StageCompute:
    """:func:`stages`' features and TP/EP/pipeline seconds of the stage classes that exist, the other calls not
    built nor timed (the tuner's lower bound, :mod:`llmcomm.tune.bound`): the same numbers, bit for bit, since
    the formulas are element-wise and each sum of :func:`_comm_sums` adds the same calls of its own term in the
    same order from zero."""
    c, c3, layers3, hf3, hl3, q3, gm = _stacked_features(model, t, cluster, bandwidth, True, _LOOK_UP,
                                                         _existing_classes)
    tot, _ = _comm_sums(model, c3, hf3, hl3, layers3, None, bandwidth, COMPUTE_TERMS)
    return StageCompute(q3, {k: tot[k] for k in (*COMPUTE_TERMS, "ub_b")}, _existing_classes(c["pp"]), len(c["tp"]),
                        measured_gemm=gm is not None)


def _existing_classes(pp: np.ndarray) -> np.ndarray:
    """The rows of :func:`stack_classes`' ``3n`` whose stage class exists: every ``first``, ``mid`` where
    ``pp ≥ 3``, ``last`` where ``pp ≥ 2`` (:func:`stage_compute`; the others are 0 there, and read by nothing)."""
    n = len(pp)
    return np.concatenate([np.arange(n), n + np.flatnonzero(pp >= 3), 2 * n + np.flatnonzero(pp >= 2)])


def _call_key(it: CommItem) -> tuple[str, int, int, int]:
    """What decides an item's call times (:func:`stages`, many rows): its op and the identities of its bytes, group
    size and ranks-per-node arrays (items of one :func:`comm_items` call share these arrays; the items hold them,
    so the identities stay theirs)."""
    return (it.op, id(it.nbytes), id(it.size), id(it.rpn))


def _shared_calls(items: list[tuple[CommItem, Any]]) -> dict[tuple[str, int, int, int], list[Any]]:
    """The calls several items issue (:func:`_call_key`; e.g. a layer's forward and backward TP all-reduces of one
    activation), each with the rows where any of them is live: ``{key: [live rows of all, (x, t) or None]}``
    (:func:`_shared_time` fills the second on first use)."""
    by: dict[tuple[str, int, int, int], list[np.ndarray]] = {}
    for it, live in items:
        if not it.unit:
            by.setdefault(_call_key(it), []).append(live)
    return {k: [np.logical_or.reduce(lives) if len(lives) > 2 else lives[0] | lives[1], None]
            for k, lives in by.items() if len(lives) > 1}


def _shared_time(bandwidth: Any, it: CommItem, f_op: np.ndarray, live: np.ndarray, same: list[Any]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(x, t)`` of a call several items share (:func:`_shared_calls`): the bus bytes ``f_op·nbytes`` and the
    seconds on the rows any of them is live, computed for the first of them, then ``t`` on this item's ``live``
    rows (0 elsewhere) — what :meth:`_Timer.time_rows` gives for the item alone, bit for bit (elementwise; each
    row's value depends on its own bytes and group only). Where a regime of the shared rows cannot be looked up
    the item is timed alone (only the groups its own rows need, as before)."""
    if same[1] is None:
        x = f_op * it.nbytes
        try:
            same[1] = (x, bandwidth.time_rows(it.op, x, it.size, it.rpn, same[0]))
        except (ConfigError, DataError, KeyError, ValueError):
            same[1] = (x, None)
    x, t_all = same[1]
    if t_all is None:
        return x, bandwidth.time_rows(it.op, x, it.size, it.rpn, live)
    return x, np.where(live, t_all, 0.0)


def _item_sums(it: CommItem) -> list[tuple[str, int]]:
    """The sums of :func:`stages` a call item (not an FSDP unit's) adds to, each with what it adds: ``0`` its
    seconds ``count·t``, ``1`` one call's seconds ``t``, ``2`` its ``count``, ``3`` its nccl-tests bus bytes
    ``count·x`` (a receive's bytes are its peer's send's: none)."""
    key = _KIND(it)
    hit = _ITEM_SUMS.get(key)
    if hit is not None:
        return hit
    out = [(it.term, 0)]
    if it.ub == "replay":  # a recomputed block's forward call in the backward phase
        out.append(("ub_ag_r" if it.op == "all_gather" else "ub_rs_r", 0))
    elif it.ub:
        out.append(("ub_b" if it.phase == "backward" else "ub_ag_f" if it.op == "all_gather" else "ub_rs_f", 0))
        if it.phase == "forward":  # one call's seconds: the all-gather, the reduce-scatter after proj / fc2
            out.append(("ub_t_ag" if it.op == "all_gather" else "ub_t_" + it.ub, 1))
    elif it.term == "dp" and it.op == "all_gather":
        out.append(("dp_ag", 0))
    if it.grad:
        out += [("g_" + it.grad, 1), ("g_all", 0)]
    elif it.term == "pp" and it.op == "send":
        f_ = it.phase == "forward"
        out += [("pp_sf" if f_ else "pp_sb", 1), ("pp_nf" if f_ else "pp_nb", 2)]
    elif it.op == "all_to_all" and it.term == "ep":  # CP all-to-alls: cp_time
        out.append(("ep_a2a", 0))
    if it.op != "recv":
        out.append((it.term + "_bus", 3))
    _ITEM_SUMS[key] = out
    return out


_ITEM_SUMS: dict[tuple[str, str, str, bool, str], list[tuple[str, int]]] = {}  # _item_sums per kind of item


def _sums_at_once(items: list[CommItem], *parts: np.ndarray) -> dict[str, np.ndarray]:
    """Each sum of :func:`_item_sums` over ``items``, from zero: ``0 + part[j] + ...`` for each item ``j`` in
    order, with ``parts`` the ``(items, rows)`` arrays of the kinds (seconds, one call's seconds, count, bus bytes)
    — what ``tot[key] += part[j]`` item by item gives, bit for bit: one sequential ``np.add.accumulate`` of every
    sum's terms, gathered as rows of one array and padded with zeros. The gathering is planned once per sequence
    of item kinds (the calls of one configuration's shape)."""
    kinds = tuple(map(_KIND, items))
    plan = _SUM_PLANS.get(kinds)
    if plan is None:
        rows = len(items)
        by: dict[str, list[int]] = {}
        for j, it in enumerate(items):
            for key, kind in _item_sums(it):
                by.setdefault(key, []).append(1 + kind * rows + j)
        index = np.zeros((len(by), 1 + max(map(len, by.values()), default=0)), np.int64)  # row 0: zeros
        for i, js in enumerate(by.values()):
            index[i, 1:1 + len(js)] = js
        if len(_SUM_PLANS) > 1024:
            _SUM_PLANS.clear()
        plan = _SUM_PLANS[kinds] = (list(by), index)
    keys, index = plan
    stack = np.concatenate([np.zeros((1, parts[0].shape[1])), *parts])
    return dict(zip(keys, np.add.accumulate(stack[index], axis=1)[:, -1], strict=True))


_KIND = operator.attrgetter("term", "op", "phase", "ub", "grad")  # what decides an item's sums (_item_sums)
_SUM_PLANS: dict[tuple[Any, ...], tuple[list[str], np.ndarray]] = {}  # _sums_at_once per sequence of item kinds


def _batched_times(bandwidth: Any, items: list[tuple[CommItem, list[bool]]]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Each item's call times and nccl-tests bus bytes ``bus_factor(op, size)·nbytes`` (both 0 where it issues
    no call), for a few rows: for one configuration the per-call overhead, not the arithmetic, is the cost.
    Through a caching :class:`_Timer` of a :class:`~llmcomm.overhead.bandwidth.Bandwidth` each distinct call
    (op, group size, ranks per node, bytes) is evaluated once (:meth:`_Timer.calls`); any other model is called
    once per op over every item's live rows. Elementwise, so equal to timing item by item."""
    n = len(items[0][0].count) if items else 0
    if isinstance(bandwidth, _Timer) and bandwidth.fast:
        keys = bandwidth.call_keys(items)
        memo = bandwidth.calls_of(keys)
        none = (0.0, 0.0)
        # (items, rows, 2): seconds and bus bytes of every item's call, one array built from one flat list of
        # floats (no nested sequences for numpy to inspect); the items' rows are views of it
        flat = list(chain.from_iterable(memo[k] if k is not None else none for row in keys for k in row))
        tx = np.array(flat, dtype=np.float64).reshape(len(keys), n, 2)
        return tx[:, :, 0], tx[:, :, 1]
    out = [np.zeros(n) for _ in items]
    xs = [np.zeros(n) for _ in items]
    by_op: dict[str, list[int]] = {}
    for j, (it, _) in enumerate(items):
        by_op.setdefault(it.op, []).append(j)
    for op, js in by_op.items():
        sel = [np.asarray(items[j][1], dtype=bool) for j in js]
        nb = np.concatenate([items[j][0].nbytes[m] for j, m in zip(js, sel, strict=True)])
        size = np.concatenate([items[j][0].size[m] for j, m in zip(js, sel, strict=True)])
        rpn = np.concatenate([items[j][0].rpn[m] for j, m in zip(js, sel, strict=True)])
        tt = bandwidth.time(op, nb, size, rpn)
        x = bus_factor(op, size) * nb
        at = 0
        for j, m in zip(js, sel, strict=True):
            k = int(m.sum())
            out[j][m] = tt[at:at + k]
            xs[j][m] = x[at:at + k]
            at += k
    return np.array(out).reshape(len(items), n), np.array(xs).reshape(len(items), n)


def tp_overlap_exposed(tp: np.ndarray, ub: np.ndarray, bwd: np.ndarray, g_bwd: np.ndarray, t_ag: np.ndarray,
                       t_rs: np.ndarray, n: np.ndarray, g_ag: np.ndarray, g_rs: np.ndarray,
                       tp_size: np.ndarray) -> np.ndarray:
    """TP seconds per micro-batch left exposed with ``tp_comm_overlap`` (TransformerEngine userbuffers), from the
    stage's TP seconds ``tp`` of which ``ub`` are the blocks' SP all-gathers/reduce-scatters (forward, replayed,
    backward) and ``bwd`` their backward ones, ``g_bwd`` the forward seconds of the stage's qkv, proj, fc1 and fc2
    GEMMs, and per block kind ``k`` (``(rows, 3)``: attention, dense MLP, shared experts) ``n_k`` its forward
    passes (the forward's and those replayed in the backward by full, ``recompute_method="block"`` or
    ``--recompute-modules`` recomputation: :func:`replayed_blocks`), ``g_ag,k``/``g_rs,k`` the forward seconds of
    one block's GEMM after its all-gather (qkv, fc1, shared fc1) and before its reduce-scatter (proj, fc2, shared
    fc2), ``t_ag`` one forward all-gather's seconds and ``t_rs,k`` one reduce-scatter's::

        exposed = max(0, tp − ub)                                  the TP calls outside the overlapped blocks
                + Σ_k n_k·( max(0, t_ag − g_ag,k·(t−1)/t)           ring_exchange (qkv_fprop, fc1_fprop), num_splits t = tp
                          + max(0, t_rs,k − g_rs,k·(4−1)/4) )       pipeline (proj_fprop, fc2_fprop), num_splits = 4
                + max(0, bwd − 2·g_bwd·(t−1)/t)                     dgrad ring_exchange / bulk under dgrad+wgrad

    A split-pipelined overlap of ``s`` chunks hides the communication under all but one chunk of the GEMM (the
    chunk computed before the first transfer arrives, or after the last leaves): the stated share, ``1/s`` of
    the GEMM cannot hide anything. Methods and ``num_splits`` are TransformerEngine's defaults
    (transformer_engine/pytorch/module/base.py:357, the ``methods`` table of ``initialize_ub``, and :387,
    ``"num_splits": tp_size if method == "ring_exchange" else 4``; TransformerEngine d0067d0). Not counted: the 16 SMs the pipeline
    method's communication kernels take from the GEMM (``num_sm``). The seconds are those of :func:`comm_items`'
    bytes, which under FP8 are TransformerEngine's wire bytes with or without userbuffers (TE quantizes before
    it gathers; :mod:`llmcomm.predict.fp8_wire`).

    A block's forward collective overlaps the GEMM of that block (the GEMM consumes the chunks as they arrive, or
    produces what is sent): each block's exposure is its own ``max``, one GEMM's slack hides no other block's call.
    A recomputed block's replayed forward is its forward run again, with grad enabled, by the checkpoint's
    backward: Megatron-LM d98e8a6 megatron/core/recompute.py:134/:142 (full and block recomputation,
    ``te_checkpoint`` / ``tensor_parallel.checkpoint``), transformer_layer.py:992-1006 (``mlp``),
    moe/moe_layer.py:517-527 (``shared_experts``) and :701-713 (``moe``), each running ``ctx.run_function``
    under ``torch.enable_grad()`` (tensor_parallel/random.py:658-659; TransformerEngine d0067d0
    transformer_engine/pytorch/distributed.py:441). TransformerEngine's linears keep their forward userbuffers
    there: ``ub_overlap_ag_fprop and is_grad_enabled`` takes the ``<name>_fprop`` communicator
    (module/layernorm_linear.py:212-220), and the row-parallel ``Linear`` takes it for ``ub_overlap_rs_fprop``
    whatever the phase (module/linear.py:360-365). So a replayed block is timed as its forward, for full
    recomputation and every module set alike, and the backward's own calls hide under its dgrad and wgrad GEMMs
    (2 passes), not under the replayed forward's. Recomputing a block more adds its ``n_k`` term, ``≥ 0``: the
    exposed time never falls as more is recomputed (``tests/test_tune_modules.py``).

    Every term is an exposed time, ``max(0, ·)`` by definition: the first too, whose exact value is ``≥ 0`` (the
    blocks' collectives are a part of the stage's TP calls) but whose floating-point difference can come out a
    few ulps below zero when the stage has no other TP call (``tp`` and ``ub`` summed in another order: −2.8e-17 s
    reported on LLaMA-3 405B rows at tp 2 whose collectives all hide)."""
    t = tp_size.astype(np.float64)
    hide = (t - 1.0) / t
    per_block = (np.maximum(0.0, t_ag[:, None] - g_ag * hide[:, None])
                 + np.maximum(0.0, t_rs - 0.75 * g_rs))
    return (np.maximum(0.0, tp - ub) + (n * per_block).sum(axis=1)
            + np.maximum(0.0, bwd - 2.0 * g_bwd * hide))


def param_gather_exposed(ag: np.ndarray, fwd: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """Seconds of the distributed optimizer's parameter all-gather left exposed with ``overlap_param_gather``:
    the gathers of stage 0 move into the next iteration's forward (Megatron-LM's forward pre-hook waits for a
    bucket's gather and dispatches the next bucket's: megatron/core/distributed/distributed_data_parallel.py:517
    ``_make_forward_pre_hook``, param_and_grad_buffer.py:538 ``finish_param_sync``, Megatron-LM d98e8a6), in
    forward order over ``nb`` equal buckets (stage 0's: its first chunk's in the predictor's layout,
    :func:`llmcomm.overhead.overlap.bucket_profile`, plus one per later chunk)::

        exposed = max(ag/nb, ag − fwd·(nb − 1)/nb)

    the first bucket before any layer can run, then each bucket under the forward of the previous bucket's
    layers (first micro-batch). Later stages start their first forward ``r`` steps later: their gathers hide
    in that wait (not checked)."""
    nb = buckets.astype(np.float64)
    return np.maximum(ag / nb, ag - fwd * (nb - 1.0) / nb)


def combine_utilization(st: Stages | StageCompute, util: U.Utilization) -> U.Utilization:
    """The utilization model :func:`combine` times ``st`` with (``θ_gemm = 1`` where the GEMMs are measured; see
    there); also what the tuner's lower bound (:mod:`llmcomm.tune.bound`) times the compute with."""
    if st.measured_gemm and util.coef[U.I["gemm"]] != 1.0:
        return util.with_gemm_efficiency(1.0)
    return util


def combine(st: Stages, util: U.Utilization, overlap_grad_reduce: bool = False) -> dict[str, np.ndarray]:
    """The terms of :data:`TERMS` from :class:`Stages` and a utilization model (module docstring). Where the
    linear GEMMs are measured seconds (``st.measured_gemm``: H100, H200) ``θ_gemm`` is taken as 1: it is the A100
    matmul efficiency of ``FLOPs/peak`` features (the single-node fit), and a measured kernel time already holds
    its own (the attention core stays at ``FLOPs/peak`` there, as it did while the fit sat at 1)."""
    util = combine_utilization(st, util)
    pp, v, m = st.pp, st.vpp, st.m
    n = len(pp)
    tpo = st.tp_comm_overlap if st.tp_comm_overlap is not None else np.zeros(n, bool)
    ogr = np.asarray(overlap_grad_reduce, dtype=bool) | (st.overlap_grad_reduce if st.overlap_grad_reduce is not None
                                                         else False)
    opg = st.overlap_param_gather if st.overlap_param_gather is not None else np.zeros(n, bool)
    split_ag = ogr | opg  # one flag per row (opg is one)
    if split_ag.shape != (n,):
        split_ag = np.broadcast_to(split_ag, (n,))
    per: dict[str, dict[str, np.ndarray]] = {}
    times3 = None  # class_times is elementwise per row: the 3n stacked rows at once give each class's same numbers
    if st.stacked is not None and len(st.cls) == len(CLASSES) and all(
            st.cls.get(k, {}).get("q") is q for k, q in zip(CLASSES, st.stacked[1], strict=True)):
        times3 = class_times(st.stacked[0], util)
    for cls, r in st.cls.items():
        if times3 is not None:
            sl = slice(CLASSES.index(cls) * n, (CLASSES.index(cls) + 1) * n)
            fwd, bwd, rec = (x[sl] for x in times3)
        else:
            fwd, bwd, rec = class_times(r["q"], util)
        tp_s = r["tp"]
        th = util.coef[U.I["gemm"]] / util.scale
        if np.count_nonzero(r["ub_b"] > 0):  # SP without userbuffers: the column-parallel backward's async collectives
            tp_s = _overlap.sp_backward_exposed(r["tp"], r["ub_b"], th * r["q"]["Gag"])
        if np.count_nonzero(tpo):
            q_ = r["q"]
            ub = r["ub_ag_f"] + r["ub_rs_f"] + r["ub_ag_r"] + r["ub_rs_r"] + r["ub_b"]
            t_rs = np.stack([r["ub_t_proj"], r["ub_t_fc2"], r["ub_t_fc2"]], axis=1)
            ex = tp_overlap_exposed(r["tp"], ub, r["ub_b"], th * (q_["Gag"] + q_["Grs"]), r["ub_t_ag"], t_rs,
                                    q_["ub_n"], th * q_["ub_gag"], th * q_["ub_grs"], r["tp_size"])
            tp_s = np.where(tpo, ex, tp_s)
        q = {"fwd": fwd, "bwd": bwd, "rec": rec, "tp": tp_s, "ep": r["ep"], "pp": r["pp"], "dp": r["dp"],
             "bus": r["tp_bus"] + r["ep_bus"] + r["pp_bus"] + r["cp_bus"]}
        q["cp"] = (cp_time.exposed(r["cp_calls"], st.cp, util.work(r["q"]["Cd"]))
                   if r["cp_calls"] and st.cp is not None else np.zeros(n))
        _overlap.pipeline_and_moe(st, cls, r, q, util.layer_pass)  # overlap_p2p_comm, moe_a2a_overlap
        if np.count_nonzero(split_ag):  # the parameter all-gather follows the optimizer step: never under the backward
            q["dp"] = np.where(split_ag, r["dp"] - r["dp_ag"], r["dp"])
        q["fsdp"], q["fsdp_total"] = np.zeros(n), np.zeros(n)
        if st.fsdp is not None and np.count_nonzero(st.fsdp):  # FSDP per unit under prefetch (llmcomm.overhead.fsdp_time)
            q["fsdp"] = fsdp_time.exposed(r, *layer_times(r["q"], util), v)
            q["fsdp_total"], q["bus"] = fsdp_time.total(r, v), q["bus"] + r["fsdp_bus"]
        q["stage"] = q["fwd"] + q["bwd"] + q["rec"] + q["tp"] + q["ep"] + q["pp"] + q["fsdp"] + q["cp"]
        per[cls] = q
    first, mid, last = (per[k] for k in CLASSES)
    has_mid, has_last = pp >= 3, pp >= 2
    stage = np.concatenate([first["stage"], np.where(has_mid, mid["stage"], -np.inf),
                            np.where(has_last, last["stage"], -np.inf)]).reshape(3, n)
    crit = np.argmax(stage, axis=0)
    total_stage = (first["stage"] + np.where(has_mid, (pp - 2) * mid["stage"], 0)
                   + np.where(has_last, last["stage"], 0))
    rows = np.arange(n)
    ccrit = stage[crit, rows]
    # the critical class's value of every picked term, gathered at once: (class, term, row) -> (term, row)
    picked = [first[k] for k in _PICKED] + [mid[k] for k in _PICKED] + [last[k] for k in _PICKED]
    if all(x.dtype == np.float64 and x.shape == (n,) for x in picked):
        at = dict(zip(_PICKED, np.concatenate(picked).reshape(3, len(_PICKED), n)[crit, :, rows].T, strict=True))
    else:  # other dtypes or shapes: term by term, as chosen
        at = {k: np.choose(crit, [first[k], mid[k], last[k]]) for k in _PICKED}

    def pick(key: str) -> np.ndarray:
        return at[key]

    out = {"forward_s": m * pick("fwd"), "backward_s": m * pick("bwd"), "recompute_s": m * pick("rec"),
           "tp_comm_s": m * pick("tp"), "ep_comm_s": m * pick("ep"), "pp_comm_s": m * pick("pp"),
           "cp_comm_s": m * pick("cp"),
           "bubble_s": (total_stage - ccrit) / v}
    # DP: stage 0 finishes its last backward last; stage r finishes r backward steps earlier
    step = last["bwd"] + last["rec"] + last["tp"] + last["ep"] + last["pp"] + last["cp"]
    dp_exposed = np.maximum(first["dp"], np.where(has_last, last["dp"] - (pp - 1) * step, 0.0))
    dp_exposed = np.maximum(dp_exposed, np.where(has_mid, mid["dp"] - step, 0.0))
    if np.count_nonzero(ogr):  # Megatron's buckets and schedule: llmcomm.overhead.overlap.grad_reduce_exposed
        dp_exposed = np.where(ogr, _overlap.stage_grad_reduce(st, per, has_mid, has_last), dp_exposed)
    ag = np.zeros(n)
    if np.count_nonzero(split_ag):  # the parameter all-gather: exposed after the optimizer step, or hidden in the next forward
        cl = st.cls
        ag = np.maximum(cl["first"]["dp_ag"], np.maximum(np.where(has_last, cl["last"]["dp_ag"], 0.0),
                                                         np.where(has_mid, cl["mid"]["dp_ag"], 0.0)))
        assert st.buckets is not None, "stages() sets the first stage's DDP buckets"
        hidden = param_gather_exposed(cl["first"]["dp_ag"], first["fwd"], st.buckets)
        dp_exposed = dp_exposed + np.where(split_ag, np.where(opg, hidden, ag), 0.0)
    out["dp_comm_s"] = dp_exposed + m * pick("fsdp")  # + FSDP's exposed per-unit calls, every micro-batch
    out["dp_comm_total_s"] = np.maximum(first["dp"], np.maximum(np.where(has_last, last["dp"], 0.0),
                                                                np.where(has_mid, mid["dp"], 0.0))) + np.where(
        split_ag, ag, 0.0) + m * pick("fsdp_total")
    out["optimizer_s"] = st.optimizer_bytes / st.hbm / util.scale
    out["comm_bus_bytes"] = m * pick("bus") + st.cls["first"]["dp_bus"]  # + stage 0's gradient reduction
    out["critical"] = np.asarray(CLASSES)[crit]
    out["critical_index"] = crit
    out["num_microbatches"] = m
    return out


_PICKED = ("fwd", "bwd", "rec", "tp", "ep", "pp", "cp", "fsdp", "fsdp_total", "bus")  # combine's per-class terms


def _evaluate(model: ModelSpec, t: ParallelTable, cluster: Cluster, bandwidth: Any,
              util: U.Utilization, overlap_grad_reduce: bool = False, measured_gemms: bool = True
              ) -> dict[str, np.ndarray]:
    """:func:`combine` of :func:`stages`, :data:`EVAL_CHUNK` rows at a time (every term is a function of its
    own row alone): the arrays of a block stay in the CPU's cache and the allocator reuses their memory, where
    arrays of a whole table (a few MB each, hundreds of them) go to and from the kernel page by page."""
    n = len(t)
    if n <= EVAL_CHUNK:
        return combine(stages(model, t, cluster, bandwidth, measured_gemms), util, overlap_grad_reduce)
    parts = [combine(stages(model, t.slice(a, min(a + EVAL_CHUNK, n)), cluster, bandwidth, measured_gemms), util,
                     overlap_grad_reduce) for a in range(0, n, EVAL_CHUNK)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


EVAL_CHUNK = 16384  # rows _evaluate computes at a time (8192–65536 measured alike on 200,000 rows; 2048 slower)


class _Timer:
    """Times calls through a bandwidth model, caching its per-regime parameters.

    With a :class:`~llmcomm.overhead.bandwidth.Bandwidth` the regime ``(x_lo, α, β)`` of each (op, group
    size, ranks per node) is looked up once and every call is evaluated by the same piecewise expression as
    ``Bandwidth.time`` (``bandwidth.eval_pieces``; checked equal in ``tests/test_overhead_iteration.py``); any
    other object with a ``time(op, nbytes, group_size, ranks_per_node)`` method is called as it is."""

    def __init__(self, bandwidth: Any) -> None:
        self.bw = bandwidth
        self.fast = hasattr(bandwidth, "regime")
        self.cache: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.groups: dict[tuple[int, int], tuple[Any, Any, np.ndarray, np.ndarray]] = {}
        self.sorted: dict[tuple[int, int], tuple[Any, Any, np.ndarray, list[int]]] = {}  # _sorted
        self.tables: dict[tuple[str, int, int], tuple[Any, Any, _RegimeRows | None]] = {}  # _regime_rows
        self.memo: dict[tuple[str, int, int, float], tuple[float, float]] = {}  # calls(): one call's time, bus bytes
        self.prepared: dict[tuple[str, int, int], tuple[Any, Any, Any, float]] = {}  # _prepared
        self.padded: dict[tuple[str, int, int, int], tuple[list[float], list[float], list[float], list[float]]] = {}

    def calls(self, items: list[tuple[CommItem, list[bool]]]
              ) -> dict[tuple[str, int, int, float], tuple[float, float]]:
        """``{(op, group size, ranks per node, bytes): (seconds, bus bytes)}`` holding every live call of
        ``items``: the calls not met before are evaluated, grouped by regime, with ``bus_factor`` and
        ``eval_pieces`` as :meth:`time` does (a group of one rank: 0 s), and kept (up to :data:`CALL_MEMO_SIZE`
        calls, then forgotten all at once). A sweep of one model meets the same calls again and again."""
        return self.calls_of(self.call_keys(items))

    @staticmethod
    def call_keys(items: list[tuple[CommItem, list[bool]]]) -> list[list[tuple[str, int, int, float] | None]]:
        """Per item and row the key ``(op, group size, ranks per node, bytes)`` of its call, ``None`` where the row
        issues none (:meth:`calls_of` reads them)."""
        return [[(it.op, s_, r_, b_) if on else None
                 for s_, r_, b_, on in zip(it.size.tolist(), it.rpn.tolist(), it.nbytes.tolist(), live, strict=True)]
                for it, live in items]

    def calls_of(self, keys: list[list[tuple[str, int, int, float] | None]]
                 ) -> dict[tuple[str, int, int, float], tuple[float, float]]:
        """:meth:`calls` from the calls' keys (:meth:`call_keys`)."""
        memo = self.memo
        if len(memo) > CALL_MEMO_SIZE:
            memo.clear()
        todo: dict[tuple[str, int, int], dict[Any, None]] = {}
        for row in keys:
            for key in row:
                if key is not None and key not in memo:
                    todo.setdefault(key[:3], {})[key[3]] = None
        if not todo:
            return memo
        # the new calls of every (op, group size, ranks per node) at once: each row with its group's bus factor and
        # regime (padded to the widest one: a lower end +∞ no bus byte count reaches; a group of one rank α = β = 0
        # and floor −∞, i.e. 0 s), evaluated as eval_pieces does, element by element
        groups = list(todo.items())
        regs = [self._prepared(op, nn, kk) for (op, nn, kk), _ in groups]
        width = max(len(r[0]) for r in regs)
        tables = [self._padded(key, reg, width) for (key, _), reg in zip(groups, regs, strict=True)]
        counts = [len(nbs) for _, nbs in groups]
        nbytes = [b for _, nbs in groups for b in nbs]
        gid = np.repeat(np.arange(len(groups)), counts)
        x = np.repeat(np.array([r[3] for r in regs]), counts) * np.asarray(nbytes, dtype=np.float64)
        lo, alpha, beta, floor = (np.array([tb[i] for tb in tables], dtype=np.float64) for i in range(4))
        p = ((x[:, None] >= lo.take(gid, axis=0)[:, 1:]).sum(axis=1) if width > 1
             else np.zeros(len(x), np.intp))  # the piece: Σ_j [x ≥ x_lo_j] over the pieces after the first
        idx = gid * width + p
        tt = piece_time(x, alpha.ravel().take(idx), beta.ravel().take(idx), floor.ravel().take(idx))
        names = [(op, nn, kk, b) for (op, nn, kk), nbs in groups for b in nbs]
        memo.update(zip(names, zip(tt.tolist(), x.tolist(), strict=True), strict=True))
        return memo

    def _prepared(self, op: str, nn: int, kk: int) -> tuple[Any, Any, Any, float]:
        """``(x_lo, α, β, bus factor)`` of one group's regime (``x_lo`` empty for a group of one rank: no time),
        the bus factor ``bus_factor(op, nn)`` as a number (:meth:`calls_of`)."""
        key = (op, nn, kk)
        hit = self.prepared.get(key)
        if hit is None:
            f = float(bus_factor(op, np.full(1, nn))[0])
            if nn == 1:
                hit = (np.zeros(1), np.zeros(1), np.zeros(1), f)
            else:
                reg = self.cache.get(key)
                if reg is None:
                    reg = self.cache[key] = self.bw.regime(op, nn, kk)
                hit = (*reg, f)
            self.prepared[key] = hit
        return hit

    def _padded(self, key: tuple[str, int, int], reg: tuple[Any, Any, Any, float], width: int
                ) -> tuple[list[float], list[float], list[float], list[float]]:
        """One regime's lower ends, α, β and floors (:func:`~llmcomm.overhead.bandwidth.piece_floor`) as lists of
        ``width`` pieces, padded with pieces no bus byte count reaches (lower end +∞); a group of one rank
        (``key[1] == 1``): α = β = 0, floor −∞ (0 s)."""
        hit = self.padded.get((*key, width))
        if hit is None:
            x_lo, a, b, _ = reg
            pad = width - len(x_lo)
            if key[1] == 1:
                hit = ([0.0] + [np.inf] * (width - 1), [0.0] * width, [0.0] * width, [-np.inf] * width)
            else:
                hit = (x_lo.tolist() + [np.inf] * pad, a.tolist() + [0.0] * pad, b.tolist() + [0.0] * pad,
                       piece_floor(x_lo, a, b).tolist() + [-np.inf] * pad)
            self.padded[(*key, width)] = hit
        return hit

    def time_rows(self, op: str, x: np.ndarray, n: np.ndarray, k: np.ndarray, live: np.ndarray) -> np.ndarray:
        """Seconds of one call on the rows ``live`` (0 elsewhere) from its bus bytes ``x = bus_factor(op, n)·nbytes``
        (all rows): ``time(op, nbytes[live], n[live], k[live])`` placed in zeros, with the rows grouped by
        (``n``, ``k``) once per pair of arrays (items share them) instead of once per call; with several groups each
        row reads its group's regime from tables (:meth:`_regime_rows`), no sorting. Fast timers only."""
        hit = self.groups.get((id(n), id(k)))
        if hit is not None and hit[0] is n and hit[1] is k:
            uniq, inv = hit[2], hit[3]
        else:
            n64, k64 = np.asarray(n, dtype=np.int64), np.asarray(k, dtype=np.int64)
            key = n64 * (1 << 20) + k64
            if len(key) and (key == key[0]).all():
                uniq, inv = key[:1], np.zeros(len(key), np.int64)
            else:
                inv, uniq = _group_codes(n64, k64, key)
            self.groups[(id(n), id(k))] = (n, k, uniq, inv)
        out = np.zeros(len(x))
        every = bool(live.all())
        if len(uniq) > 1:  # several groups: every row with its own group's regime (tables cached per op and arrays)
            table = self._regime_rows(op, n, k, inv, uniq)
            if table is not None:
                lo_cols, pieces, alpha, beta, floor = table.lo_cols, table.pieces, table.alpha, table.beta, table.floor
                rows = None if every else np.flatnonzero(live)
                if rows is not None and len(rows) <= LIVE_SHARE_APART * len(x):  # a few live rows: those alone
                    xl, inv_l = x.take(rows), inv.take(rows)
                    idx = piece_of(xl, [col.take(inv_l) for col in lo_cols])
                    idx += inv_l * pieces
                    out[rows] = piece_time(xl, alpha.take(idx), beta.take(idx), floor.take(idx))
                    return out
                starts, base = table.per_row(inv)
                idx = piece_of(x, starts)
                idx += base  # row r's piece p is entry p of its group's row of the tables
                out = piece_time(x, alpha.take(idx), beta.take(idx), floor.take(idx))
                return out if every else np.where(live, out, 0.0)
            # the rows sorted by group once (cached), each group a slice
            order, bounds = self._sorted(n, k, inv, len(uniq))
            xs, ts, ls = x[order], np.zeros(len(x)), live[order]
            for i, u in enumerate(uniq.tolist()):
                nn, kk = u >> 20, u & ((1 << 20) - 1)
                b0, b1 = bounds[i], bounds[i + 1]
                if nn == 1 or not ls[b0:b1].any():  # no call's time, or a group no live row is in
                    continue
                reg = self.cache.get((op, nn, kk))
                if reg is None:
                    reg = self.cache[(op, nn, kk)] = self.bw.regime(op, nn, kk)
                ts[b0:b1] = eval_pieces(xs[b0:b1], *reg)[0]  # elementwise: the live rows' values as alone
            out[order] = ts
            return out if every else np.where(live, out, 0.0)
        xl = x if every else x[live]
        tl = out if every else np.zeros(len(xl))
        u = int(uniq[0]) if len(uniq) else 1
        nn, kk = u >> 20, u & ((1 << 20) - 1)
        if nn != 1 and len(xl):  # a group of one rank: no call's time; no live row: nothing
            reg = self.cache.get((op, nn, kk))
            if reg is None:
                reg = self.cache[(op, nn, kk)] = self.bw.regime(op, nn, kk)
            tl[:] = eval_pieces(xl, *reg)[0]
        if not every:
            out[live] = tl
        return out

    def _regime_rows(self, op: str, n: np.ndarray, k: np.ndarray, inv: np.ndarray, uniq: np.ndarray
                     ) -> _RegimeRows | None:
        """Each row's regime of ``op`` as tables (:meth:`time_rows`, several groups): the groups' regimes
        ``(x_lo, α, β)`` and floors (:func:`~llmcomm.overhead.bandwidth.piece_floor`) as ``(groups, pieces)`` rows,
        flattened (``α``, ``β``, floor), padded with pieces no bus byte count reaches (lower end ``+∞``); per row
        the lower ends of its group's pieces after the first and the offset ``group·pieces`` of its group's row
        (:meth:`_RegimeRows.per_row`, built on first use: rows timed apart read the groups' columns).
        A group of one rank has ``α = β = 0``: no time, as :meth:`time` gives. Once per op and pair of (group size,
        ranks per node) arrays; ``None`` where a group's regime cannot be looked up (:meth:`time_rows` then asks
        only the groups it needs, as before)."""
        key = (op, id(n), id(k))
        hit = self.tables.get(key)
        if hit is not None and hit[0] is n and hit[1] is k:
            return hit[2]
        regimes: list[Any] = []
        try:
            for u in uniq.tolist():
                nn, kk = u >> 20, u & ((1 << 20) - 1)
                if nn == 1:
                    regimes.append(None)
                    continue
                reg = self.cache.get((op, nn, kk))
                if reg is None:
                    reg = self.cache[(op, nn, kk)] = self.bw.regime(op, nn, kk)
                regimes.append(reg)
        except (ConfigError, DataError, KeyError, ValueError):
            self.tables[key] = (n, k, None)
            return None
        pieces = max([len(r[0]) for r in regimes if r is not None], default=1)
        lo = np.full((len(regimes), pieces), np.inf)
        alpha, beta = np.zeros((len(regimes), pieces)), np.zeros((len(regimes), pieces))
        floor = np.full((len(regimes), pieces), -np.inf)
        for g, reg in enumerate(regimes):
            if reg is None:  # one rank: max(0 + 0·x, −∞) = 0 s
                continue
            x_lo, a, b = reg
            lo[g, :len(x_lo)], alpha[g, :len(x_lo)], beta[g, :len(x_lo)] = x_lo, a, b
            floor[g, :len(x_lo)] = piece_floor(x_lo, a, b)
        table = _RegimeRows([lo[:, j].copy() for j in range(1, pieces)], pieces, alpha.ravel(), beta.ravel(),
                            floor.ravel())
        self.tables[key] = (n, k, table)
        return table

    def _sorted(self, n: np.ndarray, k: np.ndarray, inv: np.ndarray, groups: int) -> tuple[np.ndarray, list[int]]:
        """The rows ordered by group code ``inv`` (stable) and each group's ``[start, end)`` in that order, once
        per pair of (group size, ranks per node) arrays (:meth:`time_rows`)."""
        hit = self.sorted.get((id(n), id(k)))
        if hit is not None and hit[0] is n and hit[1] is k:
            return hit[2], hit[3]
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(groups + 1)).tolist()
        self.sorted[(id(n), id(k))] = (n, k, order, bounds)
        return order, bounds

    def reset(self) -> None:
        """Forget the grouping of rows by (group size, ranks per node) cached for the current arrays."""
        self.groups.clear()
        self.sorted.clear()
        self.tables.clear()

    def time(self, op: str, nbytes: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
        if not self.fast:
            return np.asarray(self.bw.time(op, nbytes, n, k), dtype=np.float64)
        if len(n) == 1:
            nn, kk = int(n[0]), int(k[0])
            if nn == 1:
                return np.zeros(1)
            reg = self.cache.get((op, nn, kk))
            if reg is None:
                reg = self.cache[(op, nn, kk)] = self.bw.regime(op, nn, kk)
            return eval_pieces(bus_factor(op, n) * np.asarray(nbytes, dtype=np.float64), *reg)[0]
        nbytes = np.asarray(nbytes, dtype=np.float64)
        n = np.asarray(n, dtype=np.int64)
        k = np.asarray(k, dtype=np.int64)
        x = bus_factor(op, n) * nbytes
        out = np.zeros(len(x))
        if len(x) <= SMALL_ROWS:  # a few rows (one configuration's calls): grouped by a dict, no hashing pass
            by: dict[tuple[int, int], list[int]] = {}
            for i, g in enumerate(zip(n.tolist(), k.tolist(), strict=True)):
                by.setdefault(g, []).append(i)
            for (nn, kk), idx in by.items():
                if nn == 1:
                    continue
                reg = self.cache.get((op, nn, kk))
                if reg is None:
                    reg = self.cache[(op, nn, kk)] = self.bw.regime(op, nn, kk)
                if len(by) == 1:
                    out = eval_pieces(x, *reg)[0]
                else:
                    out[idx] = eval_pieces(x[idx], *reg)[0]
            return out
        hit = self.groups.get((id(n), id(k)))
        if hit is not None and hit[0] is n and hit[1] is k:
            uniq, inv = hit[2], hit[3]
        else:
            key = n * (1 << 20) + k
            if len(key) and (key == key[0]).all():
                uniq, inv = key[:1], np.zeros(len(key), np.int64)
            else:  # hashed, O(rows): a few distinct groups among many rows (np.unique sorts them all)
                inv, uniq = pd.factorize(key, sort=False)
            self.groups[(id(n), id(k))] = (n, k, uniq, inv)
        for i, u in enumerate(uniq.tolist()):
            nn, kk = u >> 20, u & ((1 << 20) - 1)
            if nn == 1:
                continue
            reg = self.cache.get((op, nn, kk))
            if reg is None:
                reg = self.cache[(op, nn, kk)] = self.bw.regime(op, nn, kk)
            x_lo, alpha, beta = reg
            sel = slice(None) if len(uniq) == 1 else inv == i
            out[sel] = eval_pieces(x[sel], x_lo, alpha, beta)[0]
        return out


@dataclass
class _RegimeRows:
    """One op's regimes of several groups as tables (:meth:`_Timer._regime_rows`): per piece after the first the
    groups' lower ends ``lo_cols`` (``(groups,)`` each), the number of ``pieces`` per group, and ``α``, ``β`` and
    floors flattened from ``(groups, pieces)``; :meth:`per_row` spreads the lower ends and the offsets
    ``group·pieces`` over the rows, once."""

    lo_cols: list[np.ndarray]
    pieces: int
    alpha: np.ndarray
    beta: np.ndarray
    floor: np.ndarray
    rows: tuple[list[np.ndarray], np.ndarray] | None = None

    def per_row(self, inv: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Each row's lower ends of its group's pieces after the first, and its group's offset ``group·pieces``
        (``inv``: each row's group; the same array on every call, :meth:`_Timer.time_rows`)."""
        if self.rows is None:
            self.rows = ([col.take(inv) for col in self.lo_cols], inv * self.pieces)
        return self.rows


def _group_codes(n: np.ndarray, k: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(code of each row, distinct keys)`` of the rows' (group size ``n``, ranks per node ``k``) pairs, ``key =
    n·2²⁰ + k`` (:meth:`_Timer.time_rows`): through a dense look-up table of the pairs' range where it is small
    (a count per pair, no hashing), else by hashing (``pandas.factorize``). Codes number the distinct pairs (in
    ascending order for the table, of first appearance for the hash); what a row's code stands for is the same."""
    n_lo, k_lo = int(n.min()), int(k.min())
    width = int(k.max()) - k_lo + 1
    span = (int(n.max()) - n_lo + 1) * width
    if span > DENSE_GROUP_CODES:
        inv, uniq = pd.factorize(key, sort=False)
        return inv, uniq
    dense = (n - n_lo) * width + (k - k_lo)
    present = np.flatnonzero(np.bincount(dense, minlength=span))
    lut = np.zeros(span, np.int64)
    lut[present] = np.arange(len(present))
    uniq = (present // width + n_lo) * (1 << 20) + (present % width + k_lo)
    return lut.take(dense), uniq


LIVE_SHARE_APART = 0.3  # _Timer.time_rows: up to this share of live rows, only those are timed (elementwise: equal)
DENSE_GROUP_CODES = 1 << 20  # _group_codes: a look-up table up to this many (group size, ranks per node) pairs
CALL_MEMO_SIZE = 200_000  # distinct calls a _Timer keeps (_Timer.calls)
SMALL_ROWS = 256  # _Timer.time groups this many rows or fewer by a dict (pandas' hashing pays off above)
_TIMERS: dict[int, tuple[Any, _Timer]] = {}


def _timer(bandwidth: Any) -> _Timer:
    hit = _TIMERS.get(id(bandwidth))
    if hit is None or hit[0] is not bandwidth:
        if len(_TIMERS) > 64:
            _TIMERS.clear()
        hit = _TIMERS[id(bandwidth)] = (bandwidth, _Timer(bandwidth))
    return hit[1]


def _resolve(cluster: Cluster, bandwidth: Any, utilization: U.Utilization | None) -> tuple[Any, U.Utilization]:
    """The bandwidth model (``None``: the shipped calibration carried to ``cluster``) wrapped in a caching
    :class:`_Timer`, and the utilization model (``None``: the shipped one)."""
    if bandwidth is None:  # Bandwidth.default caches per cluster and calibration file stamp (one os.stat)
        bandwidth = Bandwidth.default(cluster)
    return _timer(bandwidth), (utilization if utilization is not None else U.Utilization.default())




_STAGES: OrderedDict[tuple[Any, ...], tuple[Any, Any, float, Stages]] = OrderedDict()
STAGE_CACHE_SIZE = 256  # configurations whose Stages iteration_time keeps (least recently used dropped)


def _one_stages(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, bw: Any, measured_gemms: bool
                ) -> tuple[float, Stages]:
    """The model state bytes (:func:`~llmcomm.overhead.memory.model_state`) and the :class:`Stages` of one
    configuration, kept for the :data:`STAGE_CACHE_SIZE` most recent (model, configuration, cluster, bandwidth
    model, GEMM model): all are frozen values except the two models, which are held and matched by identity (the
    shipped ones are the same objects while their calibration files are unchanged, :func:`_resolve`,
    :func:`measured_gemm`). The cached arrays are read-only, so that nothing downstream can change a cached
    value in place. A repeated configuration (the explorer, a CLI call, a notebook) costs :func:`combine` only."""
    gemm = measured_gemm(cluster) if measured_gemms else None
    key = (model, parallel, cluster, id(bw), id(gemm), measured_gemms)
    hit = _STAGES.get(key)
    if hit is not None and hit[0] is bw and hit[1] is gemm:
        _STAGES.move_to_end(key)
        return hit[2], hit[3]
    state = float(sum(model_state(model, parallel)))
    st = stages(model, ParallelTable.from_parallel(parallel, model), cluster, bw, measured_gemms, gemm=gemm)
    _freeze(st)
    _STAGES[key] = (bw, gemm, state, st)
    if len(_STAGES) > STAGE_CACHE_SIZE:
        _STAGES.popitem(last=False)
    return state, st


def _freeze(x: Any) -> None:
    """Every numpy array in ``x`` (a :class:`Stages`, its dicts) read-only (a loop, not a recursion: a
    configuration's :class:`Stages` holds some 150 arrays)."""
    todo = [x]
    ndarray = np.ndarray
    while todo:
        v = todo.pop()
        if isinstance(v, dict):  # most arrays sit in dicts: frozen here, the rest looked into
            for u in v.values():
                if type(u) is ndarray:
                    u.setflags(write=False)
                else:
                    todo.append(u)
        elif isinstance(v, np.ndarray):
            v.setflags(write=False)
        elif isinstance(v, Stages):
            todo.extend(vars(v).values())


def iteration_times(model: ModelSpec, candidates: pd.DataFrame, cluster: Cluster, bandwidth: Any = None,
                    utilization: U.Utilization | None = None, *, overlap_grad_reduce: bool = False,
                    interval: bool = True) -> pd.DataFrame:
    """Evaluate a table of configurations with numpy: ``candidates`` holds ``tp, pp, dp`` and optionally any other
    :class:`ParallelConfig` field (absent: its default; :class:`~llmcomm.parallel_table.ParallelTable`); returns
    the candidates with every term of :data:`TERMS`, ``total_s``, ``exposed_comm_s``, ``comm_overhead``,
    ``critical`` (stage class), ``num_microbatches`` and, with ``interval`` and the shipped interval file, the
    90 % interval ``total_s_lo``, ``total_s_hi`` (:mod:`llmcomm.overhead.interval`). Raises :class:`ConfigError` naming the first row that
    breaks a rule (:func:`candidate_table`)."""
    t = candidate_table(model, candidates)
    bw, ut = _resolve(cluster, bandwidth, utilization)
    r = _evaluate(model, t, cluster, bw, ut, overlap_grad_reduce)
    out = candidates.reset_index(drop=True).copy()
    for k in (*TERMS, "dp_comm_total_s", "critical", "num_microbatches", "comm_bus_bytes"):
        out[k] = _critical_column(r["critical_index"]) if k == "critical" else r[k]
    out["total_s"] = sum(r[k] for k in TERMS)
    out["exposed_comm_s"] = sum(r[k] for k in COMM_TERMS)
    out["comm_overhead"] = out["exposed_comm_s"] / out["total_s"]
    iv = _interval.apply(out["total_s"].to_numpy()) if interval else None
    if iv is not None:  # the 90 % interval from the calibration residuals (llmcomm.overhead.interval)
        out["total_s_lo"], out["total_s_hi"] = iv
    return out


def _critical_column(crit: np.ndarray) -> Any:
    """The ``critical`` column of :func:`iteration_times` from the critical class's index per row: the column the
    names ``CLASSES[crit]`` (:func:`combine`'s ``critical``) would make, taken from a column of the three names
    (the dtype pandas gives those names, built once), not converted from a numpy string array row by row."""
    return _class_names().take(np.asarray(crit, dtype=np.intp))


@lru_cache(maxsize=1)
def _class_names() -> Any:
    """:data:`~llmcomm.step.CLASSES` as the array a frame column of them holds (pandas' string dtype)."""
    return pd.Series(np.asarray(CLASSES)).array


def iteration_time(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, bandwidth: Any = None,
                   utilization: U.Utilization | None = None, *, overlap_grad_reduce: bool = False,
                   measured_gemms: bool = True) -> Breakdown:
    """The :class:`Breakdown` of one configuration (the formulation of the module docstring);
    ``measured_gemms=False``: linear GEMMs at ``FLOPs/peak`` even on a GPU with a measured GEMM model
    (:func:`stages`; what :mod:`llmcomm.overhead.ablation` starts from). Raises
    :class:`ConfigError` when the model and configuration break a rule (:data:`SCOPES` of :mod:`llmcomm.rules`),
    when the cluster has fewer GPUs than the configuration needs, or when the model state alone (weights,
    gradients and optimizer state of the stage holding the most, :func:`llmcomm.overhead.memory.model_state`)
    exceeds the GPU memory; warns with :class:`~llmcomm.overhead.capacity.MemoryWarning` when activations
    included it does (:func:`llmcomm.overhead.capacity.check_fits`)."""
    overlap_grad_reduce = overlap_grad_reduce or parallel.overlap_grad_reduce
    rules.check(model, parallel, SCOPES[1:])  # "config" held when the ParallelConfig was built
    if cluster.num_gpus is not None and parallel.world_size > cluster.num_gpus:
        raise ConfigError(f"tp*pp*dp={parallel.world_size} GPUs but cluster {cluster.name} holds "
                          f"{cluster.num_gpus}")
    bw, ut = _resolve(cluster, bandwidth, utilization)
    state, st = _one_stages(model, parallel, cluster, bw, measured_gemms)
    if state > cluster.gpu_memory_bytes:
        raise ConfigError(f"{model.name} under tp={parallel.tp} pp={parallel.pp} needs {state / 1e9:.1f} GB "
                          f"per GPU for weights, gradients and optimizer state alone; {cluster.name} GPUs hold "
                          f"{cluster.gpu_memory_bytes / 1e9:.0f} GB")
    check_fits(model, parallel, cluster)  # activations too: a MemoryWarning with the numbers
    r = combine(st, ut, overlap_grad_reduce)
    return Breakdown(**{k: float(r[k][0]) for k in (*TERMS, "dp_comm_total_s", "comm_bus_bytes")},
                     critical_stage=str(r["critical"][0]))
