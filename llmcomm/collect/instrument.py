"""Connect the training code to the recorder's context: which layer, micro-batch and phase a call belongs to.

* :func:`mark_layers`: forward hooks on each transformer block set ``layer`` while the block runs forward;
  identity autograd functions at the block's output and input set ``layer`` (and ``phase="backward"``) when
  the block's backward starts and reset it to -1 when it ends.
* :func:`mark_pipeline_stage`: a ``PipelineStage``'s ``forward_one_chunk`` / ``backward_one_chunk`` set the
  micro-batch and phase; the p2p ops built by ``get_{fwd,bwd}_{send,recv}_ops(chunk)`` are labelled by their
  tensor, because the schedules batch the sends of one micro-batch with the receives of another.
* :func:`mark_routing`: MoE layers report their per-expert token counts to the recorder.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .moe import MoE
from .record import Recorder


class _Mark(torch.autograd.Function):
    """Identity; its backward sets the recorder's layer (and phase ``backward``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rec: Recorder, layer: int) -> torch.Tensor:
        ctx.rec, ctx.layer = rec, layer
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.rec.layer(ctx.layer)
        ctx.rec.phase("backward")
        return grad, None, None


def _mark(x: Any, rec: Recorder, layer: int) -> Any:
    if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
        return _Mark.apply(x, rec, layer)
    return x


def mark_layers(blocks: dict[str, nn.Module] | nn.ModuleDict, rec: Recorder) -> None:
    """Tag calls inside each block with its ``layer_id``, forward and backward."""
    for block in blocks.values():
        lid = int(block.layer_id)  # type: ignore[arg-type]  # an int attribute of the block, not a tensor

        def pre(mod: nn.Module, args: tuple, lid: int = lid) -> tuple:
            rec.layer(lid)
            return (_mark(args[0], rec, -1), *args[1:])

        def post(mod: nn.Module, args: tuple, out: Any, lid: int = lid) -> Any:
            rec.layer(-1)
            return _mark(out, rec, lid)

        block.register_forward_pre_hook(pre)
        block.register_forward_hook(post)


def mark_pipeline_stage(stage: Any, rec: Recorder) -> None:
    """Wrap the stage's per-chunk methods so calls carry the micro-batch and phase (module docstring)."""

    def wrap_compute(name: str, phase: str) -> None:
        orig = getattr(stage, name)

        def run(chunk_id: int, *a: Any, **k: Any) -> Any:
            rec.microbatch(chunk_id)
            rec.phase(phase)
            rec.layer(-1)
            return orig(chunk_id, *a, **k)

        setattr(stage, name, run)

    def wrap_ops(name: str, phase: str) -> None:
        orig = getattr(stage, name)

        def ops(chunk_id: int, *a: Any, **k: Any) -> Any:
            out = orig(chunk_id, *a, **k)
            for op in out:
                rec.p2p_context[id(op.tensor)] = (chunk_id, phase)
            return out

        setattr(stage, name, ops)

    wrap_compute("forward_one_chunk", "forward")
    wrap_compute("backward_one_chunk", "backward")
    for name in ("get_fwd_recv_ops", "get_fwd_send_ops"):
        wrap_ops(name, "forward")
    for name in ("get_bwd_recv_ops", "get_bwd_send_ops"):
        wrap_ops(name, "backward")


def mark_routing(model: nn.Module, rec: Recorder) -> None:
    """MoE layers report ``counts[e]`` (tokens this rank routed to expert ``e``) per call."""
    for m in model.modules():
        if isinstance(m, MoE):
            m.on_route = rec.routing
