"""Routing, stated: which links a flow between two GPU slots crosses (vectorized over flows).

1. **Scale-up**: two GPUs of one scale-up domain (``gpu // scale_up_gpus`` equal) talk over NVLink: the
   source's NVLink port up, the destination's down. Nothing else.
2. **Scale-out**: otherwise the flow leaves through a NIC. Its *reach* is the lowest switch tier whose unit
   holds both ends: tier 1 when both NICs hang off the same tier-1 switch (the same rack's ToR; with rails,
   the same SU *and* the same rail: rail-aligned traffic stays on its rail's leaf), else the lowest tier ``k``
   whose domain holds both servers. It climbs from the source's tier-1 switch to tier ``k`` and down to the
   destination's.
3. **PXN** (``pxn=True``, rail-optimized fabrics only): a scale-out flow between GPUs of different rails is
   first moved over NVLink to the GPU of the source's server on the destination's rail, which sends it
   rail-aligned; NCCL does this for point-to-point traffic by default (``NCCL_PXN_DISABLE=0``,
   ``NCCL_P2P_PXN_LEVEL=2``: NCCL ``src/graph/paths.cc`` and ``src/graph/search.cc``, ``ncclTopoGetNetDev``).
   The rule is applied here to every cross-rail scale-out flow, ring steps of collectives included (NCCL
   builds its rings from its topology search and picks their NICs itself; a ring step between GPUs of
   different local index is an approximation either way). With ``pxn=False`` cross-rail traffic goes up to
   the spine, as the DGX SuperPOD RA describes.
4. **ECMP** over the tiers above tier 1, two ways:

   * ``expected``: every flow splits evenly over its equal-cost choices, so each uplink of a tier-1 switch
     carries ``1/uplinks`` of what the switch sends up, each uplink out of a tier-``k`` domain
     ``1/(switches · uplinks)`` of what the domain sends up (the same on the way down), and each plane
     ``1/planes`` of a GPU's traffic;
   * ``sample``: each flow (or each of its ``qps`` queue pairs, NCCL_IB_QPS_PER_CONNECTION) is hashed, with
     a seed, to one plane and one port per hop; the down path from the top switch takes the links that switch
     has into the destination's side, again by hash (see :func:`sample_paths`). Collisions of large flows on
     one port are what makes real ECMP uneven.

Device ids: GPU slot ``g``; server ``g // gpus_per_server``; rail ``g % gpus_per_server``; tier-1 switch
``domain · R + rail`` (``R`` rails, 1 without rails); a tier-``k`` switch ``domain_k · switches_k + i``; a
port ``p`` of a tier-``k`` switch goes to switch ``domain_{k+1} · S + p mod S`` above it (``S`` = switches of
tier ``k+1``); planes repeat every switch id.
"""

from __future__ import annotations

import numpy as np

from .topology import Topology

ECMP_MODES = ("expected", "sample")
_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def server(topo: Topology, gpu: np.ndarray) -> np.ndarray:
    return gpu // topo.gpus_per_server


def rail(topo: Topology, gpu: np.ndarray) -> np.ndarray:
    return gpu % topo.gpus_per_server


def domain(topo: Topology, gpu: np.ndarray, k: int) -> np.ndarray:
    """The tier-``k`` domain (0-based tier index) of each GPU slot."""
    return server(topo, gpu) // topo.tiers[k].servers


def tier0_switch(topo: Topology, gpu: np.ndarray) -> np.ndarray:
    """The tier-1 switch (0-based tier 0) each GPU's NIC hangs off, per plane."""
    d = domain(topo, gpu, 0)
    return d * topo.gpus_per_server + rail(topo, gpu) if topo.rail_optimized else d


def scale_up_domain(topo: Topology, gpu: np.ndarray) -> np.ndarray:
    return gpu // topo.scale_up_gpus


def reach(topo: Topology, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Highest point each flow reaches: 0 inside its scale-up domain (NVLink), ``k + 1`` when tier ``k``
    (0-based) is the lowest whose switch (tier 0) or domain (above) holds both ends."""
    out = np.full(len(src), len(topo.tiers), dtype=np.int8)
    todo = scale_up_domain(topo, src) != scale_up_domain(topo, dst)
    out[~todo] = 0
    same = tier0_switch(topo, src) == tier0_switch(topo, dst)
    hit = todo & same
    out[hit] = 1
    todo &= ~same
    for k in range(1, len(topo.tiers) - 1):
        same = domain(topo, src, k) == domain(topo, dst, k)
        hit = todo & same
        out[hit] = k + 1
        todo &= ~same
    return out


def relay(topo: Topology, src: np.ndarray, dst: np.ndarray, pxn: bool) -> np.ndarray:
    """The GPU whose NIC sends each flow: the source itself, or with PXN on a rail-optimized fabric, for a
    scale-out flow across rails, the GPU of the source's server on the destination's rail."""
    if not (pxn and topo.rail_optimized):
        return src
    out = src.copy()
    move = (scale_up_domain(topo, src) != scale_up_domain(topo, dst)) & (rail(topo, src) != rail(topo, dst))
    out[move] = server(topo, src[move]) * topo.gpus_per_server + rail(topo, dst[move])
    return out


def upper_switch(topo: Topology, k: int, lower: np.ndarray, port: np.ndarray) -> np.ndarray:
    """The tier-``k+1`` switch (per plane) that port ``port`` of tier-``k`` switch ``lower`` goes to."""
    per = topo.switches_per_domain(k)
    dom_up = (lower // per) // (topo.tiers[k + 1].servers // topo.tiers[k].servers)
    s_up = topo.switches_per_domain(k + 1)
    return dom_up * s_up + port % s_up


# -------------------------------------------------------------------------------------- ECMP hashing
def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 (wrapping arithmetic): a fast, well-spread integer hash."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
    return x


def flow_hash(src: np.ndarray, dst: np.ndarray, qp: np.ndarray, seed: int, salt: int) -> np.ndarray:
    """A seeded per-flow hash of (source, destination, queue pair) for hop ``salt``: the stand-in for a
    switch hashing a RoCE/IB flow's header fields."""
    with np.errstate(over="ignore"):
        key = (src.astype(np.uint64) * _GOLD) ^ mix(dst.astype(np.uint64) + np.uint64(seed) * _M1)
        key ^= mix(qp.astype(np.uint64) + np.uint64(salt) * _M2 + np.uint64(seed))
    return mix(key)


def sample_paths(topo: Topology, src: np.ndarray, dst: np.ndarray, qp: np.ndarray, reach_: np.ndarray,
                 seed: int) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                                     list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Per-flow ECMP choices: ``(plane, up, down)``; ``up[k]`` / ``down[k]`` are ``(flow index, lower switch,
    port)`` of the tier-``k`` uplinks each flow with reach above tier ``k`` climbs / descends.

    Up: from the source's tier-0 switch, hop ``k`` takes port ``hash_k mod uplinks_k`` to switch
    :func:`upper_switch`. Down from the top switch ``σ`` (tier ``L``) towards the destination: at each tier
    ``k`` below it the lower switch is the destination's own at tier 0, else a hashed one of the
    destination's tier-``k`` domain; of that switch's ports the ones wired to ``σ`` are ``σ mod S + S · j``,
    and ``j`` is hashed."""
    n_tiers = len(topo.tiers)
    plane = (flow_hash(src, dst, qp, seed, 0) % np.uint64(topo.planes)).astype(np.int64)
    up: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    down: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    idx = np.nonzero(reach_ >= 2)[0]
    cur = tier0_switch(topo, src[idx])
    top = np.zeros(len(src), dtype=np.int64)
    for k in range(n_tiers - 1):
        keep = reach_[idx] >= k + 2
        idx, cur = idx[keep], cur[keep]
        u = topo.tiers[k].uplinks
        port = (flow_hash(src[idx], dst[idx], qp[idx], seed, 1 + k) % np.uint64(u)).astype(np.int64)
        up.append((idx, cur, port))
        cur = upper_switch(topo, k, cur, port)
        at_top = reach_[idx] == k + 2
        top[idx[at_top]] = cur[at_top]
    for k in range(n_tiers - 1):  # tier k's uplinks used on the way down: flows whose reach is above k
        idx = np.nonzero(reach_ >= k + 2)[0]
        down.append((idx, np.zeros(0, np.int64), np.zeros(0, np.int64)))
    # walk down from each flow's top switch, tier by tier
    sigma = top.copy()
    for k in range(n_tiers - 2, -1, -1):
        idx = down[k][0]
        s_up = topo.switches_per_domain(k + 1)
        sig_local = sigma[idx] % s_up
        if k == 0:
            lower = tier0_switch(topo, dst[idx])
        else:
            per = topo.switches_per_domain(k)
            pick = (flow_hash(src[idx], dst[idx], qp[idx], seed, 100 + k) % np.uint64(per)).astype(np.int64)
            lower = domain(topo, dst[idx], k) * per + pick
        parallel = topo.tiers[k].uplinks // s_up
        j = (flow_hash(src[idx], dst[idx], qp[idx], seed, 200 + k) % np.uint64(parallel)).astype(np.int64)
        down[k] = (idx, lower, sig_local + s_up * j)
        sigma[idx] = lower
    return plane, up, down
