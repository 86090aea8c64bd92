"""Where a job's ranks sit in a topology: ``placement[rank]`` = the GPU slot (``0 .. topology.gpus - 1``).

Four policies; the first three move whole servers, so a rank keeps its GPU index inside the server (its
rail) and a TP group inside a server stays inside it:

* ``contiguous``: rank ``r`` on slot ``r`` (a scheduler that packs the job from the first server on);
* ``by_rack``: the job's servers dealt round-robin over as many tier-1 domains (racks, SUs) as the job needs,
  so consecutive servers land in different racks (job server ``j`` -> domain ``j mod D``, position
  ``j // D`` in it): what a scheduler that spreads a job rack by rack does to rank-order locality;
* ``random``: a seeded random choice and order of servers anywhere in the cluster (a fragmented cluster);
* a user mapping: an integer array (or a ``rank, gpu`` DataFrame) giving each rank's slot; it must be a
  one-to-one map into the cluster.

Every policy refuses a job larger than the topology, with the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .topology import Topology

POLICIES = ("contiguous", "by_rack", "random")
Placement: TypeAlias = str | np.ndarray | Sequence[int] | pd.DataFrame | None


def place(world_size: int, topology: Topology, placement: Placement = "contiguous", *, seed: int = 0) -> np.ndarray:
    """The GPU slot of every rank (int64, length ``world_size``); see the module doc for the policies."""
    if world_size < 1:
        raise ConfigError(f"world_size={world_size} must be >= 1")
    if world_size > topology.gpus:
        raise ConfigError(f"a job of {world_size:,} GPUs does not fit topology {topology.name} of "
                          f"{topology.gpus:,} GPUs; use topology.for_world({world_size}) to widen its top tier")
    if placement is None or (isinstance(placement, str) and placement == "contiguous"):
        return np.arange(world_size, dtype=np.int64)
    if isinstance(placement, str):
        if placement not in POLICIES:
            raise ConfigError(f"placement={placement!r} is not one of {list(POLICIES)} or a rank -> GPU mapping")
        g = topology.gpus_per_server
        if world_size % g:
            raise ConfigError(f"placement={placement!r} moves whole servers: world_size={world_size} must be a "
                              f"multiple of gpus_per_server={g} (or give a mapping)")
        n = world_size // g
        if placement == "by_rack":
            per = topology.tiers[0].servers
            d = -(-n // per)
            j = np.arange(n)
            server = (j % d) * per + j // d
        else:
            server = np.random.default_rng(seed).choice(topology.servers, size=n, replace=False)
        ranks = np.arange(world_size, dtype=np.int64)
        return server.astype(np.int64)[ranks // g] * g + ranks % g
    return _mapping(placement, world_size, topology)


def _mapping(placement: np.ndarray | Sequence[int] | pd.DataFrame, world_size: int, topology: Topology) -> np.ndarray:
    if isinstance(placement, pd.DataFrame):
        missing = [c for c in ("rank", "gpu") if c not in placement.columns]
        if missing:
            raise ConfigError(f"placement mapping: missing column(s) {missing}; expected rank, gpu")
        ranks = placement["rank"].to_numpy()
        if len(ranks) != world_size or not np.array_equal(np.sort(ranks), np.arange(world_size)):
            raise ConfigError(f"placement mapping: column rank must hold each of 0..{world_size - 1} once")
        arr = np.empty(world_size, dtype=np.int64)
        arr[ranks.astype(np.int64)] = placement["gpu"].to_numpy()
    else:
        raw = np.asarray(placement)
        if raw.ndim != 1 or not np.issubdtype(raw.dtype, np.integer):
            raise ConfigError("placement mapping must be a 1-d integer array: the GPU slot of each rank")
        arr = raw.astype(np.int64)
    if len(arr) != world_size:
        raise ConfigError(f"placement mapping has {len(arr)} entries; the job has {world_size} ranks")
    if len(arr) and (arr.min() < 0 or arr.max() >= topology.gpus):
        bad = int(np.argmax((arr < 0) | (arr >= topology.gpus)))
        raise ConfigError(f"placement mapping: rank {bad} -> GPU {int(arr[bad])} is outside 0..{topology.gpus - 1} "
                          f"of topology {topology.name}")
    uniq, counts = np.unique(arr, return_counts=True)
    if (counts > 1).any():
        raise ConfigError(f"placement mapping: GPU {int(uniq[counts > 1][0])} holds more than one rank")
    return arr
