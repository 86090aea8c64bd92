"""A cluster's network as data: the scale-up domain and the switch tiers above it (``data/topologies/*.yaml``).

A topology is a tree of *domains* counted in servers (a server holds ``gpus_per_server`` consecutive GPU
slots; ``server = gpu // gpus_per_server``, its GPU's *rail* is ``gpu % gpus_per_server``):

* the **scale-up domain**: ``scale_up_gpus`` consecutive GPUs joined by NVLink (8 in an HGX server, 72 in an
  NVL72 rack), ``nvlink_bandwidth`` bytes/s per GPU and direction;
* **tier 1** (leaf, ToR): a domain of ``tiers[0].servers`` servers. Each GPU has one NIC of ``nic_bandwidth``
  bytes/s per direction (split over ``planes`` ports, one per plane). Without rails the domain has one switch
  per plane (a ToR); ``rail_optimized`` gives it one switch per rail and plane (NVIDIA's rail-optimized SU: the
  GPUs of local index ``r`` of all the SU's servers share leaf ``r``);
* **tier k > 1** (spine, aggregation, core): a domain of ``tiers[k].servers`` servers (a multiple of tier
  ``k-1``'s) holding ``tiers[k].switches`` switches per plane. The top tier's domain is the whole cluster.

Wiring (a folded Clos per plane): every switch of tier ``k`` has ``tiers[k].uplinks`` ports to tier ``k+1``;
port ``p`` goes to switch ``p mod S`` of its tier-``k+1`` domain (``S = tiers[k+1].switches``, which must
divide the uplinks). Capacities follow from the oversubscription (downlink : uplink capacity) of each tier::

    C_down(1)  = G_1 · nic_bandwidth / planes                  (one tier-1 domain, one plane; G_1 its GPUs)
    C_up(k)    = C_down(k) / oversubscription_k                (k below the top)
    port(k)    = C_up(k) / (switches_k · uplinks_k)            (one uplink, one direction)
    C_down(k+1) = C_up(k) · servers_{k+1} / servers_k

so a published ratio (Llama 3's 1:7 at the aggregation layer) sets the capacity, and ``uplinks`` is the ECMP
fan-out. Where a source gives port counts (DGX SuperPOD: 32 up / 32 down per leaf) the two agree.

Validation names the file and the field: ``<file>: tiers[1].servers=100 must be a multiple of
tiers[0].servers=32``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..paths import data_dir
from ..specs import read_yaml


@dataclass(frozen=True)
class Tier:
    """One switch tier: its domain size in servers, switches per domain (per plane), uplink ports per switch
    to the next tier (0 at the top) and its oversubscription (downlink : uplink capacity; 1 = full
    bisection)."""

    name: str
    servers: int
    switches: int = 1
    uplinks: int = 0
    oversubscription: float = 1.0


TOPOLOGY_FIELDS = ("name", "gpus_per_server", "scale_up_gpus", "nvlink_bandwidth", "nic_bandwidth", "tiers",
                   "rail_optimized", "planes", "source", "notes")
TIER_FIELDS = tuple(f.name for f in dataclasses.fields(Tier))


@dataclass(frozen=True)
class Topology:
    """A cluster network (see the module doc). Bandwidths are bytes/s per GPU and direction."""

    name: str
    gpus_per_server: int
    scale_up_gpus: int
    nvlink_bandwidth: float
    nic_bandwidth: float
    tiers: tuple[Tier, ...]
    rail_optimized: bool = False
    planes: int = 1
    source: str = ""
    notes: str = ""
    origin: str = "<topology>"  # the file it came from, for messages
    extended_from: int | None = None  # servers of the published design, when widened by for_world

    def __post_init__(self) -> None:
        validate(self)

    # -- sizes ------------------------------------------------------------------------------------
    @property
    def servers(self) -> int:
        """Servers in the whole cluster (the top tier's domain)."""
        return self.tiers[-1].servers

    @property
    def gpus(self) -> int:
        return self.servers * self.gpus_per_server

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tiers)

    def domains(self, k: int) -> int:
        """Number of tier-``k`` domains (``k`` 0-based into ``tiers``)."""
        return self.servers // self.tiers[k].servers

    def switches_per_domain(self, k: int) -> int:
        """Switches of tier ``k`` in one of its domains, per plane (tier 0 with rails: one per rail)."""
        if k == 0:
            return self.gpus_per_server if self.rail_optimized else 1
        return self.tiers[k].switches

    def switch_count(self, k: int) -> int:
        """Switches of tier ``k`` in the cluster, per plane."""
        return self.domains(k) * self.switches_per_domain(k)

    @property
    def link_tiers(self) -> tuple[str, ...]:
        """Names of the link tiers, bottom up: ``nvlink``, ``host`` (NIC to tier 1), then ``a-b`` for each
        pair of adjacent switch tiers."""
        up = [f"{a.name}-{b.name}" for a, b in zip(self.tiers[:-1], self.tiers[1:], strict=True)]
        return ("nvlink", "host", *up)

    @property
    def reach_tiers(self) -> tuple[str, ...]:
        """Names of the highest point a flow reaches: ``nvlink`` (inside its scale-up domain), then each
        switch tier's name."""
        return ("nvlink", *self.tier_names)

    # -- capacities -------------------------------------------------------------------------------
    def port_bandwidth(self, k: int) -> float:
        """Bytes/s of one uplink of a tier-``k`` switch, one direction (see the module doc)."""
        down = self.tiers[0].servers * self.gpus_per_server * self.nic_bandwidth / self.planes
        for j in range(k + 1):
            up = down / self.tiers[j].oversubscription
            if j == k:
                return up / (self.switches_per_domain(j) * self.tiers[j].uplinks)
            down = up * self.tiers[j + 1].servers / self.tiers[j].servers
        raise ConfigError(f"{self.origin}: tier index {k} out of range")  # pragma: no cover

    def host_bandwidth(self) -> float:
        """Bytes/s of one NIC port (one plane), one direction."""
        return self.nic_bandwidth / self.planes

    # -- scale ------------------------------------------------------------------------------------
    def for_world(self, gpus: int) -> Topology:
        """This topology if it holds ``gpus`` GPUs, else a copy whose top tier is widened to the fewest whole
        next-to-top domains that do (more pods under the same top layer, every per-tier rule unchanged);
        ``extended_from`` records the published size. A one-tier topology widens its only domain."""
        if gpus <= self.gpus:
            return self
        unit = self.tiers[-2].servers if len(self.tiers) > 1 else 1
        need = math.ceil(gpus / self.gpus_per_server / unit) * unit
        top = dataclasses.replace(self.tiers[-1], servers=need)
        return dataclasses.replace(self, tiers=(*self.tiers[:-1], top), extended_from=self.extended_from or self.servers)

    def describe(self) -> str:
        """One line: name, GPUs, tiers with domain sizes and oversubscription."""
        parts = [f"scale-up {self.scale_up_gpus} GPUs"]
        for k, t in enumerate(self.tiers):
            ov = f", 1:{t.oversubscription:.3g} up" if k < len(self.tiers) - 1 and t.oversubscription != 1 else ""
            parts.append(f"{t.name} {t.servers * self.gpus_per_server:,} GPUs{ov}")
        rails = ", rail-optimized" if self.rail_optimized else ""
        planes = f", {self.planes} planes" if self.planes > 1 else ""
        ext = f" (widened from {self.extended_from * self.gpus_per_server:,})" if self.extended_from else ""
        return f"{self.name}: {self.gpus:,} GPUs{ext}; " + " < ".join(parts) + rails + planes

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tiers"] = [dataclasses.asdict(t) for t in self.tiers]
        return d


def validate(t: Topology) -> None:
    """Check a topology's rules; a broken one raises :class:`ConfigError` naming the file and the field."""
    o = t.origin

    def bad(field: str, rule: str) -> None:
        raise ConfigError(f"{o}: {field} {rule}")

    for f in ("gpus_per_server", "scale_up_gpus", "planes"):
        v = getattr(t, f)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            bad(f"{f}={v!r}", "must be an integer >= 1")
    for f in ("nvlink_bandwidth", "nic_bandwidth"):
        v = getattr(t, f)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or not math.isfinite(v):
            bad(f"{f}={v!r}", "must be a number > 0 (bytes/s per GPU and direction)")
    if t.scale_up_gpus % t.gpus_per_server:
        bad(f"scale_up_gpus={t.scale_up_gpus}", f"must be a multiple of gpus_per_server={t.gpus_per_server}")
    if not t.tiers:
        bad("tiers", "must list at least one switch tier")
    names = set()
    for k, tier in enumerate(t.tiers):
        w = f"tiers[{k}]"
        for f in ("servers", "switches"):
            v = getattr(tier, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(f"{w}.{f}={v!r}", "must be an integer >= 1")
        if not isinstance(tier.uplinks, int) or isinstance(tier.uplinks, bool) or tier.uplinks < 0:
            bad(f"{w}.uplinks={tier.uplinks!r}", "must be an integer >= 0")
        ov = tier.oversubscription
        if not isinstance(ov, (int, float)) or isinstance(ov, bool) or not ov >= 1 or not math.isfinite(ov):
            bad(f"{w}.oversubscription={ov!r}", "must be a number >= 1 (downlink : uplink capacity)")
        if not tier.name or not isinstance(tier.name, str) or tier.name in names or tier.name in ("nvlink", "host"):
            bad(f"{w}.name={tier.name!r}", "must be a unique name other than 'nvlink' and 'host'")
        names.add(tier.name)
        top = k == len(t.tiers) - 1
        if top and tier.uplinks:
            bad(f"{w}.uplinks={tier.uplinks}", "must be 0 on the top tier (nothing above it)")
        if not top and tier.uplinks < 1:
            bad(f"{w}.uplinks={tier.uplinks}", "must be >= 1 below the top tier")
        if k == 0 and tier.switches != 1:
            bad(f"{w}.switches={tier.switches}", "must be 1 on tier 0 (rails and planes set its switches)")
        if k and tier.servers % t.tiers[k - 1].servers:
            bad(f"{w}.servers={tier.servers}", f"must be a multiple of tiers[{k - 1}].servers="
                f"{t.tiers[k - 1].servers}")
        if k and t.tiers[k - 1].uplinks % tier.switches:
            bad(f"tiers[{k - 1}].uplinks={t.tiers[k - 1].uplinks}", f"must be a multiple of tiers[{k}].switches="
                f"{tier.switches} (each port goes to switch port mod switches)")
    scale_servers = t.scale_up_gpus // t.gpus_per_server
    if t.tiers[0].servers % scale_servers and scale_servers % t.tiers[0].servers:
        bad(f"tiers[0].servers={t.tiers[0].servers}", f"and scale_up_gpus={t.scale_up_gpus} must nest (one a "
            "multiple of the other, in servers)")
    if t.servers % scale_servers:
        bad(f"tiers[{len(t.tiers) - 1}].servers={t.servers}", f"must hold whole scale-up domains of "
            f"{scale_servers} servers")


# ----------------------------------------------------------------------------------------------- files
def topology_dir() -> Path:
    return data_dir() / "topologies"


def list_topologies() -> list[str]:
    """Names of the topologies in ``data/topologies``, sorted."""
    return sorted(p.stem for p in topology_dir().glob("*.yaml"))


def load_topology(name_or_path: str | os.PathLike[str] | Topology) -> Topology:
    """A :class:`Topology` from ``data/topologies/NAME.yaml`` or a YAML path (a Topology passes through)."""
    if isinstance(name_or_path, Topology):
        return name_or_path
    p = Path(name_or_path)
    if not p.is_file():
        p = topology_dir() / f"{name_or_path}.yaml"
        if not p.is_file():
            raise ConfigError(f"topology {str(name_or_path)!r} not found; known: {', '.join(list_topologies())}")
    return topology_from_dict(read_yaml(p), str(p))


def topology_from_dict(d: Any, origin: str = "<topology>") -> Topology:
    """A :class:`Topology` from a mapping as the YAML files hold it; unknown, missing or mistyped fields are a
    :class:`ConfigError` naming ``origin`` and the field."""
    if not isinstance(d, dict):
        raise ConfigError(f"{origin}: a topology file must hold a mapping of fields {list(TOPOLOGY_FIELDS)}")
    unknown = sorted(set(d) - set(TOPOLOGY_FIELDS))
    if unknown:
        raise ConfigError(f"{origin}: unknown field(s) {unknown}; known fields: {list(TOPOLOGY_FIELDS)}")
    required = ("name", "gpus_per_server", "scale_up_gpus", "nvlink_bandwidth", "nic_bandwidth", "tiers")
    missing = [f for f in required if f not in d]
    if missing:
        raise ConfigError(f"{origin}: missing required field(s) {missing}")
    tiers_raw = d["tiers"]
    if not isinstance(tiers_raw, list) or not tiers_raw:
        raise ConfigError(f"{origin}: tiers must be a non-empty list of tier mappings")
    tiers = []
    for k, tr in enumerate(tiers_raw):
        if not isinstance(tr, dict):
            raise ConfigError(f"{origin}: tiers[{k}] must be a mapping of {list(TIER_FIELDS)}")
        unk = sorted(set(tr) - set(TIER_FIELDS))
        if unk:
            raise ConfigError(f"{origin}: tiers[{k}]: unknown field(s) {unk}; known fields: {list(TIER_FIELDS)}")
        for f in ("name", "servers"):
            if f not in tr:
                raise ConfigError(f"{origin}: tiers[{k}]: missing required field {f!r}")
        tr = dict(tr)
        if "oversubscription" in tr:
            tr["oversubscription"] = _number(tr["oversubscription"], f"{origin}: tiers[{k}].oversubscription")
        tiers.append(Tier(**tr))
    fields = {k: v for k, v in d.items() if k != "tiers"}
    for f in ("nvlink_bandwidth", "nic_bandwidth"):
        fields[f] = _number(fields[f], f"{origin}: {f}")
    for f in ("rail_optimized",):
        if f in fields and not isinstance(fields[f], bool):
            raise ConfigError(f"{origin}: {f}={fields[f]!r} must be true or false")
    return Topology(**fields, tiers=tuple(tiers), origin=origin)


def _number(v: Any, where: str) -> float:
    """YAML reads ``50.0e9`` as a float but ``50e9`` as a string: both are numbers here."""
    if isinstance(v, bool):
        raise ConfigError(f"{where}={v!r} must be a number")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}={v!r} must be a number") from None
