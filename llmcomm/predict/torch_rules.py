"""Differences between what torch's own parallel APIs issue (the collector's runs) and Megatron-LM.

Filled in from ``llmcomm/collect/WHAT_TORCH_ISSUES.md`` and the recorded traces; until then the torch
program equals the Megatron one.
"""

from __future__ import annotations

from .calls import Call, Context


def adjust(ctx: Context, stage: int, calls: list[Call]) -> list[Call]:
    """The torch program of ``stage`` from the Megatron one."""
    return calls
