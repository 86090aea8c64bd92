"""The formulation's mechanisms switched on one at a time: how much each changes one configuration's breakdown.

Given a *target* configuration (a recipe: the settings the run used), :func:`ablation` starts from the same
configuration with every mechanism of :data:`MECHANISMS` that the target uses switched off (the formulation as it
stood before issue 20: GEMMs at ``FLOPs/peak``, attention unfused, nothing overlapped, BF16) and switches them
back on in the stated order, cumulatively, one row per step::

    config_0 = target with every mechanism the target uses off             (baseline)
    config_k = target with the mechanisms k+1, ... still off               (step k: mechanism k on)
    delta_k  = total_s(config_k) − total_s(config_{k-1 applied})

Each row holds the :class:`~llmcomm.overhead.iteration.Breakdown` of its configuration: compute (forward +
backward + recomputation), the optimizer step, the pipeline bubble, the exposed communication per parallelism
(every term of :data:`llmcomm.overhead.iteration.COMM_TERMS`, read at call time so that terms added there appear
here) and the total with its 90 % interval (:mod:`llmcomm.overhead.interval`).

The order (:data:`MECHANISMS`): measured GEMM efficiency (the GPU's measured GEMM model,
:func:`~llmcomm.overhead.iteration.measured_gemm`, instead of ``FLOPs/peak``), ``attention_backend`` fused,
``tp_comm_overlap``, ``overlap_grad_reduce``, ``overlap_param_gather`` (Megatron-LM needs the previous one for
it), ``overlap_p2p_comm``, ``fp8`` (with its ``fp8_recipe`` and ``fp8_param_gather``), context parallelism
(``cp``; off: folded into DP on the same GPUs, ``dp·cp``) and ``fsdp`` (off: the distributed optimizer). A
mechanism whose :class:`~llmcomm.specs.ParallelConfig` field does not exist is left out (it is detected by field,
so mechanisms other modules add appear once their field exists); one the target does not use is left out; one the
formulation refuses (:class:`~llmcomm.errors.ConfigError`, e.g. ``cp > 1`` before context parallelism is
modelled) is listed with ``status = "refused"``, the error in ``note`` and no numbers, and stays off for the
steps after it, so the last applied row is what the formulation predicts for the target *less* the refused ones.

:func:`recipe_case` builds the target from one of NVIDIA's published DGX-H100 rows
(:mod:`llmcomm.overhead.nemo_rows`, the settings read from NVIDIA's performance scripts, as
:func:`llmcomm.overhead.validation.validate` predicts them), with its measured step time.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, UsageError
from ..specs import Cluster, ModelSpec, ParallelConfig
from ..vocab import FUSED_ATTENTION_BACKENDS
from . import interval as _interval
from . import iteration as it
from .capacity import MemoryWarning
from .utilization import Utilization

_FIELDS = frozenset(f.name for f in dataclasses.fields(ParallelConfig))
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ParallelConfig)}


@dataclass(frozen=True)
class Mechanism:
    """One mechanism of the formulation: the :class:`ParallelConfig` ``field`` it needs (``None``: none, it is a
    keyword of :func:`~llmcomm.overhead.iteration.iteration_time`), whether a target configuration uses it
    (``uses``), the changes that switch it off (``off``: config fields; ``off_kwargs``: keywords of
    ``iteration_time``) and what it stands for (``meaning``)."""

    name: str
    field: str | None
    uses: Callable[[ParallelConfig, Cluster], bool]
    off: Callable[[ParallelConfig], dict[str, Any]]
    meaning: str
    off_kwargs: tuple[tuple[str, Any], ...] = ()


def _flag(name: str) -> Callable[[ParallelConfig, Cluster], bool]:
    return lambda p, c: bool(getattr(p, name, False))


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism("measured GEMM efficiency", None, lambda p, c: it.measured_gemm(c) is not None,
              lambda p: {}, "linear GEMMs timed by the GPU's measured GEMM model instead of FLOPs / peak "
              "(llmcomm.overhead.gemm)", (("measured_gemms", False),)),
    Mechanism("attention_backend fused", "attention_backend",
              lambda p, c: p.attention_backend in FUSED_ATTENTION_BACKENDS, lambda p: {"attention_backend": "unfused"},
              "one fused attention kernel (causal FLOPs, no score-matrix traffic) instead of unfused"),
    Mechanism("tp_comm_overlap", "tp_comm_overlap", _flag("tp_comm_overlap"), lambda p: {"tp_comm_overlap": False},
              "TransformerEngine userbuffers: SP all-gather / reduce-scatter under the GEMMs they feed"),
    Mechanism("overlap_grad_reduce", "overlap_grad_reduce", _flag("overlap_grad_reduce"),
              lambda p: {"overlap_grad_reduce": False}, "DP gradient reduction bucketed under the backward"),
    Mechanism("overlap_param_gather", "overlap_param_gather", _flag("overlap_param_gather"),
              lambda p: {"overlap_param_gather": False},
              "distributed optimizer's parameter all-gather in the next iteration's forward"),
    Mechanism("overlap_p2p_comm", "overlap_p2p_comm", _flag("overlap_p2p_comm"), lambda p: {"overlap_p2p_comm": False},
              "interleaved schedule's pipeline send/recv asynchronous, under compute"),
    Mechanism("fp8", "fp8", lambda p, c: p.fp8 is not None,
              lambda p: {"fp8": None, "fp8_recipe": _DEFAULTS["fp8_recipe"], "fp8_param_gather": False},
              "TransformerEngine FP8 GEMMs (its recipe's casts as element-wise work; FP8 parameter all-gather)"),
    Mechanism("context parallelism", "cp", lambda p, c: p.cp > 1, lambda p: {"cp": 1, "dp": p.dp * p.cp},
              "sequence split over cp ranks (off: the cp ranks folded into DP, same GPUs)"),
    Mechanism("fsdp", "fsdp", _flag("fsdp"), lambda p: {"fsdp": False, "distributed_optimizer": True},
              "parameters, gradients and optimizer state sharded (off: the distributed optimizer)"),
)
NAMES = tuple(m.name for m in MECHANISMS)


def mechanisms(order: Sequence[str] | None = None) -> list[Mechanism]:
    """:data:`MECHANISMS` whose field exists on :class:`ParallelConfig`, in :data:`MECHANISMS`' order or in
    ``order`` (names of :data:`NAMES`; a name not there raises :class:`UsageError`)."""
    by_name = {m.name: m for m in MECHANISMS}
    if order is not None:
        bad = [n for n in order if n not in by_name]
        if bad:
            raise UsageError(f"ablation: order names {bad}, not mechanisms (known: {list(NAMES)})")
    chosen = [by_name[n] for n in order] if order is not None else list(MECHANISMS)
    return [m for m in chosen if m.field is None or m.field in _FIELDS]


def _change(m: Mechanism, target: ParallelConfig) -> str:
    off = m.off(target)
    if not off:
        return f"{m.name}: off -> on"
    return ", ".join(f"{k}: {off[k]!r} -> {getattr(target, k)!r}" for k in off if off[k] != getattr(target, k))


def ablation(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, bandwidth: Any = None,
             utilization: Utilization | None = None, *, order: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per step (module docstring): ``step`` (0: baseline), ``mechanism``, ``change`` (field: off ->
    target value), ``status`` (``baseline``, ``on``, ``refused``), ``note`` (the refusal), every term of
    :data:`~llmcomm.overhead.iteration.TERMS` (read at call time), ``compute_s`` (forward + backward +
    recomputation), ``exposed_comm_s``, ``total_s``, ``comm_overhead``, ``delta_s`` (against the previous applied step),
    ``delta_share`` (of the baseline total), ``total_s_lo``/``total_s_hi`` (90 % interval, where shipped) and
    ``fits_memory`` (no :class:`~llmcomm.overhead.capacity.MemoryWarning`). The baseline itself breaking a rule
    raises its :class:`ConfigError`."""
    used = [m for m in mechanisms(order) if m.uses(parallel, cluster)]
    terms = tuple(it.TERMS)  # read at call time: terms added to the formulation appear here
    on: set[str] = set()
    rows: list[dict[str, Any]] = []
    prev = None
    for k in range(len(used) + 1):
        m = used[k - 1] if k else None
        active = on | ({m.name} if m else set())
        changes: dict[str, Any] = {}
        kwargs: dict[str, Any] = {}
        for mm in reversed(used):  # every mechanism not (yet) on is switched off
            if mm.name not in active:
                changes.update(mm.off(parallel))
                kwargs.update(dict(mm.off_kwargs))
        row: dict[str, Any] = {"step": k, "mechanism": m.name if m else "baseline",
                               "change": _change(m, parallel) if m else "every mechanism below off",
                               "meaning": m.meaning if m else "", "note": ""}
        try:
            cfg = dataclasses.replace(parallel, **changes)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", MemoryWarning)
                b = it.iteration_time(model, cfg, cluster, bandwidth, utilization, **kwargs)
        except ConfigError as e:
            if m is None:
                raise
            rows.append({**row, "status": "refused", "note": str(e)})
            continue
        if m is not None:
            on.add(m.name)
        total = b.total_s
        row.update(status="on" if m else "baseline", **{t: getattr(b, t) for t in terms}, compute_s=b.compute_s,
                   exposed_comm_s=b.exposed_comm_s, total_s=total, comm_overhead=b.comm_overhead,
                   delta_s=0.0 if prev is None else total - prev,
                   fits_memory=not any(issubclass(w.category, MemoryWarning) for w in caught))
        iv = _interval.apply(np.array([total]))
        if iv is not None:
            row["total_s_lo"], row["total_s_hi"] = float(iv[0][0]), float(iv[1][0])
        prev = total
        rows.append(row)
    out = pd.DataFrame(rows)
    base = float(out.loc[0, "total_s"])
    out["delta_share"] = out["delta_s"] / base
    return out


def ablation_terms(table: pd.DataFrame) -> pd.DataFrame:
    """The applied steps of :func:`ablation` in the long form of
    :meth:`~llmcomm.overhead.iteration.Breakdown.to_frame` (``row``, ``term``, ``seconds``, ``kind``: each term
    of :data:`~llmcomm.overhead.iteration.TERMS`, ``comm`` for the communication terms, ``idle`` for the
    bubble) for :func:`llmcomm.plots.breakdown_bars`."""
    terms = [(t, "comm" if t in it.COMM_TERMS else "idle" if t == "bubble_s" else "compute")
             for t in it.TERMS if t in table.columns]
    applied = table[table["status"] != "refused"]
    rows = []
    for _, r in applied.iterrows():
        label = f"{int(r['step'])} · " + ("baseline" if r["step"] == 0 else f"+ {r['mechanism']}")
        for col, kind in terms:
            rows.append({"row": label, "term": col.removesuffix("_s"), "seconds": float(r[col]), "kind": kind})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class RecipeCase:
    """A published run as a target for :func:`ablation`: the catalogue ``model``, its ``parallel``
    configuration (sizes from the table, settings from NVIDIA's recipe file), the ``cluster`` sized to its GPUs,
    the ``measured_s`` step time and a ``label``."""

    model: ModelSpec
    parallel: ParallelConfig
    cluster: Cluster
    measured_s: float
    label: str


def recipe_case(container: str, model: str) -> RecipeCase:
    """The DGX-H100 row of ``container`` and table ``model`` name (e.g. ``"25.11"``, ``"LLAMA3_70B"``) as
    :func:`llmcomm.overhead.validation.validate` plans it (:mod:`llmcomm.overhead.nemo_rows`). Raises
    :class:`UsageError` when there is no such row, or when the formulation has no column for one of its settings
    (named)."""
    from ..specs import load_cluster, load_model
    from . import nemo_rows, validation

    rows = nemo_rows.read()
    hit = rows[(rows["container"].astype(str) == str(container)) & (rows["model"] == model)]
    if len(hit) != 1:
        raise UsageError(f"recipe_case: {len(hit)} rows of {nemo_rows.FILE} have container={container!r} and "
                         f"model={model!r} (need exactly one)")
    row = hit.iloc[0]
    st, cand, missing, _ = validation._plan(row, ())
    if st.model is None or missing:
        raise UsageError(f"recipe_case: {model} ({container}) cannot be expressed: "
                         f"{st.model_issue if st.model is None else ', '.join(missing)}")
    unknown = sorted(set(cand) - _FIELDS)
    if unknown:
        raise UsageError(f"recipe_case: {model} ({container}) sets {unknown}, not ParallelConfig fields")
    n = int(row["num_gpus"])
    label = f"{model} {container} ({row['precision']}) on {n} H100s"
    return RecipeCase(load_model(st.model), ParallelConfig(**cand), load_cluster(nemo_rows.CLUSTER).for_world(n),
                      float(row["time_s"]), label)
