"""The rules of :mod:`llmcomm.rules` over a product of two tables, without building the product.

The tuner's space is a product: every shape row (tp, cp, pp, dp, ep, etp, micro-batch, vpp, the pipeline split,
``cp_comm_type``) times every categorical combination (sp, recompute, distributed optimizer, FSDP, attention
backend, FP8, its parameter gather). Checking each rule on every row of the product (400,000 rows for
Qwen3-235B on 1,024 GPUs) spends most of its time on columns the rule does not read. Here each rule is
evaluated — its own ``bad`` predicate, unchanged: the rules table stays the one home of every rule — on the
distinct values of the columns it reads only:

* which columns a rule reads is recorded by running it once on a one-row table whose column mapping notes
  every access (:func:`rule_reads`; the rules' predicates branch on types and on the model, not on values);
* a rule that reads no column of the right table is evaluated on the left table (one row per shape), one that
  reads no column of the left table on the right one, and a rule reading both on the product of the distinct
  left keys and the distinct right keys of the columns it reads (:func:`product_valid`).

``bad[i, j]`` is then the rule on row ``(i, j)`` of the product, since the predicate is elementwise over rows
and reads nothing else. ``tests/test_tune.py`` checks :func:`product_valid` against
:func:`llmcomm.rules.valid` on every row of the product for full spaces (dense, MoE with and without expert
folding, CP with every ``cp_comm_type``, FSDP, FP8, uneven stages) and the accepted rows against
``rules.check`` of each row's :class:`~llmcomm.specs.ParallelConfig`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from .. import rules, step
from ..parallel_table import ParallelTable


class _Recording(dict):
    """A column mapping that notes the names read through it."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        super().__init__(columns)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> np.ndarray:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self:
            self.read.add(key)
        return super().get(key, default)


def rule_reads(model: Any, rule: rules.Rule, sample: ParallelTable) -> frozenset[str]:
    """The columns of :class:`ParallelTable` ``sample`` (one row is enough) that ``rule.bad`` reads."""
    rec = _Recording(sample.columns)
    rule.bad(model, ParallelTable(rec))
    return frozenset(rec.read)


def _key(table: ParallelTable, names: Sequence[str], cache: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(inverse, first)``: per row the index of its distinct value of the columns ``names``, and one row per
    distinct value (``cache``: the columns' codes, by name)."""
    n = len(table)
    code = np.zeros(n, np.int64)
    for c in names:
        if c not in cache:
            cache[c] = pd.factorize(table.columns[c], use_na_sentinel=False)[0].astype(np.int64)
        codes = cache[c]
        code = code * (int(codes.max()) + 1 if n else 1) + codes
        code = pd.factorize(code)[0].astype(np.int64)  # keep it small
    # factorize's codes, in order of first appearance (zeros without names): np.unique's inverse as they are
    return code, step.first_rows(code)


def _combine(left: ParallelTable, li: np.ndarray, right: ParallelTable, ri: np.ndarray,
             right_fields: frozenset[str]) -> ParallelTable:
    """Rows ``(li[k], ri[k])`` of the product: ``right_fields`` from ``right``, every other column from ``left``."""
    return ParallelTable({f: (right.columns[f][ri] if f in right_fields else v[li]) for f, v in left.columns.items()})


def product_valid(model: Any, left: ParallelTable, right: ParallelTable, right_fields: Sequence[str],
                  scopes: Sequence[str]) -> np.ndarray:
    """``ok[i, j]``: whether row ``(i, j)`` of the product — ``left``'s row ``i`` with the columns
    ``right_fields`` taken from ``right``'s row ``j`` — breaks no rule of ``scopes``: :func:`llmcomm.rules.valid`
    of the product table, reshaped to ``(len(left), len(right))`` (module docstring)."""
    nl, nr = len(left), len(right)
    ok = np.ones((nl, nr), bool)
    if nl == 0 or nr == 0:
        return ok
    rf = frozenset(right_fields)
    sample = _combine(left, np.zeros(1, np.int64), right, np.zeros(1, np.int64), rf)
    left0 = _combine(left, np.zeros(nr, np.int64), right, np.arange(nr), rf)  # right's rows, left's first row
    right0 = _combine(left, np.arange(nl), right, np.zeros(nl, np.int64), rf)  # left's rows, right's first row
    lcache: dict[str, np.ndarray] = {}
    rcache: dict[str, np.ndarray] = {}
    for r in rules.rules(scopes):
        reads = rule_reads(model, r, sample)
        on_right, on_left = sorted(reads & rf), sorted(reads - rf)
        if not on_right:
            ok &= ~np.broadcast_to(np.asarray(r.bad(model, right0), dtype=bool), (nl,))[:, None]
        elif not on_left:
            ok &= ~np.broadcast_to(np.asarray(r.bad(model, left0), dtype=bool), (nr,))[None, :]
        else:
            li, lf = _key(left, on_left, lcache)
            ri, rfirst = _key(right, on_right, rcache)
            a, b = np.repeat(lf, len(rfirst)), np.tile(rfirst, len(lf))
            bad = np.broadcast_to(np.asarray(r.bad(model, _combine(left, a, right, b, rf)), dtype=bool),
                                  (len(a),)).reshape(len(lf), len(rfirst))
            ok &= ~bad[li][:, ri]
    return ok
