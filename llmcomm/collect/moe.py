"""Mixture-of-experts layer: top-k router with an auxiliary load-balancing loss, expert MLPs, and an
expert-parallel token dispatcher built on ``all_to_all_single``.

Routing of ``T`` tokens over ``E`` experts, top ``k``::

    p = softmax(x·W_r)                     (T × E)
    (w, e) = topk(p, k), w renormalized    tokens go to experts e with weights w
    aux = E · Σ_e f_e · P_e                f_e = share of the T·k assignments that went to e,
                                           P_e = mean router probability of e (Switch / GShard)

Expert parallelism over ``ep`` ranks: rank j holds experts ``j·E/ep .. (j+1)·E/ep - 1``. Per MoE layer and
micro-batch, forward:

1. ``all_to_all`` of the per-expert token counts (``E`` int64, ``8E`` bytes) so each rank knows what it
   receives;
2. dispatch ``all_to_all`` of the token copies sorted by expert: to rank j goes
   ``Σ_{e on j} count_e · h · 4`` bytes (fp32);
3. combine ``all_to_all`` of the expert outputs back, the transpose of (2).

Backward runs the gradients of (3) and (2): (3)'s gradient has the splits of (2) and vice versa. The aux loss
joins the backward through :class:`AuxLossScaler` so it works inside a pipeline stage as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class AuxLossScaler(torch.autograd.Function):
    """Identity on ``x`` whose backward also sends gradient ``coef`` into ``aux`` (Megatron's
    MoEAuxLossAutoScaler): ``loss_total = loss + coef·aux`` without returning ``aux``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, aux: torch.Tensor, coef: float) -> torch.Tensor:
        ctx.save_for_backward(aux)
        ctx.coef = coef
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.coef), None


class Experts(nn.Module):
    """The expert MLPs held by this rank: ``w1`` (E_local × h × f_e), ``w2`` (E_local × f_e × h)."""

    def __init__(self, num_experts: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(num_experts, dim, hidden) * 0.02)
        self.w2 = nn.Parameter(torch.randn(num_experts, hidden, dim) * 0.02)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Apply local expert i to the ``counts[i]`` consecutive rows that belong to it."""
        outs = [F.gelu(part @ self.w1[i]) @ self.w2[i] for i, part in enumerate(torch.split(x, counts))]
        return torch.cat(outs) if outs else x

    def keep(self, first: int, n: int) -> None:
        """Keep only experts ``first .. first+n-1`` (expert parallelism)."""
        self.w1 = nn.Parameter(self.w1.detach()[first:first + n].clone())
        self.w2 = nn.Parameter(self.w2.detach()[first:first + n].clone())


class MoE(nn.Module):
    """Top-k MoE MLP over ``num_experts`` experts, of which this rank holds ``num_local_experts``."""

    def __init__(self, layer_id: int, dim: int, hidden: int, num_experts: int, topk: int,
                 aux_loss_coef: float = 0.01) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_experts = num_experts
        self.topk = topk
        self.aux_loss_coef = aux_loss_coef
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = Experts(num_experts, dim, hidden)
        self.ep_group: Any = None  # set by parallelize.apply_ep
        self.ep_size = 1
        self.ep_rank = 0
        self.on_route: Callable[[int, list[int]], None] | None = None
        self.last_aux_loss: torch.Tensor | None = None

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.ep_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        probs = F.softmax(self.router(tokens).float(), dim=-1)
        w, e = probs.topk(self.topk, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        counts = torch.bincount(e.flatten(), minlength=self.num_experts)
        aux = self.num_experts * ((counts.float() / e.numel()) * probs.mean(0)).sum()
        self.last_aux_loss = aux.detach()
        if self.on_route is not None:
            self.on_route(self.layer_id, counts.tolist())
        order = torch.argsort(e.flatten(), stable=True)
        x_sorted = tokens.repeat_interleave(self.topk, dim=0)[order]
        y_sorted = self._experts_parallel(x_sorted, counts) if self.ep_size > 1 else \
            self.experts(x_sorted, counts.tolist())
        y = torch.empty_like(y_sorted).index_copy(0, order, y_sorted)
        out = (y.view(-1, self.topk, shape[-1]) * w.unsqueeze(-1).to(y.dtype)).sum(1)
        out = AuxLossScaler.apply(out, aux, self.aux_loss_coef)
        return out.view(shape)

    def _experts_parallel(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Dispatch over the EP group, run the local experts, combine back (module docstring)."""
        from torch.distributed import _functional_collectives as fc

        n, el = self.ep_size, self.num_local_experts
        # (1) how many tokens each rank sends to each of my experts: recv[j, i] from rank j to expert i
        recv = fc.all_to_all_single(counts, None, None, self.ep_group).view(n, el)
        send_splits = counts.view(n, el).sum(1).tolist()
        recv_splits = recv.sum(1).tolist()
        # (2) dispatch
        x_recv = fc.all_to_all_single_autograd(x_sorted, recv_splits, send_splits, self.ep_group)
        # rows arrive grouped by source rank, then by expert; regroup by local expert
        expert_of_row = torch.arange(el).repeat(n).repeat_interleave(recv.flatten())
        order = torch.argsort(expert_of_row, stable=True)
        y_grouped = self.experts(x_recv[order], recv.sum(0).tolist())
        y_recv = torch.empty_like(y_grouped).index_copy(0, order, y_grouped)
        # (3) combine: the transpose of (2)
        return fc.all_to_all_single_autograd(y_recv, send_splits, recv_splits, self.ep_group)
