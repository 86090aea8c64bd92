"""Summaries of a (predicted or recorded) trace: bytes per parallelism, phase and pair class, the TP share,
and how the TP share grows with the number of micro-batches.

Two byte measures:

* message bytes (``algorithm=None``): the events' nccl-tests sizes × count (what :meth:`Trace.volumes` sums),
  a point-to-point transfer counted once, at its sender (``recv`` rows are left out);
* wire bytes (``algorithm="ring"`` or ``"direct"``): the flows each rank puts on links, from
  :meth:`Trace.flows` (all-reduce ``2(n-1)/n·S`` per rank under ring, send ``S``...).

A pair ``(src, dst)`` is intra-node when ``src // gpus_per_node == dst // gpus_per_node``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import pandas as pd

from ..specs import ModelSpec, ParallelConfig
from ..trace import Trace


def bytes_by(trace: Trace, by: Iterable[str] = ("parallelism",), algorithm: str | None = None) -> pd.DataFrame:
    """Bytes grouped by ``by`` with each group's ``share`` of the total (message or wire bytes)."""
    by = list(by)
    if algorithm is None:
        df = trace.volumes(by, sent_only=True)[[*by, "bytes"]]
    else:
        f = trace.flows(algorithm)
        df = f.groupby(by, observed=True)["bytes"].sum().reset_index()
    df = df.copy()
    total = float(df["bytes"].sum())
    df["share"] = df["bytes"] / total if total else 0.0
    return df.sort_values("bytes", ascending=False, ignore_index=True)


def pair_classes(trace: Trace, gpus_per_node: int = 8, algorithm: str = "ring") -> pd.DataFrame:
    """Wire bytes per parallelism and pair class (``intra-node``/``inter-node``)."""
    f = trace.flows(algorithm)
    cls = np.where(f["src"].to_numpy() // gpus_per_node == f["dst"].to_numpy() // gpus_per_node,
                   "intra-node", "inter-node")
    df = (pd.DataFrame({"parallelism": f["parallelism"].to_numpy(), "pair_class": cls, "bytes": f["bytes"]})
          .groupby(["parallelism", "pair_class"], observed=True)["bytes"].sum().reset_index())
    total = float(df["bytes"].sum())
    df["share"] = df["bytes"] / total if total else 0.0
    return df


def tp_share(trace: Trace, algorithm: str | None = None) -> float:
    """Fraction of all bytes that TP (and SP) calls carry."""
    df = bytes_by(trace, ("parallelism",), algorithm)
    return float(df.loc[df["parallelism"].isin(["tp", "sp"]), "share"].sum())


def tp_share_vs_microbatches(model: ModelSpec, parallel: ParallelConfig, microbatches: Iterable[int],
                             algorithm: str | None = None) -> pd.DataFrame:
    """TP share of the bytes for each number of micro-batches ``m`` (global batch = m · micro_batch · dp).

    TP and PP bytes grow as ``m`` (per micro-batch terms) while DP bytes are per iteration, so the share
    is ``m·t / (m·t + m·p + d)``, rising towards ``t / (t + p)``."""
    from . import predict_traffic

    rows = []
    for m in microbatches:
        p = dataclasses.replace(parallel, global_batch=m * parallel.micro_batch * parallel.dp)
        t = predict_traffic(model, p, aggregate=True)
        v = bytes_by(t, ("parallelism",), algorithm).set_index("parallelism")["bytes"]
        rows.append({"microbatches": m, **{k: float(v.get(k, 0.0)) for k in ("tp", "pp", "dp", "ep")},
                     "tp_share": tp_share(t, algorithm)})
    return pd.DataFrame(rows)


def first_crossing(df: pd.DataFrame, threshold: float = 0.99) -> int | None:
    """Smallest number of micro-batches whose TP share reaches ``threshold`` (None if none does)."""
    hit = df.loc[df["tp_share"] >= threshold, "microbatches"]
    return int(hit.min()) if len(hit) else None


def summary_text(trace: Trace, gpus_per_node: int = 8) -> str:
    """The CLI's summary: bytes per parallelism, per phase, per pair class, and the TP share."""
    def table(df: pd.DataFrame, key: str | list[str]) -> list[str]:
        keys = [key] if isinstance(key, str) else key
        lines = []
        for _, r in df.iterrows():
            name = " / ".join(str(r[k]) for k in keys)
            lines.append(f"  {name:<28} {_human(r['bytes']):>12}  {100 * r['share']:6.2f}%")
        return lines

    out = [f"{trace.meta.get('model', {}).get('name', '?')}: {trace.world_size} ranks, "
           f"{int(trace.events['count'].sum()):,} calls ({len(trace):,} rows)",
           "message bytes per parallelism:", *table(bytes_by(trace, ["parallelism"]), "parallelism"),
           "message bytes per phase:", *table(bytes_by(trace, ["phase"]), "phase"),
           f"wire bytes (ring) per pair class ({gpus_per_node} GPUs per node):",
           *table(pair_classes(trace, gpus_per_node).sort_values("bytes", ascending=False),
                  ["parallelism", "pair_class"]),
           f"TP share of message bytes: {100 * tp_share(trace):.2f}%"]
    return "\n".join(out)


def _human(n: float) -> str:
    for unit, div in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


# ------------------------------------------------------------------------------------ notebook helpers
def predict_cases(cases: dict[str, tuple[str | ModelSpec, dict]], **kw) -> dict[str, Trace]:
    """``{label: (model, ParallelConfig keyword arguments)}`` -> ``{label: predicted Trace}``."""
    from ..specs import load_model
    from . import predict_traffic

    out = {}
    for label, (model, par) in cases.items():
        m = load_model(model) if isinstance(model, str) else model
        out[label] = predict_traffic(m, ParallelConfig(**par), **kw)
    return out


def volume_table(traces: dict[str, Trace], algorithm: str | None = None) -> pd.DataFrame:
    """Tidy ``config, parallelism, bytes, share`` over several traces."""
    return pd.concat([bytes_by(t, ["parallelism"], algorithm).assign(config=k) for k, t in traces.items()],
                     ignore_index=True)


def pair_class_table(traces: dict[str, Trace], gpus_per_node: int = 8, algorithm: str = "ring") -> pd.DataFrame:
    """Tidy ``config, parallelism, pair_class, bytes, share`` over several traces."""
    return pd.concat([pair_classes(t, gpus_per_node, algorithm).assign(config=k) for k, t in traces.items()],
                     ignore_index=True)


def support_violations(trace: Trace, algorithm: str = "direct") -> pd.DataFrame:
    """Nonzero matrix entries ``(parallelism, src, dst)`` whose two ranks share no group of that
    parallelism in the trace's layout (``tp`` for tp, ``tp`` and ``etp`` for sp, ``cp``, ``pp``, ``dp`` (with CP
    folded in) and ``edp`` for dp, ``ep``, ``tpep`` and ``tpcp`` for ep (the token dispatchers' and router's
    groups), ``mp``, ``world``, ``pp``, ``tpcp``, ``dp`` and ``tp`` for the per-iteration scalars and the batch broadcast tagged ``other``).
    Empty when every
    byte flows inside a group — finding F1's "determined by the parallel config and the rank mapping"."""
    from ..layout import Layout

    lay = Layout(ParallelConfig.from_dict(trace.meta["parallel"]), int(trace.meta.get("gpus_per_node", 8)))
    f = trace.flows(algorithm)
    f = f[f["bytes"] > 0]
    bad = []
    kinds = {"tp": ["tp"], "sp": ["tp", "etp"], "cp": ["cp"], "pp": ["pp"], "dp": ["dp", "edp", "dpcp"],
             "ep": ["ep", "tpep", "tpcp"], "other": ["mp", "world", "pp", "tpcp", "dp", "tp"]}
    for par, sub in f.groupby("parallelism", observed=True):
        ok = np.zeros(len(sub), dtype=bool)
        src, dst = sub["src"].to_numpy(), sub["dst"].to_numpy()
        for k in kinds.get(str(par), []):
            gi = lay.group_index(k)
            ok |= gi[src] == gi[dst]
        bad.append(sub.loc[~ok, ["parallelism", "src", "dst", "bytes"]])
    return pd.concat(bad, ignore_index=True) if bad else pd.DataFrame(columns=["parallelism", "src", "dst", "bytes"])
