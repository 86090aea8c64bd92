"""What the network sees: any trace's traffic on the links of a cluster topology.

``load_topology(name)`` reads ``data/topologies/NAME.yaml`` (:mod:`.topology`); :func:`place` puts ranks on GPU
slots (:mod:`.placement`); :mod:`.routing` states which links a flow crosses (NVLink, rails, PXN, ECMP
expected or sampled); :func:`link_loads` sums a trace onto every link (:mod:`.loads`); :func:`link_demand` spreads
a timed iteration over time (:mod:`.demand`); :func:`scenarios` varies order, placement and topology for one job
(:mod:`.whatif`); :func:`to_aicb` / :func:`flow_list` export for simulators (:mod:`.export`); ``llmcomm network``
is :mod:`.cli`.
"""

from __future__ import annotations

from .demand import fabric_bound_share, link_demand
from .export import flow_list, to_aicb, write_aicb, write_flow_list
from .loads import LinkLoads, PairFlows, link_loads, pair_flows
from .placement import POLICIES, place
from .topology import Tier, Topology, list_topologies, load_topology, topology_from_dict
from .whatif import off_rail, scenarios, with_oversubscription

__all__ = ["POLICIES", "LinkLoads", "PairFlows", "Tier", "Topology", "fabric_bound_share", "flow_list",
           "link_demand", "link_loads", "list_topologies", "load_topology", "off_rail", "pair_flows", "place",
           "scenarios", "to_aicb", "topology_from_dict", "with_oversubscription", "write_aicb", "write_flow_list"]
