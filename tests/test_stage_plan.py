"""The predictor's compact stage programs (:class:`llmcomm.predict.program.StagePlan`) list exactly the calls the
step-by-step definition (:func:`~llmcomm.predict.program.direct_stage_program`) lists, and aggregate exactly as
:func:`llmcomm.predict.expand.aggregate_calls` does, on every kind of stage: pipeline edges and middles, the
interleaved schedule, FSDP (both flavours), overlapped gradient reduction, MoE, CP, recomputation, fewer
micro-batches than stages."""

from __future__ import annotations

import pytest

import llmcomm as lc
from llmcomm.predict import expand
from llmcomm.predict.calls import Call, Context
from llmcomm.predict.program import StagePlan, _Template, direct_stage_program, stage_plan, stage_program
from llmcomm.specs import ParallelConfig

CASES = [
    ("gpt3-6.7b", dict(tp=4, pp=4, dp=2, global_batch=16)),
    ("gpt3-6.7b", dict(tp=2, pp=4, dp=1, global_batch=2)),  # fewer micro-batches than stages
    ("gpt3-6.7b", dict(tp=2, pp=1, dp=2, global_batch=2)),  # one micro-batch
    ("gpt3-6.7b", dict(tp=2, pp=4, dp=1, vpp=2, schedule="interleaved", global_batch=8)),
    ("gpt3-6.7b", dict(tp=2, pp=2, dp=2, overlap_grad_reduce=True, distributed_optimizer=True, global_batch=8)),
    ("gpt3-6.7b", dict(tp=2, pp=2, dp=2, fsdp=True, distributed_optimizer=True, overlap_grad_reduce=True,
                       global_batch=8)),
    ("gpt3-6.7b", dict(tp=2, pp=2, dp=2, fsdp=True, global_batch=8)),
    ("gpt3-6.7b", dict(tp=2, pp=2, dp=2, cp=2, sp=True, recompute="full", global_batch=8)),
    ("gpt3-6.7b", dict(tp=2, pp=2, dp=1, recompute="full", recompute_method="block", recompute_num_layers=3,
                       global_batch=8)),
    ("mixtral-8x7b", dict(tp=2, pp=2, dp=4, ep=4, sp=True, global_batch=16)),
]


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_plan_lists_the_direct_program(name: str, kw: dict) -> None:
    ctx = Context(lc.load_model(name), ParallelConfig(**kw))
    for stage in range(ctx.pp):
        direct = direct_stage_program(ctx, stage)
        plan = stage_plan(ctx, stage)
        assert plan.calls() == direct and stage_program(ctx, stage) == direct and len(plan) == len(direct)
        assert plan.aggregated() == expand.aggregate_calls(direct)
        for mb in {0, ctx.num_microbatches - 1, ctx.num_microbatches // 2, -1}:
            assert plan.microbatch_calls(mb) == [c for c in direct if c.microbatch == mb]
        if ctx.num_microbatches > 3:  # a middle class is built once, not per micro-batch
            assert len(plan.templates) < len(plan.pieces)


def test_a_call_with_a_fixed_microbatch_is_kept() -> None:
    fixed = Call("forward", "tp", "all_reduce", "tp", 8, "bf16", 0, 3)
    t = _Template((Call("forward", "tp", "all_reduce", "tp", 8, "bf16", 0, 1), fixed), 1, (True, False))
    assert t.at(5) == [Call("forward", "tp", "all_reduce", "tp", 8, "bf16", 0, 5), fixed]
    plan = StagePlan((t,), ((0, 1), (0, 5)), ())
    assert plan.microbatch_calls(3) == [fixed, fixed] and plan.microbatch_calls(5)[0].microbatch == 5


def test_a_step_whose_calls_depend_on_its_microbatch_otherwise_is_built_step_by_step(monkeypatch) -> None:
    import dataclasses

    from llmcomm.predict import program

    real = program._step_calls

    def odd(ctx, stage, step):  # bytes that grow with the micro-batch: no class of steps shares its calls
        return [dataclasses.replace(c, bytes=c.bytes + step.microbatch) for c in real(ctx, stage, step)]

    monkeypatch.setattr(program, "_step_calls", odd)
    program.stage_plan.cache_clear()
    ctx = Context(lc.load_model("gpt3-6.7b"), ParallelConfig(tp=2, pp=2, dp=1, global_batch=8))
    plan = stage_plan(ctx, 1)
    assert len(plan.templates) == len(plan.pieces)
    assert plan.calls() == program.direct_stage_program(ctx, 1)
    program.stage_plan.cache_clear()
