"""ConfigTuner (finding F7): rank every valid configuration of a model on a cluster by the iteration-time
formulation, after dropping those that do not fit in GPU memory, and prune the ones that cannot win.

``tune(model, gpus, cluster, global_batch)`` enumerates the space (:mod:`.space`), computes each candidate's
memory (:func:`llmcomm.overhead.memory.memory_table`) and evaluates the formulation
(:func:`llmcomm.overhead.iteration.iteration_times`) on what remains. With ``prune=True`` it first removes
candidates by rules that can never remove the optimum, each applied before any time is evaluated:

``memory``
    total bytes > ``memory_fraction`` · GPU memory. Not a heuristic: such a configuration cannot run. Applied
    in both searches.
``recompute-dominated``
    among candidates equal in everything but ``recompute``, only the least recomputation that fits is kept.
    Safe because the formulation's time is non-decreasing in recomputation (none ≤ selective ≤ full: each adds
    forward work to the backward pass and full recomputation re-issues the forward TP calls) while nothing else
    changes; ``tests/test_tune.py`` checks that monotonicity over many configurations.
``unfused-dominated``
    among candidates equal in everything but ``attention_backend``, an unfused (or ``local``) backend is dropped
    where a fused twin (``flash``/``fused``/``auto``) fits. Safe because the formulation's fused attention does
    the same calls with no score-matrix HBM traffic and half the causal score FLOPs, and stores no ``s²``
    scores (memory never above the unfused twin's), so its time is never above the unfused one's;
    ``tests/test_tune.py`` checks that over many configurations.
``fp8-param-gather-dominated``
    FP8 with the distributed optimizer and ``fp8_param_gather`` off, where its twin with it on is in the space:
    the flag only shrinks the parameter all-gather (1 byte per parameter) and makes the primary weights FP8
    (memory never above), so the twin is never slower and fits whenever it does.
``overlap-dominated``
    ``overlap_param_gather`` off with both the distributed optimizer and ``overlap_grad_reduce`` on: the twin with
    the flag on only subtracts hidden time from the exposed DP term (``max(0, x − y) ≤ x``;
    :func:`overlap_dominated` has the proof and what it does not cover: ``overlap_grad_reduce`` itself,
    ``tp_comm_overlap`` and the distributed optimizer's "both off" are evaluated, not pruned).
``same-as-without``
    the distributed optimizer with ``dp·cp = 1`` shards nothing and issues the same calls as without it, and
    ``tp_comm_overlap`` at tp = 1 overlaps nothing: exact ties, so only one copy is evaluated.

``lower-bound``
    branch-and-bound on the rows every other rule keeps: each row's lower bound (:mod:`llmcomm.tune.bound`:
    the formulation's compute and the TP/EP/pipeline seconds that no flag of the row hides, through its own
    pipeline expression, every other term at zero; why it is never above the row's time is proved there and
    checked on every candidate of full spaces in ``tests/test_tune.py``), rows evaluated in the order of their
    bound, in doubling chunks, until the next bound is above the ``exact_top``-th best time found
    (:func:`branch_and_bound`): the first ``exact_top`` rows of the table (10 by default: the CLI's ``--top``
    and notebook 08 read them) are those of evaluating every row.

The order: the space's rows without the time-only flags (:data:`~llmcomm.tune.space.BOOL_TIME_FLAGS`, which the
memory model does not read) are built first; ``unfused-dominated`` and ``fp8-param-gather-dominated`` act while
they are built (their dominating twin never needs more memory, so no budget can undo them:
:func:`~llmcomm.tune.space.dominated_combinations`, which counts what it leaves out); memory, ``recompute-dominated``
and ``same-as-without`` act on those rows (each safe for every flag combination: the tests check the
formulation's monotonicity over the full space, flags and FP8 included); then the flags are expanded and
``overlap-dominated`` and ``same-as-without`` act on the expanded rows; ``lower-bound`` acts last, while they are
evaluated.

Rules that need no time at all are in the space itself (:mod:`.space`): lighter-only uneven end stages, and the
dimensions the cost model refuses (rule scope ``cost``) never enumerated.

The pruned search returns the same optimum as the exhaustive one (property test over random catalogue models,
GPU counts and batches); ``TuneResult.stats`` counts what each search enumerated, pruned and evaluated.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .. import bounds, step
from ..bounds import check_tune_candidates, check_tune_gpus
from ..errors import ConfigError
from ..parallel_table import ParallelTable
from ..specs import Cluster, ModelSpec, ParallelConfig, load_cluster, load_model
from .bound import compute_key, lower_bounds
from .space import (
    BOOL_TIME_FLAGS,
    DIMENSIONS,
    TWIN_COLUMNS,
    SearchSpace,
    base_and_table,
    column_codes,
    divisors,
    enumerate_base,
    enumerate_candidates,
    expand_by_grid,
    expand_cells,
    partial_modules,
    row_codes,
    splits,
    time_flag_grid,
)


@dataclass(frozen=True)
class TuneResult:
    """``table``: every evaluated candidate that fits, fastest first, with its predicted terms, memory and
    throughput; ``pruned``: the rest, each with the ``rule`` that removed it and the number of configurations
    of the space it stands for (``rows``: a row removed before the time-only flags were expanded stands for each
    of its flag combinations, :func:`~llmcomm.tune.space.time_flag_multiplicity`); ``stats``: counts and wall
    time."""

    table: pd.DataFrame
    pruned_rows: pd.DataFrame | Any  # the frame, or a function building it (on the first read of ``pruned``)
    stats: dict[str, Any]
    model: ModelSpec
    cluster: Cluster
    gpus: int
    global_batch: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def pruned(self) -> pd.DataFrame:
        if callable(self.pruned_rows):  # built once, when first read (the search's counts are in ``stats``)
            object.__setattr__(self, "pruned_rows", self.pruned_rows())
        return self.pruned_rows

    @property
    def best(self) -> pd.Series:
        return self.table.iloc[0]

    def best_parallel(self) -> ParallelConfig:
        return to_parallel(self.best)

    def top(self, n: int = 10) -> pd.DataFrame:
        cols = [*DIMENSIONS, "total_s", "comm_overhead", "tflops_per_gpu", "total_bytes"]
        return self.table.head(n)[cols]


def to_parallel(row: pd.Series | dict) -> ParallelConfig:
    """A candidate row (columns named as :class:`ParallelConfig` fields; others ignored) as a validated
    :class:`ParallelConfig` (:meth:`llmcomm.parallel_table.ParallelTable.row`)."""
    return ParallelTable.from_frame(pd.DataFrame([dict(row)]), required=("tp", "pp", "dp")).row(0)


# Megatron-LM's defaults of the precision and overlap dimensions: BF16, nothing overlapped (the rule of thumb's and
# the 2021 configurations' values)
MEGATRON_DEFAULT_FLAGS: dict[str, Any] = {
    "fp8": (None,), "fp8_param_gather": (False,), "tp_comm_overlap": (False,), "overlap_grad_reduce": (False,),
    "overlap_param_gather": (False,), "overlap_p2p_comm": (False,), "moe_a2a_overlap": (False,)}


# ------------------------------------------------------------------------------------------- rules
def recompute_dominated(cands: pd.DataFrame, partial: frozenset[str] = frozenset()) -> np.ndarray:
    """Rows that recompute more than another row among ``cands`` equal in everything else (every row of
    ``cands`` fits): "more" is the partial order :func:`recomputes_less` of (``recompute``, ``recompute_modules``),
    which for ``none``/``selective``/``full`` alone is none < selective < full, the least that fits kept;
    ``partial``: the model's modules that recompute some layers only (:func:`~llmcomm.tune.space.partial_modules`)."""
    if "recompute_modules" not in cands:
        cands = cands.assign(recompute_modules=None)
    rc, ruq = column_codes(cands["recompute"])
    mc, muq = column_codes(cands["recompute_modules"])
    pairs, uniq = pd.factorize(rc * (len(muq) + 1) + mc)
    desc = [(ruq[int(u) // (len(muq) + 1)], muq[int(u) % (len(muq) + 1)]) for u in uniq]
    below = np.array([[recomputes_less(a, b, partial) for b in desc] for a in desc], bool).reshape(len(desc), len(desc))
    group = row_codes(cands, [c for c in DIMENSIONS if c in cands and c not in ("recompute", "recompute_modules")])
    present = np.zeros((int(group.max()) + 1 if len(group) else 0, len(desc)), bool)
    present[group, pairs] = True
    return (present.astype(np.int64) @ below.astype(np.int64) > 0)[group, pairs]


def recomputes_less(a: tuple[Any, Any], b: tuple[Any, Any], partial: frozenset[str] = frozenset()) -> bool:
    """Whether ``(recompute, recompute_modules)`` ``a`` recomputes strictly less than ``b`` for pruning: ``none``
    less than anything else, anything less than ``full``, and a selective set less than a selective set that
    holds every one of its modules and more (``None``: Megatron-LM's default, ``core_attn``) — except where what
    ``b`` adds over ``a`` holds a module of ``partial``, one that recomputes some layers of the model only
    (:func:`~llmcomm.tune.space.partial_modules`), and a selective set holding one against ``full``: there the
    formulation's time has not been shown monotone, so such pairs are both evaluated. Measured on DeepSeek-MoE 16B
    (dense first layer): ``mlp`` was up to 0.37% faster than ``none`` under ``overlap_grad_reduce`` with
    interleaved stages — a bug, fixed (the chunks' launch times now count back at the slowest stage's pace,
    :func:`llmcomm.overhead.overlap.stage_grad_reduce`); ``full`` was up to 0.16% faster than selective ``moe``
    under ``tp_comm_overlap`` with SP and FSDP (the userbuffers backward credited the recomputed GEMMs under ``full``
    only) — fixed too: each replayed block's SP calls are timed against its own GEMMs
    (:func:`llmcomm.overhead.iteration.tp_overlap_exposed`); the rule still leaves these pairs out, as nothing
    shows every mechanism monotone on them. Safe for pruning because, along this
    order, the formulation's time is non-decreasing and its memory non-increasing (each module recomputed adds
    its forward to the backward and discards what it kept; full recomputation re-runs the whole layer and keeps
    only its input), all else equal; ``tests/test_tune_modules.py`` checks both over full spaces with every
    module of the kit."""
    from ..step import recompute_flags

    def mods(v: tuple[Any, Any]) -> frozenset[str]:
        m = v[1] if isinstance(v[1], tuple) else None
        return frozenset(k for k, on in recompute_flags("selective", m).items() if on)

    (ra, _), (rb, _) = a, b
    if ra == rb == "selective":
        return mods(a) < mods(b) and not (mods(b) - mods(a)) & partial
    if ra == "none" and rb == "selective":
        return not mods(b) & partial
    if ra == "selective" and rb == "full":
        return not mods(a) & partial
    return ra != rb and (ra == "none" or rb == "full")


def unfused_dominated(cands: pd.DataFrame) -> np.ndarray:
    """Rows with an unfused attention backend that have a fused twin (equal in everything else) among ``cands``."""
    from ..vocab import FUSED_ATTENTION_BACKENDS

    unfused = ~cands["attention_backend"].isin(FUSED_ATTENTION_BACKENDS).to_numpy()
    if not unfused.any() or unfused.all():
        return np.zeros(len(cands), bool)
    key = [c for c in DIMENSIONS if c != "attention_backend"]
    has_fused = pd.Series(~unfused, index=cands.index).groupby([cands[c] for c in key], sort=False,
                                                               dropna=False).transform("max")
    return unfused & has_fused.to_numpy(bool)


def _has_twin(cands: pd.DataFrame, drop: np.ndarray, changes: dict[str, Any]) -> np.ndarray:
    """``drop`` narrowed to the rows whose twin (the same row with ``changes`` applied) is among ``cands``: rows
    and twins coded by one integer key over :data:`DIMENSIONS` (:func:`pandas.factorize` per column)."""
    if not drop.any():
        return drop
    key = [c for c in DIMENSIONS if c in cands.columns]
    idx = np.flatnonzero(drop)
    n = len(cands)
    code_have = np.zeros(n, np.int64)
    code_want = np.zeros(len(idx), np.int64)
    span = 1  # the codes are below span
    for c in key:
        # each column coded once; a changed column's twin value is one constant, coded by the same uniques (or
        # one past them where no row holds it)
        codes, uniq = column_codes(cands[c])
        radix = len(uniq) + 1
        if c in changes:
            v = changes[c]
            hit = [i for i, u in enumerate(uniq.tolist()) if (u is None and v is None) or (
                u is not None and v is not None and isinstance(u, bool) == isinstance(v, bool) and u == v)]
            want = np.full(len(idx), hit[0] if hit else len(uniq), np.int64)
        else:
            want = codes[idx]
        if span * radix >= 2**62:  # recode the pair together before the product overflows
            both, uniq_codes = pd.factorize(np.concatenate([code_have, code_want]))
            code_have, code_want = both[:n].astype(np.int64), both[n:].astype(np.int64)
            span = len(uniq_codes)
        code_have = code_have * radix + codes
        code_want = code_want * radix + want
        span *= radix
    out = np.zeros(n, bool)
    out[idx] = np.isin(code_want, code_have)
    return out


def same_as_without(cands: pd.DataFrame) -> np.ndarray:
    """Exact ties, one copy kept: the distributed optimizer where it shards nothing (dp·cp = 1, no FP8 parameter
    gather) is the row without it; ``tp_comm_overlap`` at tp = 1 overlaps nothing (Megatron-Bridge turns it off
    there; the formulation's TP term is empty) and is the row without it; so is ``overlap_p2p_comm`` without the
    interleaved schedule (Megatron turns it off there, :mod:`llmcomm.overhead.overlap`). Each only where that
    twin is kept."""
    out = _dopt_same_as_without(cands)
    if "tp_comm_overlap" in cands:
        tpo = cands["tp_comm_overlap"].to_numpy(bool) & (cands["tp"].to_numpy() == 1)
        out |= _has_twin(cands, tpo, {"tp_comm_overlap": False})
    if "overlap_p2p_comm" in cands:  # without the interleaved schedule Megatron turns it off: a no-op
        p2p = cands["overlap_p2p_comm"].to_numpy(bool) & (cands["vpp"].to_numpy() == 1)
        out |= _has_twin(cands, p2p, {"overlap_p2p_comm": False})
    return out


def _dopt_same_as_without(cands: pd.DataFrame) -> np.ndarray:
    """The distributed optimizer's part of :func:`same_as_without` (its twin: the row without it)."""
    return _has_twin(cands, _dopt_tie(cands), {"distributed_optimizer": False})


def _dopt_tie(cands: pd.DataFrame) -> np.ndarray:
    """The rows whose distributed optimizer shards nothing (:func:`same_as_without`), before looking for twins."""
    dopt = (cands["distributed_optimizer"].to_numpy(bool) & (cands["dp"].to_numpy() * cands["cp"].to_numpy() == 1)
            & ~cands.get("fp8_param_gather", pd.Series(False, index=cands.index)).to_numpy(bool)
            & ~cands.get("overlap_param_gather", pd.Series(False, index=cands.index)).to_numpy(bool))
    # moe-fold: with expert TP other than tp (MoE parallel folding) a stage can have expert buffers at dp·cp = 1 —
    # sharded over edp = world/(etp·ep·pp) and stepped by an expert optimizer whose gradient statistics differ with
    # and without the distributed optimizer — so the tie needs no expert buffers (ep = 1 and etp = tp)
    etp = cands.get("etp", pd.Series(-1, index=cands.index)).to_numpy()
    return dopt & ((etp < 0) | (etp == cands["tp"].to_numpy())) & (cands["ep"].to_numpy() == 1)


def fp8_param_gather_dominated(cands: pd.DataFrame) -> np.ndarray:
    """FP8 rows with the distributed optimizer and ``fp8_param_gather`` off whose twin with it on is among
    ``cands`` (it fits: its memory is never above, :mod:`llmcomm.overhead.memory`). Safe: the flag changes only
    the bytes of the parameter all-gather (1 byte per parameter instead of 2, ``overhead/iteration.py``), a
    term the formulation's time is non-decreasing in; tested."""
    if "fp8_param_gather" not in cands:
        return np.zeros(len(cands), bool)
    off = (~cands["fp8_param_gather"].to_numpy(bool) & cands["distributed_optimizer"].to_numpy(bool)
           & cands["fp8"].notna().to_numpy())
    return _has_twin(cands, off, {"fp8_param_gather": True})


def overlap_dominated(cands: pd.DataFrame) -> np.ndarray:
    """Rows whose overlap flags a twin among ``cands`` improves on, provably in the formulation
    (:func:`llmcomm.overhead.iteration.combine`), all else equal:

    * ``overlap_grad_reduce`` on and ``overlap_param_gather`` off with the distributed optimizer: with the
      gather overlapped its exposed part ``max(ag/nb, ag − fwd·(nb−1)/nb)`` ≤ ``ag`` and nothing else moves.

    It is checked over the full space of three models (``tests/test_tune.py``), since the formulation's DP
    schedule is another module's and may change.

    Not pruned: ``overlap_grad_reduce`` off without the distributed optimizer. It was a rule while turning it on
    only moved the same serial reductions earlier; since the formulation splits the gradients into Megatron's
    buckets when it is on (:mod:`llmcomm.overhead.overlap`), a stage whose buckets cannot hide pays each bucket's
    latency, and on is slower somewhere (Mixtral 8x7B on 32 H100s, cp 2: 297 of 60,048 twins, by up to 0.42%).
    Nor (neither provably better) the distributed optimizer with both off against both on (with the
    reduce-scatter overlapped the last stage's parameter all-gather is no longer hidden behind the earlier
    stages' backward), and ``tp_comm_overlap`` (less TP time on the last stage hides less of its gradient
    reduction behind the pipeline drain): both are evaluated."""
    if "overlap_grad_reduce" not in cands:
        return np.zeros(len(cands), bool)
    dopt = cands["distributed_optimizer"].to_numpy(bool)
    ogr, opg = cands["overlap_grad_reduce"].to_numpy(bool), cands["overlap_param_gather"].to_numpy(bool)
    return _has_twin(cands, dopt & ogr & ~opg, {"overlap_param_gather": True})


def _grid_twin(present: np.ndarray, combos: list[dict[str, bool]], pick: Any, change: dict[str, bool]) -> np.ndarray:
    """``out[i, j]``: cell ``(i, j)`` present, combination ``j`` picked (``pick(combo)``) and its twin — the same
    row ``i`` with ``change`` applied to the combination — present too (:func:`_has_twin` on the grid of
    :func:`flag_rules`: a row's twin in a time-only flag is the same memory-model row)."""
    at = {tuple(c[k] for k in BOOL_TIME_FLAGS): j for j, c in enumerate(combos)}
    out = np.zeros_like(present)
    for j, c in enumerate(combos):
        twin = at.get(tuple({**c, **change}[k] for k in BOOL_TIME_FLAGS)) if pick(c) else None
        if twin is not None and twin != j:
            out[:, j] = present[:, j] & present[:, twin]
    return out


def flag_rules(kept: pd.DataFrame, combos: list[dict[str, bool]], ok: np.ndarray, spans: np.ndarray,
               prune: bool) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """The memory-model rows ``kept`` expanded by the time-only flags (:func:`~.space.expand_by_grid`), and the
    rows of the expansion each rule removes there (:func:`flag_drops`)."""
    return expand_by_grid(kept, combos, ok), flag_drops(kept, combos, ok, spans, prune)


def flag_drops(kept: pd.DataFrame, combos: list[dict[str, bool]], ok: np.ndarray, spans: np.ndarray,
               prune: bool) -> dict[str, np.ndarray]:
    """The cells of the grid ``ok`` (rows of ``kept`` × the time-only flags' combinations, as
    :func:`~.space.time_flag_grid`; a mask over its true cells in row-major order, the rows of
    :func:`~.space.expand_by_grid`) each rule removes, in order: ``tp-comm-overlap-intra-node``
    (``tp_comm_overlap`` where the row's TP group ``spans`` nodes), then, with ``prune``, ``overlap-dominated``
    and ``same-as-without`` (each on the rows the previous ones keep). The same rows as :func:`overlap_dominated`
    and :func:`same_as_without` on the expanded frame: their twins differ from a row in one time-only flag, so
    they are the same row of ``kept`` with another combination, found on the grid without building the expanded
    frame or coding every column of every expanded row. ``tests/test_tune.py`` compares both."""
    def flag(name: str) -> np.ndarray:
        return np.array([c[name] for c in combos], bool)

    present = ok & ~(flag("tp_comm_overlap")[None, :] & spans[:, None])
    masks = {"tp-comm-overlap-intra-node": ok & ~present}
    if prune:
        dopt = kept["distributed_optimizer"].to_numpy(bool)
        od = _grid_twin(present, combos, lambda c: c["overlap_grad_reduce"] and not c["overlap_param_gather"],
                        {"overlap_param_gather": True}) & dopt[:, None]
        present &= ~od
        saw = _grid_twin(present, combos, lambda c: c["tp_comm_overlap"], {"tp_comm_overlap": False}) \
            & (kept["tp"].to_numpy() == 1)[:, None]
        if "overlap_p2p_comm" in BOOL_TIME_FLAGS:
            saw |= _grid_twin(present, combos, lambda c: c["overlap_p2p_comm"], {"overlap_p2p_comm": False}) \
                & (kept["vpp"].to_numpy() == 1)[:, None]
        masks.update({"overlap-dominated": od, "same-as-without": saw})
    out = {rule: m[ok] for rule, m in masks.items()}
    # the distributed optimizer's tie: its twin is another row of ``kept`` (rare: dp·cp = 1), looked up among the
    # expanded rows the other rules keep (its predicate reads overlap_param_gather, off in ``kept``)
    if prune and (_dopt_tie(kept)[:, None] & ~flag("overlap_param_gather")[None, :] & present).any():
        left = np.flatnonzero(present[ok])
        rows, which = np.nonzero(ok)
        out["same-as-without"][left] |= _dopt_same_as_without(expand_cells(kept, combos, rows[left], which[left]))
    return out


BOUND = "lower_bound_s"  # the column of the candidates' lower bound (llmcomm.tune.bound) while they are searched
FIRST_CHUNK = 512  # rows evaluated before the first threshold; each later chunk twice the previous
# rows evaluated with a chunk beyond its own and the next one's, where that is every row under the threshold (about
# the rows iteration_times evaluates in its fixed cost per call: _branch_and_bound)
SPECULATE_ROWS = 2048


def branch_and_bound(cands: pd.DataFrame, evaluate: Any, top: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(table, beyond)``: the candidates evaluated (``evaluate(frame)`` adds ``total_s``), in chunks in the
    order of their lower bound (column :data:`BOUND`, :mod:`llmcomm.tune.bound`), and those never evaluated
    because their bound is above the ``top``-th smallest time found so far.

    Safe: a row whose bound ``b`` exceeds the ``top``-th smallest time ``t_top`` among rows already evaluated
    has ``total_s ≥ b > t_top``, so at least ``top`` evaluated rows are strictly faster and it is not among the
    first ``top`` of the full ranking (ties at ``t_top`` are kept: ``b ≤ t_top`` is evaluated). The first
    ``top`` rows of ``table`` sorted by ``total_s`` are therefore those of evaluating every row (ties ordered as
    :func:`tune` orders them, by the other columns); ``tests/test_tune.py`` checks it against the search
    without the bound."""
    table, evaluated = _branch_and_bound(cands, evaluate, top)
    return table, cands[~evaluated]


def _branch_and_bound(cands: pd.DataFrame, evaluate: Any, top: int) -> tuple[pd.DataFrame, np.ndarray]:
    """:func:`branch_and_bound` with the rows evaluated as a mask.

    The chunks are those of the sequential search (each twice the previous, each row kept where its bound is not
    above the threshold of the times before it); the evaluation of a chunk also takes the rows of the next chunk
    whose bound is not above the current threshold, which can only fall, so that the next chunk's rows are among
    them (or every row under it, where they are at most :data:`SPECULATE_ROWS` more): one call of ``evaluate`` per
    two chunks or fewer instead of one per chunk (each call has a fixed cost of tens of milliseconds). The rows a chunk evaluates, their order and their times are those of the
    sequential search: the formulation is elementwise (:func:`llmcomm.overhead.iteration._evaluate`), a row's
    time does not depend on the rows evaluated with it."""
    bound = cands[BOUND].to_numpy()
    order = np.argsort(bound, kind="stable")
    blocks: list[pd.DataFrame] = []  # the frames evaluate returned
    where = np.full(len(cands), -1, np.int64)  # each evaluated row's position in the blocks, concatenated
    row_time = np.zeros(len(cands))
    picked: list[np.ndarray] = []  # per chunk: the rows the sequential search evaluates there
    evaluated = np.zeros(len(cands), bool)
    times = np.zeros(0)
    at, chunk, filled = 0, FIRST_CHUNK, 0
    while at < len(order):
        thr = np.partition(times, top - 1)[top - 1] if len(times) >= top else np.inf
        if bound[order[at]] > thr:  # every later row's bound is above too
            break
        sel = order[at:at + chunk]
        sel = sel[bound[sel] <= thr]
        if (where[sel] < 0).any():  # this chunk's rows and the next chunk's under the threshold, not yet evaluated
            span = chunk
            if np.isfinite(thr):  # every row under the threshold where they are few, else the next chunk's
                under = int(np.searchsorted(bound[order[at:]], thr, side="right"))  # bound[order] is sorted
                span = under if under <= 3 * chunk + SPECULATE_ROWS else 3 * chunk
            more = order[at:at + span]
            more = more[(bound[more] <= thr) & (where[more] < 0)]
            part = evaluate(cands.iloc[more].drop(columns=[BOUND]).reset_index(drop=True))
            blocks.append(part)
            where[more] = filled + np.arange(len(more))
            row_time[more] = part["total_s"].to_numpy()
            filled += len(more)
        picked.append(sel)
        evaluated[sel] = True
        times = np.concatenate([times, row_time[sel]])
        at, chunk = at + chunk, 2 * chunk
    if not picked:
        return pd.concat([evaluate(cands.iloc[:0].drop(columns=[BOUND]))], ignore_index=True), evaluated
    done = pd.concat(blocks, ignore_index=True)
    return done.iloc[where[np.concatenate(picked)]].reset_index(drop=True), evaluated


# ----------------------------------------------------------------------------------- explanations
def has_split(model: ModelSpec, gpus: int, global_batch: int) -> bool:
    """Whether some tp·pp·dp = ``gpus`` satisfies the divisibility rules of :mod:`.space` (a quick check)."""
    return next(splits(model, gpus, global_batch), None) is not None


def _no_split_error(model: ModelSpec, gpus: int, global_batch: int) -> ConfigError:
    # the counts has_split accepts are exactly t·p·d with t | gcd(heads, groups, ffn), p | layers, d | batch:
    # enumerate those products instead of testing every count in [gpus/2, 2·gpus] (minutes at 10⁶ GPUs)
    g = math.gcd(model.num_attention_heads, model.query_groups, model.ffn_hidden_size)
    valid = {t * p * d for t in divisors(g) for p in divisors(model.num_layers) for d in divisors(global_batch)}
    near = sorted(n for n in valid if max(1, gpus // 2) <= n <= gpus * 2)
    closest = sorted(near, key=lambda n: (abs(n - gpus), n))[:4]
    dps = sorted({gpus // (t * p) for t in divisors(gpus) for p in divisors(gpus // t)})
    return ConfigError(
        f"{model.name} on {gpus} GPUs with global batch {global_batch}: no tp·pp·dp split is valid (tp must "
        f"divide {model.num_attention_heads} heads, pp the {model.num_layers} layers, dp the global batch; "
        f"possible dp sizes {dps[:12]}); GPU counts that work with this batch: {closest}")


def _does_not_fit_error(model: ModelSpec, gpus: int, cluster: Cluster, global_batch: int, seq_len: int,
                        space: SearchSpace, memory_fraction: float, least: float) -> ConfigError:
    from ..overhead.memory import memory_table

    budget = memory_fraction * cluster.gpu_memory_bytes
    fits_at = None
    # the hint's search is bounded like the tuner itself (llmcomm.bounds.MAX_TUNE_GPUS): up to 256x the GPUs asked
    # for, never past the bound (2x of a count near it would enumerate a space the tuner refuses)
    tried = [gpus * f for f in (2, 4, 8, 16, 32, 64, 128, 256) if gpus * f <= bounds.MAX_TUNE_GPUS]
    for n in tried:
        cands = enumerate_base(model, n, global_batch, seq_len, space)
        if len(cands) and (memory_table(model, cands)["total_bytes"] <= budget).any():
            fits_at = n
            break
    if fits_at:
        hint = (f"; with global batch {global_batch} the smallest power-of-two multiple of {gpus} GPUs on which a "
                f"configuration fits is {fits_at}")
    elif tried:
        hint = f"; it does not fit on {tried[-1]} GPUs either" + (
            f" (the most the tuner enumerates is {bounds.MAX_TUNE_GPUS:,})" if tried[-1] < gpus * 256 else "")
    else:
        hint = (f"; no larger GPU count is searched: {2 * gpus:,} is above the {bounds.MAX_TUNE_GPUS:,} the tuner"
                " enumerates")
    return ConfigError(
        f"{model.name} does not fit on {gpus} {cluster.gpu} GPUs: the least memory any configuration needs is "
        f"{least / 1e9:.1f} GB per GPU, above {memory_fraction:.0%} of {cluster.gpu_memory_bytes / 1e9:.0f} GB"
        + hint)


# ------------------------------------------------------------------------------------------ search
def tune(model: ModelSpec | str, gpus: int, cluster: Cluster | str, global_batch: int, seq_len: int | None = None,
         *, space: SearchSpace | dict | None = None, prune: bool = True, bandwidth: Any = None,
         utilization: Any = None, memory_fraction: float = 0.9, exact_top: int | None = 10) -> TuneResult:
    """Rank every valid configuration of ``model`` on ``gpus`` GPUs of ``cluster`` by predicted iteration time.

    ``memory_fraction``: the share of GPU memory a configuration may use (the rest is left to the CUDA context,
    NCCL buffers and fragmentation). Raises :class:`ConfigError` saying what would work when no configuration
    is valid or none fits. ``exact_top`` (with ``prune``): the branch-and-bound on the compute-only lower
    bound (rule ``lower-bound``, :func:`branch_and_bound`) keeps the first ``exact_top`` rows of ``table`` equal
    to those of the search without it (``None``: no bound, every row the other rules keep is evaluated)."""
    from ..overhead.iteration import iteration_times
    from ..overhead.memory import memory_table

    t0 = time.perf_counter()
    model = load_model(model) if isinstance(model, str) else model
    cluster = load_cluster(cluster) if isinstance(cluster, str) else cluster
    if not isinstance(gpus, (int, np.integer)) or gpus < 1:
        raise ConfigError(f"gpus={gpus!r} must be a positive integer")
    check_tune_gpus(int(gpus))  # llmcomm.bounds: refused with the limit, not enumerated for minutes
    if not isinstance(global_batch, (int, np.integer)) or global_batch < 1:
        raise ConfigError(f"global_batch={global_batch!r} must be a positive integer")
    if cluster.num_gpus is not None and cluster.num_gpus < gpus:
        raise ConfigError(f"cluster {cluster.name} holds {cluster.num_gpus} GPUs, fewer than gpus={gpus}")
    space = space if isinstance(space, SearchSpace) else SearchSpace.from_dict(space)
    space = space.for_cluster(cluster)
    if not model.is_moe and (space.etp is not None or any(e != 1 for e in space.ep or ())):
        raise ConfigError(f"space: ep={space.ep!r}, etp={space.etp!r} on {model.name}, which has no experts: expert "
                          "parallelism and expert TP apply to MoE models only (leave ep and etp unset)")
    if not cluster.peak_fp8_flops and any(v is not None for v in space.fp8 or ()):
        raise ConfigError(f"space: fp8={space.fp8!r} on {cluster.name}, whose GPU ({cluster.gpu}) states no FP8 "
                          "peak (peak_fp8_flops): only fp8=None (BF16) can run there")
    s = seq_len or model.seq_length
    # the time-only flags off (space.expand_time_flags); pruned: without the rows two rules remove whatever the
    # memory budget (space.dominated_combinations), each counted in the row that dominates it
    base, base_table = base_and_table(model, gpus, global_batch, s, space, dominated=prune)
    combos, flag_ok = time_flag_grid(model, base, space)
    flags = flag_ok.sum(axis=1, dtype=np.int64)  # time_flag_multiplicity
    twins = [base.pop(c).to_numpy() if c in base else np.zeros(len(base), np.int64) for c in TWIN_COLUMNS]
    enumerated = int((flags * (1 + sum(twins))).sum())
    check_tune_candidates(enumerated)
    if enumerated == 0:
        raise _no_split_error(model, gpus, global_batch)
    mem = memory_table(model, base_table)  # the same rows as a table (no DataFrame conversion)
    base = pd.concat([base, mem], axis=1)
    budget = memory_fraction * cluster.gpu_memory_bytes
    fits = base["total_bytes"].to_numpy() <= budget
    if not fits.any():
        raise _does_not_fit_error(model, gpus, cluster, global_batch, s, space, memory_fraction,
                                  float(base["total_bytes"].min()))
    # the removed rows as (rule, rows, configurations they stand for, how to build them): the frame of them all
    # (TuneResult.pruned) is built on first read, the counts now
    removed: list[tuple[str, int, int, Any]] = []

    def remove(rule: str, frame: pd.DataFrame | Any, drop: np.ndarray, rows: np.ndarray | int, **assign: Any
               ) -> None:  # frame: the rows, or a function taking the mask to the rows it removes
        n = int(np.count_nonzero(drop))
        stands = int(np.sum(rows)) if isinstance(rows, np.ndarray) else n * rows
        take = frame if callable(frame) else (lambda d: frame[d])
        removed.append((rule, n, stands, lambda: take(drop).drop(columns=[BOUND], errors="ignore").assign(
            rule=rule, **assign, rows=rows)))

    # a memory-model row removed stands for its time-flag combinations (column ``rows``), removed by the same rule
    # (each removed row is a row of base, by its index, or its twin in attention_backend / fp8_param_gather, which
    # no rule of the time-only flags reads: the same multiplicity)
    remove("memory", base, ~fits, flags[~fits])
    for rule, k, change in (("unfused-dominated", 0, {"attention_backend": "unfused"}),
                            ("fp8-param-gather-dominated", 1, {"fp8_param_gather": False}),
                            ("recompute-dominated", 2, {"recompute": "selective"})):
        if twins[k].any():  # the left-out twins, one row per dominating row standing for all of them
            has = twins[k] > 0
            remove(rule, base, has, flags[has] * twins[k][has], **change)
    kept = base[fits]
    if prune:  # rules on the memory-model rows: each holds for every combination of the time-only flags
        # each rule reads the dimensions only (its twins: equal in all of them): applied to those columns, the
        # rows it removes taken from base (whose index is its rows' positions) when the pruned frame is built
        narrow = kept[[c for c in DIMENSIONS if c in kept.columns]]
        partial = partial_modules(model)
        for rule, fn in (("recompute-dominated", lambda c: recompute_dominated(c, partial)),
                         ("unfused-dominated", unfused_dominated),
                         ("fp8-param-gather-dominated", fp8_param_gather_dominated),
                         ("same-as-without", same_as_without)):
            drop = fn(narrow)
            at = narrow.index.to_numpy()[drop]
            remove(rule, base, np.isin(np.arange(len(base)), at), flags[at])
            narrow = narrow[~drop]
        kept = base.iloc[narrow.index.to_numpy()]
    cluster_n = cluster if cluster.num_gpus is not None else cluster.for_world(gpus)
    # not a pruning rule, a rule of the software: userbuffers cannot span nodes (iteration.USERBUFFERS_RULE), read
    # per distinct rank layout; then the pruning rules of the time-only flags, on the grid of rows × combinations
    bounded = prune and exact_top is not None
    key = compute_key(kept) if bounded else None  # the bound's key reads none of the time-only flags
    ok = flag_ok[kept.index.to_numpy()]
    drops = flag_drops(kept, combos, ok, _tp_spans_nodes(kept, cluster_n), prune)
    rows, which = np.nonzero(ok)  # the expanded rows (space.expand_by_grid), each taken from kept once, when needed
    for rule, drop in drops.items():
        remove(rule, lambda d, k=kept: expand_cells(k, combos, rows[d], which[d]), drop, 1)
    stay = ~np.logical_or.reduce(list(drops.values())) if drops else np.ones(len(rows), bool)
    kept = expand_cells(kept, combos, rows[stay], which[stay])
    bounded = bounded and len(kept) > 0
    if bounded:  # the lower bound of each row (llmcomm.tune.bound)
        t_bound = time.perf_counter()
        assert key is not None  # computed above whenever bounded
        key = key[np.nonzero(ok)[0][stay]]  # each expanded row's memory-model row (space.expand_by_grid's order)
        kept = kept.assign(**{BOUND: lower_bounds(model, kept, cluster_n, bandwidth, utilization, key=key)})
        bound_s = time.perf_counter() - t_bound
    t_eval = time.perf_counter()
    if bounded:
        kept = kept.reset_index(drop=True)
        table, evaluated = _branch_and_bound(kept, lambda c: iteration_times(
            model, c, cluster_n, bandwidth, utilization), int(exact_top or 0))
        remove("lower-bound", kept, ~evaluated, 1)
    else:
        table = iteration_times(model, kept.reset_index(drop=True), cluster_n, bandwidth, utilization)
    eval_s = time.perf_counter() - t_eval
    flops = _iteration_flops(model, table)
    table["tokens_per_s"] = table["global_batch"] * table["seq_len"] / table["total_s"]
    table["tflops_per_gpu"] = flops / table["total_s"] / gpus / 1e12
    table = table.sort_values(["total_s", "tp", "pp", "micro_batch"], kind="stable").reset_index(drop=True)
    by_rule: dict[str, int] = {}
    for rule, n, stands, _ in removed:  # in the order rules first remove a row (a groupby of the frame)
        if n:
            by_rule[rule] = by_rule.get(rule, 0) + stands
    stats = {"enumerated": enumerated, "evaluated": len(table), "pruned": sum(by_rule.values()),
             "pruned_by_rule": dict(sorted(by_rule.items(), key=lambda kv: -kv[1])), "prune": prune,
             "wall_s": time.perf_counter() - t0, "evaluate_s": eval_s}
    if bounded:
        stats["bound_s"] = bound_s
    pieces = [build for *_, build in removed]

    def pruned() -> pd.DataFrame:
        return pd.concat([build() for build in pieces], ignore_index=True)

    return TuneResult(table, pruned, stats, model, cluster_n, gpus, global_batch,
                      {"seq_len": s, "memory_fraction": memory_fraction})


def _tp_spans_nodes(cands: pd.DataFrame, cluster: Cluster) -> np.ndarray:
    """Per row: whether ``tp_comm_overlap`` would put its TP group across nodes
    (:func:`llmcomm.overhead.iteration.userbuffers_unavailable`, on one row per distinct rank layout: it reads
    the placement, :func:`llmcomm.step.placement`, of tp, cp, dp, pp, ep and expert TP)."""
    from ..overhead.iteration import userbuffers_unavailable

    if not len(cands):
        return np.zeros(0, bool)
    code = row_codes(cands, [c for c in ("tp", "cp", "dp", "pp", "ep", "etp") if c in cands])
    first = step.first_rows(code)  # row_codes numbers rows in order of first appearance: code is the inverse
    reps = cands.iloc[first].reset_index(drop=True).assign(tp_comm_overlap=True)
    return userbuffers_unavailable(ParallelTable.from_frame(reps), cluster.gpus_per_node)[code]


def _iteration_flops(model: ModelSpec, table: pd.DataFrame) -> np.ndarray:
    """Model FLOPs of one iteration, without recomputation (the useful work; Megatron-LM's MFU convention):
    ``3 · B · s · (linear + attention + logits)`` per token."""
    out = np.empty(len(table))
    for seq, rows in table.groupby("seq_len").indices.items():
        f = model.forward_flops(int(seq), model.padded_vocab_size(1))
        out[rows] = 3.0 * table["global_batch"].to_numpy()[rows] * seq * f.total
    return out


def rule_of_thumb(model: ModelSpec, gpus: int, cluster: Cluster, global_batch: int, seq_len: int | None = None,
                  memory_fraction: float = 0.9) -> dict[str, Any]:
    """The configuration a Megatron-LM user would start from: TP = GPUs per node, the smallest PP that fits in
    memory with even stages, micro-batch 1, no recomputation unless needed (then selective, then full), no distributed optimizer
    unless needed."""
    from ..overhead.memory import memory_table
    from ..vocab import RECOMPUTE_CODE

    # the largest TP within a node that the tuner's own rules accept (heads, query groups, FFN, vocabulary...)
    for tp in sorted(divisors(cluster.gpus_per_node), reverse=True):
        # even pipeline stages: the starting point of a user (uneven first/last stages are a tuning step, and
        # a lighter stage paired with the smallest fitting PP would otherwise be "the rule")
        space = SearchSpace(tp=(tp,), cp=(1,), micro_batch=(1,), vpp=(1,), sp=(False,), attention_backend=("auto",),
                            uneven=(False,), fsdp=(False,),  # a Megatron-LM user's start: no FSDP
                            recompute_modules=(None,),  # and Megatron-LM's default selective modules
                            **MEGATRON_DEFAULT_FLAGS)
        cands = enumerate_candidates(model, gpus, global_batch, seq_len, space)
        if not cands.empty:
            break
    else:
        raise _no_split_error(model, gpus, global_batch)
    mem = memory_table(model, cands)["total_bytes"]
    order = cands.assign(total_bytes=mem, level=cands["recompute"].map(RECOMPUTE_CODE)).sort_values(
        ["pp", "level", "distributed_optimizer"], kind="stable")
    ok = order[order["total_bytes"] <= memory_fraction * cluster.gpu_memory_bytes]
    if ok.empty:
        raise ConfigError(f"the rule of thumb (tp={tp}, micro-batch 1) fits {model.name} on no pipeline depth "
                          f"of {gpus} GPUs")
    return ok.iloc[0].drop(labels=["level"]).to_dict()
