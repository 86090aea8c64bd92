"""Parallelize the plain model with torch's own APIs on one DeviceMesh (torchtitan style).

Mesh: ``init_device_mesh("cpu", (pp, edp, ep, tp), ("pp", "edp", "ep", "tp"))`` with ``("edp", "ep")``
flattened into ``"dp"``. Row-major order makes ``rank = tp_i + tp·(dp_i + dp·pp_i)`` with
``dp_i = ep_i + ep·edp_i``: Megatron's ``tp-cp-ep-dp-pp`` order, the same numbering as
:class:`llmcomm.layout.Layout` for the same :class:`~llmcomm.specs.ParallelConfig`.

One function per dimension, applied in this order to each rank's copy of the full model:

* :func:`apply_pp` — keep this stage's layers (``L/pp`` consecutive ones; the embedding on the first stage,
  final norm and output layer on the last) and wrap them in ``torch.distributed.pipelining``.
* :func:`apply_tp` — ``torch.distributed.tensor.parallel``: Q/K/V and ``w1`` column-parallel, ``wo`` and
  ``w2`` row-parallel, vocabulary-parallel embedding (row-parallel), column-parallel output layer gathered
  to full logits; with ``sp`` the norms are ``SequenceParallel`` and the block inputs are gathered.
  MoE layers are not tensor-parallel: each TP rank runs the whole MoE layer on its (replicated) tokens.
* :func:`apply_ep` — keep ``E/ep`` experts per rank and give the MoE layers the EP group.
* :func:`apply_dp` — ``replicate`` (torch's FSDP2-based DDP, ``torch.distributed._composable.
  replicate_with_fsdp``) per transformer block and on the root: one gradient all-reduce per block and one
  for the rest, per iteration. Expert weights are excluded when ``ep > 1`` and replicated over ``edp``
  when ``edp > 1``. (``torch.nn.parallel.DistributedDataParallel`` cannot wrap DTensor parameters — its
  constructor's broadcast has no sharding strategy — so it is not used.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..errors import ConfigError
from ..specs import ParallelConfig
from .model import GPT, TransformerBlock
from .moe import MoE


def build_mesh(parallel: ParallelConfig) -> DeviceMesh:
    """The 4-D mesh ``(pp, edp, ep, tp)`` with ``dp`` = flattened ``(edp, ep)`` (see module docstring)."""
    p = parallel
    mesh = init_device_mesh("cpu", (p.pp, p.dp // p.ep, p.ep, p.tp), mesh_dim_names=("pp", "edp", "ep", "tp"))
    mesh["edp", "ep"]._flatten("dp")
    return mesh


def apply_pp(model: GPT, stage: int, num_stages: int) -> GPT:
    """Keep only stage ``stage``'s share of the model (in place): layers
    ``[stage·L/pp, (stage+1)·L/pp)``, the embedding on stage 0, norm and output on the last stage."""
    n = model.args.n_layers
    if n % num_stages:
        raise ConfigError(f"pp={num_stages} does not divide num_layers={n}")
    per = n // num_stages
    keep = {str(i) for i in range(stage * per, (stage + 1) * per)}
    for k in list(model.layers.keys()):
        if k not in keep:
            del model.layers[k]
    if stage != 0:
        model.tok_embeddings = None
    if stage != num_stages - 1:
        model.norm = None
        model.output = None
    return model


def pipeline_schedule(model: GPT, mesh: DeviceMesh, num_microbatches: int, schedule: str,
                      loss_fn: Any) -> tuple[Any, Any]:
    """``PipelineStage`` of this rank's stage and the schedule (``gpipe`` -> ``ScheduleGPipe``,
    ``1f1b`` -> ``Schedule1F1B``)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    pp_mesh = mesh["pp"]
    stage = PipelineStage(model, pp_mesh.get_local_rank(), pp_mesh.size(), torch.device("cpu"),
                          group=pp_mesh.get_group())
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}.get(schedule)
    if cls is None:
        raise ConfigError(f"schedule={schedule!r}: the collect workload runs gpipe or 1f1b")
    return stage, cls(stage, n_microbatches=num_microbatches, loss_fn=loss_fn)


def apply_tp(model: GPT, tp_mesh: DeviceMesh, sp: bool = False) -> None:
    """Tensor (and sequence) parallelism with ``parallelize_module`` (module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq_or_rep = Shard(1) if sp else Replicate()
    root: dict[str, Any] = {}
    if model.tok_embeddings is not None:
        root["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq_or_rep)
    if model.norm is not None and sp:
        root["norm"] = SequenceParallel()
    if model.output is not None:
        root["output"] = ColwiseParallel(input_layouts=seq_or_rep, output_layouts=Replicate(),
                                         use_local_output=True)
    if root:
        parallelize_module(model, tp_mesh, root)
    for block in model.layers.values():
        assert isinstance(block, TransformerBlock)
        plan: dict[str, Any] = {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=seq_or_rep),
        }
        # one DTensor input per sub-layer: the Q/K/V (w1) input-gradients add up before one reduction
        gather = PrepareModuleInput(input_layouts=(seq_or_rep,), desired_input_layouts=(Replicate(),))
        plan["attention"] = gather
        if sp:
            plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
        if block.moe:
            if sp:
                raise ConfigError("sequence parallelism with MoE layers is not supported by this workload")
        else:
            plan.update({"feed_forward": PrepareModuleInput(input_layouts=(seq_or_rep,),
                                                            desired_input_layouts=(Replicate(),)),
                         "feed_forward.w1": ColwiseParallel(),
                         "feed_forward.w2": RowwiseParallel(output_layouts=seq_or_rep)})
        parallelize_module(block, tp_mesh, plan)


def moe_layers(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def apply_ep(model: GPT, ep_mesh: DeviceMesh) -> None:
    """Expert parallelism: rank ``j`` of the EP group keeps experts ``j·E/ep .. (j+1)·E/ep - 1``."""
    n, j = ep_mesh.size(), ep_mesh.get_local_rank()
    for moe in moe_layers(model):
        if moe.num_experts % n:
            raise ConfigError(f"ep={n} does not divide num_experts={moe.num_experts}")
        local = moe.num_experts // n
        moe.experts.keep(j * local, local)
        moe.ep_group, moe.ep_size, moe.ep_rank = ep_mesh.get_group(), n, j


def apply_dp(model: GPT, dp_mesh: DeviceMesh, edp_mesh: DeviceMesh, ep: int) -> None:
    """Data parallelism with ``replicate`` per block and on the root (module docstring)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    expert_params: set[nn.Parameter] = set()
    if ep > 1:
        for moe in moe_layers(model):
            expert_params |= set(moe.experts.parameters())
            if edp_mesh.size() > 1:
                replicate(moe.experts, mesh=edp_mesh)
    for block in model.layers.values():
        mine = {p for p in block.parameters() if p in expert_params}
        replicate(block, mesh=dp_mesh, ignored_params=mine or None)
    replicate(model, mesh=dp_mesh, ignored_params=expert_params or None)
