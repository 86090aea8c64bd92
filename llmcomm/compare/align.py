"""The alignment of :func:`compare`: a measured trace's calls against its prediction's, per rank, as multisets
keyed by ``KEY`` (see :mod:`llmcomm.compare`), and the tables built from the join."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError
from ..predict import predict_traffic
from ..specs import ModelSpec, ParallelConfig, load_model, validate
from ..trace import Trace
from ..units import format_bytes
from ..vocab import FRAMEWORKS, FrameworkName
from .comparison import Comparison

KEY = ("phase", "op", "group", "peer", "bytes")
WORK_PHASES = ("forward", "backward", "optimizer")


# ------------------------------------------------------------------------------------------ inputs
def trace_framework(meta: Mapping[str, Any]) -> FrameworkName | None:
    """Whose calls a trace holds, from its metadata: ``meta['framework']`` where recorded; a trace that
    ``llmcomm collect`` wrote (``source`` ``recorded`` with the kit's ``run_config``, also the curated traces
    written before the field existed) ran the kit's torch-native workload: ``torch``. ``None``: unknown."""
    fw = meta.get("framework")
    if fw in FRAMEWORKS:
        return fw
    if isinstance(fw, str) and fw:
        raise ConfigError(f"the trace's meta['framework'] = {fw!r} is not one of {FRAMEWORKS}")
    if meta.get("source") == "recorded" and isinstance(meta.get("run_config"), Mapping):
        return "torch"
    return None


def _resolve_model(measured: Trace, model: ModelSpec | str | None) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return load_model(model)
    try:
        return measured.model_spec()
    except ConfigError as e:
        raise ConfigError(f"{e}; give --model NAME (Python: model=NAME; a catalogue name, a YAML path or a "
                          "ModelSpec)") from None


def _resolve_parallel(measured: Trace, parallel: ParallelConfig | Mapping[str, Any] | None) -> ParallelConfig:
    if isinstance(parallel, ParallelConfig):
        return parallel
    if isinstance(parallel, Mapping):
        return ParallelConfig.from_dict(parallel, origin="parallel=")
    if measured.meta.get("parallel") is None:
        raise ConfigError("the trace's metadata has no parallel configuration; give it as --tp/--pp/--dp/... "
                          "(Python: parallel= a ParallelConfig or a dict such as {'tp': 2, 'dp': 4})")
    return measured.parallel_config()


def _check_world(measured: Trace, parallel: ParallelConfig) -> None:
    found = measured.world_size  # meta['world_size'] if recorded, else the highest rank seen + 1
    if found != parallel.world_size:
        raise ConfigError(
            f"the trace has world size {found} but the configuration tp*cp*dp*pp = {parallel.world_size} "
            f"(tp={parallel.tp}, cp={parallel.cp}, dp={parallel.dp}, pp={parallel.pp}); pass the configuration "
            "the trace was recorded with")
    hi = int(measured.events["rank"].max()) if len(measured.events) else -1
    if hi >= parallel.world_size:
        raise ConfigError(f"the trace holds rank {hi}, outside the configuration's {parallel.world_size} ranks")


def _pick_iteration(measured: Trace, iteration: int | None) -> int:
    ev = measured.events
    work = ev[ev["phase"].isin(WORK_PHASES) & (ev["iteration"] >= 0)]
    marked = sorted(int(i) for i in pd.unique(work["iteration"]))
    if not marked:
        raise DataError("the trace marks no training iteration (no forward/backward/optimizer call with "
                        "iteration >= 0); record it with llmcomm.record.step() or import it with iteration "
                        "markers")
    if iteration is None:
        return marked[-1]
    if iteration not in marked:
        raise ConfigError(f"iteration={iteration} is not in the trace; it marks iterations {marked}")
    return iteration


def _routing_for(measured: Trace, model: ModelSpec, iteration: int) -> pd.DataFrame | None:
    if not model.is_moe or measured.routing is None:
        return None
    r = measured.routing[measured.routing["iteration"] == iteration]
    return r.reset_index(drop=True) if len(r) else None


# --------------------------------------------------------------------------------------- alignment
def _keyed(ev: pd.DataFrame) -> pd.DataFrame:
    """One row per call (``ev`` expanded, :meth:`Trace.expand`) with a hashable group key."""
    out = pd.DataFrame({
        "rank": ev["rank"].to_numpy(np.int64),
        "phase": ev["phase"].astype(str).to_numpy(),
        "op": ev["op"].astype(str).to_numpy(),
        "group": _group_keys(ev),
        "peer": ev["peer"].to_numpy(np.int64),
        "bytes": ev["bytes"].to_numpy(np.int64),
        "parallelism": ev["parallelism"].astype(str).to_numpy(),
        "microbatch": ev["microbatch"].to_numpy(np.int64),
    })
    out["seq"] = out.groupby("rank").cumcount()
    out["occurrence"] = out.groupby(["rank", *KEY]).cumcount()
    return out


def _group_keys(ev: pd.DataFrame) -> list[tuple[int, ...]]:
    """The group as a sorted tuple of ranks; for send/recv the pair ``{rank, peer}`` (a recorder may log the
    whole pipeline communicator, a predictor the pair: the transfer is the same)."""
    p2p = ev["op"].isin(("send", "recv")).to_numpy()
    ranks, peers = ev["rank"].to_numpy(np.int64), ev["peer"].to_numpy(np.int64)
    return [tuple(sorted((int(r), int(q)))) if is_p2p else tuple(sorted(int(x) for x in g))
            for g, r, q, is_p2p in zip(ev["group"], ranks, peers, p2p, strict=True)]


def _align(meas: pd.DataFrame, pred: pd.DataFrame) -> pd.DataFrame:
    """Outer-join the two sides on (rank, key, occurrence): the k-th measured call with a key matches the k-th
    predicted call with the same key on the same rank."""
    on = ["rank", *KEY, "occurrence"]
    j = meas.merge(pred, on=on, how="outer", suffixes=("_m", "_p"), indicator=True)
    j["side"] = j["_merge"].map({"both": "both", "left_only": "measured", "right_only": "predicted"}).astype(str)
    j["parallelism"] = j["parallelism_p"].where(j["side"] != "measured", j["parallelism_m"])
    return j.drop(columns=["_merge"])


def _by_kind(joined: pd.DataFrame) -> pd.DataFrame:
    """Calls and bytes per (parallelism, phase, op) on each side, with the joined label (a matched call counts
    under the predicted label on both sides)."""
    def side(tag: str) -> pd.DataFrame:
        rows = joined[joined["side"].isin(("both", tag))]
        g = rows.groupby(["parallelism", "phase", "op"], observed=True)["bytes"]
        return pd.DataFrame({f"calls_{tag}": g.size(), f"bytes_{tag}": g.sum()})

    t = side("measured").join(side("predicted"), how="outer").fillna(0)
    t = t.astype({c: np.int64 for c in t.columns}).reset_index()
    with np.errstate(divide="ignore", invalid="ignore"):
        t["bytes_ratio"] = t["bytes_measured"] / t["bytes_predicted"].replace(0, np.nan)
    return t.sort_values(["parallelism", "phase", "op"]).reset_index(drop=True)


def _one_sided(joined: pd.DataFrame, num_microbatches: int) -> pd.DataFrame:
    one = joined[joined["side"] != "both"].copy()
    cols = ["side", "phase", "parallelism", "op", "bytes", "group_size", "calls", "ranks", "calls_per_rank",
            "per_microbatch", "bytes_per_iteration", "what"]
    if one.empty:
        return pd.DataFrame(columns=cols)
    one["group_size"] = one["group"].map(len)
    g = one.groupby(["side", "phase", "parallelism", "op", "bytes", "group_size"], observed=True, sort=True)
    t = g.agg(calls=("rank", "size"), ranks=("rank", lambda r: tuple(sorted(set(int(x) for x in r)))))
    t = t.reset_index()
    t["calls_per_rank"] = t["calls"] / t["ranks"].map(len)
    t["per_microbatch"] = t["calls_per_rank"] / num_microbatches
    t["bytes_per_iteration"] = t["calls"] * t["bytes"]
    t["what"] = [_describe_one_sided(r) for r in t.itertuples()]
    return t[cols]


def _describe_one_sided(r: Any) -> str:
    other = "the model does not predict" if r.side == "measured" else "the measured trace does not issue"
    per = (f"{r.per_microbatch:g} per micro-batch" if r.phase in ("forward", "backward")
           else f"{r.calls_per_rank:g} per iteration")
    where = f"on rank {r.ranks[0]}" if len(r.ranks) == 1 else f"on {len(r.ranks)} ranks"
    return (f"{r.side} has {r.parallelism} {r.op} of {format_bytes(r.bytes)} over {r.group_size} ranks in "
            f"{r.phase} ({per}, {where}) that {other}")


def _verdicts(by_kind: pd.DataFrame, one_sided: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for par, t in by_kind.groupby("parallelism", sort=True):
        bm, bp = int(t["bytes_measured"].sum()), int(t["bytes_predicted"].sum())
        unmatched = int(one_sided.loc[one_sided["parallelism"] == par, "calls"].sum()) if len(one_sided) else 0
        if unmatched == 0:
            verdict = "exact"
        elif bm == bp:
            verdict = "same bytes, different calls"
        elif bp == 0:
            verdict = f"only measured ({format_bytes(bm)})"
        elif bm == 0:
            verdict = f"only predicted ({format_bytes(bp)})"
        elif 0.5 <= bm / bp <= 2:
            verdict = f"differs by {100 * (bm - bp) / bp:+.1f}%"
        else:
            verdict = f"differs: measured {format_bytes(bm)} is {bm / bp:.3g}× the predicted {format_bytes(bp)}"
        rows.append({"parallelism": par, "verdict": verdict, "bytes_measured": bm, "bytes_predicted": bp,
                     "unmatched_calls": unmatched})
    return pd.DataFrame(rows, columns=["parallelism", "verdict", "bytes_measured", "bytes_predicted",
                                       "unmatched_calls"])


def _setup_calls(events: pd.DataFrame) -> pd.DataFrame:
    """The measured ``setup`` calls (initialization, set aside): calls per (parallelism, op, call size)."""
    ev = events[events["phase"] == "setup"]
    g = ev.groupby(["parallelism", "op", "bytes"], observed=True)["count"].sum()
    return g.rename("calls").reset_index()


def _pairs(meas: Trace, pred: Trace, world: int) -> pd.DataFrame:
    a = meas.matrix("direct", world_size=world).tocoo()
    b = pred.matrix("direct", world_size=world).tocoo()
    t = pd.concat({
        "measured": pd.Series(a.data, index=pd.MultiIndex.from_arrays([a.row, a.col], names=["src", "dst"])),
        "predicted": pd.Series(b.data, index=pd.MultiIndex.from_arrays([b.row, b.col], names=["src", "dst"])),
    }, axis=1).fillna(0.0)
    t = t.groupby(level=["src", "dst"]).sum()
    t["diff"] = t["measured"] - t["predicted"]
    return t.reset_index().sort_values(["src", "dst"]).reset_index(drop=True)


# -------------------------------------------------------------------------------------------- entry
def compare(measured: Trace, predicted: Trace | None = None, *, model: ModelSpec | str | None = None,
            parallel: ParallelConfig | Mapping[str, Any] | None = None, framework: FrameworkName | None = None,
            iteration: int | None = None) -> Comparison:
    """Align ``measured`` with ``predicted`` (predicted here from the model and configuration when not given)
    call by call per rank; see the module docstring for the key and the tables. ``framework`` (whose calls to
    predict) defaults to the trace's own (:func:`trace_framework`), else ``megatron``.

    Raises :class:`ConfigError` when the model or configuration is unknown, does not fit, or does not match
    the trace's world size, and :class:`DataError` when the trace marks no iteration."""
    if not isinstance(measured, Trace):
        raise ConfigError(f"compare: measured must be a Trace (read it with llmcomm.read_trace or "
                          f"llmcomm.ingest_trace), got {type(measured).__name__}")
    framework = framework or trace_framework(measured.meta) or "megatron"
    spec = _resolve_model(measured, model)
    par = _resolve_parallel(measured, parallel)
    validate(spec, par)
    _check_world(measured, par)
    it = _pick_iteration(measured, iteration)
    if predicted is None:
        predicted = predict_traffic(spec, par, framework=framework, routing=_routing_for(measured, spec, it),
                                    aggregate=False)
    ranks = tuple(sorted(int(r) for r in pd.unique(measured.events["rank"])))
    m_it = measured.select(iteration=it, rank=list(ranks))
    m_work = m_it.select(phase=list(WORK_PHASES))
    p_work = predicted.select(phase=list(WORK_PHASES), rank=list(ranks))
    p_iters = sorted(int(i) for i in pd.unique(p_work.events["iteration"]))
    if len(p_iters) > 1:
        p_work = p_work.select(iteration=p_iters[-1])
    meas, pred = _keyed(m_work.expand().events), _keyed(p_work.expand().events)
    joined = _align(meas, pred)
    one = _one_sided(joined, par.num_microbatches)
    kinds = _by_kind(joined)
    ordered = sum(
        meas.loc[meas["rank"] == r, list(KEY)].to_numpy().tolist()
        == pred.loc[pred["rank"] == r, list(KEY)].to_numpy().tolist()
        for r in ranks
    )
    setup = _setup_calls(m_it.events)
    par_text = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(par).items()
                         if k in ("tp", "pp", "dp", "ep", "cp", "vpp", "sp", "micro_batch", "global_batch")
                         and (v not in (1, False) or k in ("tp", "pp", "dp")))
    meta = {"trace": measured.meta.get("trace_name") or measured.meta.get("command") or "trace",
            "model": spec.name, "parallel": par_text, "framework": framework}
    return Comparison(by_kind=kinds, one_sided=one, pairs=_pairs(m_work, p_work, par.world_size),
                      verdicts=_verdicts(kinds, one), setup=setup, iteration=it, ranks=ranks,
                      ordered_ranks=int(ordered), measured=m_work, predicted=p_work, meta=meta)
