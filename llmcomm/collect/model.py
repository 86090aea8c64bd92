"""A small decoder-only GPT and its mixture-of-experts variant, as plain PyTorch modules.

Nothing here knows about parallelism (torchtitan style): ``parallelize.py`` shards these modules with
torch's own APIs. Layers live in a ``ModuleDict`` keyed by their global index so that a pipeline stage can
delete the layers it does not own and keep the others' ids.

Per layer: pre-norm attention with rotary positions (no parameters) and a pre-norm MLP (dense: GELU MLP
``h -> f -> h``; MoE: :class:`llmcomm.collect.moe.MoE`). Parameters, matching
:meth:`llmcomm.specs.ModelSpec.num_parameters` for ``normalization=LayerNorm``, no linear biases,
``position_embedding_type=rope``, untied output layer::

    V·h (embedding) + L·(4h² + 2·2h) + Σ_dense 2hf + Σ_moe (E·2·h·f_e + h·E) + 2h (final norm) + V·h (output)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from ..specs import ModelSpec
from .checks import check_workload
from .moe import MoE


@dataclass(frozen=True)
class ModelArgs:
    """The hyper-parameters the torch model needs, taken from a :class:`ModelSpec`."""

    dim: int
    n_layers: int
    n_heads: int
    vocab_size: int
    ffn_dim: int
    max_seq_len: int
    num_experts: int = 0
    topk: int = 0
    moe_ffn_dim: int = 0
    moe_layers: tuple[bool, ...] = ()
    aux_loss_coef: float = 0.01

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> ModelArgs:
        check_workload(spec)
        return cls(dim=spec.hidden_size, n_layers=spec.num_layers, n_heads=spec.num_attention_heads,
                   vocab_size=spec.vocab_size, ffn_dim=spec.ffn_hidden_size, max_seq_len=spec.seq_length,
                   num_experts=spec.num_experts, topk=spec.moe_router_topk,
                   moe_ffn_dim=spec.expert_ffn_hidden_size if spec.is_moe else 0,
                   moe_layers=spec.moe_layer_pattern())


def rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, seq, heads, head_dim): pairs (x1, x2) rotate by
    ``θ_i·pos`` with ``θ_i = base^(-2i/d)``."""
    s, d = x.shape[1], x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(s, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.head_dim = a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.dim, bias=False)
        self.wk = nn.Linear(a.dim, a.dim, bias=False)
        self.wv = nn.Linear(a.dim, a.dim, bias=False)
        self.wo = nn.Linear(a.dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1: the local number of heads (all of them, or heads/tp under tensor parallelism)
        q = rotary(self.wq(x).view(b, s, -1, self.head_dim))
        k = rotary(self.wk(x).view(b, s, -1, self.head_dim))
        v = self.wv(x).view(b, s, -1, self.head_dim)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, a: ModelArgs) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = nn.LayerNorm(a.dim)
        self.attention = Attention(a)
        self.ffn_norm = nn.LayerNorm(a.dim)
        self.moe = bool(a.moe_layers and a.moe_layers[layer_id])
        self.feed_forward: nn.Module = (
            MoE(layer_id, a.dim, a.moe_ffn_dim, a.num_experts, a.topk, a.aux_loss_coef) if self.moe
            else FeedForward(a.dim, a.ffn_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class GPT(nn.Module):
    """Decoder-only transformer; ``forward(tokens) -> logits``. On a pipeline stage the modules it does not
    own are ``None`` and ``forward`` takes/returns activations instead."""

    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.args = a
        self.tok_embeddings: nn.Module | None = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, a) for i in range(a.n_layers)})
        self.norm: nn.Module | None = nn.LayerNorm(a.dim)
        self.output: nn.Module | None = nn.Linear(a.dim, a.vocab_size, bias=False)
        self.apply(_init)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def _init(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all positions."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def build_model(spec: ModelSpec, seed: int = 0, aux_loss_coef: float = 0.01) -> GPT:
    """The full model, initialized from ``seed`` (identical on every rank); MoE layers weight their
    load-balancing loss by ``aux_loss_coef`` (0 turns balancing off)."""
    torch.manual_seed(seed)
    return GPT(replace(ModelArgs.from_spec(spec), aux_loss_coef=aux_loss_coef))
