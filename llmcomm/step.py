"""One description of a training step: per pipeline stage and model chunk, which layers it holds, and per layer
its GEMMs, attention core, element-wise traffic, parameters, activation memory and communication calls.

Shaped like Calculon's ``Layer`` (``calculon/llm/layers.py``: FLOPs, weights, activations and communication carried
together) so that the traffic predictor, the cost model, the memory model and the tuner read one description:

* :func:`chunk_layers` — Megatron's layer assignment: model chunk ``c`` of stage ``r`` is virtual stage
  ``vs = c·pp + r`` and holds layers ``vs·L/(pp·v) … (vs+1)·L/(pp·v) − 1`` (``megatron/core/transformer/
  transformer_block.py`` ``get_num_layers_to_build`` / ``_get_layer_offset``);
* :func:`layer_split` / :func:`stage_parameters` — :meth:`ModelSpec.layer_parameter_split` (the one home of the
  parameter split), vectorized over tables of configurations, and the parameters beside the layers
  (:func:`edge_parameters`: the word embedding ``V'·h/tp`` on the first stage, the final norm and — untied, or
  tied with ``pp > 1`` — the output layer on the last);
* :func:`stage_classes` — the stages the vectorized cost model tells apart (first, the middle stage with the most
  MoE layers, last) and their dense and MoE layer counts;
* :func:`placement` — per group kind, its size and how many of its ranks share a node, read from
  :class:`llmcomm.layout.Layout` under the configuration's ``order``;
* :func:`describe` — the scalar description of one configuration (:class:`Step` → :class:`StageStep` →
  :class:`ChunkStep` → :class:`LayerStep`), each layer with its :class:`Gemm` s (``m × k`` by ``k × n`` per rank),
  its :class:`AttentionCore`, element-wise bytes, parameters, activation bytes and the predictor's calls.

GEMMs of one layer's forward pass on one rank (``T = b·s/cp`` tokens, all-gathered to ``T`` with SP; ``k_m = 3``
for a gated MLP else 2; ``E`` experts of which ``E/ep`` local, ``topk`` routed, ``S`` shared; expert TP ``etp``)::

    qkv      m = T        n = (a·d + 2·g·d)/tp      k = h
    proj     m = T        n = h                     k = a·d/tp
    fc1      m = T        n = (k_m − 1)·f/tp        k = h            (dense layer)
    fc2      m = T        n = h                     k = f/tp
    router   m = T        n = E                     k = h            (MoE layer, replicated over TP)
    expert   E/ep GEMMs   m = T·topk·ep·etp/(tp·E)  n = (k_m − 1)·f_e/etp, k = h; fc2 n = h, k = f_e/etp
    shared   m = T        n = (k_m − 1)·S·f_e/tp    k = h; fc2 n = h, k = S·f_e/tp
    output   m = T        n = V'/tp                 k = h            (last stage)

Attention core per rank: batch ``b``, ``a/tp`` heads, ``s/cp`` queries against ``s`` keys, head dim ``d``, causal
for a decoder; ``4·b·(a/tp)·(s/cp)·s·d`` FLOPs counted over the full score matrix and, unfused,
``SCORE_BYTES·b·(a/tp)·s²`` bytes of score traffic. Element-wise traffic of the rest of the layer:
``ACTIVATION_BYTES·T·h/w + F·T·f_eff/tp`` bytes (``w = tp`` with SP, else 1; ``f_eff`` the FFN width the
tokens pass: ``f``, or ``(topk + S)·f_e``; ``F`` the forward count of :func:`ffn_activation_bytes`), as
:func:`llmcomm.overhead.utilization.layer_features` counts them.
The counts, per element of the tensor touched, 16-bit activations, are the kernels Megatron-DeepSpeed's GPT layer
launches (``megatron/model/transformer.py``: ``ParallelTransformerLayer.forward``, ``ParallelAttention.forward``,
``bias_dropout_add_fused_train``; Megatron-LM's layer has the same kernels)::

    ACTIVATION_BYTES = 22   b·s·h: input and post-attention LayerNorm, each read + written (2 · 4 B); two
                            fused bias-dropout-adds (TorchScript fuser: the CUDA lowering of dropout is
                            ``rand_like(x) < 1-p``, fused with the bias and residual adds, torch
                            ``symbolic_script.cpp`` ``dropout``), each reading x and the residual and writing
                            the sum (6 B) and the bool mask kept for the backward (1 B): 2 · 7 B
    FFN activation          b·s·f/tp: :func:`ffn_activation_bytes` (the fused bias-GeLU reads and writes it, 4 B;
                            a gated MLP's fused SwiGLU reads the 2f-wide fc1 output and writes f, 6 B)
    SCORE_BYTES = 13        b·(a/tp)·s², unfused core: Q·Kᵀ (``baddbmm``) writes the scores (2 B), the fused
                            scale-mask-softmax reads and writes them (4 B), ``torch.nn.Dropout`` reads and writes
                            them (4 B) and writes its bool mask (1 B), scores·V (``bmm``) reads them (2 B)

(the kit counted 32 and 10 before: three unfused adds per residual branch and no mask or ``bmm`` read.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from .errors import ConfigError
from .specs import LayerParams, ModelSpec, ParallelConfig
from .stage_split import pipeline_split
from .vocab import FUSED_ATTENTION_BACKENDS, RECOMPUTE_MODULES, dtype_bytes

CLASSES = ("first", "mid", "last")
# element-wise HBM bytes of one layer forward pass per element touched, 16-bit (module docstring: the kernels counted)
ACTIVATION_BYTES = 22  # b·s·h: two LayerNorms, two fused bias-dropout-adds with their bool masks
GELU_BYTES = (4, 8)  # b·s·f/tp, (forward, backward): the fused bias-GeLU (ffn_activation_bytes)
SWIGLU_BYTES = (6, 10)  # b·s·f/tp, (forward, backward): the fused SwiGLU of a gated MLP (ffn_activation_bytes)
SQUARED_RELU_BYTES = (4, 6)  # b·s·f/tp, (forward, backward): Nemotron's compiled squared ReLU (ffn_activation_bytes)
ACTIVATION_KERNEL_BYTES = {"gelu": GELU_BYTES, "swiglu": SWIGLU_BYTES, "squared_relu": SQUARED_RELU_BYTES}
SCORE_BYTES = 13  # b·(a/tp)·s², unfused core: Q·Kᵀ out, softmax, dropout (+ bool mask), scores·V in


def ffn_activation_bytes(activation: str) -> tuple[int, int]:
    """``(forward, backward)`` HBM bytes of the FFN activation kernel per element of its ``f``-wide output
    (``b·s·f/tp`` elements a dense layer, ``b·s·(topk + S)·f_e/tp`` an MoE layer), 16-bit: the one home of the
    count, read by :func:`llmcomm.overhead.utilization.layer_features` (forward, in the layer pass), by
    :func:`llmcomm.overhead.layer_kernels.ffn_backward_extra` (the backward beyond twice it) and by the
    recompute-module features of :mod:`llmcomm.overhead.iteration` (the replayed forward); ``activation`` the
    model's :attr:`~llmcomm.specs.ModelSpec.activation_kind`::

        gelu       (4, 8)   the fused bias-GeLU: forward reads the fc1 output and writes it (2 accesses); backward
                            reads the gradient and the input and writes the input's gradient, and autograd sums
                            that gradient over the tokens for the bias (GeLUFunction.backward returns it twice):
                            4 accesses, exactly twice the forward (Megatron-LM ``megatron/core/fusions/
                            fused_bias_gelu.py:16-55``; Megatron-LM's ``mlp.py`` asserts a bias on this path)
        swiglu     (6, 10)  the fused SwiGLU: forward reads the 2f-wide fc1 output and writes f (3 accesses per
                            output element); backward reads the gradient (f) and the input (2f) and writes the
                            input's gradient (2f): 5 accesses, 2 B below twice the forward
        squared_relu (4, 6) Nemotron's ``relu(x)²``, no bias: forward reads x and writes y (2 accesses); backward
                            reads the gradient and x and writes x's gradient (3 accesses, 2 B below twice the
                            forward). NeMo r2.0.0rc1 (the 24.07 container's) ``nemo/collections/nlp/modules/
                            common/megatron/utils.py:179-187``: ``squared_relu`` under ``jit_fuser``, i.e.
                            ``torch.compile`` (PyTorch 2.x), one Inductor kernel each way (AOTAutograd saves
                            ``x``, already alive as the fc1 output, and recomputes ``relu`` in the backward);
                            ``activation: squared-relu`` maps to it (``parts/utils_funcs.py:210-211``), and the
                            Nemotron recipes switch ``bias_activation_fusion`` off (Launcher 24.07
                            ``conf/training/nemotron/nemotron_8b.yaml:115``, ``nemotron_22b.yaml:115``,
                            ``nemotron_340b.yaml:112``), so Megatron-Core's ``MLP.forward`` calls it as is
                            (``mlp.py:115-125`` at ``core_r0.8.0``)

    The gated path, read in the Megatron-LM that Megatron-Bridge pins (``92c8482``, ``23dd639``, ``9ed8b0c``,
    ``23265d2``, ``2d1fa8d``; lines of ``23dd639``) and in the NeMo 24.07 container's (``338af51``, NeMo r2.0.0rc1
    ``Dockerfile:67``; the same files as ``core_r0.8.0``, ``mlp.py:100-112``): a TE-spec dense layer is
    Megatron's ``MLP`` (``gpt_layer_specs.py:497-513``: ``TEFusedMLP`` only with ``use_te_op_fuser``, which the
    performance scripts switch off, Megatron-Bridge ``scripts/performance/utils/overrides.py:62-63`` at
    ``c0b9a00``; TE's activation module only with ``use_te_activation_func``, default False,
    ``transformer_config.py:831``), whose forward runs ``bias_swiglu_impl`` under ``bias_activation_fusion``
    (``mlp.py:264, 296-304``; set by every Llama and Qwen3 recipe of the rows: Bridge ``llama_provider.py:45``,
    ``scripts/performance/configs/qwen/qwen3_llm_pretrain.py:32`` at ``c0b9a00``; NeMo 24.07
    ``launcher_scripts/conf/training/llama/llama2_7b.yaml:111``). ``SwiGLUFunction`` (``fused_bias_swiglu.py:
    147-188``; no bias in these models) calls ``swiglu`` (:15-26) forward and ``swiglu_back`` (:54-69) backward,
    each one ``torch.compile`` kernel (``jit_fuser``, ``megatron/core/jit.py:16-33``: Inductor fuses the chunk,
    the pointwise math and the concatenation). The routed experts (``TEGroupedMLP``) run ``weighted_bias_
    swiglu_impl`` (``moe/experts.py:784-792``; ``fused_bias_swiglu.py:44-48, 89-97, 191-251``), the same
    accesses and the router probability (one per row, not counted); its probability gradient reduces
    ``swiglu(y)·g`` over the same loads, counted as one pass (a second kernel would read ``g`` and ``y`` once
    more: 3 accesses, a lower bound here). Shared experts are an ``MLP``. GPT-OSS's clamped quick-GEGLU is
    the same fused kernel (:func:`llmcomm.overhead.eager_ops.clamped_glu_bytes` counts only the eager clamps and
    concatenation before it)."""
    if activation not in ACTIVATION_KERNEL_BYTES:
        raise ConfigError(f"activation={activation!r} is not one of {list(ACTIVATION_KERNEL_BYTES)}")
    return ACTIVATION_KERNEL_BYTES[activation]


# --------------------------------------------------------------------------------------- layer assignment
def _split_of(parallel: Any, num_layers: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    p = parallel
    return pipeline_split(num_layers, p.pp, p.vpp, p.num_layers_in_first_pipeline_stage,
                          p.num_layers_in_last_pipeline_stage, p.account_for_embedding_in_pipeline_split,
                          p.account_for_loss_in_pipeline_split)


def chunk_layers(num_layers: int, parallel: Any, stage: int, chunk: int) -> range:
    """Global layer indices of model chunk ``chunk`` on pipeline stage ``stage`` (:func:`pipeline_split`;
    ``parallel`` a :class:`ParallelConfig`)."""
    start, count = _split_of(parallel, num_layers)[stage][chunk]
    return range(start, start + count)


def stage_layers(num_layers: int, parallel: Any, stage: int) -> list[int]:
    """Every layer of stage ``stage``, chunk by chunk."""
    return [la for c in range(parallel.vpp) for la in chunk_layers(num_layers, parallel, stage, c)]


@lru_cache(maxsize=512)
def _stage_counts(model: ModelSpec, split: tuple[tuple[tuple[int, int], ...], ...]) -> tuple[tuple[int, int], ...]:
    """(layers, MoE layers) held by each stage of a :func:`pipeline_split`."""
    pat = model.moe_layer_pattern()
    return tuple((sum(n for _, n in row), sum(pat[la] for s0, n in row for la in range(s0, s0 + n))) for row in split)


UNEVEN = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
          "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def stage_classes(model: ModelSpec, pp: np.ndarray, vpp: np.ndarray, uneven: dict[str, np.ndarray] | None = None
                  ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{class: (dense layers, MoE layers)}`` of the first stage, the middle stage with the most MoE layers (the
    slowest of the middle ones) and the last stage, per configuration; ``uneven``: the arrays of :data:`UNEVEN`
    (``-1`` for an unset layer count), absent for even splits."""
    n = len(pp)
    u = uneven or {}
    cols = [pp, vpp] + [np.asarray(u.get(k, np.full(n, -1 if "num" in k else 0)), np.int64) for k in UNEVEN]
    if n == 1:  # one configuration: its layout's counts, no grouping
        one = _class_counts(model, *(int(col[0]) for col in cols))
        return {c: (np.array([one[c][0]], np.int64), np.array([one[c][1]], np.int64)) for c in CLASSES}
    out = {c: (np.zeros(n, np.int64), np.zeros(n, np.int64)) for c in CLASSES}
    inv, uniq = factorize(cols)
    for j, key in enumerate(uniq):
        sel = inv == j
        for c, (dense, moe) in _class_counts(model, *key).items():
            out[c][0][sel] = dense
            out[c][1][sel] = moe
    return out


def _class_counts(model: ModelSpec, p_: int, v_: int, f: int, la: int, e: int, lo: int
                  ) -> dict[str, tuple[int, int]]:
    """``{class: (dense layers, MoE layers)}`` of one layout (:func:`stage_classes`; ``f``, ``la`` are ``-1``
    when unset)."""
    counts = _stage_counts(model, pipeline_split(model.num_layers, p_, v_, None if f < 0 else f,
                                                 None if la < 0 else la, bool(e), bool(lo)))
    m = _mid_stage(counts, p_)
    mid = counts[m] if m is not None else (0, 0)
    return {c: (held - moe, moe) for c, (held, moe) in {"first": counts[0], "last": counts[-1], "mid": mid}.items()}


def _mid_stage(counts: tuple[tuple[int, int], ...], p_: int) -> int | None:
    """The stage the ``mid`` class stands for, among ``counts`` (``(layers, MoE layers)`` per stage): the middle
    stage with the most MoE layers, then the most layers, the first of ties; ``None`` for ``p ≤ 2``."""
    return max(range(1, p_ - 1), key=lambda i: (counts[i][1], counts[i][0])) if p_ > 2 else None


def recompute_groups(count: int, method: str | None, num_layers: int | None) -> tuple[tuple[int, ...], ...]:
    """The checkpointed groups of one model chunk of ``count`` layers under full recomputation, as indices within
    the chunk (Megatron-LM d98e8a6, megatron/core/recompute.py:157-183, which runs per TransformerBlock, i.e. per
    model chunk: ``num_layers_per_pipeline_rank`` is the block's own layer count): ``method=None`` (the kit's
    ``recompute="full"`` alone) every layer on its own; ``"uniform"`` consecutive groups of ``num_layers`` (the
    last one shorter), each recomputed as a whole with only its input kept (:160-166); ``"block"`` the first
    ``num_layers`` layers each on its own, the rest not checkpointed (:173-181; the FP8/FP4 skip of layers whose
    input needs no gradient, :175-176, does not arise in training: the embedding output needs one). The one home
    of which layers full recomputation recomputes: :func:`recomputed_stage_classes` (time),
    :func:`llmcomm.overhead.memory.memory_table` (memory), :func:`llmcomm.predict.program` (the calls)."""
    if method is None:
        return tuple((i,) for i in range(count))
    n = int(num_layers or 1)
    if method == "uniform":
        return tuple(tuple(range(i, min(i + n, count))) for i in range(0, count, n))
    if method == "block":
        return tuple((i,) for i in range(min(n, count)))
    raise ValueError(f"recompute_method={method!r} is not None, 'uniform' or 'block'")


def recomputed_share(count: int, method: str | None, num_layers: int | None) -> float:
    """The share of a chunk's ``count`` layers full recomputation recomputes (:func:`recompute_groups`): 1.0 for
    ``None`` and ``"uniform"``, ``min(N, count)/count`` for ``"block"``."""
    return 1.0 if method is None or count == 0 else sum(len(g) for g in recompute_groups(count, method,
                                                                                            num_layers)) / count


def model_recomputed_share(model: ModelSpec, parallel: Any) -> float:
    """The share of the model's layers full recomputation recomputes over every stage and chunk."""
    if parallel.recompute_method is None:
        return 1.0
    rec = sum(len(g) for r in range(parallel.pp) for c in range(parallel.vpp)
              for g in recompute_groups(len(chunk_layers(model.num_layers, parallel, r, c)),
                                        parallel.recompute_method, parallel.recompute_num_layers))
    return rec / model.num_layers


def recomputed_stage_classes(model: ModelSpec, pp: np.ndarray, vpp: np.ndarray, num_layers: np.ndarray,
                             uneven: dict[str, np.ndarray] | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{class: (dense layers, MoE layers)}`` that ``recompute_method="block"`` with ``num_layers`` recomputes
    on the stage of each class of :func:`stage_classes` (the same stages: first, the middle one with the most MoE
    layers, last): per model chunk the layers of :func:`recompute_groups`. Rows with ``num_layers < 1`` get 0."""
    n = len(pp)
    out = {c: (np.zeros(n, np.int64), np.zeros(n, np.int64)) for c in CLASSES}
    u = uneven or {}
    cols = [pp, vpp, np.asarray(num_layers, np.int64)] + [
        np.asarray(u.get(k, np.full(n, -1 if "num" in k else 0)), np.int64) for k in UNEVEN]
    inv, uniq = factorize(cols)
    pat = model.moe_layer_pattern()
    for j, (p_, v_, nl, f, la, e, lo) in enumerate(uniq):
        if nl < 1:
            continue
        sel = inv == j
        split = pipeline_split(model.num_layers, p_, v_, None if f < 0 else f, None if la < 0 else la, bool(e),
                               bool(lo))
        counts = _stage_counts(model, split)
        rec = [(sum(1 for s0, c in row for g in recompute_groups(c, "block", nl) for _ in g),
                sum(pat[s0 + i] for s0, c in row for g in recompute_groups(c, "block", nl) for i in g))
               for row in split]
        for cname, i in {"first": 0, "last": p_ - 1, "mid": _mid_stage(counts, p_)}.items():
            if i is None:
                continue
            out[cname][0][sel] = rec[i][0] - rec[i][1]
            out[cname][1][sel] = rec[i][1]
    return out


def holds_edges(cls: str, pp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether stage class ``cls`` holds the first virtual stage (embedding) and the last (output layer)."""
    n = len(pp)
    if cls == "first":
        return np.ones(n, bool), pp == 1
    if cls == "mid":
        return np.zeros(n, bool), np.zeros(n, bool)
    return pp == 1, np.ones(n, bool)


# -------------------------------------------------------------------------------------------- parameters
def _first_layer(model: ModelSpec, moe: bool) -> int | None:
    pat = model.moe_layer_pattern()
    return pat.index(moe) if moe in pat else None


def layer_split(model: ModelSpec, tp: np.ndarray, ep: np.ndarray, etp: np.ndarray, moe: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sharded, expert, replicated)`` of one dense (``moe=False``) or MoE layer per configuration:
    :meth:`ModelSpec.layer_parameter_split` evaluated once per distinct ``(tp, ep, etp)`` (zeros where the model
    has no layer of that kind)."""
    n = len(tp)
    out = np.zeros((3, n), np.int64)
    layer = _first_layer(model, moe)
    if layer is None:
        return out[0], out[1], out[2]
    inv, uniq = factorize([tp, ep, etp])
    vals = np.array([_split(model, layer, *u) for u in uniq], np.int64).T
    out = vals[:, inv]
    return out[0], out[1], out[2]


@lru_cache(maxsize=4096)
def _split(model: ModelSpec, layer: int, tp: int, ep: int, etp: int) -> tuple[int, int, int]:
    s = model.layer_parameter_split(layer, tp, ep, etp=etp)
    return s.sharded, s.expert, s.replicated


def embedding_shard(model: ModelSpec, tp: Any) -> Any:
    """One TP rank's share of the word embedding (and of an output layer): ``V'·h/tp`` with Megatron's padded
    vocabulary ``V'`` (:meth:`ModelSpec.padded_vocab_size`); ``tp`` a number or an array."""
    return model.padded_vocab_size(tp) * model.hidden_size // tp


def edge_parameters(model: ModelSpec, tp: Any, pp: Any, holds_first: Any, holds_last: Any) -> tuple[Any, Any]:
    """``(params, replicated)`` beside the layers on a stage: the word embedding ``V'·h/tp`` (plus ``P·h``
    learned positions) where it holds the first virtual stage; the final norm (replicated over TP) and, untied
    or tied with ``pp > 1`` (the last stage's copy), the output layer ``V'·h/tp`` where it holds the last.
    Arguments broadcast (numbers or arrays)."""
    h = model.hidden_size
    vh = embedding_shard(model, tp)
    pos = ((model.max_position_embeddings or model.seq_length) * h
           if model.position_embedding_type == "learned_absolute" else 0)
    norm = model.norm_parameters()
    out_layer = np.where(np.logical_or(not model.tied_embeddings, np.asarray(pp) > 1), vh, 0)
    params = np.asarray(holds_first) * (vh + pos) + np.asarray(holds_last) * (norm + out_layer)
    return params, np.asarray(holds_last) * norm


def stage_parameters(model: ModelSpec, tp: np.ndarray, ep: np.ndarray, etp: np.ndarray, pp: np.ndarray,
                     nd: np.ndarray, nm: np.ndarray, holds_first: np.ndarray, holds_last: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dense, expert, replicated)`` parameters of one TP rank of a stage of ``nd`` dense and ``nm`` MoE layers:
    the layers' splits plus :func:`edge_parameters`; equal to the predictor's
    :func:`llmcomm.predict.dp.stage_parameters` (tested)."""
    sh_d, _, rep_d = layer_split(model, tp, ep, etp, moe=False)
    sh_m, ex_m, rep_m = layer_split(model, tp, ep, etp, moe=True)
    edge, edge_repl = edge_parameters(model, tp, pp, holds_first, holds_last)
    dense = nd * (sh_d + rep_d) + nm * (sh_m + rep_m) + edge
    return dense, nm * ex_m, nd * rep_d + nm * rep_m + edge_repl


# --------------------------------------------------------------------------------------------- placement
PLACED_KINDS = ("tp", "dp", "pp", "ep", "edp", "tpep", "mp", "world", "emb", "tpeppp", "cp", "dpcp", "tpcp",
                "etp")  # etp: the expert-TP group (the TP group where etp = tp; llmcomm.overhead.moe_fold)


def class_stages(cls: str, pp: int) -> list[int]:
    """The pipeline stages a stage class stands for: ``first`` stage 0, ``last`` stage ``pp − 1``, ``mid`` every
    stage between them."""
    return [0] if cls == "first" else [pp - 1] if cls == "last" else list(range(1, pp - 1))


@lru_cache(maxsize=4096)
def _placement(parallel: ParallelConfig, gpus_per_node: int) -> dict[str, dict[str, tuple[int, int]]]:
    """:func:`ranks_per_node` of every class, exactly as a whole-world :class:`~llmcomm.layout.Layout` gives it, but
    computed on the reduced world of :func:`_reduced_placement_shape` when there is one (then only the group sizes
    come from ``parallel``), so its cost is bounded by a few nodes' worth of ranks rather than the world."""
    from .layout import Layout  # layout imports specs only; imported here to keep this module light

    small = _reduced_placement_shape(parallel, gpus_per_node)
    if small is None:
        return _placement_full(parallel, gpus_per_node)
    lay = Layout(parallel, gpus_per_node)
    p = parallel
    sizes = {"tp": p.tp, "dp": p.dp, "pp": p.pp, "ep": p.ep, "edp": lay.size("edp"), "tpep": p.expert_tp * p.ep,
             "mp": p.tp * p.pp, "world": p.world_size, "emb": 2 if p.pp > 1 else 1,
             "tpeppp": p.expert_tp * p.ep * p.pp, "cp": p.cp, "dpcp": p.cp * p.dp, "tpcp": p.tp * p.cp,
             "etp": p.expert_tp, "p2p": 2}
    return {cls: {kind: (sizes[kind], k) for kind, (_, k) in d.items()}
            for cls, d in _placement_full(small, gpus_per_node).items()}


@lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` in increasing order (trial division up to ``sqrt(n)``)."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def _inner_axes(axes: list[tuple[str, int]], block: int) -> tuple[tuple[str, int, int], ...] | None:
    """The part of a mixed-radix rank grid (``axes``: ``(name, size)`` fastest first, stride = product of the
    sizes before) below rank ``block``, as ``(name, size, stride)`` sub-axes, or ``None`` when ``block`` is not a
    boundary of the grid (not ``stride · u`` with ``u`` dividing the size of the axis it falls in)."""
    out: list[tuple[str, int, int]] = []
    stride = 1
    for name, n in axes:
        if n == 1:
            continue
        if block >= stride * n:
            out.append((name, n, stride))
            stride *= n
            continue
        if block % stride or n % (block // stride):
            return None
        if block // stride > 1:
            out.append((name, block // stride, stride))
        break
    return tuple(out)


def _placement_grids(parallel: ParallelConfig) -> list[list[tuple[str, int]]] | None:
    """The mixed-radix rank grids (``(name, size)`` fastest first) whose boxes are all of :data:`PLACED_KINDS`'
    groups in :class:`~llmcomm.layout.Layout`: the order's grid (``tp, cp, dp, pp``, and ``emb`` on the ``pp``
    axis), the expert grid (``etp, ep, edp, pp``: ``tpep``, ``tpeppp``, and ``etp, ep, edp`` when ``etp ≠ tp``) and,
    when ``etp = tp``, the order's grid with its (adjacent) data axes read as ``ep`` (fastest) × ``edp``; ``None``
    when the data axes ``cp`` and ``dp`` (both > 1, ``ep > 1``) are not adjacent (an EP group is then no box)."""
    from .layout import Layout

    lay = Layout(parallel)
    main = [(d, lay.size(d)) for d in lay.order]
    grids = [main, list(lay._expert_dims)]
    if parallel.expert_tp == parallel.tp and parallel.ep > 1:
        big = [(d, n) for d, n in main if n > 1]
        at = [i for i, (d, _) in enumerate(big) if d in ("cp", "dp")]
        if not at or at[-1] - at[0] != len(at) - 1:
            return None
        data = parallel.cp * parallel.dp
        grids.append(big[:at[0]] + [("ep", parallel.ep), ("edp", data // parallel.ep)] + big[at[-1] + 1:])
    return grids


def _reduced_placement_shape(parallel: ParallelConfig, gpus_per_node: int) -> ParallelConfig | None:
    """A small shape with the same ranks per node (and ``p2p``) as ``parallel`` for every kind and class, or
    ``None`` when there is none smaller than the world.

    Exact reduction: take a block of ``B`` ranks, ``B`` a multiple of ``gpus_per_node``, that is a boundary of every
    grid of :func:`_placement_grids` (each grid's axes below ``B`` are whole axes plus a fastest sub-axis of the
    axis ``B`` falls in) and that the order's ``pp`` axis does not straddle. Every rank is ``r = a + B·b`` with
    ``a < B``; every group is (a box of ``a``) × (a box of ``b``), and ``B·b`` moves ranks by whole nodes, so a
    group spans (nodes of its ``a`` part) × (its ``b`` box size) nodes and holds (its ``a`` size) × (that size)
    ranks: ranks per node, ``ceil(size / nodes)``, depends only on the grids' parts below ``B``. With ``pp``
    below ``B`` the stage classes are sets of ``a``; with ``pp`` above, a class meets every ``a`` and
    pipeline neighbours always sit on different nodes. So the shape keeping each order dimension's part below
    ``B`` (and ``min(pp, 2)`` stages when ``pp`` lies above) has the same ranks per node, checked by requiring its
    grids' parts below ``B`` to equal ``parallel``'s."""
    world = parallel.world_size
    grids = _placement_grids(parallel)
    if grids is None:
        return None
    main = grids[0]
    blocks: set[int] = set()
    stride = 1
    for _, n in main:
        blocks.update(stride * u for u in _divisors(n) if (stride * u) % gpus_per_node == 0)
        stride *= n
    for block in sorted(b for b in blocks if b < world):
        inner = [_inner_axes(g, block) for g in grids]
        if any(x is None for x in inner):
            continue
        keep = {d: n for d, n, _ in inner[0]}  # type: ignore[union-attr]
        pp_in = keep.get("pp", 1)
        if pp_in not in (1, parallel.pp):  # pp straddles the block
            continue
        pp = parallel.pp if pp_in > 1 else min(parallel.pp, 2)
        if block * (pp if pp_in == 1 else 1) >= world:
            continue
        tp, cp, dp = keep.get("tp", 1), keep.get("cp", 1), keep.get("dp", 1)
        own = parallel.expert_tp != parallel.tp  # expert layers on a grid of their own: the small shape too
        if own and parallel.expert_tp == tp:
            continue
        if (tp * cp * dp) % ((parallel.expert_tp if own else tp) * parallel.ep) or (cp * dp) % parallel.ep:
            continue
        small = ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, ep=parallel.ep, etp=parallel.expert_tp if own else None,
                               order=parallel.order, global_batch=dp)
        small_grids = _placement_grids(small)
        if small_grids is None or len(small_grids) != len(grids):
            continue
        if all(_inner_axes(g, block) == x for g, x in zip(small_grids, inner, strict=True)):
            return small
    return None


def _placement_full(parallel: ParallelConfig, gpus_per_node: int) -> dict[str, dict[str, tuple[int, int]]]:
    """:func:`_placement` from the whole-world :class:`~llmcomm.layout.Layout` (every group's node span)."""
    from .layout import Layout

    lay = Layout(parallel, gpus_per_node)
    stage = lay.coords["pp"].to_numpy()
    pp_groups = lay.groups("pp")  # (pp groups, stages): column r holds stage r's ranks
    spans: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
    for kind in PLACED_KINDS:  # every group's node span once per kind; the classes pick their groups' rows
        g, row_of_rank = lay.group_lookup(kind)
        nodes = np.sort(g // gpus_per_node, axis=1)
        spans[kind] = (1 + (np.diff(nodes, axis=1) != 0).sum(axis=1), row_of_rank, g.shape[1])
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for cls in CLASSES:
        stages = class_stages(cls, parallel.pp) or [0]
        ranks = np.flatnonzero(np.isin(stage, stages))
        d = {}
        for kind, (span, row_of_rank, size) in spans.items():
            d[kind] = (size, -(-size // int(span[row_of_rank[ranks]].max())))
        pairs = [(r, q) for r in stages for q in (r - 1, r + 1) if 0 <= q < parallel.pp]
        same = all((pp_groups[:, r] // gpus_per_node == pp_groups[:, q] // gpus_per_node).all() for r, q in pairs)
        d["p2p"] = (2, 2 if same else 1)
        out[cls] = d
    return out


def ranks_per_node(parallel: ParallelConfig, gpus_per_node: int, cls: str = "first") -> dict[str, tuple[int, int]]:
    """``{kind: (group size, ranks per node)}`` for :data:`PLACED_KINDS` of the groups that hold the ranks of stage
    class ``cls`` (:func:`class_stages`) under ``parallel.order`` on nodes of ``gpus_per_node`` consecutive ranks
    (:class:`~llmcomm.layout.Layout`). Ranks per node is ``ceil(size / nodes)`` with ``nodes`` the most nodes one
    such group spans (the convention of the bandwidth fits, :func:`llmcomm.overhead.bandwidth.regimes`). ``p2p``
    is a pipeline send's pair: 2 ranks, both on one node when every send and receive of the class's stages stays
    inside a node, else 1 per node."""
    return _placement(parallel, gpus_per_node)[cls]


@lru_cache(maxsize=4096)
def _shape_placement(tp: int, cp: int, dp: int, pp: int, ep: int, etp: int, order: str, gpus_per_node: int
                     ) -> dict[str, tuple[int, int]]:
    """``{"<kind>@<class>": (size, ranks per node)}`` of one shape."""
    from .specs import ParallelConfig

    shape = ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp, order=order, global_batch=dp)
    return {f"{kind}@{cls}": v for cls, d in _placement(shape, gpus_per_node).items() for kind, v in d.items()}


@lru_cache(maxsize=4096)
def _shape_placement_rows(tp: int, cp: int, dp: int, pp: int, ep: int, etp: int, order: str, gpus_per_node: int
                          ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """:func:`_shape_placement` as one-row read-only arrays (what :func:`placement` gives for one configuration)."""
    out = {}
    for key, (size, k) in _shape_placement(tp, cp, dp, pp, ep, etp, order, gpus_per_node).items():
        pair = np.array([[size], [k]], np.int64)
        pair.setflags(write=False)
        out[key] = (pair[0], pair[1])
    return out


def placement(t: Any, gpus_per_node: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """:func:`ranks_per_node` for every row of a :class:`~llmcomm.parallel_table.ParallelTable` and every stage class:
    ``{"<kind>@<class>": (sizes, ranks per node)}``, one layout per distinct shape (``tp, cp, dp, pp, ep, etp,
    order``)."""
    n = len(t)
    if n == 1:  # one configuration: no grouping; the shape's one-row arrays (read-only, shared)
        return dict(_shape_placement_rows(int(t.tp[0]), int(t.cp[0]), int(t.dp[0]), int(t.pp[0]), int(t.ep[0]),
                                          int(t.expert_tp[0]), str(t.order[0]), gpus_per_node))
    order_codes, order_names = pd.factorize(t.order)
    inv, uniq = factorize([t.tp, t.cp, t.dp, t.pp, t.ep, t.expert_tp, order_codes])
    per = [_shape_placement_vector(*u[:6], str(order_names[u[6]]), gpus_per_node) for u in uniq]
    if not per:
        return {}
    keys = per[0][0]
    vectors = [v if k == keys else _in_order(k, v, keys) for k, v in per]
    # (2·keys, shapes): row 2j the sizes of key j per shape, row 2j + 1 its ranks per node (rows contiguous)
    lut = np.array(vectors, np.int64).T.copy()
    return {key: (lut[2 * j].take(inv), lut[2 * j + 1].take(inv)) for j, key in enumerate(keys)}


def _in_order(keys: tuple[str, ...], vector: np.ndarray, order: tuple[str, ...]) -> np.ndarray:
    """A :func:`_shape_placement_vector` of ``keys`` with its pairs in the key order ``order``."""
    pairs = dict(zip(keys, vector.reshape(-1, 2).tolist(), strict=True))
    return np.array([pairs[key] for key in order], np.int64).reshape(-1)


@lru_cache(maxsize=4096)
def _shape_placement_vector(tp: int, cp: int, dp: int, pp: int, ep: int, etp: int, order: str, gpus_per_node: int
                            ) -> tuple[tuple[str, ...], np.ndarray]:
    """:func:`_shape_placement` as its keys and one read-only int64 vector ``(size, ranks per node)`` per key, side
    by side (what :func:`placement` stacks over a table's shapes)."""
    d = _shape_placement(tp, cp, dp, pp, ep, etp, order, gpus_per_node)
    v = np.array(list(d.values()), np.int64).reshape(-1)
    v.setflags(write=False)
    return tuple(d), v


def factorize(keys: list[np.ndarray]) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Rows grouped by the tuple of integer ``keys``: ``(code of each row, distinct tuples)``, by hashing
    (:func:`group_rows`), not by sorting."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, np.int64), []
    if n == 1 or all(k[0] == k[-1] and (k == k[0]).all() for k in keys):
        return np.zeros(n, np.int64), [tuple(int(k[0]) for k in keys)]
    codes, first = group_rows(keys)
    return codes, [tuple(int(k[i]) for k in keys) for i in first]


def first_rows(codes: np.ndarray) -> np.ndarray:
    """The first row of each group of ``codes`` numbered in order of first appearance (what
    :func:`pandas.factorize` returns): row ``i`` opens a group where its code is above every code before it."""
    if len(codes) == 0:
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.concatenate([[True], codes[1:] > np.maximum.accumulate(codes[:-1])]))


def group_rows(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped by the tuple of their values in the integer arrays ``keys`` (equal lengths): ``(code of each
    row, first row of each group)``, groups numbered in order of first appearance. One mixed-radix key (each
    array shifted to start at 0; recoded by :func:`pandas.factorize` before the product would overflow), hashed
    once: the same groups as ``numpy.unique`` of the tuples, without sorting."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    key = np.zeros(n, np.int64)
    span = 1  # the key's values are below span
    for k in keys:
        lo, hi = int(k.min()), int(k.max())
        if lo == hi:  # one value: adds nothing to the key
            continue
        radix = hi - lo + 1
        if span * radix >= 2**62:
            key = pd.factorize(key)[0].astype(np.int64)
            span = int(key.max()) + 1
            if span * radix >= 2**62:  # the array alone is too wide: its own codes
                kc, ku = pd.factorize(k)
                k, lo, radix = kc.astype(np.int64), 0, len(ku)
        key = key * radix + (k - lo)
        span *= radix
    codes = pd.factorize(key)[0].astype(np.int64)
    return codes, first_rows(codes)


# ------------------------------------------------------------------------------------------ activations
def recompute_flags(recompute: Any, recompute_modules: Any = None) -> dict[str, Any]:
    """``{module: where it is recomputed}`` for each of :data:`llmcomm.vocab.RECOMPUTE_MODULES`: where ``recompute``
    is ``"selective"`` and ``recompute_modules`` names it, ``None`` standing for Megatron-LM's default
    ``["core_attn"]`` (transformer_config.py:1940-1941) — the one home of "``recompute='selective'`` means
    ``core_attn``". Scalars (a ``ParallelConfig``'s fields: bools) or arrays (a table's columns, ``recompute_modules``
    an object array of ``None``/tuples: boolean arrays)."""
    sel = np.asarray(recompute) == "selective"
    if isinstance(recompute_modules, np.ndarray):
        vals = recompute_modules.tolist()
        uniq = list(dict.fromkeys(vals))
        if len(uniq) == 1:
            one = ("core_attn",) if uniq[0] is None else uniq[0]
            return {k: sel & (k in one) for k in RECOMPUTE_MODULES}
        code = {u: i for i, u in enumerate(uniq)}
        idx = np.array([code[v] for v in vals], np.int64)
        sets = [("core_attn",) if u is None else u for u in uniq]
        return {k: sel & np.array([k in u for u in sets], bool)[idx] for k in RECOMPUTE_MODULES}
    one = ("core_attn",) if recompute_modules is None else tuple(recompute_modules)
    return {k: sel & (k in one) for k in RECOMPUTE_MODULES}


def layer_activation_bytes(model: ModelSpec, moe_layer: bool, *, seq: Any, micro_batch: Any, tp: Any, sp: Any,
                           recompute: Any, act_bytes: Any, fused_attention: Any = False,
                           recompute_modules: Any = None, fp8: Any = False) -> np.ndarray:
    """Activation bytes one transformer layer keeps per micro-batch on one GPU (Korthikanti et al. 2023, Table 2,
    generalized; the formula is in :mod:`llmcomm.overhead.memory`'s docstring). ``seq`` is the sequence per CP
    rank; ``recompute`` holds ``"none"``/``"selective"``/``"full"``; ``fused_attention``: no ``5·a·s`` score
    tensors (a fused kernel keeps only its log-sum-exp, ``b·a·s`` fp32, negligible); ``fp8``: the linear layers'
    saved inputs that are kept (QKV and fc1 input ``h`` each, projection input ``a·d``, fc2 input ``x·f``) are the
    FP8 copies TransformerEngine quantized for the GEMM, 1 byte per element instead of ``act_bytes``; arguments
    broadcast.

    Selective recomputation keeps what its modules do not discard (:func:`recompute_flags`; Megatron-LM
    transformer_config.py:560 and the modules' checkpoints): ``core_attn`` the ``5·a·s`` scores; ``mlp`` (dense
    layers, transformer_layer.py:537-539, a normal checkpoint whose input is kept) the fc1 input ``2h`` and the MLP
    activations ``2·f_up + 2·f``; ``moe`` (moe_layer.py:247, the whole MoE forward) every expert's ``2·f_up + 2·f``;
    ``moe_act`` (experts.py:271, output-discarding) the routed experts' activation output ``top-k·2·f``;
    ``shared_experts`` (moe_layer.py:252) the shared experts' ``2·f_up + 2·f``; ``layernorm`` (transformer_layer.py:
    475-527) the pre-MLP norm output ``2h`` of an MoE layer — with Transformer Engine the dense layer's two norms are
    fused into ``linear_qkv``/``linear_fc1`` (``input_layernorm``/``pre_mlp_layernorm`` are ``IdentityOp``,
    gpt_layer_specs.py:318-336), so there it keeps everything. ``mla_up_proj`` is not modelled here."""
    recompute = np.asarray(recompute)
    rf = recompute_flags(recompute, recompute_modules)
    sp_div = np.where(np.asarray(sp, dtype=bool), tp, 1)
    tokens = seq * micro_batch
    scale = np.asarray(act_bytes) / 2
    h, a, g, d = model.hidden_size, model.num_attention_heads, model.query_groups, model.head_dim
    f = model.expert_ffn_hidden_size if moe_layer else model.ffn_hidden_size
    experts = (model.moe_router_topk + model.num_shared_experts) if moe_layer else 1
    f_up = 2 * f if model.gated_mlp else f
    replicated: Any = 4 * h + 2 * h + h + 2 * h + h
    sharded = 2 * a * d + 4 * g * d + 2 * a * d + experts * (2 * f_up + 2 * f) \
        + np.where(rf["core_attn"] | np.asarray(fused_attention, dtype=bool), 0, 5 * a * seq)
    if moe_layer:  # what the selective modules discard (docstring)
        topk, shared = model.moe_router_topk, model.num_shared_experts
        routed = np.where(rf["moe"], topk * (2 * f_up + 2 * f), np.where(rf["moe_act"], topk * 2 * f, 0))
        sharded = sharded - routed - np.where(rf["moe"] | rf["shared_experts"], shared * (2 * f_up + 2 * f), 0)
        replicated = replicated - np.where(rf["layernorm"], 2 * h, 0)
    else:
        sharded = sharded - np.where(rf["mlp"], 2 * f_up + 2 * f, 0)
        replicated = replicated - np.where(rf["mlp"], 2 * h, 0)
    kept = scale * tokens * (replicated / sp_div + sharded / tp)
    fp8 = np.asarray(fp8, dtype=bool)
    if np.count_nonzero(fp8):  # the kept linear inputs at 1 byte: 2 bytes-per-element units of `scale` become 1/2
        if moe_layer:  # fc1 input: the pre-MLP norm output; fc2 inputs: routed and shared experts' activations
            fc1_in = np.where(rf["layernorm"], 0, h)
            fc2_in = (np.where(rf["moe"] | rf["moe_act"], 0, model.moe_router_topk * f)
                      + np.where(rf["moe"] | rf["shared_experts"], model.num_shared_experts * f, 0))
        else:
            fc1_in, fc2_in = np.where(rf["mlp"], 0, h), np.where(rf["mlp"], 0, f)
        saved_inputs = tokens * ((h + fc1_in) / sp_div + (a * d + fc2_in) / tp)
        kept = kept - np.where(fp8, (scale - 0.5) * 2 * saved_inputs, 0.0)
    full = scale * tokens * 2 * h / sp_div
    return np.where(recompute == "full", full, kept)


# ------------------------------------------------------------------------------------- the description
@dataclass(frozen=True)
class Gemm:
    """``count`` matrix products of an ``m × k`` by a ``k × n`` matrix on one rank, forward pass."""

    name: str
    m: int
    n: int
    k: int
    dtype: str
    count: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class AttentionCore:
    """The attention core of one layer on one rank: ``batch`` sequences, ``heads`` query heads, ``q_len`` queries
    against ``kv_len`` keys of ``head_dim`` channels; ``causal`` for a decoder's mask."""

    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    causal: bool = True
    fused: bool = False  # one kernel (attention_backend flash/fused/auto): no score traffic

    @property
    def flops(self) -> int:
        """``Q·Kᵀ`` and ``scores·V``: over the full score matrix unfused (Megatron's convention), the causal half
        with a fused kernel (it skips the masked blocks)."""
        full = 4 * self.batch * self.heads * self.q_len * self.kv_len * self.head_dim
        return full // 2 if self.fused and self.causal else full

    def score_bytes(self, act_bytes: int = 2) -> int:
        """Unfused score traffic (:data:`SCORE_BYTES` per score element at 16 bits, module docstring; scaled to
        ``act_bytes`` elements; 2 as the utilization model counts); 0 fused."""
        return 0 if self.fused else SCORE_BYTES * self.batch * self.heads * self.q_len * self.kv_len * act_bytes // 2


@dataclass(frozen=True)
class LayerStep:
    """One transformer layer as one rank runs it, forward pass: compute, parameters, activations, calls."""

    layer: int
    moe: bool
    gemms: tuple[Gemm, ...]
    core: AttentionCore
    elementwise_bytes: int
    params: LayerParams
    activation_bytes: float
    forward_calls: tuple[Any, ...] = ()
    backward_calls: tuple[Any, ...] = ()

    @property
    def gemm_flops(self) -> int:
        return sum(g.flops for g in self.gemms)


@dataclass(frozen=True)
class ChunkStep:
    stage: int
    chunk: int
    virtual_stage: int
    layers: tuple[LayerStep, ...]
    holds_embedding: bool
    holds_output: bool
    edge_params: int
    edge_gemms: tuple[Gemm, ...] = ()


@dataclass(frozen=True)
class StageStep:
    stage: int
    chunks: tuple[ChunkStep, ...]

    @property
    def layers(self) -> tuple[LayerStep, ...]:
        return tuple(la for c in self.chunks for la in c.layers)


@dataclass(frozen=True)
class Step:
    """The whole step of one configuration: :class:`StageStep` per pipeline stage."""

    model: ModelSpec
    parallel: ParallelConfig
    stages: tuple[StageStep, ...] = field(default_factory=tuple)


def layer_gemms(model: ModelSpec, parallel: ParallelConfig, moe: bool) -> tuple[Gemm, ...]:
    """The forward GEMMs of one layer on one rank (module docstring's table)."""
    p = parallel
    T = p.micro_batch * p.sequence_length(model) // p.cp
    h, a, g, d, tp = model.hidden_size, model.num_attention_heads, model.query_groups, model.head_dim, p.tp
    km, dt = (3 if model.gated_mlp else 2), p.act_dtype
    out = [Gemm("qkv", T, (a * d + 2 * g * d) // tp, h, dt), Gemm("proj", T, h, a * d // tp, dt)]
    if not moe:
        f = model.ffn_hidden_size
        return (*out, Gemm("fc1", T, (km - 1) * f // tp, h, dt), Gemm("fc2", T, h, f // tp, dt))
    E, fe, etp = model.num_experts, model.expert_ffn_hidden_size, p.expert_tp
    rows = T * model.moe_router_topk * p.ep * etp // (tp * E)  # llmcomm.overhead.moe_fold.expert_rows
    out += [Gemm("router", T, E, h, dt), Gemm("expert_fc1", rows, (km - 1) * fe // etp, h, dt, E // p.ep),
            Gemm("expert_fc2", rows, h, fe // etp, dt, E // p.ep)]
    if model.num_shared_experts:
        sf = model.num_shared_experts * fe
        out += [Gemm("shared_fc1", T, (km - 1) * sf // tp, h, dt), Gemm("shared_fc2", T, h, sf // tp, dt)]
    return tuple(out)


def describe(model: ModelSpec, parallel: ParallelConfig, *, calls: bool = True) -> Step:
    """The :class:`Step` of one configuration (validated first); ``calls``: attach each layer's calls of
    micro-batch 0 from the predictor's stage program (:func:`llmcomm.predict.program.layer_forward`,
    ``layer_backward``), the one home of what is sent."""
    from .specs import validate

    validate(model, parallel)
    p = parallel
    s, tp = p.sequence_length(model), p.tp
    T = p.micro_batch * s // p.cp
    h = model.hidden_size
    fw = tp if p.sp else 1
    core = AttentionCore(p.micro_batch, model.num_attention_heads // tp, s // p.cp, s, model.head_dim, True,
                         p.attention_backend in FUSED_ATTENTION_BACKENDS)
    pattern = model.moe_layer_pattern()
    ffn_fwd = ffn_activation_bytes(model.activation_kind)[0]
    ctx = None
    if calls:
        from .predict import program
        from .predict.calls import Context

        ctx = Context(model, p)
    stages = []
    for r in range(p.pp):
        chunks = []
        for c in range(p.vpp):
            vs = c * p.pp + r
            first, last = vs == 0, vs == p.pp * p.vpp - 1
            layers = []
            cl = chunk_layers(model.num_layers, p, r, c)
            groups = recompute_groups(len(cl), p.recompute_method, p.recompute_num_layers)
            keeps_input = {g[0] for g in groups}  # full recomputation: a group keeps only its input
            for i, la in enumerate(cl):
                moe = pattern[la]
                in_group = any(i in g for g in groups)
                rec = "none" if p.recompute == "full" and not in_group else p.recompute
                f_eff = ((model.moe_router_topk + model.num_shared_experts) * model.expert_ffn_hidden_size if moe
                         else model.ffn_hidden_size)
                act: Any = layer_activation_bytes(model, moe, seq=s / p.cp, micro_batch=p.micro_batch, tp=tp, sp=p.sp,
                                             recompute=rec, act_bytes=dtype_bytes(p.act_dtype),
                                             fused_attention=core.fused, recompute_modules=p.recompute_modules,
                                             fp8=p.fp8 is not None)
                if rec == "full" and in_group and i not in keeps_input:
                    act = 0.0  # inside a uniform group: only the group's first layer keeps its input
                layers.append(LayerStep(
                    la, moe, layer_gemms(model, p, moe), core,
                    int(ACTIVATION_BYTES * T * h // fw + ffn_fwd * T * f_eff // tp),
                    model.layer_parameter_split(la, tp, p.ep, etp=p.expert_tp), float(act),
                    tuple(program.layer_forward(ctx, la, 0)) if ctx else (),
                    tuple(program.layer_backward(ctx, la, 0)) if ctx else ()))
            edge, _ = edge_parameters(model, tp, p.pp, first, last)
            out_gemm = (Gemm("output", T, model.padded_vocab_size(tp) // tp, h, p.act_dtype),) if last else ()
            chunks.append(ChunkStep(r, c, vs, tuple(layers), first, last, int(edge), out_gemm))
        stages.append(StageStep(r, tuple(chunks)))
    return Step(model, p, tuple(stages))
