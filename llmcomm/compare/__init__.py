"""A measured trace against its prediction, call by call: where a training run's communication matches the
model and where it does not.

``compare(measured)`` predicts the measured trace's own configuration (model and parallel config from the
arguments or from the trace's metadata) and aligns the two **per rank** as multisets of calls keyed by

    (phase, op, group, peer, bytes)

— the columns every source fills, the group as a set of ranks (for send/recv: the pair of ranks). A Kineto or
AICB trace has no layer numbers, and micro-batch numbering differs between frameworks, so they are reported,
not matched on. For each rank and key, ``matched = min(n_measured, n_predicted)``; the remainder on either side
is a call present on one side only. The parallelism label is not part of the key (AICB labels
sequence-parallel gathers ``tp`` where the predictor says ``sp``): a matched call keeps the predicted label, a
one-sided call its own side's label.

Only one iteration is compared (``iteration=``; default: the last one the measured trace marks), on the ranks the
measured trace holds (an AICB workload holds rank 0 only); ``setup`` calls (initialization) are set aside and
listed. For MoE traces with recorded routing, the prediction is fed that iteration's routing, so all-to-all
splits can match exactly.

Tables of :class:`Comparison` (all tidy DataFrames):

* ``by_kind``: per (parallelism, phase, op) calls and bytes on each side and ``bytes_ratio = measured /
  predicted``;
* ``one_sided``: the unmatched calls grouped by (side, phase, parallelism, op, bytes, group size) with the ranks
  involved, the count per iteration and per micro-batch, and a sentence saying what they are;
* ``pairs``: per (src, dst) bytes of the direct matrix on both sides and their difference;
* ``verdicts``: one line per parallelism: ``exact`` (every call matched), ``same bytes, different calls``, or
  ``differs by X%`` (measured bytes relative to predicted).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError
from ..specs import ModelSpec, ParallelConfig, load_model, validate
from ..trace import Trace, read_trace
from ..units import format_bytes

__all__ = ["Comparison", "compare", "load_measured"]

KEY = ("phase", "op", "group", "peer", "bytes")
WORK_PHASES = ("forward", "backward", "optimizer")


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
        """A report: header, verdicts, per-kind table, one-sided calls, largest pair differences."""
        m = self.meta
        lines = [
            f"# {m.get('trace', 'trace')} against its prediction",
            "",
            f"model `{m.get('model')}`, {m.get('parallel')}, framework `{m.get('framework')}`; "
            f"iteration {self.iteration}, ranks compared: {_ranks_text(self.ranks)}; "
            f"{self.ordered_ranks} of {len(self.ranks)} ranks issue the same calls in the same order.",
            "",
            "## Verdict per parallelism",
            "",
            *[f"- **{r.parallelism}**: {r.verdict}" for r in self.verdicts.itertuples()],
            "",
            "## Calls and bytes per parallelism, phase and op",
            "",
            _table_markdown(self.by_kind),
            "",
            "## Calls on one side only",
            "",
            *([f"- {s}" for s in self.one_sided["what"]] if not self.one_sided.empty else ["none"]),
            "",
            "## Largest per-pair differences (direct matrix, bytes)",
            "",
            _table_markdown(self.pairs.reindex(self.pairs["diff"].abs().sort_values(ascending=False).index)
                            .head(15)),
        ]
        return "\n".join(lines) + "\n"

    def to_html(self) -> str:
        """The same report as HTML (tables rendered by pandas)."""
        import html

        m = self.meta
        parts = [
            "<!doctype html><meta charset='utf-8'>",
            f"<title>{html.escape(str(m.get('trace', 'trace')))} against its prediction</title>",
            f"<h1>{html.escape(str(m.get('trace', 'trace')))} against its prediction</h1>",
            f"<p>model <code>{html.escape(str(m.get('model')))}</code>, {html.escape(str(m.get('parallel')))}, "
            f"framework {html.escape(str(m.get('framework')))}; iteration {self.iteration}; ranks "
            f"{html.escape(_ranks_text(self.ranks))}; {self.ordered_ranks} of {len(self.ranks)} ranks in the "
            "same order.</p>",
            "<h2>Verdict per parallelism</h2><ul>",
            *[f"<li><b>{html.escape(r.parallelism)}</b>: {html.escape(r.verdict)}</li>"
              for r in self.verdicts.itertuples()],
            "</ul><h2>Calls and bytes per parallelism, phase and op</h2>",
            self.by_kind.to_html(index=False),
            "<h2>Calls on one side only</h2>",
            self.one_sided.drop(columns=["ranks"], errors="ignore").to_html(index=False)
            if not self.one_sided.empty else "<p>none</p>",
        ]
        return "\n".join(parts) + "\n"


def _ranks_text(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 6:
        return f"{len(ranks)} ranks ({ranks[0]}..{ranks[-1]})"
    return ", ".join(map(str, ranks))


def _table_markdown(df: pd.DataFrame) -> str:
    if df.empty:
        return "none"
    cols = list(df.columns)
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        rows.append("| " + " | ".join(_cell(v) for v in r) + " |")
    return "\n".join(rows)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


# ------------------------------------------------------------------------------------------ inputs
def trace_framework(meta: Mapping[str, Any]) -> str | None:
    """Whose calls a trace holds, from its metadata: ``meta['framework']`` where recorded; a trace that
    ``llmcomm collect`` wrote (``source`` ``recorded`` with the kit's ``run_config``, also the curated traces
    written before the field existed) ran the kit's torch-native workload: ``torch``. ``None``: unknown."""
    fw = meta.get("framework")
    if isinstance(fw, str) and fw:
        return fw
    if meta.get("source") == "recorded" and isinstance(meta.get("run_config"), Mapping):
        return "torch"
    return None


def _resolve_model(measured: Trace, model: ModelSpec | str | None) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return load_model(model)
    spec = measured.meta.get("model_spec")
    if isinstance(spec, Mapping):
        return ModelSpec.from_dict(spec, origin="the trace's meta['model_spec']")
    name = measured.meta.get("model")
    if isinstance(name, Mapping):
        return ModelSpec.from_dict(name, origin="the trace's meta['model']")
    if isinstance(name, str):
        return load_model(name)
    raise ConfigError("the trace's metadata names no model (no 'model' or 'model_spec'); give --model NAME "
                      "(Python: model=NAME; a catalogue name, a YAML path or a ModelSpec)")


def _resolve_parallel(measured: Trace, parallel: ParallelConfig | Mapping[str, Any] | None) -> ParallelConfig:
    if isinstance(parallel, ParallelConfig):
        return parallel
    if isinstance(parallel, Mapping):
        return ParallelConfig.from_dict(parallel, origin="parallel=")
    meta = measured.meta.get("parallel")
    if isinstance(meta, Mapping):
        return ParallelConfig.from_dict(meta, origin="the trace's meta['parallel']")
    raise ConfigError("the trace's metadata has no parallel configuration; give it as --tp/--pp/--dp/... "
                      "(Python: parallel= a ParallelConfig or a dict such as {'tp': 2, 'dp': 4})")


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
            parallel: ParallelConfig | Mapping[str, Any] | None = None, framework: str | None = None,
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
        from ..predict import predict_traffic

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


def load_measured(source: str) -> Trace:
    """A trace to compare, by what a user has: a curated trace's name (``"gpt_tp2pp2dp2"``), a file of the
    external-data manifest (``"aicb/A100_example.csv"``), or a path to any trace file or folder llmcomm reads
    (``.parquet`` written by llmcomm, a dataset folder written by ``llmcomm ingest`` — read as
    :func:`llmcomm.read_trace` reads it — or a format :func:`llmcomm.ingest_trace` detects)."""
    from pathlib import Path

    from ..paths import data_dir

    curated = data_dir() / "traces" / f"{source}.parquet"
    if curated.is_file():
        return _named(read_trace(curated), source)
    from .. import data

    if source in data.entries():
        from ..ingest import ingest_trace

        return _named(ingest_trace(data.path(source)), source)
    p = Path(source)
    if p.is_dir() and next(p.rglob("*.parquet"), None) is not None:  # a dataset folder (llmcomm ingest --out DIR)
        return _named(read_trace(p), p.name)
    if not p.exists():
        raise ConfigError(f"trace {source!r} is neither a curated trace name (data/traces), a file of the "
                          "external-data manifest (data/external.yaml) nor an existing path")
    if p.suffix == ".parquet" and p.is_file():
        return _named(read_trace(p), p.name)
    from ..ingest import ingest_trace

    return _named(ingest_trace(p), p.name)


def _named(trace: Trace, name: str) -> Trace:
    trace.meta.setdefault("trace_name", name)
    return trace
