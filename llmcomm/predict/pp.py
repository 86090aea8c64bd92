"""Pipeline-parallel calls.

Per micro-batch and model chunk, a stage that is not the first virtual stage receives the activation from its
predecessor before computing (``recv_forward``), and one that is not the last sends its output on
(``send_forward``); in the backward pass the gradient goes the other way (``recv_backward`` from the
successor, ``send_backward`` to the predecessor). Every tensor is ``p2p_bytes = b·s·h·act/cp`` (divided by
``tp`` with sequence parallelism: Megatron's p2p ``tensor_shape`` is ``(s/cp/tp, b, h)`` then; and under
DeepSpeed's PipelineEngine, ``pipe_partitioned``, which splits the tensor over TP and all-gathers it on
arrival: :func:`partitioned_gathers`).

Peers are stage offsets in the rank's PP group: ``+1`` (next) and ``-1`` (previous), wrapping from the last
stage to the first under the interleaved schedule (chunk ``c`` of stage ``pp-1`` feeds chunk ``c+1`` of
stage 0).

With tied embeddings and ``pp > 1`` the first and last stage each hold the word embedding; Megatron
all-reduces its gradient over the embedding group ``{first stage, last stage}`` once per iteration
(``_allreduce_embedding_grads``): ``V'·h/tp`` elements in ``grad_reduce_dtype`` (``V'`` the padded
vocabulary).
"""

from __future__ import annotations

from .. import step
from ..vocab import PhaseName, dtype_bytes
from .calls import Call, Context


def recv_forward(ctx: Context, mb: int, layer: int) -> Call:
    return Call("forward", "pp", "recv", "p2p", ctx.p2p_bytes, ctx.act_dtype, layer, mb, peer=-1)


def send_forward(ctx: Context, mb: int, layer: int) -> Call:
    return Call("forward", "pp", "send", "p2p", ctx.p2p_bytes, ctx.act_dtype, layer, mb, peer=+1)


def recv_backward(ctx: Context, mb: int, layer: int) -> Call:
    return Call("backward", "pp", "recv", "p2p", ctx.p2p_bytes, ctx.act_dtype, layer, mb, peer=+1)


def send_backward(ctx: Context, mb: int, layer: int) -> Call:
    return Call("backward", "pp", "send", "p2p", ctx.p2p_bytes, ctx.act_dtype, layer, mb, peer=-1)


def partitioned_gathers(ctx: Context, phase: PhaseName, mb: int, layer: int) -> list[Call]:
    """DeepSpeed's PipelineEngine (:attr:`Context.pipe_partitioned`) rebuilds a partitioned pipeline tensor
    with an all-gather over TP (``PartitionedTensor.full``, ``deepspeed/runtime/pipe/engine.py``): forward,
    the received activation (``_exec_recv_activations``); backward, the received gradient
    (``_exec_recv_grads``) and the stage's own output, kept only as its partition, before its backward pass
    (``_exec_backward_pass``). ``act_bytes`` each (the gathered tensor); tagged ``pp``, over the TP group."""
    if not ctx.pipe_partitioned:
        return []
    n = 1 if phase == "forward" else 2
    return [Call(phase, "pp", "all_gather", "tp", ctx.act_bytes, ctx.act_dtype, layer, mb) for _ in range(n)]


def tied_embedding_allreduce(ctx: Context, stage: int) -> list[Call]:
    """The embedding-group all-reduce on the first and last stage (pp > 1, tied embeddings)."""
    m = ctx.model
    if ctx.pp == 1 or not m.tied_embeddings or stage not in (0, ctx.pp - 1):
        return []
    gdt = ctx.parallel.grad_reduce_dtype
    n = step.embedding_shard(m, ctx.tp)
    return [Call("optimizer", "pp", "all_reduce", "emb", n * dtype_bytes(gdt), gdt)]
