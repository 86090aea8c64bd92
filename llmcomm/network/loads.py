"""Link loads: any trace's bytes per iteration on every link of a topology, per tier and per parallelism.

:func:`link_loads` takes the trace's communication matrix one parallelism at a time
(:meth:`llmcomm.trace.Trace.matrix`, the blocked sparse builder of :mod:`llmcomm.matrix`, so a prediction is
decomposed from its group references and the matrix is bit-identical to the rest of the kit's), maps ranks to
GPU slots (:mod:`.placement`), routes every nonzero (a GPU pair of one parallelism: one NCCL connection) with
:mod:`.routing` and sums with ``np.bincount``; nothing loops over flows or links. Per link it reports:

============ ===================================================================================================
column       meaning
============ ===================================================================================================
tier         link tier: ``nvlink`` (GPU to its NVLink switch), ``host`` (NIC port to its tier-1 switch), ``a-b``
             (uplinks of tier ``a`` to tier ``b``); :attr:`Topology.link_tiers`
direction    ``up`` (towards the top) or ``down``
plane        network plane (0 unless the topology has several)
lower        the device below: GPU slot (``nvlink``, ``host``) or switch id of tier ``a`` (per plane)
port         the lower device's port (``host``: 0; ``nvlink``: 0)
upper        the device above: scale-up domain (``nvlink``), tier-1 switch (``host``), switch of tier ``b``
bytes        bytes per iteration (the trace's bytes divided by its number of iterations)
flows        ``expected``: connections whose equal-cost choices include the link; ``sample``: hashed onto it
capacity     bytes/s of the link in that direction
busy_s       ``bytes / capacity``: seconds the link needs at line rate per iteration
============ ===================================================================================================

Only links that carry bytes are listed; :attr:`LinkLoads.tiers` gives per tier the links in the cluster, the
ones used, total, mean and peak bytes and the peak ``busy_s``; :attr:`LinkLoads.reach` the share of each
parallelism's bytes by the highest tier it reaches; :meth:`LinkLoads.hottest` the links with the largest
``busy_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from ..errors import ConfigError
from ..events import vocabulary_codes
from ..matrix import stacked_matrix
from ..vocab import ALGORITHMS, PARALLELISM_TAGS, AlgorithmName
from . import routing as R
from .placement import Placement, place
from .topology import Topology, load_topology

if TYPE_CHECKING:
    from ..trace import Trace

LINK_COLUMNS = ("tier", "direction", "plane", "lower", "port", "upper", "bytes", "flows", "capacity", "busy_s")
MAX_FLOWS = 400_000_000  # GPU pairs routed at once (~60 bytes each in the temporaries)


@dataclass(frozen=True)
class PairFlows:
    """Traffic as routed: one row per (parallelism, source slot, destination slot) with its bytes per
    iteration. ``parallelism`` holds codes into ``parallelisms``."""

    src: np.ndarray
    dst: np.ndarray
    bytes: np.ndarray
    parallelism: np.ndarray
    parallelisms: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.src)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"parallelism": pd.Categorical.from_codes(self.parallelism, self.parallelisms),
                             "src": self.src, "dst": self.dst, "bytes": self.bytes})


@dataclass(frozen=True)
class LinkLoads:
    """The result of :func:`link_loads` (see the module doc)."""

    links: pd.DataFrame
    tiers: pd.DataFrame
    reach: pd.DataFrame
    topology: Topology
    placement: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def hottest(self, n: int = 10, tier: str | None = None) -> pd.DataFrame:
        """The ``n`` links with the largest ``busy_s`` (optionally of one tier), hottest first."""
        df = self.links if tier is None else self.links[self.links["tier"] == tier]
        return df.nlargest(n, "busy_s").reset_index(drop=True)

    def tier_bytes(self) -> pd.Series:
        """Bytes per iteration summed over each tier's links (a byte crossing two links of a tier counts twice)."""
        return self.tiers.set_index("tier")["bytes"]


def pair_flows(trace: Trace, topology: Topology, placement: Placement = "contiguous", *, algorithm: AlgorithmName = "ring",
               seed: int = 0, per_iteration: bool = True) -> tuple[PairFlows, np.ndarray]:
    """The trace's GPU-pair traffic per parallelism, placed on ``topology``: ``(PairFlows, slots)`` where
    ``slots[rank]`` is each rank's GPU slot. ``per_iteration`` divides by the trace's number of iterations."""
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}")
    world = trace.world_size
    slots = place(world, topology, placement, seed=seed)
    events = trace.ref_events if trace.ref_events is not None else trace.to_table()
    tags = vocabulary_codes(events.column("parallelism"), PARALLELISM_TAGS)  # validated traces: none outside
    present = np.bincount(tags[tags >= 0], minlength=len(PARALLELISM_TAGS)) > 0 if len(tags) else \
        np.zeros(len(PARALLELISM_TAGS), bool)
    names = tuple(sorted(PARALLELISM_TAGS[i] for i in np.nonzero(present)[0]))
    iters = pc.count_distinct(events.column("iteration")).as_py() if events.num_rows else 0
    n_iter = max(1, iters) if per_iteration else 1
    src, dst, byt, par = [], [], [], []
    if algorithm == "ring" and (tags >= 0).all():
        # every parallelism's ring matrix from one decomposition (llmcomm.matrix.stacked_matrix: the same
        # matrices, bit for bit, as trace.matrix(algorithm, parallelism=p) one by one)
        code_of = np.full(len(PARALLELISM_TAGS), -1, dtype=np.int64)
        code_of[[PARALLELISM_TAGS.index(p) for p in names]] = np.arange(len(names))
        stack = stacked_matrix(events, world, algorithm, code_of[tags], len(names)).tocoo()
        row = stack.row.astype(np.int64)
        src.append(slots[row % world])
        dst.append(slots[stack.col.astype(np.int64)])
        byt.append(stack.data / n_iter)
        par.append((row // world).astype(np.int8))
    else:
        for code, p in enumerate(names):
            m = trace.matrix(algorithm, world, parallelism=p).tocoo()
            if m.nnz == 0:
                continue
            src.append(slots[m.row.astype(np.int64)])
            dst.append(slots[m.col.astype(np.int64)])
            byt.append(m.data / n_iter)
            par.append(np.full(m.nnz, code, dtype=np.int8))
    cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))  # noqa: E731
    pf = PairFlows(cat(src, np.int64), cat(dst, np.int64), cat(byt, np.float64), cat(par, np.int8), names)
    if len(pf) > MAX_FLOWS:
        raise ConfigError(f"{len(pf):,} GPU pairs exceed the {MAX_FLOWS:,} routed at once; use algorithm='ring' "
                          "or fewer GPUs")
    return pf, slots


def link_loads(trace: Trace, topology: Topology | str, placement: Placement = "contiguous", *,
               algorithm: AlgorithmName = "ring", ecmp: str = "expected", pxn: bool = True, qps: int = 1, seed: int = 0,
               per_iteration: bool = True) -> LinkLoads:
    """Bytes per iteration on every link of ``topology`` for ``trace`` placed by ``placement`` (see the module
    doc; routing rules in :mod:`llmcomm.network.routing`). ``algorithm``: how collectives become flows
    (``ring``: NCCL's ring, the default; ``direct``); ``ecmp``: ``expected`` or ``sample`` (seeded per-flow
    hashing, ``qps`` queue pairs per connection); ``pxn``: NCCL's PXN relay on rail-optimized fabrics."""
    topo = load_topology(topology)
    if ecmp not in R.ECMP_MODES:
        raise ConfigError(f"ecmp={ecmp!r} is not one of {list(R.ECMP_MODES)}")
    if qps < 1:
        raise ConfigError(f"qps={qps} must be >= 1")
    pf, slots = pair_flows(trace, topo, placement, algorithm=algorithm, seed=seed, per_iteration=per_iteration)
    links, reach_df = route(pf, topo, ecmp=ecmp, pxn=pxn, qps=qps, seed=seed)
    meta = {"algorithm": algorithm, "ecmp": ecmp, "pxn": pxn, "qps": qps, "seed": seed,
            "world_size": trace.world_size, "topology": topo.name, "pairs": len(pf)}
    return LinkLoads(links, tier_summary(links, topo), reach_df, topo, slots, meta)


def route(pf: PairFlows, topo: Topology, *, ecmp: str = "expected", pxn: bool = True, qps: int = 1,
          seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(links, reach)`` of placed pair flows (see :func:`link_loads`)."""
    src, dst, w = pf.src, pf.dst, pf.bytes
    nic = R.relay(topo, src, dst, pxn)
    rch = R.reach(topo, nic, dst)
    parts: list[pd.DataFrame] = []
    # NVLink: flows inside a scale-up domain, and PXN's hop to the relaying GPU
    legs = [(rch == 0, src, dst), (nic != src, src, nic)]
    s_nv = np.concatenate([s[m] for m, s, _ in legs])
    d_nv = np.concatenate([d[m] for m, _, d in legs])
    w_nv = np.concatenate([w[m] for m, _, _ in legs])
    cap_nv = topo.nvlink_bandwidth
    for direction, ends in (("up", s_nv), ("down", d_nv)):
        ids, b, f = _sum(ends, w_nv)
        parts.append(_frame("nvlink", direction, 0, ids, 0, ids // topo.scale_up_gpus, b, f, cap_nv))
    out = rch > 0
    if ecmp == "expected":
        parts += _expected(topo, nic[out], dst[out], w[out], rch[out])
    else:
        parts += _sampled(topo, nic[out], dst[out], w[out], rch[out], qps, seed)
    links = pd.concat(parts, ignore_index=True)
    links["tier"] = pd.Categorical(links["tier"], categories=list(topo.link_tiers))
    links["direction"] = pd.Categorical(links["direction"], categories=["up", "down"])
    order = ["tier", "direction", "plane", "lower", "port"]
    if not _ascending(links, order):  # the parts come in this order (then the stable sort changes nothing)
        links = links.sort_values(order, kind="stable", ignore_index=True)
    return links, reach_table(pf, rch, topo)


def _ascending(df: pd.DataFrame, columns: list[str]) -> bool:
    """Whether ``df``'s rows are in ascending lexicographic order of ``columns`` (categoricals by code)."""
    if len(df) < 2:
        return True
    keys = [df[c].cat.codes.to_numpy() if isinstance(df[c].dtype, pd.CategoricalDtype) else df[c].to_numpy()
            for c in columns]
    undecided = np.ones(len(df) - 1, dtype=bool)  # pairs (i, i+1) equal on the columns so far
    for k in keys:
        a, b = k[:-1], k[1:]
        if (undecided & (a > b)).any():
            return False
        undecided &= a == b
    return True


def _sum(keys: np.ndarray, w: np.ndarray, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct keys (ascending) with their summed bytes (× ``scale``) and flow counts. Keys below a few times
    their number are binned directly (``bincount`` adds in input order, as over ``np.unique``'s inverse: the
    same sums), others through ``np.unique``."""
    if len(keys) == 0:
        return keys.astype(np.int64), np.zeros(0), np.zeros(0, np.int64)
    top = int(keys.max())
    if keys.min() >= 0 and top < max(4 * len(keys), 1 << 20):
        counts = np.bincount(keys, minlength=top + 1)
        uniq = np.nonzero(counts)[0]
        return uniq, np.bincount(keys, weights=w, minlength=top + 1)[uniq] * scale, counts[uniq].astype(np.int64)
    uniq, inv = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inv, weights=w) * scale, np.bincount(inv).astype(np.int64)


def _frame(tier: str, direction: str, plane: int | np.ndarray, lower: np.ndarray, port: int | np.ndarray,
           upper: np.ndarray, b: np.ndarray, f: np.ndarray, cap: float) -> pd.DataFrame:
    n = len(lower)
    return pd.DataFrame({"tier": tier, "direction": direction,
                         "plane": np.broadcast_to(np.asarray(plane, np.int64), n).copy(),
                         "lower": lower.astype(np.int64), "port": np.broadcast_to(np.asarray(port, np.int64), n).copy(),
                         "upper": np.asarray(upper, np.int64), "bytes": b, "flows": f, "capacity": cap,
                         "busy_s": b / cap})


def _per_plane(topo: Topology, df: pd.DataFrame) -> list[pd.DataFrame]:
    """Expected loads of one plane repeated for every plane (each plane carries ``1/planes``)."""
    if topo.planes == 1:
        return [df]
    out = []
    for p in range(topo.planes):
        d = df.copy()
        d["plane"] = p
        out.append(d)
    return out


def _expected(topo: Topology, src: np.ndarray, dst: np.ndarray, w: np.ndarray, rch: np.ndarray) -> list[pd.DataFrame]:
    share = 1.0 / topo.planes
    parts = []
    for direction, ends in (("up", src), ("down", dst)):
        ids, b, f = _sum(ends, w, share)
        parts += _per_plane(topo, _frame("host", direction, 0, ids, 0, R.tier0_switch(topo, ids), b, f,
                                         topo.host_bandwidth()))
    names = topo.link_tiers
    for k in range(len(topo.tiers) - 1):
        above = rch >= k + 2
        u = topo.tiers[k].uplinks
        per = topo.switches_per_domain(k)
        cap = topo.port_bandwidth(k)
        for direction, ends in (("up", src[above]), ("down", dst[above])):
            unit = R.tier0_switch(topo, ends) if k == 0 else R.domain(topo, ends, k)
            ids, b, f = _sum(unit, w[above], share)
            n_ports = u if k == 0 else per * u  # equal-cost links out of the unit
            if k == 0:
                lower = np.repeat(ids, u)
                port = np.tile(np.arange(u), len(ids))
            else:
                lower = (np.repeat(ids * per, per * u) + np.tile(np.repeat(np.arange(per), u), len(ids)))
                port = np.tile(np.arange(u), len(ids) * per)
            bb, ff = np.repeat(b / n_ports, n_ports), np.repeat(f, n_ports)
            parts += _per_plane(topo, _frame(names[2 + k], direction, 0, lower, port,
                                             R.upper_switch(topo, k, lower, port), bb, ff, cap))
    return parts


def _sampled(topo: Topology, src: np.ndarray, dst: np.ndarray, w: np.ndarray, rch: np.ndarray, qps: int,
             seed: int) -> list[pd.DataFrame]:
    if qps > 1:
        src, dst, rch = np.repeat(src, qps), np.repeat(dst, qps), np.repeat(rch, qps)
        w = np.repeat(w / qps, qps)
        qp = np.tile(np.arange(qps, dtype=np.int64), len(src) // qps)
    else:
        qp = np.zeros(len(src), np.int64)
    plane, up, down = R.sample_paths(topo, src, dst, qp, rch, seed)
    parts = []
    gpus = topo.gpus
    for direction, ends in (("up", src), ("down", dst)):
        ids, b, f = _sum(plane * gpus + ends, w)
        g = ids % gpus
        parts.append(_frame("host", direction, ids // gpus, g, 0, R.tier0_switch(topo, g), b, f,
                            topo.host_bandwidth()))
    names = topo.link_tiers
    for k in range(len(topo.tiers) - 1):
        u = topo.tiers[k].uplinks
        n_sw = topo.switch_count(k)
        for direction, (idx, lower, port) in (("up", up[k]), ("down", down[k])):
            key = (plane[idx] * n_sw + lower) * u + port
            ids, b, f = _sum(key, w[idx])
            port_ = ids % u
            lower_ = (ids // u) % n_sw
            parts.append(_frame(names[2 + k], direction, ids // u // n_sw, lower_, port_,
                                R.upper_switch(topo, k, lower_, port_), b, f, topo.port_bandwidth(k)))
    return parts


def tier_summary(links: pd.DataFrame, topo: Topology) -> pd.DataFrame:
    """Per link tier: links in the cluster (both directions), links used, total bytes over all its links and
    directions (``bytes``) and over its up direction (``up_bytes``: each byte once per hop it climbs), mean and
    peak bytes per link, peak ``busy_s`` and ``imbalance`` (peak / mean over the links used)."""
    rows = []
    counts = {"nvlink": topo.gpus, "host": topo.gpus * topo.planes}
    for k in range(len(topo.tiers) - 1):
        counts[topo.link_tiers[2 + k]] = topo.switch_count(k) * topo.planes * topo.tiers[k].uplinks
    for tier in topo.link_tiers:
        d = links[links["tier"] == tier]
        b = d["bytes"].to_numpy()
        up = float(d.loc[d["direction"] == "up", "bytes"].sum())
        rows.append({"tier": tier, "links": 2 * counts[tier], "used": len(d), "bytes": float(b.sum()), "up_bytes": up,
                     "mean_bytes": float(b.mean()) if len(b) else 0.0, "max_bytes": float(b.max()) if len(b) else 0.0,
                     "max_busy_s": float(d["busy_s"].max()) if len(d) else 0.0,
                     "imbalance": float(b.max() / b.mean()) if len(b) and b.mean() > 0 else float("nan")})
    return pd.DataFrame(rows)


def reach_table(pf: PairFlows, rch: np.ndarray, topo: Topology) -> pd.DataFrame:
    """Per parallelism and highest tier reached (:attr:`Topology.reach_tiers`): bytes per iteration and the
    share of that parallelism's bytes."""
    n_reach = len(topo.reach_tiers)
    key = pf.parallelism.astype(np.int64) * n_reach + rch
    sums: np.ndarray = np.bincount(key, weights=pf.bytes, minlength=len(pf.parallelisms) * n_reach)
    sums = sums.reshape(len(pf.parallelisms), n_reach) if len(pf.parallelisms) else np.zeros((0, n_reach))
    tot = sums.sum(axis=1, keepdims=True)
    share = np.divide(sums, tot, out=np.zeros_like(sums), where=tot > 0)
    return pd.DataFrame({
        "parallelism": np.repeat(pf.parallelisms, n_reach),
        "reach": pd.Categorical(np.tile(topo.reach_tiers, len(pf.parallelisms)), categories=list(topo.reach_tiers)),
        "bytes": sums.ravel(), "share": share.ravel()})
