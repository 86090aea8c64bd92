"""What-if: one job with its rank order, placement or topology varied, answered in bytes per tier and peak link load.

:func:`scenarios` predicts the job once per distinct ``(parallel config, order)`` and maps it with
:func:`llmcomm.network.link_loads` once per scenario; each scenario is a mapping of changes to the base case:
``order`` (Megatron's rank order string), ``placement``, ``topology`` (a name, path or :class:`Topology`),
``oversubscription`` (``{tier name: ratio}`` replacing those tiers' ratios), ``pxn``, ``ecmp``, ``seed``.
The result has one row per scenario and reach tier (the bytes whose path tops out at that tier, and their
share) plus, per link tier, the peak link's bytes and ``busy_s`` (seconds at line rate per iteration).

:func:`off_rail` measures what a rail-only network (Wang et al., "Rail-only", 2023: no spine, cross-rail
traffic forwarded over NVLink inside the server) would have to relay: the scale-out bytes between GPUs of
different rails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..specs import ModelSpec, ParallelConfig, load_model
from ..vocab import AlgorithmName
from . import routing as R
from .loads import LinkLoads, PairFlows, link_loads, pair_flows
from .topology import Topology, load_topology

SCENARIO_KEYS = ("label", "order", "placement", "topology", "oversubscription", "pxn", "ecmp", "seed", "parallel")


def with_oversubscription(topology: Topology | str, ratios: Mapping[str, float]) -> Topology:
    """``topology`` with the oversubscription of the named tiers replaced (``{"cluster": 1}``: full bisection)."""
    topo = load_topology(topology)
    names = topo.tier_names
    bad = [n for n in ratios if n not in names[:-1]]
    if bad:
        raise ConfigError(f"oversubscription: {bad} are not tiers below the top of {topo.name} ({list(names[:-1])})")
    tiers = tuple(dataclasses.replace(t, oversubscription=float(ratios.get(t.name, t.oversubscription)))
                  for t in topo.tiers)
    return dataclasses.replace(topo, tiers=tiers, name=f"{topo.name}+{'+'.join(f'{k}1:{v:g}' for k, v in ratios.items())}")


def scenarios(model: ModelSpec | str, parallel: ParallelConfig, topology: Topology | str,
              cases: Sequence[Mapping[str, Any]], *, algorithm: AlgorithmName = "ring") -> tuple[pd.DataFrame, dict[str, LinkLoads]]:
    """``(table, loads)``: the table described in the module doc and each scenario's :class:`LinkLoads` by label."""
    from ..predict import predict_traffic

    spec = load_model(model) if isinstance(model, str) else model
    traces: dict[tuple, Any] = {}
    rows, loads = [], {}
    for i, case in enumerate(cases):
        unknown = sorted(set(case) - set(SCENARIO_KEYS))
        if unknown:
            raise ConfigError(f"scenario {i}: unknown key(s) {unknown}; known: {list(SCENARIO_KEYS)}")
        label = str(case.get("label", f"scenario {i}"))
        par = case.get("parallel", parallel)
        if case.get("order"):
            par = dataclasses.replace(par, order=case["order"])
        key = (repr(sorted(par.to_dict().items())),)
        if key not in traces:
            traces[key] = predict_traffic(spec, par)
        trace = traces[key]
        topo = load_topology(case.get("topology", topology)).for_world(trace.world_size)
        if case.get("oversubscription"):
            topo = with_oversubscription(topo, case["oversubscription"])
        L = link_loads(trace, topo, case.get("placement", "contiguous"), algorithm=algorithm,
                       ecmp=case.get("ecmp", "expected"), pxn=case.get("pxn", True), seed=case.get("seed", 0))
        loads[label] = L
        reach = L.reach.groupby("reach", observed=False)["bytes"].sum()
        total = float(reach.sum())
        peaks = L.tiers.set_index("tier")
        for tier, b in reach.items():
            rows.append({"scenario": label, "order": par.order, "topology": topo.name, "reach": tier,
                         "bytes": float(b), "share": float(b) / total if total else 0.0})
        for tier in topo.link_tiers:
            rows.append({"scenario": label, "order": par.order, "topology": topo.name, "link_tier": tier,
                         "peak_bytes": float(peaks.loc[tier, "max_bytes"]), "peak_busy_s": float(peaks.loc[tier, "max_busy_s"])})
    return pd.DataFrame(rows), loads


def off_rail(model: ModelSpec | str, parallel: ParallelConfig, topology: Topology | str,
             placement: Any = "contiguous", *, algorithm: AlgorithmName = "ring") -> pd.DataFrame:
    """Per parallelism: scale-out bytes per iteration, the part between GPUs of different rails (what a
    rail-only network relays over NVLink), and its share."""
    from ..predict import predict_traffic

    spec = load_model(model) if isinstance(model, str) else model
    trace = predict_traffic(spec, parallel)
    topo = load_topology(topology).for_world(trace.world_size)
    pf, _ = pair_flows(trace, topo, placement, algorithm=algorithm)
    return off_rail_table(pf, topo)


def off_rail_table(pf: PairFlows, topo: Topology) -> pd.DataFrame:
    """:func:`off_rail` of placed pair flows."""
    out = R.scale_up_domain(topo, pf.src) != R.scale_up_domain(topo, pf.dst)
    cross = out & (R.rail(topo, pf.src) != R.rail(topo, pf.dst))
    n = len(pf.parallelisms)
    so = np.bincount(pf.parallelism[out], weights=pf.bytes[out], minlength=n)
    cr = np.bincount(pf.parallelism[cross], weights=pf.bytes[cross], minlength=n)
    df = pd.DataFrame({"parallelism": pf.parallelisms, "scale_out_bytes": so, "off_rail_bytes": cr})
    df.loc[len(df)] = ["all", so.sum(), cr.sum()]
    df["off_rail_share"] = np.divide(df["off_rail_bytes"], df["scale_out_bytes"],
                                     out=np.zeros(len(df)), where=df["scale_out_bytes"] > 0)
    return df
