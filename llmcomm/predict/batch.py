"""The batch broadcast over TP: Megatron-LM's ``get_batch`` (``pretrain_gpt.py``) reads the micro-batch on TP
rank 0 and ``get_batch_on_this_tp_rank`` (``megatron/core/utils.py``) broadcasts each tensor to the other TP
ranks, one ``torch.distributed.broadcast`` per tensor, every micro-batch, on the stages that need the data.

Tensors of one micro-batch (``b`` micro-batch, ``s`` the full sequence: the CP split happens after the
broadcast, in ``get_batch_on_this_cp_rank``)::

    tokens         int64   b·s·8
    labels         int64   b·s·8
    loss_mask      fp32    b·s·4
    position_ids   int64   b·s·8
    attention_mask bool    b·s·s      (when create_attention_mask_in_dataloader, Megatron's default)

* ``pp == 1``: tokens, labels, loss_mask, position_ids, [attention_mask];
* first stage (``pp > 1``): tokens, position_ids, [attention_mask];
* last stage (``pp > 1``): labels, loss_mask, [attention_mask];
* middle stages: nothing (``get_batch`` returns early: ``is_first_or_last_pipeline_stage(vp_stage)``).

With the interleaved schedule the first model chunk of stage 0 and the last chunk of the last stage read a
batch. Issued only when ``tp > 1`` (a group of one issues nothing), ``phase="forward"``, at the start of the
micro-batch's forward step (after the pipeline receive). Tagged ``other`` (data loading, not the model's
tensor parallelism: the TP matrix keeps the all-reduce blocks of finding F1; a broadcast from TP rank 0 is
one-directional), though it runs on the TP group. The attention mask is 4 MiB per
micro-batch at ``b = 1, s = 2,048`` and 64 MiB at ``s = 8,192``.
"""

from __future__ import annotations

from .calls import Call, Context


def _bcast(nbytes: int, dtype: str, mb: int) -> Call:
    return Call("forward", "other", "broadcast", "tp", nbytes, dtype, -1, mb)


def batch_broadcast(ctx: Context, vs: int, mb: int) -> list[Call]:
    """The broadcasts of micro-batch ``mb`` on virtual stage ``vs`` (empty on middle stages or ``tp == 1``)."""
    if ctx.tp == 1:
        return []
    first, last = vs == 0, vs == ctx.last_virtual
    if not (first or last):
        return []
    n = ctx.parallel.micro_batch * ctx.seq
    tokens, labels = _bcast(8 * n, "int64", mb), _bcast(8 * n, "int64", mb)
    loss_mask, pos = _bcast(4 * n, "fp32", mb), _bcast(8 * n, "int64", mb)
    if first and last:
        out = [tokens, labels, loss_mask, pos]
    elif first:
        out = [tokens, pos]
    else:
        out = [labels, loss_mask]
    if ctx.parallel.create_attention_mask_in_dataloader:
        out.append(_bcast(n * ctx.seq, "bool", mb))
    return out
