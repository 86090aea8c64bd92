"""The result of comparing a measured trace with its prediction: the tables of :func:`llmcomm.compare.compare`
(see :mod:`llmcomm.compare` for each) and their report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..trace import Trace
from . import report


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare`; see the module docstring for each table."""

    by_kind: pd.DataFrame
    one_sided: pd.DataFrame
    pairs: pd.DataFrame
    verdicts: pd.DataFrame
    setup: pd.DataFrame
    iteration: int
    ranks: tuple[int, ...]
    ordered_ranks: int  # ranks whose measured and predicted call sequences are equal, in order
    measured: Trace  # the compared calls: one iteration, the measured ranks, setup set aside
    predicted: Trace
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        """Every call on both sides matched (per rank, as multisets)."""
        return bool(self.one_sided.empty)

    def verdict_lines(self) -> list[str]:
        return [f"{r.parallelism:<4} {r.verdict}" for r in self.verdicts.itertuples()]

    def largest_differences(self, n: int = 10) -> pd.DataFrame:
        """The one-sided call groups that carry the most bytes per iteration."""
        if self.one_sided.empty:
            return self.one_sided
        return self.one_sided.sort_values("bytes_per_iteration", ascending=False).head(n)

    def to_markdown(self) -> str:
        """The report (:mod:`.report`): header, verdicts, per-kind table, one-sided calls, largest pair
        differences."""
        return report.to_markdown(self)

    def to_html(self) -> str:
        """The same report as HTML (tables rendered by pandas)."""
        return report.to_html(self)
