"""Model, parallelism and cluster specifications, their catalogues and their validation.

Field names follow Megatron-LM's command-line arguments (``--num-layers`` -> ``num_layers``) so that a
Megatron launch script translates into a :class:`ModelSpec` and a :class:`ParallelConfig` line by line.

Parameter count of a transformer with ``L`` layers, hidden size ``h``, ``a`` heads of ``d`` channels,
``g`` key/value groups, FFN size ``f`` and vocabulary ``V`` (Megatron-LM's layout)::

    attention  = h·a·d (Q) + 2·h·g·d (K, V) + a·d·h (out)            [+ a·d + 2·g·d + h biases]
    mlp        = k·h·f with k = 3 for a gated (SwiGLU) MLP, else 2      [+ (k-1)·f + h biases]
    moe layer  = E·k·h·f_e (experts) + h·E (router) + k·h·(S·f_e) (S shared experts)
    norms      = 2 per layer, 1 final; LayerNorm has 2·h parameters, RMSNorm h
    embedding  = V·h (+ P·h learned positions);   output layer V·h unless tied

For GPT-3 this reduces to Megatron's ``12·L·h²·(1 + 13/(12h) + (V+s)/(12·L·h))``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from . import rules
from .errors import ConfigError
from .paths import data_dir
from .stage_split import pipeline_split
from .vocab import (
    ACTIVATIONS,
    ATTENTION_BACKENDS,
    FP8_BUF_LAYERS,
    MOE_FLEX_BACKENDS,
    MOE_TOKEN_DISPATCHERS,
    NORMALIZATIONS,
    PIPELINE_SCHEDULES,
    POSITION_EMBEDDINGS,
    RECOMPUTE_MODES,
    ActivationName,
    DispatcherName,
    DtypeName,
    NormalizationName,
    PositionEmbeddingName,
    RecomputeName,
    ScheduleName,
    dtype_bytes,
    parse_order,
)

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
RERUN_MODES = ("disabled", "validate_results", "report_stats")  # megatron/training/config/resilience_config.py
LOAD_BALANCING_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")  # TopKRouter (sinkhorn not modelled)


def _literal_str(hint: Any) -> bool:
    """A ``Literal`` of strings (a closed set of :mod:`llmcomm.vocab`): read as ``str`` here, its values are
    checked by the spec's own validation, which names them."""
    return typing.get_origin(hint) is typing.Literal and all(isinstance(a, str) for a in typing.get_args(hint))


def _expected(hint: Any) -> str:
    """How a field's annotation reads in an error message."""
    if _literal_str(hint):
        hint = str
    if hint is bool:
        return "true or false (a YAML boolean, unquoted)"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if hint is type(None):
        return "null"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_expected(a) for a in args)
    if origin is tuple:
        return f"a list of {_expected(args[0]).replace('an ', '').replace('a ', '')}s"
    return str(hint)


def _type_ok(v: Any, hint: Any) -> bool:
    """Whether ``v`` (as YAML or JSON loaded it) has the annotated type: booleans only ``true``/``false`` (not
    the string ``"false"``, not 0/1), integers not booleans nor floats (2048.0 is refused), numbers finite."""
    if _literal_str(hint):
        hint = str
    if hint is bool:
        return isinstance(v, bool)
    if hint is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if hint is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if hint is str:
        return isinstance(v, str)
    if hint is type(None):
        return v is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_type_ok(v, a) for a in args)
    if origin is tuple:
        return isinstance(v, (list, tuple)) and all(_type_ok(x, args[0]) for x in v)
    return True


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_field_types(cls: type, d: Mapping[str, Any], origin: str, what: str) -> None:
    """Every value of ``d`` has the type its field of ``cls`` is annotated with (:func:`_type_ok`); the first
    that has not is a :class:`ConfigError` naming ``origin``, the field, the value and the type expected."""
    hints = _field_types(cls)
    label = f"{what} {d['name']}" if isinstance(d.get("name"), str) else what
    for name, v in d.items():
        hint = hints.get(name)
        if hint is not None and not _type_ok(v, hint):
            got = "a string" if isinstance(v, str) else type(v).__name__
            raise ConfigError(f"{origin}: {label}: {name}={v!r} must be {_expected(hint)}, got {got}")


def _from_fields(cls: type, d: Mapping[str, Any], origin: str, what: str) -> Any:
    """``cls(**d)`` for a frozen spec dataclass; unknown or missing fields, a value of the wrong type
    (:func:`check_field_types`) and failed validation become a :class:`ConfigError` that names ``origin`` and
    the field."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"{origin}: unknown {what} field(s) {unknown}; known fields: {sorted(known)}")
    missing = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and f.name not in d]
    if missing:
        raise ConfigError(f"{origin}: missing required {what} field(s) {missing}")
    check_field_types(cls, d, origin, what)
    try:
        return cls(**dict(d))
    except (ConfigError, TypeError) as e:  # TypeError: e.g. a list where a number belongs
        raise ConfigError(f"{origin}: {e}") from None


@functools.lru_cache(maxsize=1024)
def _moe_layer_pattern(is_moe: bool, freq: int | tuple[int, ...], num_layers: int) -> tuple[bool, ...]:
    if not is_moe:
        return (False,) * num_layers
    if isinstance(freq, tuple):
        return tuple(bool(x) for x in freq)
    return tuple(i % freq == 0 for i in range(num_layers))


# --------------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class LayerParams:
    """One layer's parameters on one TP (and EP) rank, by how they are reduced (see
    :meth:`ModelSpec.layer_parameter_split`)."""

    sharded: int  # split across TP, reduced over the data-parallel group
    expert: int  # routed-expert weights, reduced over the expert-data-parallel group
    replicated: int  # identical on every TP rank (norms, SP biases, router): also all-reduced over TP with SP

    @property
    def dense(self) -> int:
        """Everything reduced over the data-parallel group: ``sharded + replicated``."""
        return self.sharded + self.replicated

    @property
    def total(self) -> int:
        return self.sharded + self.expert + self.replicated


@dataclass(frozen=True)
class TokenFlops:
    """Forward FLOPs per token by term (see :meth:`ModelSpec.forward_flops`)."""

    linear: float  # weight matmuls of every transformer layer
    attention: float  # Q·Kᵀ and scores·V
    logits: float  # output layer

    @property
    def total(self) -> float:
        return self.linear + self.attention + self.logits


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, dense or mixture-of-experts, in Megatron-LM's argument names."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    vocab_size: int
    num_query_groups: int | None = None  # KV heads (GQA); None -> num_attention_heads
    kv_channels: int | None = None  # head dimension; None -> hidden_size // num_attention_heads
    gated_mlp: bool = False  # SwiGLU: three FFN matrices instead of two
    # the FFN activation kernel (llmcomm.vocab.Activation); None: "swiglu" if gated_mlp else "gelu" (activation_kind)
    activation: ActivationName | None = None
    tied_embeddings: bool = True  # output layer shares the input embedding
    add_bias_linear: bool = False  # biases on the linear layers (GPT-2/3 style)
    add_qkv_bias: bool = False  # biases only on Q, K, V (Qwen2 style)
    normalization: NormalizationName = "LayerNorm"
    position_embedding_type: PositionEmbeddingName = "rope"  # "learned_absolute" adds max_position_embeddings·h parameters
    max_position_embeddings: int | None = None
    num_experts: int = 0  # 0 for a dense model
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int | None = None  # per expert; None -> ffn_hidden_size
    num_shared_experts: int = 0  # shared expert FFN size = num_shared_experts · moe_ffn_hidden_size
    moe_layer_freq: int | tuple[int, ...] = 1  # int k: every k-th layer is MoE; tuple: 0/1 per layer
    moe_shared_expert_gate: bool = False  # Qwen2-MoE: a sigmoid gate (1 x h, replicated) on the shared experts
    qk_layernorm: bool = False  # Qwen3 / OLMo: RMSNorm of each head's q and k (2·d parameters per layer)
    # multi-head latent attention (DeepSeek-V2/V3; Megatron-LM MLASelfAttention, --multi-latent-attention)
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None  # None: q projected directly (linear_q_proj), else down/up through this rank
    kv_lora_rank: int = 512
    qk_head_dim: int = 128  # per-head q/k channels without rotary part (--qk-head-dim)
    qk_pos_emb_head_dim: int = 64  # per-head rotary channels, shared across heads in k (--qk-pos-emb-head-dim)
    v_head_dim: int = 128
    mtp_num_layers: int = 0  # multi-token prediction layers (DeepSeek-V3: 1), each after the decoder
    window_size: int | None = None  # sliding-window attention: tokens to the left (GPT-OSS: 128)
    window_attn_skip_freq: int | None = None  # every k-th layer full attention (GPT-OSS: 2, alternating)
    softmax_type: str = "vanilla"  # "learnable": one sink logit per head (GPT-OSS attention sinks)
    # Megatron-LM's activation_func_clamp_value: the gated activation's inputs clamped (GPT-OSS: 7.0), run as
    # eager kernels around the fused activation (llmcomm.overhead.eager_ops)
    activation_func_clamp_value: float | None = None
    hybrid_override_pattern: str | None = None  # Mamba hybrid layer pattern (refused by the predictor)
    seq_length: int = 2048  # default training sequence length
    source: str = ""
    published_parameters: float | None = None
    published_active_parameters: float | None = None
    # nemo (issue 20): True where the only published figure is the model's name ("8B"), not a parameter count
    published_is_nominal: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.moe_layer_freq, list):
            object.__setattr__(self, "moe_layer_freq", tuple(self.moe_layer_freq))
        self.validate()

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def expert_ffn_hidden_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def shared_expert_ffn_hidden_size(self) -> int:
        """FFN size of the shared expert(s): ``num_shared_experts · moe_ffn_hidden_size`` (Megatron-LM's
        ``--moe-shared-expert-intermediate-size``)."""
        return self.num_shared_experts * self.expert_ffn_hidden_size

    @property
    def q_head_dim(self) -> int:
        """Query/key channels per head: ``head_dim``, or ``qk_head_dim + qk_pos_emb_head_dim`` with MLA."""
        return self.qk_head_dim + self.qk_pos_emb_head_dim if self.multi_latent_attention else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.multi_latent_attention else self.head_dim

    @property
    def kv_heads(self) -> int:
        """Heads of the K and V tensors core attention sees: the query groups, or every head with MLA
        (``linear_kv_up_proj`` gives each head its own k and v; the rotary part of k is expanded to all heads,
        ``MLASelfAttention.get_query_key_value_tensors``, core/transformer/multi_latent_attention.py)."""
        return self.num_attention_heads if self.multi_latent_attention else self.query_groups

    def attention_tensors(self, tp: int = 1) -> list[int]:
        """Element counts of one layer's attention (and input-norm) tensors on one TP rank, in module order.

        Standard (``SelfAttention`` with TE's fused ``linear_qkv``): ``linear_proj`` ``a·d·h/tp`` [bias ``h``],
        ``linear_qkv`` norm ``h`` [+ ``h``], weight ``(a·d + 2·g·d)·h/tp`` [bias ``(a·d + 2·g·d)/tp``], then
        ``q_layernorm``, ``k_layernorm`` ``d`` each with ``qk_layernorm``, and ``a/tp`` sink logits with
        ``softmax_type="learnable"``.

        MLA (``MLASelfAttention``, core/transformer/multi_latent_attention.py ~505-630; the unfused TE spec of
        core/models/gpt/gpt_layer_specs.py ~244-320): input norm ``h`` [+ ``h``], ``linear_proj`` ``a·d_v·h/tp``,
        ``linear_q_down_proj`` ``h·q_lora`` (TELinear ``duplicated``: whole on every TP rank), ``linear_q_up_proj``
        norm ``q_lora`` and weight ``q_lora·a·(d_qk + d_rope)/tp`` (or ``linear_q_proj`` ``h·a·(d_qk + d_rope)/tp``
        without ``q_lora_rank``), ``linear_kv_down_proj`` ``h·(kv_lora + d_rope)`` (duplicated),
        ``linear_kv_up_proj`` norm ``kv_lora`` and weight ``kv_lora·a·(d_qk + d_v)/tp``."""
        h, a = self.hidden_size, self.num_attention_heads
        norm = [h] * (2 if self.normalization == "LayerNorm" else 1)
        bias = self.add_bias_linear
        if self.multi_latent_attention:
            dq, dv, dr = self.qk_head_dim, self.v_head_dim, self.qk_pos_emb_head_dim
            out = norm + [a * dv * h // tp] + ([h] if bias else [])
            if self.q_lora_rank is None:
                out.append(h * a * (dq + dr) // tp)
            else:
                out += [h * self.q_lora_rank, self.q_lora_rank, self.q_lora_rank * a * (dq + dr) // tp]
            out += [h * (self.kv_lora_rank + dr), self.kv_lora_rank, self.kv_lora_rank * a * (dq + dv) // tp]
            return out
        g, d = self.query_groups, self.head_dim
        out = [a * d * h // tp] + ([h] if bias else []) + norm + [(a * d + 2 * g * d) * h // tp]
        if bias or self.add_qkv_bias:
            out.append((a * d + 2 * g * d) // tp)
        if self.qk_layernorm:
            out += [d, d]
        if self.softmax_type == "learnable":
            out.append(a // tp)
        return out

    def attention_parameter_split(self, tp: int = 1) -> tuple[int, int]:
        """``(sharded, replicated)`` of :meth:`attention_tensors` without the input norm: what TP splits, and
        what every TP rank holds whole — the attention-output bias, ``q/k_layernorm``, and with MLA the
        duplicated down projections and their norms (``TELinear(parallel_mode="duplicated")`` marks its weight
        ``sequence_parallel``, core/extensions/transformer_engine.py ~1310-1318, so with SP it joins the
        layer norms' TP all-reduce)."""
        h, a = self.hidden_size, self.num_attention_heads
        if self.multi_latent_attention:
            dq, dv, dr = self.qk_head_dim, self.v_head_dim, self.qk_pos_emb_head_dim
            sharded = a * dv * h // tp + self.kv_lora_rank * a * (dq + dv) // tp
            repl = h * (self.kv_lora_rank + dr) + self.kv_lora_rank + (h if self.add_bias_linear else 0)
            if self.q_lora_rank is None:
                sharded += h * a * (dq + dr) // tp
            else:
                sharded += self.q_lora_rank * a * (dq + dr) // tp
                repl += h * self.q_lora_rank + self.q_lora_rank
            return sharded, repl
        g, d = self.query_groups, self.head_dim
        sharded = (h * a * d + 2 * h * g * d + a * d * h) // tp
        if self.add_bias_linear or self.add_qkv_bias:
            sharded += (a * d + 2 * g * d) // tp
        if self.softmax_type == "learnable":
            sharded += a // tp
        repl = (h if self.add_bias_linear else 0) + (2 * d if self.qk_layernorm else 0)
        return sharded, repl

    def moe_layer_pattern(self) -> tuple[bool, ...]:
        """Which layers are MoE layers (``True``), in order (cached: the memory model and the tuner ask once per
        layer and candidate)."""
        return _moe_layer_pattern(self.is_moe, self.moe_layer_freq, self.num_layers)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_pattern())

    def padded_vocab_size(self, tp: Any = 1, divisible_by: int = 128) -> Any:
        """Megatron pads the vocabulary to a multiple of ``divisible_by · tp`` (``--make-vocab-size-divisible-by``,
        ``megatron/training/tokenizer/tokenizer.py`` ``_vocab_size_with_padding``); ``tp`` a number or an array."""
        m = divisible_by * tp
        padded = -(-self.vocab_size // m) * m
        return int(padded) if np.ndim(padded) == 0 else padded

    def attention_projection_parameters(self) -> int:
        """Weights of one layer's attention projections: ``h·a·d (Q) + 2·h·g·d (K, V) + a·d·h (out)``."""
        h, a, g, d = self.hidden_size, self.num_attention_heads, self.query_groups, self.head_dim
        return h * a * d + 2 * h * g * d + a * d * h

    @property
    def activation_kind(self) -> ActivationName:
        """The FFN activation kernel: ``activation`` where set, else ``"swiglu"`` for a gated MLP and ``"gelu"``
        otherwise (so a model file without the field means what it meant before the field existed)."""
        if self.activation is not None:
            return self.activation
        return "swiglu" if self.gated_mlp else "gelu"

    # -- parameter counts ------------------------------------------------------------------------
    def _mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    def layer_parameter_split(self, layer: int, tp: int = 1, ep: int = 1, *, active: bool = False,
                              etp: int | None = None) -> LayerParams:
        """The parameters of transformer layer ``layer`` (0-based) that one TP rank of one EP rank holds,
        split by how data parallelism reduces them (Megatron-LM's layout; ``k`` = 3 gated, else 2)::

            sharded    = (h·a·d + 2·h·g·d + a·d·h)/tp  [+ (a·d + 2·g·d)/tp Q/K/V biases] [+ a/tp sinks]
                         (MLA: :meth:`attention_parameter_split`)
                         + k·h·f/tp [+ (k-1)·f/tp biases]          (dense MLP layer)
                         + k·h·(S·f_e)/tp                           (MoE layer: shared experts)
            expert     = (E/ep)·k·h·f_e/etp [+ (E/ep)·((k-1)·f_e/etp + h) biases]
                         (routed experts; with ``active``: top-k experts, no ep split)
            replicated = 2 norms [+ h attention-output bias + h MLP-output bias] [+ h·E router]
                         [+ h shared-expert gate] [+ 2·d q/k norms] [MLA: the down projections and their norms]

        ``sharded`` is reduced over the DP group, ``expert`` over the expert-data-parallel group, and
        ``replicated`` (identical on every TP rank) also by sequence parallelism's TP all-reduce. Each term is
        floor-divided separately, as the predictor's byte counts require. With ``tp = ep = 1`` the three add up
        to :meth:`layer_parameters`. ``etp`` is the expert tensor-parallel size (Megatron-LM's
        ``--expert-tensor-parallel-size``; ``None``: ``tp``, Megatron's default): routed experts are split over
        ``etp`` ranks, not ``tp`` (``megatron/core/transformer/moe/experts.py``, ``TEGroupedMLP`` built on
        the expert tensor-parallel group); shared experts stay on the TP group.
        """
        h = self.hidden_size
        k = self._mlp_matrices()
        etp = tp if etp is None else etp
        sharded, replicated = self.attention_parameter_split(tp)
        replicated += 2 * self.norm_parameters()
        expert = 0
        if self.moe_layer_pattern()[layer]:
            fe = self.expert_ffn_hidden_size
            replicated += h * self.num_experts + (h if self.moe_shared_expert_gate and self.num_shared_experts else 0)
            routed = self.moe_router_topk if active else self.num_experts // ep
            expert = routed * k * h * fe // etp
            if self.add_bias_linear:  # expert fc1/fc2 biases (GPT-OSS), split like their weights
                expert += routed * ((k - 1) * fe // etp + h)
            sharded += k * h * self.shared_expert_ffn_hidden_size // tp
        else:
            sharded += k * h * self.ffn_hidden_size // tp
            if self.add_bias_linear:
                sharded += (k - 1) * self.ffn_hidden_size // tp
                replicated += h
        return LayerParams(sharded=sharded, expert=expert, replicated=replicated)

    def norm_parameters(self) -> int:
        return (2 if self.normalization == "LayerNorm" else 1) * self.hidden_size

    def embedding_parameters(self) -> int:
        p = self.vocab_size * self.hidden_size
        if self.position_embedding_type == "learned_absolute":
            p += (self.max_position_embeddings or self.seq_length) * self.hidden_size
        return p

    def output_parameters(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    def layer_parameters(self, layer: int, active: bool = False) -> int:
        """Parameters of transformer layer ``layer`` (0-based): :meth:`layer_parameter_split` summed."""
        return self.layer_parameter_split(layer, active=active).total

    def num_parameters(self) -> int:
        """Total parameter count (every expert counted)."""
        return self._count(active=False)

    def num_active_parameters(self) -> int:
        """Parameters touched per token: only ``moe_router_topk`` experts of each MoE layer (multi-token
        prediction layers left out, as published activated counts do)."""
        return self._count(active=True)

    def _count(self, active: bool) -> int:
        """Embedding + output layer + final norm + Σ layers (one dense and one MoE layer size, each times
        its count) + the multi-token-prediction layers (:meth:`mtp_parameters`)."""
        pattern = self.moe_layer_pattern()
        layers = sum(
            pattern.count(is_moe) * self.layer_parameters(pattern.index(is_moe), active)
            for is_moe in (False, True) if is_moe in pattern
        )
        # the MTP layers count in the total (the job holds and trains them) but not in the activated count:
        # published activated counts are the main model's (DeepSeek-V3's 37B excludes its 14B MTP module)
        return (self.embedding_parameters() + self.output_parameters() + self.norm_parameters() + layers
                + (0 if active else self.mtp_parameters()))

    def mtp_parameters(self, active: bool = False) -> int:
        """Parameters of the ``mtp_num_layers`` multi-token-prediction layers: each ``enorm``, ``hnorm`` and
        ``final_layernorm`` (3 norms), ``eh_proj`` (``2h → h``, no bias) and one transformer layer built like the
        decoder's last (``MultiTokenPredictionLayer``, core/transformer/multi_token_prediction.py ~1157-1250);
        the embedding and output layer are the main model's (shared)."""
        if not self.mtp_num_layers:
            return 0
        h = self.hidden_size
        one = 3 * self.norm_parameters() + 2 * h * h + self.layer_parameters(self.num_layers - 1, active)
        return self.mtp_num_layers * one

    # -- FLOPs ---------------------------------------------------------------------------------------
    def forward_flops(self, seq_length: int | None = None, vocab_size: int | None = None) -> TokenFlops:
        """Forward FLOPs per token, split into named terms (a multiply-add is 2 FLOPs; Megatron-LM's
        convention of ``num_floating_point_operations`` in ``megatron/training/training.py``)::

            linear    = Σ_layers 2·[(h·a·d + 2·h·g·d + a·d·h)                         attention projections
                                    + k·h·f              (dense layer)
                                    + topk·k·h·f_e + k·h·S·f_e + h·E (MoE layer: experts, shared, router)]
            attention = L · 2·a·(d_qk + d_v)·s   (Q·Kᵀ and scores·V over the full sequence, causal mask not
                                                 halved, sliding windows not shortened; d_qk = d_v = d without MLA)
            logits    = 2·h·V               (output layer; V the padded vocabulary if given)

        Embedding lookups, norms, biases, softmax and the loss are not matrix work and are left out (as in
        Megatron-LM). For GPT-3-style models (f = 4h, no GQA) ``total = 24·L·h²·(1 + s/(6h) + V/(12·L·h))``.
        """
        s = self.seq_length if seq_length is None else seq_length
        V = self.vocab_size if vocab_size is None else vocab_size
        h, a = self.hidden_size, self.num_attention_heads
        k = self._mlp_matrices()
        n_moe = self.num_moe_layers
        n_dense = self.num_layers - n_moe
        proj = self.attention_parameter_split(1)[0] - (a if self.softmax_type == "learnable" else 0)
        if self.multi_latent_attention:  # the duplicated down projections are matrix work too
            proj += h * (self.kv_lora_rank + self.qk_pos_emb_head_dim) + h * (self.q_lora_rank or 0)
        if self.add_bias_linear or self.add_qkv_bias:
            proj -= (a * self.head_dim + 2 * self.query_groups * self.head_dim) if not self.multi_latent_attention else 0
        dense_mlp = k * h * self.ffn_hidden_size
        fe = self.expert_ffn_hidden_size
        moe_mlp = (self.moe_router_topk + self.num_shared_experts) * k * h * fe + h * self.num_experts
        linear = 2.0 * (self.num_layers * proj + n_dense * dense_mlp + n_moe * moe_mlp)
        attention = self.num_layers * 2.0 * a * (self.q_head_dim + self.value_head_dim) * s
        return TokenFlops(linear=linear, attention=attention, logits=2.0 * h * V)

    def flops_per_token(self, seq_length: int | None = None, vocab_size: int | None = None) -> float:
        """Forward FLOPs per token, attention included: :meth:`forward_flops` ``.total``.

        A training iteration of ``B`` sequences costs ``B·s·(3 + r)·(linear + attention) + 3·B·s·logits``
        with ``r = 1`` under full recomputation (the output layer is not recomputed), which for GPT-3-style
        models is Megatron-LM's ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))``.
        """
        return self.forward_flops(seq_length, vocab_size).total

    # -- validation --------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first broken rule."""
        for f in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size",
                  "seq_length"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"model {self.name}: {f}={v!r} must be a positive integer")
        for f in ("num_query_groups", "kv_channels", "max_position_embeddings", "moe_ffn_hidden_size"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ConfigError(f"model {self.name}: {f}={v!r} must be a positive integer or unset")
        for f in ("num_experts", "moe_router_topk", "num_shared_experts"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"model {self.name}: {f}={v!r} must be an integer >= 0")
        for f in ("published_parameters", "published_active_parameters"):
            v = getattr(self, f)
            if v is not None and not v > 0:
                raise ConfigError(f"model {self.name}: {f}={v!r} must be > 0 or unset")
        if isinstance(self.moe_layer_freq, tuple) and set(self.moe_layer_freq) - {0, 1}:
            raise ConfigError(f"model {self.name}: moe_layer_freq as a list holds 0 (dense) or 1 (MoE) per layer, "
                              f"got {sorted(set(self.moe_layer_freq) - {0, 1})}")
        mpe = self.max_position_embeddings
        if self.position_embedding_type == "learned_absolute" and mpe is not None and self.seq_length > mpe:
            raise ConfigError(f"model {self.name}: seq_length={self.seq_length} exceeds max_position_embeddings="
                              f"{mpe}: learned absolute positions have no embedding beyond it")
        if self.num_attention_heads % self.query_groups:
            raise ConfigError(
                f"model {self.name}: num_query_groups={self.query_groups} does not divide "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"model {self.name}: num_attention_heads={self.num_attention_heads} does not divide "
                f"hidden_size={self.hidden_size} (set kv_channels)"
            )
        if self.normalization not in NORMALIZATIONS:
            raise ConfigError(f"model {self.name}: normalization={self.normalization!r} is not LayerNorm or RMSNorm")
        if self.position_embedding_type not in POSITION_EMBEDDINGS:
            raise ConfigError(
                f"model {self.name}: position_embedding_type={self.position_embedding_type!r} is not "
                "rope, learned_absolute, none or yarn"
            )
        if self.num_experts < 0:
            raise ConfigError(f"model {self.name}: num_experts={self.num_experts} must be >= 0")
        if self.is_moe:
            if not 1 <= self.moe_router_topk <= self.num_experts:
                raise ConfigError(
                    f"model {self.name}: moe_router_topk={self.moe_router_topk} must be in "
                    f"[1, num_experts={self.num_experts}]"
                )
            if isinstance(self.moe_layer_freq, tuple):
                if len(self.moe_layer_freq) != self.num_layers:
                    raise ConfigError(
                        f"model {self.name}: moe_layer_freq has {len(self.moe_layer_freq)} entries but "
                        f"num_layers={self.num_layers}"
                    )
            elif self.moe_layer_freq < 1:
                raise ConfigError(f"model {self.name}: moe_layer_freq={self.moe_layer_freq} must be >= 1")
        elif self.moe_router_topk or self.num_shared_experts:
            raise ConfigError(f"model {self.name}: moe_router_topk/num_shared_experts need num_experts > 0")
        self._validate_attention_variants()

    def _validate_attention_variants(self) -> None:
        """Rules of the fields for MLA, sliding windows, sinks, MTP and the shared-expert gate."""
        pos = ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
        for f in pos + ("q_lora_rank", "window_size", "window_attn_skip_freq"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError(f"model {self.name}: {f}={v!r} must be a positive integer")
        if not isinstance(self.mtp_num_layers, int) or self.mtp_num_layers < 0:
            raise ConfigError(f"model {self.name}: mtp_num_layers={self.mtp_num_layers!r} must be an integer >= 0")
        if self.softmax_type not in ("vanilla", "learnable"):
            raise ConfigError(f"model {self.name}: softmax_type={self.softmax_type!r} is not 'vanilla' or "
                              "'learnable' (Megatron-LM's --softmax-type; 'off-by-one' is not modelled)")
        if self.moe_shared_expert_gate and not self.num_shared_experts:
            raise ConfigError(f"model {self.name}: moe_shared_expert_gate needs num_shared_experts > 0")
        if self.window_attn_skip_freq is not None and self.window_size is None:
            raise ConfigError(f"model {self.name}: window_attn_skip_freq needs window_size")
        if self.activation is not None:
            if self.activation not in ACTIVATIONS:
                raise ConfigError(f"model {self.name}: activation={self.activation!r} is not one of "
                                  f"{list(ACTIVATIONS)}")
            if (self.activation == "swiglu") != self.gated_mlp:
                raise ConfigError(f"model {self.name}: activation={self.activation!r} with gated_mlp="
                                  f"{self.gated_mlp}: 'swiglu' is the gated MLP's activation and only its")
        clamp = self.activation_func_clamp_value
        if clamp is not None:
            if isinstance(clamp, bool) or not isinstance(clamp, (int, float)) or not clamp > 0:
                raise ConfigError(f"model {self.name}: activation_func_clamp_value={clamp!r} must be a positive "
                                  "number or unset")
            if not self.gated_mlp:
                raise ConfigError(f"model {self.name}: activation_func_clamp_value needs gated_mlp (Megatron-LM "
                                  "clamps the two halves of a gated linear unit's input)")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if isinstance(d["moe_layer_freq"], tuple):
            d["moe_layer_freq"] = list(d["moe_layer_freq"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], origin: str = "<dict>") -> ModelSpec:
        return _from_fields(cls, d, origin, "model")


def model_catalogue_dir() -> Path:
    return data_dir() / "models"


def read_yaml(path: Path) -> Any:
    """A YAML file's content; a file that is not valid YAML (or not UTF-8 text) is a :class:`ConfigError`
    naming the file and the line."""
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}{where}: not valid YAML: {what}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None


def list_models() -> list[str]:
    """Names of the models in the catalogue, sorted."""
    return sorted(p.stem for p in model_catalogue_dir().glob("*.yaml"))


def load_model(name_or_path: str | os.PathLike[str]) -> ModelSpec:
    """A :class:`ModelSpec` from the catalogue (``"gpt3-175b"``) or from a YAML file path."""
    p = Path(name_or_path)
    if not p.is_file():
        p = model_catalogue_dir() / f"{name_or_path}.yaml"
        if not p.is_file():
            raise ConfigError(
                f"model {str(name_or_path)!r} is neither a file nor in the catalogue; known: {', '.join(list_models())}"
            )
    d = read_yaml(p)
    if not isinstance(d, dict):
        raise ConfigError(f"{p}: a model file must hold a mapping of ModelSpec fields")
    return ModelSpec.from_dict(d, origin=str(p))


# ------------------------------------------------------------------------------------------ parallel
@dataclass(frozen=True)
class ParallelConfig:
    """How one training job is split over GPUs (Megatron-LM's argument names).

    ``world = tp · cp · dp · pp``; expert parallelism ``ep`` subdivides the ``cp · dp`` ranks of the expert
    layers (Megatron's expert layout), so it does not multiply the world size.
    ``num_microbatches = global_batch / (micro_batch · dp)``.

    Expert layers have their own grid (Megatron-LM ``parallel_state.initialize_model_parallel``'s
    ``expert_decoder_rank_generator``): ``world = etp · ep · edp · pp`` with ``etp``
    (``--expert-tensor-parallel-size``, default ``tp``), so the rule is ``world % (etp·ep·pp) == 0``
    (``megatron/core/parallel_state.py``: "world_size must be divisible by expert_tensor_parallel_size *
    expert_model_parallel_size * pipeline_model_parallel_size").

    ``moe_token_dispatcher_type``: Megatron-LM's CLI default is ``allgather``; the field defaults to
    ``alltoall``, the dispatcher of the published MoE recipes (Mixtral, DeepSeek) and of the predictions made
    before the field existed. ``overlap_grad_reduce`` splits the DP gradient sync into buckets of
    ``bucket_size`` elements (``None``: ``max(40M, 1M·dp·cp)``, ``resolve_ddp_bucket_size`` in
    megatron/training/training.py), on the first pipeline stage's first model chunk only
    (:func:`llmcomm.predict.dp.chunk_bucket_size`).
    ``microbatch_group_size_per_vp_stage`` (``None``: ``pp``) groups micro-batches of the interleaved schedule.
    ``create_attention_mask_in_dataloader`` (Megatron's default ``True``) adds the ``(b, 1, s, s)`` boolean
    mask to the batch broadcast over TP.
    ``pipe_partitioned`` describes Megatron-DeepSpeed, whose GPT model runs on DeepSpeed's PipelineEngine: the
    activation and its gradient cross a stage boundary split over the TP group (``tokens/tp · h`` per rank) and
    are rebuilt by TP all-gathers (``deepspeed/runtime/pipe/engine.py``, ``pipe_partitioned`` and
    ``grad_partitioned``, on by default); Megatron-LM sends the whole tensor. It needs ``sp=False`` (with SP the
    tensor is already split; the combination is not modelled).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    cp: int = 1
    sp: bool = False
    vpp: int = 1  # virtual pipeline stages (model chunks) per rank; >1 means interleaved 1F1B
    micro_batch: int = 1
    global_batch: int | None = None  # None -> micro_batch · dp (one micro-batch per rank)
    seq_len: int | None = None  # None -> the model's seq_length
    act_dtype: DtypeName = "bf16"
    grad_reduce_dtype: DtypeName = "fp32"
    param_dtype: DtypeName = "bf16"
    distributed_optimizer: bool = False
    fsdp: bool = False
    recompute: RecomputeName = "none"
    schedule: ScheduleName = "1f1b"
    order: str = DEFAULT_ORDER
    moe_token_dispatcher_type: DispatcherName = "alltoall"
    etp: int | None = None  # expert tensor-parallel size; None -> tp (Megatron's default)
    overlap_grad_reduce: bool = False
    bucket_size: int | None = None  # DDP bucket, elements; None -> max(40M, 1M·dp·cp) with overlap_grad_reduce
    microbatch_group_size_per_vp_stage: int | None = None  # None -> pp
    create_attention_mask_in_dataloader: bool = True
    moe_aux_loss_coeff: float = 0.0  # Megatron's default; > 0 adds the router's token-count all-reduce
    pipe_partitioned: bool = False  # DeepSpeed's PipelineEngine (Megatron-DeepSpeed); Megatron-LM: False
    # Megatron-LM options of today's recipes (issue 24); defaults are Megatron-LM's
    rerun_mode: str = "validate_results"  # --rerun-mode; validate_results/report_stats: a world all-reduce per step
    ddp_num_buckets: int | None = None  # --ddp-num-buckets: bucket size = parameters // this (overlap_grad_reduce)
    num_distributed_optimizer_instances: int = 1  # --num-distributed-optimizer-instances (partial DistOpt)
    moe_router_dtype: str | None = None  # --moe-router-dtype: None (activation dtype) or fp32 / fp64
    moe_router_load_balancing_type: str | tuple[str, ...] = "aux_loss"  # aux_loss, seq_aux_loss, global_aux_loss, none (or a list)
    moe_router_enable_expert_bias: bool = False  # DeepSeek-V3's aux-loss-free balancing (expert bias update)
    cross_entropy_loss_fusion: bool = False  # --cross-entropy-loss-fusion: two all-reduces instead of three
    calculate_per_token_loss: bool = False  # --calculate-per-token-loss: num_tokens broadcast + all-reduce
    # uneven pipelines (--decoder-first/last-pipeline-num-layers, --account-for-embedding/loss-in-pipeline-split)
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    attention_backend: str = "auto"  # Megatron-LM's --attention-backend (llmcomm.vocab.AttentionBackend)
    # overlap and precision of today's recipes (issue 20), Megatron-LM's names; in time only
    # (llmcomm.overhead.iteration: the equations and their sources)
    overlap_param_gather: bool = False  # --overlap-param-gather: DistOpt all-gathers hidden behind the next forward
    tp_comm_overlap: bool = False  # --tp-comm-overlap: TransformerEngine userbuffers, SP AG/RS under the GEMMs
    fp8: str | None = None  # --fp8-format: None (BF16 GEMMs), "hybrid" or "e4m3" (TransformerEngine FP8 GEMMs)
    fp8_recipe: str = "delayed"  # --fp8-recipe (transformer_config.py:594): delayed, tensorwise, mxfp8, blockwise, custom
    fp8_param_gather: bool = False  # --fp8-param-gather: FP8 weights, the DistOpt all-gather moves them in FP8
    # FP8 on the wire (acc-fp8wire; llmcomm.predict.fp8_wire): the userbuffers layers whose tp_comm_overlap_cfg sets
    # fp8_buf (Megatron-Bridge/NeMo ub config): "proj_fprop" / "fc2_fprop" reduce-scatter their FP8 GEMM output
    tp_comm_overlap_fp8_buf: tuple[str, ...] = ()
    # FSDP and selective recomputation (issue 20, deliverable 6; llmcomm.overhead.fsdp_time, rules.py)
    fsdp_reshard_after_forward: bool = True  # torch FSDP2's reshard_after_forward (--torch-fsdp2-no-reshard-after-forward)
    recompute_modules: tuple[str, ...] | None = None  # --recompute-modules with recompute="selective" (None: core_attn)
    # pipeline and MoE communication overlap (issue 20, the overlap stream; in time only: the equations and their
    # Megatron-LM sources are in llmcomm.overhead.overlap)
    overlap_p2p_comm: bool = False  # --overlap-p2p-communication: interleaved schedule's async send/recv (else no-op)
    moe_a2a_overlap: bool = False  # NVIDIA's recipes' name for Megatron-LM's overlap_moe_expert_parallel_comm
    moe_flex_dispatcher_backend: str | None = None  # --moe-flex-dispatcher-backend (deepep, hybridep, ncclep): flex
    align_grad_reduce: bool = True  # Megatron-LM's default (--no-align-grad-reduce): stages launch chunk reductions together
    # context parallelism (issue 20): Megatron-LM's --cp-comm-type, one type for every layer (llmcomm.predict.cp)
    cp_comm_type: str = "p2p"  # p2p, all_gather, a2a (a2a+p2p is refused: rule "cp-hierarchical")
    # which layers full recomputation checkpoints (Megatron-LM's --recompute-method / --recompute-num-layers,
    # megatron/core/recompute.py:157-183 at d98e8a6; llmcomm.step.recomputed_layers): None with recompute="full"
    # is every layer on its own (uniform of 1, the kit's "full" before these fields); "uniform": every layer, in
    # checkpointed groups of recompute_num_layers (only each group's input kept); "block": only the first
    # recompute_num_layers layers of each model chunk, the rest keep all their activations
    recompute_method: str | None = None
    recompute_num_layers: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.moe_router_load_balancing_type, list):
            object.__setattr__(self, "moe_router_load_balancing_type", tuple(self.moe_router_load_balancing_type))
        fb = self.tp_comm_overlap_fp8_buf  # a table row without it (None, NaN) has none
        if not isinstance(fb, tuple):
            if isinstance(fb, (str, list)):
                fb = (fb,) if isinstance(fb, str) else tuple(fb)
            elif fb is None or (isinstance(fb, float) and math.isnan(fb)):
                fb = ()
            else:
                raise ConfigError(f"tp_comm_overlap_fp8_buf={fb!r} must be a list of userbuffers layer names "
                                  f"from {FP8_BUF_LAYERS}")
            object.__setattr__(self, "tp_comm_overlap_fp8_buf", fb)
        if isinstance(self.recompute_modules, (list, str)):
            mods = [self.recompute_modules] if isinstance(self.recompute_modules, str) else self.recompute_modules
            object.__setattr__(self, "recompute_modules", tuple(mods))
        if self.global_batch is None:
            object.__setattr__(self, "global_batch", self.micro_batch * self.dp)
        if self.vpp > 1 and self.schedule == "1f1b":
            object.__setattr__(self, "schedule", "interleaved")
        self.validate()

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def num_microbatches(self) -> int:
        assert self.global_batch is not None  # __post_init__ sets it
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel size: ``etp``, or ``tp`` when unset (Megatron's default)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the expert weights: ``world / (etp·ep·pp)`` (``cp·dp/ep`` when ``etp = tp``)."""
        return self.world_size // (self.expert_tp * self.ep * self.pp)

    @property
    def vp_group_size(self) -> int:
        """``microbatch_group_size_per_vp_stage``, or ``pp`` when unset (Megatron's default)."""
        return self.pp if self.microbatch_group_size_per_vp_stage is None else self.microbatch_group_size_per_vp_stage

    def sequence_length(self, model: ModelSpec | None = None) -> int:
        if self.seq_len is not None:
            return self.seq_len
        if model is None:
            raise ConfigError("seq_len is unset and no model was given to take seq_length from")
        return model.seq_length

    def validate(self) -> None:
        for f in ("tp", "pp", "dp", "ep", "cp", "vpp", "micro_batch", "global_batch"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{f}={v!r} must be a positive integer")
        for f in ("etp", "bucket_size", "microbatch_group_size_per_vp_stage", "num_layers_in_first_pipeline_stage",
                  "num_layers_in_last_pipeline_stage", "recompute_num_layers"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError(f"{f}={v!r} must be a positive integer or None")
        if not isinstance(self.moe_aux_loss_coeff, (int, float)) or self.moe_aux_loss_coeff < 0:
            raise ConfigError(f"moe_aux_loss_coeff={self.moe_aux_loss_coeff!r} must be a number >= 0")
        if self.moe_token_dispatcher_type not in MOE_TOKEN_DISPATCHERS:
            raise ConfigError(f"moe_token_dispatcher_type={self.moe_token_dispatcher_type!r} is not one of "
                              f"{MOE_TOKEN_DISPATCHERS} (Megatron-LM's --moe-token-dispatcher-type)")
        if self.seq_len is not None and (not isinstance(self.seq_len, int) or self.seq_len < 1):
            raise ConfigError(f"seq_len={self.seq_len!r} must be a positive integer")
        for f in ("act_dtype", "grad_reduce_dtype", "param_dtype"):
            dtype_bytes(getattr(self, f))
        bad = [x for x in self.tp_comm_overlap_fp8_buf if x not in FP8_BUF_LAYERS]
        if bad:
            raise ConfigError(f"tp_comm_overlap_fp8_buf={tuple(self.tp_comm_overlap_fp8_buf)!r}: {bad} not in "
                              f"{FP8_BUF_LAYERS} (TE's initialize_ub makes the all-gather buffers FP8 regardless "
                              "and the wgrad buffers never)")
        if self.recompute not in RECOMPUTE_MODES:
            raise ConfigError(f"recompute={self.recompute!r} is not one of {RECOMPUTE_MODES}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"attention_backend={self.attention_backend!r} is not one of {ATTENTION_BACKENDS} "
                              "(Megatron-LM's --attention-backend)")
        if self.schedule not in PIPELINE_SCHEDULES:
            raise ConfigError(f"schedule={self.schedule!r} is not one of {PIPELINE_SCHEDULES}")
        rules.check(None, self, ("config",))  # the cross-field rules, each with its Megatron-LM source
        self._check_recipe_options()
        self._check_overlap_options()
        parse_order(self.order)

    def _check_recipe_options(self) -> None:
        """The rules of the options of issue 24, one small check each (to move with the other rules)."""
        if self.rerun_mode not in RERUN_MODES:
            raise ConfigError(f"rerun_mode={self.rerun_mode!r} is not one of {RERUN_MODES} (Megatron-LM's "
                              "--rerun-mode, megatron/training/config/resilience_config.py)")
        n = self.num_distributed_optimizer_instances
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"num_distributed_optimizer_instances={n!r} must be a positive integer")
        if n > 1 and not self.distributed_optimizer:
            raise ConfigError("num_distributed_optimizer_instances > 1 needs distributed_optimizer=True (Megatron-LM "
                              "DistributedDataParallel: 'Partial DistOpt cannot be used without DistOpt')")
        if n > 1 and (self.dp * self.cp) % n:
            raise ConfigError(f"num_distributed_optimizer_instances={n} does not divide dp*cp={self.dp * self.cp}")
        if self.ddp_num_buckets is not None and (not isinstance(self.ddp_num_buckets, int)
                                                 or isinstance(self.ddp_num_buckets, bool) or self.ddp_num_buckets < 1):
            raise ConfigError(f"ddp_num_buckets={self.ddp_num_buckets!r} must be a positive integer or None")
        if self.ddp_num_buckets is not None and self.bucket_size is not None:
            raise ConfigError("set ddp_num_buckets or bucket_size, not both (Megatron-LM's --ddp-num-buckets and "
                              "--ddp-bucket-size are exclusive)")
        if self.moe_router_dtype not in (None, "fp32", "fp64"):
            raise ConfigError(f"moe_router_dtype={self.moe_router_dtype!r} is not None, 'fp32' or 'fp64' "
                              "(Megatron-LM's --moe-router-dtype)")
        for kind in self.load_balancing_types:
            if kind not in LOAD_BALANCING_TYPES:
                raise ConfigError(f"moe_router_load_balancing_type {kind!r} is not one of {LOAD_BALANCING_TYPES}")

    def _check_overlap_options(self) -> None:
        """The value set of ``moe_flex_dispatcher_backend`` (Megatron-LM's ``Literal['deepep', 'hybridep',
        'ncclep']``, megatron/core/transformer/transformer_config.py:898); ``None``: not set (no flex dispatcher)."""
        b = self.moe_flex_dispatcher_backend
        if b is not None and b not in MOE_FLEX_BACKENDS:
            raise ConfigError(f"moe_flex_dispatcher_backend={b!r} is not None or one of {MOE_FLEX_BACKENDS} "
                              "(Megatron-LM's --moe-flex-dispatcher-backend)")

    @property
    def load_balancing_types(self) -> tuple[str, ...]:
        """``moe_router_load_balancing_type`` as a tuple (Megatron-LM accepts a list of types)."""
        v = self.moe_router_load_balancing_type
        return tuple(v) if isinstance(v, (list, tuple)) else (v,)

    @property
    def uneven_pipeline(self) -> bool:
        """Whether the layers are split over the pipeline unevenly (see :meth:`virtual_stage_layers`)."""
        return (self.num_layers_in_first_pipeline_stage is not None or self.num_layers_in_last_pipeline_stage
                is not None or self.account_for_embedding_in_pipeline_split or self.account_for_loss_in_pipeline_split)

    def virtual_stage_layers(self, num_layers: int) -> list[int]:
        """Transformer layers of each virtual stage ``vs = chunk·pp + stage`` as Megatron-LM assigns them
        (:func:`llmcomm.stage_split.pipeline_split`, the one home of the split), after the split's rules
        (:mod:`llmcomm.rules`, scope ``job``: Megatron's divisibility asserts). Raises :class:`ConfigError`
        naming the broken rule."""
        rules.check_split(num_layers, self)
        split = pipeline_split(num_layers, self.pp, self.vpp, self.num_layers_in_first_pipeline_stage,
                                    self.num_layers_in_last_pipeline_stage,
                                    self.account_for_embedding_in_pipeline_split,
                                    self.account_for_loss_in_pipeline_split)
        return [split[vs % self.pp][vs // self.pp][1] for vs in range(self.pp * self.vpp)]

    def to_dict(self) -> dict[str, Any]:
        """The fields in their JSON form (tuples as lists, as a trace's metadata stores and reads them back;
        :meth:`from_dict` takes either)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], origin: str = "<dict>") -> ParallelConfig:
        return _from_fields(cls, d, origin, "parallel")


# ------------------------------------------------------------------------------------------- cluster
@dataclass(frozen=True)
class Cluster:
    """GPUs, nodes and links. Bandwidths are per GPU, one direction, in bytes/s; FLOP/s are dense (no
    sparsity). The optional figures (``None``: not stated for this cluster) are datasheet values: the FP8
    Tensor Core peak, the HBM bandwidth, the SM count; ``nic`` names the network adapter and ``fabric`` the
    inter-node fabric (e.g. ``hdr200-ib``), by which :mod:`llmcomm.overhead.bandwidth` says what measured data,
    if any, its inter-node efficiency comes from."""

    name: str
    gpus_per_node: int
    gpu: str
    peak_bf16_flops: float  # dense, no sparsity
    gpu_memory_bytes: float
    intra_node_bandwidth: float  # NVLink, per GPU per direction
    inter_node_bandwidth: float  # NIC per GPU per direction
    num_nodes: int | None = None  # None: as many as a configuration needs
    source: str = ""
    notes: str = ""
    peak_fp8_flops: float | None = None  # dense FP8 Tensor Core peak; None: no FP8 (A100) or not stated
    hbm_bandwidth: float | None = None  # GPU memory bandwidth, bytes/s
    sm_count: int | None = None
    nic: str = ""
    fabric: str = ""

    def __post_init__(self) -> None:
        for f in ("gpus_per_node", "peak_bf16_flops", "gpu_memory_bytes", "intra_node_bandwidth",
                  "inter_node_bandwidth"):
            if getattr(self, f) <= 0:
                raise ConfigError(f"cluster {self.name}: {f}={getattr(self, f)!r} must be > 0")
        for f in ("peak_fp8_flops", "hbm_bandwidth", "sm_count"):
            v = getattr(self, f)
            if v is not None and not v > 0:
                raise ConfigError(f"cluster {self.name}: {f}={v!r} must be > 0 (or absent)")
        if self.num_nodes is not None and self.num_nodes < 1:
            raise ConfigError(f"cluster {self.name}: num_nodes={self.num_nodes} must be >= 1")

    @property
    def num_gpus(self) -> int | None:
        return None if self.num_nodes is None else self.num_nodes * self.gpus_per_node

    def with_nodes(self, num_nodes: int) -> Cluster:
        return dataclasses.replace(self, num_nodes=num_nodes)

    def for_world(self, world_size: int) -> Cluster:
        """This cluster sized to hold ``world_size`` GPUs (whole nodes)."""
        return self.with_nodes(max(1, math.ceil(world_size / self.gpus_per_node)))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _yaml_number(v: Any) -> Any:
    """A number written as ``1e9`` (PyYAML, following YAML 1.1, reads it as a string without a dot) as a
    float, and an integer as a float (as the fields are floats); anything else unchanged (``None`` too), for
    the type check to judge."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def list_clusters() -> list[str]:
    return sorted(p.stem for p in (data_dir() / "clusters").glob("*.yaml"))


def load_cluster(name_or_path: str | os.PathLike[str], num_nodes: int | None = None) -> Cluster:
    """A :class:`Cluster` from ``data/clusters`` or a YAML path; optionally with ``num_nodes`` set."""
    p = Path(name_or_path)
    if not p.is_file():
        p = data_dir() / "clusters" / f"{name_or_path}.yaml"
        if not p.is_file():
            raise ConfigError(f"cluster {str(name_or_path)!r} not found; known: {', '.join(list_clusters())}")
    d = read_yaml(p)
    if not isinstance(d, dict):
        raise ConfigError(f"{p}: a cluster file must hold a mapping of Cluster fields")
    d = {k: (_yaml_number(v) if k.endswith(("bandwidth", "flops", "bytes")) else v) for k, v in d.items()}
    c = _from_fields(Cluster, d, str(p), "cluster")
    return c if num_nodes is None else c.with_nodes(num_nodes)


# ------------------------------------------------------------------------------------ cross-checking
def validate(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster | None = None) -> None:
    """Check that ``parallel`` can run ``model`` (on ``cluster``); raise :class:`ConfigError` naming the rule
    (the ``job`` rules of :mod:`llmcomm.rules`, each with its Megatron-LM source)."""
    rules.check(model, parallel, ("job",))
    if cluster is not None and cluster.num_gpus is not None and cluster.num_gpus != parallel.world_size:
        raise ConfigError(
            f"tp*pp*dp*cp={parallel.world_size} but the cluster {cluster.name} has {cluster.num_gpus} GPUs"
        )


@dataclass(frozen=True)
class TrainingJob:
    """A model, a parallel configuration and (optionally) a cluster, validated together."""

    model: ModelSpec
    parallel: ParallelConfig
    cluster: Cluster | None = field(default=None)

    def __post_init__(self) -> None:
        validate(self.model, self.parallel, self.cluster)
