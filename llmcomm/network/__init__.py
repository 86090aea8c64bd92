"""What the network sees: any trace's traffic on the links of a cluster topology.

``load_topology(name)`` reads ``data/topologies/NAME.yaml`` (:mod:`.topology`); :func:`place` puts ranks on GPU
slots (:mod:`.placement`); :mod:`.routing` states which links a flow crosses (NVLink, rails, PXN, ECMP
expected or sampled); :func:`link_loads` sums a trace onto every link (:mod:`.loads`).
"""

from __future__ import annotations

from .loads import LinkLoads, PairFlows, link_loads, pair_flows
from .placement import POLICIES, place
from .topology import Tier, Topology, list_topologies, load_topology, topology_from_dict

__all__ = ["POLICIES", "LinkLoads", "PairFlows", "Tier", "Topology", "link_loads", "list_topologies",
           "load_topology", "pair_flows", "place", "topology_from_dict"]
