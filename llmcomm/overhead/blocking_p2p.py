"""Which pipeline receives a stage waits for: DeepSpeed's blocking send/recv against Megatron-LM's paired ones.

Megatron-LM's 1F1B exchanges a stage's send and its matching receive in one ``batch_isend_irecv``
(``megatron/core/pipeline_parallel/p2p_communication.py``, ``_communicate``): the pair runs together and a
receive is its peer's send, timed once, on the sender. DeepSpeed's PipelineEngine (Megatron-DeepSpeed's
``GPTModelPipe``; :attr:`llmcomm.ParallelConfig.pipe_partitioned`) issues every transfer as its own blocking call:
``deepspeed/runtime/pipe/p2p.py`` ``send``/``recv`` assert ``async_op == False`` and call ``dist.send`` /
``dist.recv``, and ``TrainSchedule`` runs ``SendActivation``, ``RecvActivation``, ``SendGrad``, ``RecvGrad`` one
after another on each stage (``deepspeed/runtime/pipe/schedule.py``). A stage therefore waits for each transfer
it receives as well as for each it sends. With ``τ`` the time of one transfer, per micro-batch::

    Megatron-LM:   first: τ (send act)            mid: 2τ            last: τ (send grad)
    DeepSpeed:     first: 2τ (send act, recv grad) mid: 4τ (both ways) last: 2τ (recv act, send grad)

An event simulation of DeepSpeed's ``TrainSchedule`` with rendezvous sends (compute F and B per micro-batch,
every transfer τ, both ends released together) gives ``(m + p − 1)·(F + B) + k·τ·(m + p − 1)`` with ``k``
rising from 1.8 (p = 2) to 3.4–3.8 (p = 4…16, m = 24…48): what the per-stage counts above give through the
pipeline's ``m·c_crit + (Σ c_r − c_crit)``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .iteration import CommItem


def timed_calls(items: list[CommItem], blocking: np.ndarray) -> list[CommItem]:
    """The calls a stage's time counts: every call but receives, and the pipeline receives of the rows where
    ``blocking`` (DeepSpeed's PipelineEngine) with their count kept only there. A receive is timed as the send
    it matches (:meth:`llmcomm.overhead.bandwidth.Bandwidth.time` shares their regime)."""
    blk = np.asarray(blocking).astype(np.int64)
    out = []
    for it in items:
        if it.op != "recv":
            out.append(it)
        elif it.term == "pp" and blk.any():
            out.append(dataclasses.replace(it, count=it.count * blk))
    return out
