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

:func:`train_schedule_time` simulates DeepSpeed's ``TrainSchedule`` (its step-to-micro-batch map, each send
issued at the start of the stage's next step, every transfer a rendezvous that releases both ends ``τ`` after
the later one arrives): with ``τ = 0`` it is exactly 1F1B's ``(m + p − 1)·(F + B)``; each transfer of ``τ`` adds
about ``k·τ·(m + p − 1)`` with ``k`` = 1.8–2.0 at ``p = 2`` and 3.1–3.8 at ``p = 4…16`` (``m = 24…48``). The
per-stage counts above, through the pipeline's ``m·c_crit + (Σ c_r − c_crit)``, charge about ``4τ·(m + p − 2)``:
the same order, some 10 % more than the simulation at ``p ≥ 4``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

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
        elif it.term == "pp" and np.count_nonzero(blk):
            out.append(dataclasses.replace(it, count=it.count * blk))
    return out


def _step_micro_batch(stage: int, stages: int, step: int) -> tuple[int, bool]:
    """DeepSpeed ``TrainSchedule._step_to_micro_batch``: even stages run forwards on even steps and backwards on
    odd ones, odd stages the other way round; the micro-batch a step works on (out of range: idle)."""
    if step % 2 == stage % 2:
        return (step - stage % 2) // 2 - stage // 2, True
    if step % 2 == 0:  # odd stage, even step
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False  # even stage, odd step


MAX_SIMULATED_STEPS = 200_000  # stages × steps the simulation walks: refused above


def train_schedule_time(stages: int, microbatches: int, forward: float, backward: float, tau: float = 0.0,
                        recv_first: bool = False) -> float:
    """Seconds of one DeepSpeed ``TrainSchedule`` pass (module docstring): ``forward`` and ``backward`` per
    micro-batch on every stage, each stage-to-stage transfer a blocking rendezvous of ``tau`` seconds. The order
    of a stage's instructions per step is DeepSpeed's since microsoft/DeepSpeed b528f50e3 (2023-03-13, #2862,
    ``deepspeed/runtime/pipe/schedule.py`` ``TrainSchedule.steps``): a forward step sends the gradient of its
    previous (backward) step, then receives its activation; a backward step receives its gradient, then sends
    the activation of its previous (forward) step; then it computes. ``recv_first``: the order before that
    commit, which the 2022 releases vTrain's Megatron-DeepSpeed runs used (b609a2941, 2022-09-29,
    ``schedule.py`` lines 206-216): a forward step receives its activation, then sends the previous gradient; a
    backward step sends the previous activation, then receives its gradient. A step exchanges with one
    neighbour only (the previous stage on a forward step, the next on a backward one) and both ends of the pair
    list the same two transfers in the same order, so the two orders give the same times
    (``tests/test_overhead_blocking_p2p.py``)."""
    from ..errors import UsageError

    p, m = int(stages), int(microbatches)
    if p < 1 or m < 1:
        raise UsageError(f"train_schedule_time: stages={p} and microbatches={m} must be at least 1")
    steps = 2 * (m + p - 1)
    if p * steps > MAX_SIMULATED_STEPS:
        raise UsageError(f"train_schedule_time: {p} stages × {steps} steps exceed {MAX_SIMULATED_STEPS:,}")
    progs: list[list[tuple[str, Any]]] = []
    for s in range(p):
        prog: list[tuple[str, Any]] = []
        prev = -1
        for k in range(steps):
            mb, fwd = _step_micro_batch(s, p, k)
            ok_prev, ok = 0 <= prev < m, 0 <= mb < m
            xs: list[tuple[str, Any]] = []
            if fwd and s > 0:  # with the previous stage: the gradient of the previous step, this step's activation
                xs = [("x", (s - 1, "grad", prev))] * ok_prev + [("x", (s - 1, "act", mb))] * ok
            elif not fwd and s < p - 1:  # with the next stage: this step's gradient, the previous activation
                xs = [("x", (s + 1, "grad", mb))] * ok + [("x", (s + 1, "act", prev))] * ok_prev
            prog += xs[::-1] if recv_first else xs
            prog.append(("c", (forward if fwd else backward) if ok else 0.0))
            prev = mb
        progs.append(prog)
    t, pc = [0.0] * p, [0] * p
    waiting: dict[tuple[int, int, str, int], tuple[int, float]] = {}
    while any(pc[s] < len(progs[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pc[s] < len(progs[s]):
                kind, x = progs[s][pc[s]]
                if kind == "c":
                    t[s] += x
                    pc[s] += 1
                    moved = True
                    continue
                peer, what, mb = x
                key = (min(s, peer), max(s, peer), what, mb)
                if key in waiting and waiting[key][0] != s:
                    other, t_other = waiting.pop(key)
                    t[s] = t[other] = max(t_other, t[s]) + tau
                    pc[s] += 1
                    pc[other] += 1
                    moved = True
                    continue
                waiting.setdefault(key, (s, t[s]))
                break
        if not moved:  # cannot happen for DeepSpeed's schedule; a guard against a wrong instruction order
            raise RuntimeError("train_schedule_time: the schedule deadlocks")
    return max(t)
