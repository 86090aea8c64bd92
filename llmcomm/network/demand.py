"""Each link's demand over one iteration against its capacity: where the fabric, not the GPUs, sets the pace.

Input: a *timed* trace — a recorded one, or a prediction with a predicted timeline
(:func:`llmcomm.overhead.timeline.predicted_timeline`). Each flow (:func:`llmcomm.network.export.flow_list`) is
spread evenly over its call's ``[t_start, t_end]``: in a time bin ``[a, b)`` it carries ``bytes · overlap /
duration`` (a call of zero duration puts all its bytes in the bin of its start). The flows of each bin are routed
with :func:`llmcomm.network.loads.route` (expected ECMP) and every link's demand is ``bytes in the bin / (bin
width · capacity)``: 1 means the link is busy the whole bin at line rate; above 1 the call cannot take the time
the cost model gave it on this fabric — the network, not the GPUs, sets the pace there.

:func:`link_demand` returns per bin and link tier the peak and mean demand over the links used and the bytes;
:func:`fabric_bound_share` the share of the iteration in which some link of a tier is over capacity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..vocab import AlgorithmName
from .export import flow_list
from .loads import PairFlows, route
from .placement import Placement
from .topology import Topology, load_topology

if TYPE_CHECKING:
    from ..trace import Trace

MAX_BIN_FLOWS = 50_000_000  # flow-bin overlaps handled at once


def link_demand(trace: Trace, topology: Topology | str, placement: Placement = "contiguous", *, bins: int = 200,
                algorithm: AlgorithmName = "ring", pxn: bool = True, seed: int = 0, iteration: int | None = None) -> pd.DataFrame:
    """Per time bin and link tier: ``t_start_s, t_end_s, tier, peak_demand, mean_demand, bytes, hottest_lower,
    hottest_direction`` (see the module doc). ``iteration``: which iteration of a multi-iteration trace (default
    its last); times are relative to the iteration's first call."""
    topo = load_topology(topology).for_world(trace.world_size)
    fl = flow_list(trace, topology=topo, placement=placement, seed=seed, algorithm=algorithm)
    ev_end = trace.events["t_end_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    fl = fl[fl["phase"].isin(["forward", "backward", "optimizer"])]
    if fl["start_ns"].isna().any() or np.isnan(ev_end[fl["event"].to_numpy()]).any():
        raise ConfigError("link_demand needs a timed trace: every call's t_start_ns and t_end_ns (a recorded trace, "
                          "or llmcomm.overhead.timeline.predicted_timeline(...).trace())")
    its = sorted(fl["iteration"].unique())
    it = its[-1] if iteration is None else iteration
    fl = fl[fl["iteration"] == it]
    if fl.empty:
        raise ConfigError(f"link_demand: no flows in iteration {it}")
    start = fl["start_ns"].to_numpy() / 1e9
    end = ev_end[fl["event"].to_numpy()] / 1e9
    t0, t1 = float(start.min()), float(end.max())
    edges = np.linspace(t0, max(t1, t0 + 1e-9), bins + 1)
    width = edges[1] - edges[0]
    names = tuple(sorted(set(fl["parallelism"].astype(str))))
    par = pd.Categorical(fl["parallelism"].astype(str), categories=names).codes.astype(np.int8)
    src, dst, byt = fl["src"].to_numpy(), fl["dst"].to_numpy(), fl["bytes"].to_numpy()
    first = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, bins - 1)
    last = np.clip(np.searchsorted(edges, end, side="left") - 1, first, bins - 1)
    span = last - first + 1
    if span.sum() > MAX_BIN_FLOWS:
        raise ConfigError(f"link_demand: {int(span.sum()):,} flow-bin pieces exceed {MAX_BIN_FLOWS:,}; use fewer bins")
    flow = np.repeat(np.arange(len(fl)), span)
    b = first[flow] + (np.arange(len(flow)) - np.repeat(np.cumsum(span) - span, span))
    lo, hi = np.maximum(start[flow], edges[b]), np.minimum(end[flow], edges[b + 1])
    dur = end - start
    frac = np.where(dur[flow] > 0, np.clip(hi - lo, 0, None) / np.where(dur[flow] > 0, dur[flow], 1), 1.0)
    piece_bytes = byt[flow] * frac
    order = np.argsort(b, kind="stable")
    b, flow, piece_bytes = b[order], flow[order], piece_bytes[order]
    cuts = np.searchsorted(b, np.arange(bins + 1))
    rows = []
    for k in range(bins):
        sl = slice(cuts[k], cuts[k + 1])
        if cuts[k] == cuts[k + 1]:
            continue
        f = flow[sl]
        pf = PairFlows(src[f], dst[f], piece_bytes[sl], par[f], names)
        links, _ = route(pf, topo, ecmp="expected", pxn=pxn)
        links = links[links["bytes"] > 0]
        demand = links["bytes"].to_numpy() / (links["capacity"].to_numpy() * width)
        links = links.assign(demand=demand)
        for tier, d in links.groupby("tier", observed=True):
            i = int(np.argmax(d["demand"].to_numpy()))
            rows.append({"t_start_s": edges[k] - t0, "t_end_s": edges[k + 1] - t0, "tier": tier,
                         "peak_demand": float(d["demand"].iat[i]), "mean_demand": float(d["demand"].mean()),
                         "bytes": float(d["bytes"].sum()), "hottest_lower": int(d["lower"].iat[i]),
                         "hottest_direction": str(d["direction"].iat[i])})
    out = pd.DataFrame(rows)
    if len(out):
        out["tier"] = pd.Categorical(out["tier"], categories=list(topo.link_tiers))
    return out


def fabric_bound_share(demand: pd.DataFrame) -> pd.DataFrame:
    """Per tier: the share of the iteration's bins in which its peak link demand exceeds 1 (over capacity), and
    the largest peak demand."""
    if demand.empty:
        return pd.DataFrame(columns=["tier", "over_capacity_share", "max_peak_demand"])
    width = float(demand["t_end_s"].iat[0] - demand["t_start_s"].iat[0])
    n_bins = max(1, round(float(demand["t_end_s"].max()) / width))
    g = demand.groupby("tier", observed=True)
    return pd.DataFrame({"over_capacity_share": g["peak_demand"].apply(lambda x: float((x > 1).sum()) / n_bins),
                         "max_peak_demand": g["peak_demand"].max()}).reset_index()
