"""MoE predictability (finding F4): what of expert-parallel traffic is fixed, what only bounded, how routing
evolves over training, and how well the next iteration's all-to-all matrix can be predicted.

Inputs are an events table (:attr:`llmcomm.trace.Trace.events`) or a routing table
(:attr:`llmcomm.trace.Trace.routing`: ``iteration, microbatch, layer, src_rank, expert, tokens``, one row per
rank, MoE layer, micro-batch and expert). Outputs are numbers or tidy DataFrames.

Matrices
--------
* :func:`ep_matrices`: the dispatch matrix of each EP group from routing counts,
  ``D[r, j] = Σ_{e on j} tokens(r → e)`` (expert ``e`` lives on EP position ``e // (E/ep)``), optionally
  times ``bytes_per_token = h·act``; tidy cells ``(keys…, ep_group, src, dst, value)``.
* :func:`a2a_cells`: the matrices recorded in an events table: rank ``r``'s ``split_bytes`` is row ``r`` of
  its call's matrix. Calls are matched across ranks by (iteration, micro-batch, layer, group, ordinal of the
  all-to-all in that rank's issue order).
* :func:`matrix_stack`: tidy cells → ``(keys, array[n, ep, ep])``.

Metrics
-------
* :func:`uniformity_stats`, over the ``n`` cells ``x`` of a matrix or load vector, ``μ = mean x``:
  coefficient of variation ``CV = σ/μ`` (population σ); Gini ``G = Σ_i Σ_j |x_i − x_j| / (2 n² μ)``;
  ``max/mean``; normalized entropy ``H = −Σ p_i ln p_i / ln n`` with ``p = x/Σx``. Uniform: (0, 0, 1, 1);
  a permutation matrix of size ``m`` (``n = m²``): ``(√(m−1), 1 − 1/m, m, 1/2)``.
* :func:`a2a_identities`: for the four payload all-to-alls of a layer and micro-batch (forward dispatch
  ``F1``, forward combine ``F2``, backward ``B1``, ``B2`` in issue order) whether each pair is equal
  (``A = B``), a transpose (``A = Bᵀ``), both (symmetric) or neither — measured, not assumed.
* :func:`consecutive_distance`: ``d_t = ‖M_t − M_{t−1}‖₁ / ‖M_{t−1}‖₁`` per layer (and EP group).
* :func:`load_autocorrelation`: the ACF (:func:`llmcomm.analysis.temporal.autocorrelation`) of each
  expert's share of a layer's load over iterations.
* :func:`sequence_variation`: call-by-call comparison of each iteration with a reference iteration on
  ``(op, group, bytes)``, summarized per (parallelism, op, phase, dtype): which calls vary.

Predictors of the next iteration's matrix (:func:`predictor_errors`), error ``‖P_t − M_t‖₁ / ‖M_t‖₁``:
``uniform`` ``P_t[r, j] = Σ_j' M_t[r, j'] / ep`` (the row totals are fixed before the run, so this is what
``predict_traffic`` gives without routing); ``last`` ``P_t = M_{t−1}``; ``ema`` ``S_t = α M_{t−1} +
(1 − α) S_{t−1}``, ``S_1 = M_0``; ``window`` ``P_t = (1/w) Σ_{i=1..w} M_{t−i}``. All use only iterations
before ``t``: nothing is fitted on the iteration it predicts.

:func:`exact_bounded_split`: the shares of all-to-all bytes that are exact before the run (cells, rows,
columns or calls whose bytes never change) and that are only bounded (``[min, max]`` over training).

Tables over runs and training phases (notebook 09): :func:`call_variation_table` (dense against MoE against a
replay, each against its :func:`reference_iteration`), :func:`uniformity_over_training`, :func:`phase_means`
and :func:`phase_pivot` over the :func:`training_phase` (``early``: the first ``window`` iterations, ``late``:
the last), :func:`dispatch_exact_bounded`, :func:`envelope_summary`, :func:`routed_uniform_split`,
:func:`position_duration_spread`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..errors import AnalysisError, DataError
from ..layout import Layout
from ..specs import ModelSpec, ParallelConfig
from ..vocab import DTYPE_BYTES, ROUTING_COLUMNS, AlgorithmName
from .repeatability import in_issue_order, repeatability
from .temporal import autocorrelation

INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "bool")


# ------------------------------------------------------------------------------------------ helpers
def _check_routing(routing: pd.DataFrame | None) -> pd.DataFrame:
    if routing is None or not isinstance(routing, pd.DataFrame):
        raise DataError("routing: expected a routing table (Trace.routing), got None; "
                        "only MoE runs recorded by llmcomm.collect carry one")
    missing = [c for c in ROUTING_COLUMNS if c not in routing.columns]
    if missing:
        raise DataError(f"routing lacks column(s) {missing}; expected {list(ROUTING_COLUMNS)}")
    if (routing["tokens"] < 0).any():
        raise DataError("routing column 'tokens' has negative counts")
    return routing


def _parallel(parallel: ParallelConfig | Mapping[str, Any]) -> ParallelConfig:
    return parallel if isinstance(parallel, ParallelConfig) else ParallelConfig.from_dict(dict(parallel))


def _recorded_moe(trace: Any) -> tuple[ModelSpec, ParallelConfig, int]:
    """A recorded MoE trace's model spec and parallel configuration (:meth:`llmcomm.trace.Trace.model_spec`,
    :meth:`~llmcomm.trace.Trace.parallel_config`) and dispatch bytes per token ``h · act``."""
    spec, par = trace.model_spec(), trace.parallel_config()
    return spec, par, spec.hidden_size * DTYPE_BYTES[par.act_dtype]


def matrix_stack(cells: pd.DataFrame, keys: Sequence[str], value: str = "value") -> tuple[pd.DataFrame, np.ndarray]:
    """Tidy cells (``keys…, src, dst, value``) → ``(key table, array[n, m, m])`` with ``m = max(src,dst)+1``,
    rows sorted by ``keys``; missing cells are 0."""
    keys = list(keys)
    m = int(max(cells["src"].max(), cells["dst"].max())) + 1
    k = cells[keys].drop_duplicates().sort_values(keys, ignore_index=True) if keys else pd.DataFrame(index=[0])
    idx = (pd.MultiIndex.from_frame(k).get_indexer(pd.MultiIndex.from_frame(cells[keys])) if keys
           else np.zeros(len(cells), dtype=np.int64))
    arr = np.zeros((len(k), m, m))
    np.add.at(arr, (idx, cells["src"].to_numpy(np.int64), cells["dst"].to_numpy(np.int64)),
              cells[value].to_numpy(np.float64))
    return k, arr


def _groups(k: pd.DataFrame, keys: list[str]) -> list[np.ndarray]:
    if not keys:
        return [np.arange(len(k))]
    return [np.asarray(v) for v in k.groupby(keys, sort=True).indices.values()]


def _matrix_series(cells: pd.DataFrame, keys: Sequence[str], time: str
                   ) -> Iterator[tuple[pd.DataFrame, np.ndarray, np.ndarray]]:
    """Per group of ``keys``: the stacked keys table, the group's row positions in it, and its matrices in
    ``time`` order (shape ``(steps, n, n)``)."""
    keys = list(keys)
    k, arr = matrix_stack(cells, [*keys, time])
    for idx in _groups(k, keys):
        yield k, idx, arr[idx]


# ------------------------------------------------------------------------------------------ matrices
def ep_matrices(routing: pd.DataFrame, parallel: ParallelConfig | Mapping[str, Any], num_experts: int, *,
                bytes_per_token: float = 1.0, per_microbatch: bool = False) -> pd.DataFrame:
    """Dispatch matrices from routing counts: cells ``iteration, layer, [microbatch,] ep_group, src, dst,
    value`` with ``value = bytes_per_token · Σ_{e on dst} tokens(src → e)`` (summed over micro-batches
    unless ``per_microbatch``). ``src``/``dst`` are positions in the EP group (row ``ep_group`` of
    ``Layout.groups('ep')``)."""
    r = _check_routing(routing)
    par = _parallel(parallel)
    ep = par.ep
    if num_experts % ep:
        raise DataError(f"num_experts={num_experts} is not divisible by ep={ep}")
    groups = Layout(par).groups("ep")
    row = np.full(par.world_size, -1)
    pos = np.full(par.world_size, -1)
    row[groups.ravel()] = np.repeat(np.arange(len(groups)), groups.shape[1])
    pos[groups.ravel()] = np.tile(np.arange(groups.shape[1]), len(groups))
    src = r["src_rank"].to_numpy(np.int64)
    if (src < 0).any() or (src >= par.world_size).any():
        raise DataError(f"routing column 'src_rank' has ranks outside 0..{par.world_size - 1}")
    keys = ["iteration", "layer"] + (["microbatch"] if per_microbatch else [])
    df = pd.DataFrame({**{k: r[k].to_numpy() for k in keys}, "ep_group": row[src], "src": pos[src],
                       "dst": r["expert"].to_numpy(np.int64) // (num_experts // ep),
                       "value": r["tokens"].to_numpy(np.float64) * bytes_per_token})
    return df.groupby(keys + ["ep_group", "src", "dst"], as_index=False, sort=True)["value"].sum()


def routing_matrices(trace: Any, *, per_microbatch: bool = False) -> pd.DataFrame:
    """:func:`ep_matrices` of a recorded MoE trace in bytes (``bytes_per_token = h · act`` from its
    manifest)."""
    if trace.routing is None:
        raise DataError("trace has no routing table (not an MoE run recorded by llmcomm.collect)")
    spec, par, bpt = _recorded_moe(trace)
    return ep_matrices(trace.routing, par, spec.num_experts, per_microbatch=per_microbatch, bytes_per_token=bpt)


def iteration_matrices(trace: Any, algorithm: AlgorithmName = "direct", **filters: Any) -> pd.DataFrame:
    """The whole communication matrix of each iteration of any trace (dense or MoE): cells ``iteration,
    src, dst, value`` (bytes of :meth:`llmcomm.trace.Trace.flows`; ``direct`` leaves out what a rank sends
    itself)."""
    f = trace.flows(algorithm, **filters)
    return (f.groupby(["iteration", "src", "dst"], as_index=False, sort=True)["bytes"].sum()
            .rename(columns={"bytes": "value"}))


def expert_load(routing: pd.DataFrame) -> pd.DataFrame:
    """Tokens routed to each expert per iteration and layer (all ranks and micro-batches): ``iteration,
    layer, expert, tokens, share`` with ``share = tokens / Σ_e tokens``."""
    r = _check_routing(routing)
    load = r.groupby(["iteration", "layer", "expert"], as_index=False, sort=True)["tokens"].sum()
    load["share"] = load["tokens"] / load.groupby(["iteration", "layer"])["tokens"].transform("sum")
    return load


def a2a_cells(events: pd.DataFrame, *, payload_only: bool = True) -> pd.DataFrame:
    """The all-to-all matrices of an events table as tidy cells: ``iteration, microbatch, layer, group,
    call, phase, dtype, src, dst, value`` — ``call`` is the ordinal of the all-to-all among those of the same
    (iteration, micro-batch, layer, group) in the rank's issue order, ``src``/``dst`` are positions in the
    group, ``value`` the bytes of ``split_bytes``. ``payload_only`` drops integer-typed calls (the token-count
    exchange). Calls that not every group member recorded, or whose splits do not match the group size, raise
    :class:`DataError`."""
    e = events[events["op"] == "all_to_all"]
    if payload_only:
        e = e[~e["dtype"].astype(str).isin(INT_DTYPES)]
    if e.empty:
        return pd.DataFrame(columns=["iteration", "microbatch", "layer", "group", "call", "phase", "dtype",
                                     "src", "dst", "value"])
    e = in_issue_order(e)
    e["group"] = [tuple(int(x) for x in g) for g in e["group"]]
    e["call"] = e.groupby(["rank", "iteration", "microbatch", "layer", "group"], sort=False).cumcount()
    sizes = e["group"].map(len).to_numpy()
    splits = e["split_bytes"].to_list()
    if any(s is None or len(s) != n for s, n in zip(splits, sizes, strict=True)):
        raise DataError("events: an all_to_all lacks split_bytes or has as many splits as its group has ranks "
                        "not (rule: len(split_bytes) == len(group))")
    src = np.array([g.index(r) if r in g else -1 for g, r in zip(e["group"], e["rank"], strict=True)])
    if (src < 0).any():
        raise DataError("events: an all_to_all's rank is not in its group")
    rep = np.repeat(np.arange(len(e)), sizes)
    cells = pd.DataFrame({c: e[c].to_numpy()[rep] for c in ("iteration", "microbatch", "layer", "group", "call",
                                                            "phase", "dtype")})
    cells["dtype"] = cells["dtype"].astype(str)
    cells["src"] = src[rep]
    cells["dst"] = np.concatenate([np.arange(n) for n in sizes])
    cells["value"] = np.concatenate([np.asarray(s, dtype=np.float64) for s in splits])
    full = cells.groupby(["iteration", "microbatch", "layer", "group", "call"])["src"].transform("nunique")
    if (full != cells["group"].map(len)).any():
        raise DataError("events: an all_to_all was not recorded by every rank of its group; its matrix is "
                        "incomplete (record all ranks, or filter the trace to complete iterations)")
    return cells.reset_index(drop=True)


# ------------------------------------------------------------------------------------------ uniformity
def uniformity_stats(values: np.ndarray) -> pd.DataFrame:
    """Uniformity of each row of ``values`` (shape ``(n, cells)``; a 1-D array is one row): columns ``cv``,
    ``gini``, ``max_over_mean``, ``norm_entropy`` (module docstring). An all-zero row gives NaN."""
    x = np.atleast_2d(np.asarray(values, dtype=np.float64))
    n = x.shape[1]
    mu = x.mean(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cv = x.std(axis=1) / mu
        s = np.sort(x, axis=1)
        i = np.arange(1, n + 1)
        gini = (2 * (s * i).sum(axis=1)) / (n * s.sum(axis=1)) - (n + 1) / n
        p = x / x.sum(axis=1, keepdims=True)
        plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
        ent = -plogp.sum(axis=1) / np.log(n) if n > 1 else np.ones(len(x))
        mx = x.max(axis=1) / mu
    bad = mu <= 0
    out = pd.DataFrame({"cv": cv, "gini": gini, "max_over_mean": mx, "norm_entropy": ent})
    out.loc[bad, :] = np.nan
    return out


def matrix_uniformity(cells: pd.DataFrame, keys: Sequence[str] = ("iteration", "layer", "ep_group"), *,
                      include_self: bool = True) -> pd.DataFrame:
    """:func:`uniformity_stats` of each matrix of ``cells`` (one per ``keys``); ``include_self=False`` leaves
    out the diagonal (tokens a rank keeps, which never reach the network)."""
    k, arr = matrix_stack(cells, keys)
    m = arr.shape[-1]
    flat = arr.reshape(len(arr), -1) if include_self else arr[:, ~np.eye(m, dtype=bool)]
    return pd.concat([k, uniformity_stats(flat)], axis=1)


def load_uniformity(routing: pd.DataFrame) -> pd.DataFrame:
    """:func:`uniformity_stats` of each layer's expert load per iteration: ``iteration, layer, cv, …``."""
    load = expert_load(routing)
    wide = load.pivot_table(index=["iteration", "layer"], columns="expert", values="tokens", fill_value=0)
    return pd.concat([wide.index.to_frame(index=False), uniformity_stats(wide.to_numpy())], axis=1)


# ------------------------------------------------------------------------------------------ identities
def _relation(a: np.ndarray, b: np.ndarray) -> str:
    eq, tr = np.array_equal(a, b), np.array_equal(a, b.T)
    return "equal+transpose" if eq and tr else "equal" if eq else "transpose" if tr else "neither"


def a2a_identities(events: pd.DataFrame) -> pd.DataFrame:
    """For each (iteration, micro-batch, layer, group) with payload all-to-alls, every pair of its calls
    (in issue order, labelled ``forward 0``, ``forward 1``, ``backward 0``…): ``call_a, call_b, relation``
    with relation ``equal`` (``A = B``), ``transpose`` (``A = Bᵀ``), ``equal+transpose`` (symmetric) or
    ``neither``, compared byte for byte on the recorded ``split_bytes``."""
    cells = a2a_cells(events)
    keys = ["iteration", "microbatch", "layer", "group"]
    if cells.empty:
        return pd.DataFrame(columns=[*keys, "call_a", "call_b", "relation"])
    labels = cells.drop_duplicates([*keys, "call"]).sort_values([*keys, "call"])
    labels["label"] = labels["phase"].astype(str) + " " + labels.groupby([*keys, "phase"]).cumcount().astype(str)
    k, arr = matrix_stack(cells, [*keys, "call"])
    k = k.merge(labels[[*keys, "call", "label"]], on=[*keys, "call"], how="left")
    rows = []
    for key, idx in k.groupby(keys, sort=True).groups.items():
        idx = list(idx)
        for a in range(len(idx)):
            for b in range(a + 1, len(idx)):
                ia, ib = idx[a], idx[b]
                rows.append((*key, k.at[ia, "label"], k.at[ib, "label"], _relation(arr[ia], arr[ib])))
    return pd.DataFrame(rows, columns=[*keys, "call_a", "call_b", "relation"])


def identity_summary(identities: pd.DataFrame) -> pd.DataFrame:
    """Per pair of calls (``call_a, call_b``): how many matrices were compared and the share of each
    relation (columns ``equal``, ``transpose``, ``equal+transpose``, ``neither``)."""
    share = pd.crosstab([identities["call_a"], identities["call_b"]], identities["relation"], normalize="index")
    for c in ("equal", "transpose", "equal+transpose", "neither"):
        if c not in share.columns:
            share[c] = 0.0
    n = identities.groupby(["call_a", "call_b"]).size().rename("compared")
    return pd.concat([n, share[["equal", "transpose", "equal+transpose", "neither"]]], axis=1).reset_index()


def pooled_identity_summary(summaries: pd.DataFrame) -> pd.DataFrame:
    """Several traces' :func:`identity_summary` rows pooled per ``(call_a, call_b)`` (the index): ``compared``
    summed, each relation's share the mean of the traces' shares weighted by ``compared``."""
    relations = ["equal", "transpose", "equal+transpose", "neither"]
    weighted = summaries[relations].mul(summaries["compared"], axis=0)
    pooled = pd.concat([summaries[["call_a", "call_b", "compared"]], weighted], axis=1).groupby(
        ["call_a", "call_b"]).sum()
    pooled[relations] = pooled[relations].div(pooled["compared"], axis=0)
    pooled["compared"] = pooled["compared"].astype(int)
    return pooled[["compared", *relations]]


A2A_ROLES = ("forward: dispatch", "forward: combine", "backward: combine's grad", "backward: dispatch's grad")


def identity_panel_cells(cells: pd.DataFrame, *, iteration: int, microbatch: int, layer: int,
                         roles: Sequence[str] = A2A_ROLES) -> pd.DataFrame:
    """The payload all-to-alls of one (iteration, micro-batch, layer) of :func:`a2a_cells` as dense tidy cells
    ``panel, src, dst, value`` (every cell of each ``m × m`` matrix, summed over EP groups), one ``panel`` per
    call in issue order, labelled ``"<role> (call k)"`` with ``roles`` in that order (an MoE layer's four:
    dispatch and combine forward, then the combine's and the dispatch's gradients backward)."""
    one = cells[(cells["iteration"] == iteration) & (cells["microbatch"] == microbatch) & (cells["layer"] == layer)]
    calls = list(one.groupby("call", sort=True))
    if len(calls) != len(roles):
        raise AnalysisError(f"iteration {iteration}, micro-batch {microbatch}, layer {layer}: {len(calls)} payload "
                            f"all-to-alls, expected {len(roles)} ({', '.join(roles)})")
    frames = []
    for role, (call, g) in zip(roles, calls, strict=True):
        _, stack = matrix_stack(g, [])
        frames.append(pd.DataFrame(stack[0]).rename_axis(index="src", columns="dst").stack().rename("value")
                      .reset_index().assign(panel=f"{role} (call {int(call)})"))
    return pd.concat(frames, ignore_index=True)[["panel", "src", "dst", "value"]]


def routing_vs_events(trace: Any) -> pd.DataFrame:
    """Check that the routing table explains the recorded dispatch: for each recorded (iteration, micro-batch,
    layer), the first forward payload all-to-all's matrix against ``ep_matrices(routing) · h · act``.
    Columns ``iteration, microbatch, layer, ep_group, max_abs_diff_bytes`` (0 everywhere when they agree)."""
    spec, par, bpt = _recorded_moe(trace)
    cells = a2a_cells(trace.events)
    fwd = cells[(cells["phase"] == "forward") & (cells["call"] == 0)]
    groups = Layout(par).groups("ep")
    gid = {tuple(int(x) for x in g): i for i, g in enumerate(groups)}
    fwd = fwd.assign(ep_group=fwd["group"].map(gid))
    keys = ["iteration", "microbatch", "layer", "ep_group"]
    k_e, a_e = matrix_stack(fwd, keys)
    rt = trace.routing[trace.routing["iteration"].isin(k_e["iteration"].unique())]
    k_r, a_r = matrix_stack(ep_matrices(rt, par, spec.num_experts, bytes_per_token=bpt, per_microbatch=True),
                            keys)
    j = k_e.reset_index().merge(k_r.reset_index(), on=keys, how="left", suffixes=("_e", "_r"))
    if j["index_r"].isna().any():
        raise DataError("routing lacks counts for a recorded all_to_all (iteration, micro-batch, layer)")
    diff = np.abs(a_e[j["index_e"].to_numpy()] - a_r[j["index_r"].to_numpy(np.int64)]).max(axis=(1, 2))
    return j[keys].assign(max_abs_diff_bytes=diff)


# ------------------------------------------------------------------------------------------ over training
def consecutive_distance(cells: pd.DataFrame, keys: Sequence[str] = ("layer", "ep_group"),
                         time: str = "iteration") -> pd.DataFrame:
    """``d_t = ‖M_t − M_{t−1}‖₁ / ‖M_{t−1}‖₁`` for consecutive ``time`` values per ``keys``: columns
    ``keys…, time, rel_l1`` (from the second time step on)."""
    out = []
    for k, idx, m in _matrix_series(cells, keys, time):
        num = np.abs(np.diff(m, axis=0)).sum(axis=(1, 2))
        den = np.abs(m[:-1]).sum(axis=(1, 2))
        with np.errstate(invalid="ignore", divide="ignore"):
            d = num / den
        out.append(k.iloc[idx[1:]].assign(rel_l1=d))
    return pd.concat(out, ignore_index=True)


def load_autocorrelation(routing: pd.DataFrame, layer: int, nlags: int, *,
                         iterations: Sequence[int] | None = None) -> pd.DataFrame:
    """ACF of each expert's load share in ``layer`` over iterations: columns ``expert, lag, acf``. A constant
    share has no defined ACF (0/0): its ``acf`` is NaN beyond lag 0."""
    load = expert_load(routing)
    load = load[load["layer"] == layer]
    if iterations is not None:
        load = load[load["iteration"].isin(list(iterations))]
    if load.empty:
        raise DataError(f"routing has no counts for layer {layer}")
    wide = load.pivot_table(index="iteration", columns="expert", values="share", fill_value=0.0)
    out = []
    for e in wide.columns:
        x = wide[e].to_numpy()
        if np.ptp(x) == 0:
            n = min(nlags, len(x) - 1)
            a = pd.DataFrame({"lag": np.arange(n + 1), "acf": [1.0] + [np.nan] * n})
        else:
            a = autocorrelation(x, nlags)
        out.append(a.assign(expert=int(e)))
    return pd.concat(out, ignore_index=True)[["expert", "lag", "acf"]]


# ------------------------------------------------------------------------------------------ predictors
def predict_next(stack: np.ndarray, method: str, *, alpha: float = 0.3, window: int = 10) -> np.ndarray:
    """Predictions ``P_t`` of ``stack[t]`` (shape ``(T, m, m)``) from ``stack[:t]`` (module docstring);
    ``uniform`` uses only the row totals of ``stack[t]``, fixed before the run. ``P_0`` is NaN for the
    history-based predictors."""
    m = np.asarray(stack, dtype=np.float64)
    T = len(m)
    p = np.full_like(m, np.nan)
    if method == "uniform":
        return np.repeat(m.sum(axis=-1, keepdims=True) / m.shape[-1], m.shape[-1], axis=-1)
    if T < 2:
        return p
    if method == "last":
        p[1:] = m[:-1]
    elif method == "ema":
        if not 0 < alpha <= 1:
            raise AnalysisError(f"alpha={alpha} must be in (0, 1]")
        s = m[0].copy()
        p[1] = s
        for t in range(2, T):
            s = alpha * m[t - 1] + (1 - alpha) * s
            p[t] = s
    elif method == "window":
        if window < 1:
            raise AnalysisError(f"window={window} must be >= 1")
        c = np.concatenate([np.zeros((1, *m.shape[1:])), np.cumsum(m, axis=0)])
        steps = np.arange(1, T)
        lo = np.maximum(0, steps - window)
        p[1:] = (c[steps] - c[lo]) / (steps - lo)[:, None, None]
    else:
        raise AnalysisError(f"method={method!r} is not one of uniform, last, ema, window")
    return p


def predictor_errors(cells: pd.DataFrame, keys: Sequence[str] = ("layer", "ep_group"),
                     time: str = "iteration", *, alpha: float = 0.3, window: int = 10,
                     methods: Sequence[str] = ("uniform", "last", "ema", "window")) -> pd.DataFrame:
    """Relative L1 error ``‖P_t − M_t‖₁ / ‖M_t‖₁`` of each predictor of the next matrix, per ``keys`` and
    ``time`` step: tidy ``keys…, time, predictor, rel_l1`` (NaN where a predictor has no history yet)."""
    out = []
    for k, idx, m in _matrix_series(cells, keys, time):
        den = np.abs(m).sum(axis=(1, 2))
        for meth in methods:
            p = predict_next(m, meth, alpha=alpha, window=window)
            with np.errstate(invalid="ignore", divide="ignore"):
                err = np.abs(p - m).sum(axis=(1, 2)) / den
            out.append(k.iloc[idx].assign(predictor=meth, rel_l1=err))
    return pd.concat(out, ignore_index=True)


# ------------------------------------------------------------------------------------------ exact vs bounded
def exact_bounded_split(cells: pd.DataFrame, cell_keys: Sequence[str], time: str = "iteration", *,
                        call_keys: Sequence[str] | None = None) -> pd.DataFrame:
    """Which all-to-all bytes are exact before the run and which only bounded, over the ``time`` steps.

    A cell is identified by ``cell_keys`` (must include ``src`` and ``dst``); a call by ``call_keys``
    (default: ``cell_keys`` without ``src``/``dst``). Over time each cell has min, mean and max bytes. Shares
    of the total mean bytes ``Σ mean``: ``exact_pairs`` (cells with min = max), ``bounded_pairs`` (the rest),
    ``bounded_floor`` (``Σ min`` of the bounded cells: certain anyway), ``bounded_band`` (``Σ (max − min)``
    of the bounded cells: the uncertainty a planner must cover); ``exact_send_totals`` /
    ``exact_recv_totals`` / ``exact_call_totals``: bytes in rows / columns / calls whose total never
    changes. Tidy: ``quantity, share, bytes`` (mean bytes per time step)."""
    ck = list(cell_keys)
    if "src" not in ck or "dst" not in ck:
        raise AnalysisError("cell_keys must include 'src' and 'dst'")
    calls = list(call_keys) if call_keys is not None else [c for c in ck if c not in ("src", "dst")]
    n_t = cells[time].nunique()
    g = cells.groupby(ck, sort=False)["value"]
    st = pd.DataFrame({"min": g.min(), "max": g.max(), "sum": g.sum(), "n": g.size()}).reset_index()
    if (st["n"] != n_t).any():  # a cell missing at some time step is 0 there
        st.loc[st["n"] != n_t, "min"] = np.minimum(st.loc[st["n"] != n_t, "min"], 0.0)
    st["mean"] = st["sum"] / n_t
    total = float(st["mean"].sum())
    exact = st["min"] == st["max"]

    def fixed_share(by: list[str]) -> float:
        tot = cells.groupby([*by, time], sort=False)["value"].sum()
        per = tot.groupby(level=list(range(len(by)))).agg(["min", "max", "sum", "size"])
        fixed = (per["min"] == per["max"]) & (per["size"] == n_t)
        return float(per.loc[fixed, "sum"].sum() / n_t)

    q = {"exact_pairs": float(st.loc[exact, "mean"].sum()),
         "bounded_pairs": float(st.loc[~exact, "mean"].sum()),
         "bounded_floor": float(st.loc[~exact, "min"].sum()),
         "bounded_band": float((st.loc[~exact, "max"] - st.loc[~exact, "min"]).sum()),
         "exact_send_totals": fixed_share([*calls, "src"]),
         "exact_recv_totals": fixed_share([*calls, "dst"]),
         "exact_call_totals": fixed_share(calls) if calls else float(total)}
    return pd.DataFrame({"quantity": list(q), "bytes": list(q.values()),
                         "share": [v / total if total else np.nan for v in q.values()]})


# ------------------------------------------------------------------------------------------ call sequence
def moe_repeatability(events: pd.DataFrame, reference_iteration: int = 1,
                      columns: Sequence[str] = ("op", "group", "bytes")) -> pd.DataFrame:
    """:func:`llmcomm.analysis.repeatability.repeatability` on the ``(op, group, bytes)`` call sequence: per
    (rank, iteration) whether it equals the reference iteration's and the share of matching positions."""
    return repeatability(events, reference_iteration=reference_iteration, columns=columns)


def sequence_variation(events: pd.DataFrame, reference_iteration: int = 1,
                       columns: Sequence[str] = ("op", "group", "bytes"),
                       by: Sequence[str] = ("parallelism", "op", "phase", "dtype", "slot")) -> pd.DataFrame:
    """Which calls vary: each call is compared on ``columns`` with the call at the same position of the same
    rank's ``reference_iteration`` (issue order, :func:`~llmcomm.analysis.repeatability.in_issue_order`).
    ``slot`` is the ordinal of a call among the calls of the same (micro-batch, layer, phase, op, dtype) of its
    rank and iteration (for an MoE layer: 0 = dispatch, 1 = combine). Per ``by``: ``calls`` compared (the
    reference iteration excluded), ``identical`` share, ``bytes_min``/``bytes_max``."""
    e = in_issue_order(events)
    e["slot"] = e.groupby(["rank", "iteration", "microbatch", "layer", "phase", "op", "dtype"], sort=False,
                          observed=True).cumcount()
    e["pos"] = e.groupby(["rank", "iteration"], sort=False).cumcount()
    e["_key"] = list(zip(*(e[c].astype(str) for c in columns), strict=True))
    ref = e[e["iteration"] == reference_iteration][["rank", "pos", "_key"]]
    cur = e[e["iteration"] != reference_iteration]
    cur = cur[cur["rank"].isin(ref["rank"].unique())]
    j = cur.merge(ref, on=["rank", "pos"], how="left", suffixes=("", "_ref"))
    j["same"] = j["_key"] == j["_key_ref"]
    cols = ["calls", "identical", "bytes_min", "bytes_max"]
    if j.empty:
        return pd.DataFrame(columns=[*by, *cols])
    return j.groupby(list(by), as_index=False, observed=True).agg(
        calls=("same", "size"), identical=("same", "mean"), bytes_min=("bytes", "min"), bytes_max=("bytes", "max"))


# ------------------------------------------------------------------------------------------ dense against MoE
VARIATION_COLUMNS = ("iterations compared", "identical call order (op, group)", "identical call sequences",
                     "calls identical to reference", "matrix change per iteration (rel. L1)")
ORDER_COLUMNS = ("op", "group", "phase", "layer", "microbatch")


def _without_setup(events: pd.DataFrame) -> pd.DataFrame:
    return events[events["phase"] != "setup"]


def reference_iteration(events: pd.DataFrame, *, skip_first: bool = True) -> int:
    """The iteration the others are compared with: the second recorded iteration when ``skip_first`` (a
    recorded run's first iteration is its warm-up), else the first (a replay repeats one iteration from the
    start). Setup calls are left out before counting."""
    its = sorted(_without_setup(events)["iteration"].unique())
    need = 2 if skip_first else 1
    if len(its) < need:
        raise AnalysisError(f"events hold {len(its)} iteration(s) outside setup; a reference "
                            f"{'after the first ' if skip_first else ''}needs {need}")
    return int(its[1] if skip_first else its[0])


def call_variation(trace: Any, *, reference_iteration: int) -> dict[str, float]:
    """How much of a trace's communication repeats ``reference_iteration`` (setup calls left out), one row of
    :func:`call_variation_table`: ``iterations compared`` (the reference excluded); ``identical call order
    (op, group)``: share of (rank, iteration) whose calls match the reference's in issue order on
    (op, group, phase, layer, micro-batch), sizes ignored; ``identical call sequences``: the same on
    (op, group, bytes); ``calls identical to reference``: share of calls, pooled, equal to the call at the
    same position of the reference (:func:`sequence_variation`); ``matrix change per iteration (rel. L1)``:
    mean :func:`consecutive_distance` of the whole per-iteration matrix (:func:`iteration_matrices`)."""
    from ..trace import Trace

    ev = _without_setup(trace.events)
    ref = reference_iteration
    rep = moe_repeatability(ev, reference_iteration=ref)
    order = moe_repeatability(ev, reference_iteration=ref, columns=ORDER_COLUMNS)
    var = sequence_variation(ev, reference_iteration=ref)
    cells = iteration_matrices(Trace(ev.reset_index(drop=True), dict(trace.meta)))
    dist = consecutive_distance(cells, keys=())
    return {"iterations compared": rep["iteration"].nunique() - 1,
            "identical call order (op, group)": float(order.loc[order["iteration"] != ref, "identical"].mean()),
            "identical call sequences": float(rep.loc[rep["iteration"] != ref, "identical"].mean()),
            "calls identical to reference": float((var["identical"] * var["calls"]).sum() / var["calls"].sum()),
            "matrix change per iteration (rel. L1)": float(dist["rel_l1"].mean())}


def call_variation_table(traces: Mapping[str, Any], *, replays: Sequence[str] = ()) -> pd.DataFrame:
    """:func:`call_variation` of each named trace, indexed by ``trace`` (columns :data:`VARIATION_COLUMNS`);
    each is compared with its :func:`reference_iteration`: the second iteration, or the first for the names
    in ``replays``."""
    rows = [{"trace": name, **call_variation(t, reference_iteration=reference_iteration(
        t.events, skip_first=name not in replays))} for name, t in traces.items()]
    return pd.DataFrame(rows).set_index("trace")


# ------------------------------------------------------------------------------------------ training phases
TRAINING_PHASES = ("early", "late")  # not the events table's phases (vocab.PHASES)


def training_phase(df: pd.DataFrame, phase: str, *, window: int, iterations: int,
                   time: str = "iteration") -> pd.DataFrame:
    """The rows of ``df`` in a phase of a run of ``iterations`` iterations: ``early`` the first ``window``
    (``time < window``), ``late`` the last ``window`` (``time >= iterations − window``), ``all`` every row."""
    if phase == "all":
        return df
    if phase == "early":
        return df[df[time] < window]
    if phase == "late":
        return df[df[time] >= iterations - window]
    raise AnalysisError(f"phase={phase!r} is not one of early, late, all")


def phase_means(metrics: Mapping[str, tuple[pd.DataFrame, str]], runs: Sequence[str], *, window: int,
                iterations: int, phases: Sequence[str] = TRAINING_PHASES, run: str = "run") -> pd.DataFrame:
    """Mean of each metric per run and :func:`training_phase`: ``metrics`` maps a row label to (a tidy frame
    with a ``run`` column, the column to average); the result has one row per label and columns
    ``(run, phase)`` for ``runs`` × ``phases``, in that order."""
    return pd.DataFrame({
        (name, ph): {label: training_phase(df[df[run] == name], ph, window=window, iterations=iterations)[col].mean()
                     for label, (df, col) in metrics.items()}
        for name in runs for ph in phases})


def phase_pivot(df: pd.DataFrame, value: str, columns: str, *, window: int, iterations: int, index: str = "run",
                phases: Sequence[str] = TRAINING_PHASES) -> pd.DataFrame:
    """Mean ``value`` per ``index`` (rows) and ``columns`` in each :func:`training_phase`: columns
    ``(phase, <columns value>)``, phases in the order given."""
    return pd.concat({ph: training_phase(df, ph, window=window, iterations=iterations)
                      .groupby([index, columns])[value].mean().unstack() for ph in phases}, axis=1)


def uniformity_over_training(runs: Mapping[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Per iteration and layer of each named MoE run (a recorded trace with routing), with a ``run`` column:
    the expert load's uniformity (:func:`load_uniformity`), the dispatch matrix's off-diagonal uniformity
    (:func:`matrix_uniformity`) and its change from the previous iteration (:func:`consecutive_distance`),
    as ``(load, matrix, change)``."""
    load, uni, dist = [], [], []
    for name, t in runs.items():
        cells = routing_matrices(t)
        uni.append(matrix_uniformity(cells, include_self=False).assign(run=name))
        load.append(load_uniformity(t.routing).assign(run=name))
        dist.append(consecutive_distance(cells).assign(run=name))
    return (pd.concat(load, ignore_index=True), pd.concat(uni, ignore_index=True),
            pd.concat(dist, ignore_index=True))


DISPATCH_CELL_KEYS = ("microbatch", "layer", "ep_group", "src", "dst")


def dispatch_exact_bounded(runs: Mapping[str, Any], *, window: int, iterations: int,
                           phases: Sequence[str] = ("all", "late")) -> pd.DataFrame:
    """:func:`exact_bounded_split` of each named run's dispatch matrices per micro-batch
    (:func:`routing_matrices`), a cell being (micro-batch, layer, EP group, src, dst), over each
    :func:`training_phase`: tidy ``quantity, bytes, share, scope`` with ``scope`` ``"<run>, dispatch, <phase>
    iterations"``, runs then phases in the order given."""
    out = []
    for name, t in runs.items():
        cells = routing_matrices(t, per_microbatch=True)
        for ph in phases:
            out.append(exact_bounded_split(training_phase(cells, ph, window=window, iterations=iterations),
                                           list(DISPATCH_CELL_KEYS))
                       .assign(scope=f"{name}, dispatch, {ph} iterations"))
    return pd.concat(out, ignore_index=True)


def envelope_summary(envelope: pd.DataFrame, by: str = "source") -> pd.DataFrame:
    """Per ``by`` of an all-to-all envelope (:func:`llmcomm.predict.envelope.a2a_envelope`): ``max / uniform
    (worst pair)`` the largest ``max_bytes / uniform_bytes`` of any pair, ``min / uniform (least pair)`` the
    smallest ``min_bytes / uniform_bytes``, ``hard max / uniform`` the hard bound over the uniform bytes (of the
    first row: both are the same for every pair). Indexed by ``by``, sorted."""
    rows = {key: {"max / uniform (worst pair)": float((g["max_bytes"] / g["uniform_bytes"]).max()),
                  "min / uniform (least pair)": float((g["min_bytes"] / g["uniform_bytes"]).min()),
                  "hard max / uniform": float(g["hard_max_bytes"].iloc[0] / g["uniform_bytes"].iloc[0])}
            for key, g in envelope.groupby(by, sort=True)}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(by)


def routed_uniform_split(trace: Any) -> tuple[float, int]:
    """What a uniform router would send each peer, from a recorded MoE run's routing: each dispatch row total
    (bytes a rank sends per iteration, layer and micro-batch; :func:`routing_matrices`) over ``ep`` when every
    row totals the same — fixed by tokens × top-k before the run — else NaN; and the number of rows."""
    rows = (routing_matrices(trace, per_microbatch=True)
            .groupby(["iteration", "layer", "microbatch", "ep_group", "src"])["value"].sum())
    ep = trace.parallel_config().ep
    return (float(rows.unique()[0]) / ep if rows.nunique() == 1 else float("nan")), len(rows)


def position_duration_spread(events: pd.DataFrame, by: Sequence[str] = ("parallelism", "op")) -> pd.DataFrame:
    """How steady timed calls are across iterations: each call is numbered by its position in its rank's
    iteration (row order), each position's duration ``t_end − t_start`` (ms) summarized over the iterations
    and ranks that hold it (mean, std, max); per ``by``: ``median CV of duration over iterations`` (the
    median over positions of std/mean) and ``worst ms``. Tidy, ``by`` as columns."""
    lv = list(by)
    dur = events.assign(ms=(events["t_end_ns"] - events["t_start_ns"]) / 1e6)
    dur["pos"] = dur.groupby(["rank", "iteration"]).cumcount()
    per_call = dur.groupby([*lv, "pos"])["ms"].agg(["mean", "std", "max"])
    return pd.DataFrame({"median CV of duration over iterations":
                         (per_call["std"] / per_call["mean"]).groupby(level=lv).median(),
                         "worst ms": per_call["max"].groupby(level=lv).max()}).reset_index()
