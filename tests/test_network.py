"""llmcomm.network: hand-worked link loads on a 16-GPU two-tier topology per parallelism, conservation,
rail-aligned traffic kept off the spine, ECMP expectation vs sample, placement, and bad topology files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from llmcomm import ModelSpec, ParallelConfig
from llmcomm.errors import ConfigError
from llmcomm.network import link_loads, list_topologies, load_topology, place, topology_from_dict
from llmcomm.network import routing as R
from llmcomm.network.loads import PairFlows, route
from llmcomm.predict import predict_traffic
from llmcomm.trace import Trace

S = 1_000_000.0  # bytes of one hand-worked call

# 16 GPUs: 4 servers of 4 GPUs (NVLink inside a server); a leaf per 2 servers with 4 uplinks; 2 spines on top
FAT = {"name": "fat16", "gpus_per_server": 4, "scale_up_gpus": 4, "nvlink_bandwidth": 100.0, "nic_bandwidth": 10.0,
       "tiers": [{"name": "leaf", "servers": 2, "uplinks": 4}, {"name": "spine", "servers": 4, "switches": 2}]}
RAIL = {**FAT, "name": "rail16", "rail_optimized": True}


def fat() -> object:
    return topology_from_dict(FAT, "fat16.yaml")


def rail() -> object:
    return topology_from_dict(RAIL, "rail16.yaml")


def trace(rows: list[dict], world: int = 16) -> Trace:
    base = {"iteration": 0, "phase": "forward", "dtype": "bf16", "peer": -1, "source": "test"}
    return Trace.from_records([{**base, **r} for r in rows], meta={"world_size": world})


def all_reduce(group: list[int], par: str, size: float = S) -> list[dict]:
    return [{"rank": r, "parallelism": par, "op": "all_reduce", "group": group, "bytes": int(size)} for r in group]


def loads(links: pd.DataFrame, tier: str, direction: str) -> dict[int, float]:
    d = links[(links["tier"] == tier) & (links["direction"] == direction)]
    return d.groupby("lower")["bytes"].sum().to_dict()


# ---------------------------------------------------------------------------------------- hand-worked
def test_tp_inside_a_server_stays_on_nvlink():
    t = trace(all_reduce([0, 1, 2, 3], "tp"))
    L = link_loads(t, fat())
    # ring: each rank sends 2 (n-1)/n S = 1.5 S to its successor, all over NVLink
    assert loads(L.links, "nvlink", "up") == {0: 1.5 * S, 1: 1.5 * S, 2: 1.5 * S, 3: 1.5 * S}
    assert loads(L.links, "nvlink", "down") == {0: 1.5 * S, 1: 1.5 * S, 2: 1.5 * S, 3: 1.5 * S}
    assert set(L.links["tier"]) == {"nvlink"}
    r = L.reach.set_index(["parallelism", "reach"])["share"]
    assert r[("tp", "nvlink")] == 1.0


def test_pp_send_within_and_across_leaves():
    t = trace([{"rank": 0, "parallelism": "pp", "op": "send", "group": [0, 4], "peer": 4, "bytes": int(S)},
               {"rank": 4, "parallelism": "pp", "op": "recv", "group": [0, 4], "peer": 0, "bytes": int(S)},
               {"rank": 1, "parallelism": "pp", "op": "send", "group": [1, 9], "peer": 9, "bytes": int(S)}])
    L = link_loads(t, fat())
    assert loads(L.links, "host", "up") == {0: S, 1: S}
    assert loads(L.links, "host", "down") == {4: S, 9: S}
    # 1 -> 9 leaves leaf 0 for leaf 1: S over leaf 0's 4 uplinks, S over the 4 ports into leaf 1
    up = L.links[(L.links["tier"] == "leaf-spine") & (L.links["direction"] == "up")]
    down = L.links[(L.links["tier"] == "leaf-spine") & (L.links["direction"] == "down")]
    assert list(up["lower"]) == [0] * 4 and np.allclose(up["bytes"], S / 4)
    assert list(down["lower"]) == [1] * 4 and np.allclose(down["bytes"], S / 4)
    assert list(up["upper"]) == [0, 1, 0, 1]  # port p goes to spine p mod 2
    assert np.allclose(up["capacity"], 8 * 10.0 / 4)  # 8 GPUs x 10 B/s down, 1:1, 4 uplinks
    r = L.reach.set_index(["parallelism", "reach"])["bytes"]
    assert r[("pp", "leaf")] == S and r[("pp", "spine")] == S


def test_dp_ring_across_servers():
    t = trace(all_reduce([0, 4, 8, 12], "dp"))
    L = link_loads(t, fat())
    per = 1.5 * S  # 2 (n-1)/n S to the ring successor: 0->4, 4->8, 8->12, 12->0
    assert loads(L.links, "host", "up") == {0: per, 4: per, 8: per, 12: per}
    assert loads(L.links, "leaf-spine", "up") == {0: per, 1: per}  # 4->8 leaves leaf 0, 12->0 leaves leaf 1
    assert loads(L.links, "leaf-spine", "down") == {0: per, 1: per}
    r = L.reach.set_index(["parallelism", "reach"])["share"]
    assert r[("dp", "leaf")] == 0.5 and r[("dp", "spine")] == 0.5


def test_ep_all_to_all_splits():
    group = [0, 4, 8, 12]
    rows = [{"rank": r, "parallelism": "ep", "op": "all_to_all", "group": group, "bytes": 4 * int(S),
             "split_bytes": [int(S)] * 4} for r in group]
    L = link_loads(trace(rows), fat())
    # each rank sends S to each of 3 peers: 1 peer under its own leaf, 2 across the spine
    assert loads(L.links, "host", "up") == {g: 3 * S for g in group}
    assert loads(L.links, "leaf-spine", "up") == {0: 4 * S, 1: 4 * S}
    r = L.reach.set_index(["parallelism", "reach"])["bytes"]
    assert r[("ep", "leaf")] == 4 * S and r[("ep", "spine")] == 8 * S


def test_rails_and_pxn():
    t = trace([{"rank": 0, "parallelism": "pp", "op": "send", "group": [0, 5], "peer": 5, "bytes": int(S)}])
    # without PXN: rail 0 -> rail 1 climbs to the spine (leaf (domain 0, rail 0) up, leaf (0, rail 1) down)
    L = link_loads(t, rail(), pxn=False)
    assert loads(L.links, "host", "up") == {0: S}
    assert loads(L.links, "leaf-spine", "up") == {0: S}
    assert loads(L.links, "leaf-spine", "down") == {1: S}
    # with PXN: NVLink 0 -> 1 (the GPU on rail 1), then rail-aligned 1 -> 5 under leaf (0, rail 1)
    L = link_loads(t, rail(), pxn=True)
    assert loads(L.links, "nvlink", "up") == {0: S} and loads(L.links, "nvlink", "down") == {1: S}
    assert loads(L.links, "host", "up") == {1: S} and loads(L.links, "host", "down") == {5: S}
    assert "leaf-spine" not in set(L.links["tier"])


# ---------------------------------------------------------------------------------------- properties
def random_flows(rng: np.random.Generator, n: int, gpus: int) -> PairFlows:
    src = rng.integers(0, gpus, n)
    dst = (src + rng.integers(1, gpus, n)) % gpus
    return PairFlows(src.astype(np.int64), dst.astype(np.int64), rng.uniform(1, 1e6, n),
                     rng.integers(0, 3, n).astype(np.int8), ("dp", "pp", "tp"))


TOPOS = [FAT, RAIL, {**RAIL, "name": "planes", "planes": 2},
         {"name": "three", "gpus_per_server": 2, "scale_up_gpus": 4, "nvlink_bandwidth": 1.0, "nic_bandwidth": 1.0,
          "tiers": [{"name": "t1", "servers": 2, "uplinks": 4}, {"name": "t2", "servers": 4, "switches": 2,
                     "uplinks": 6, "oversubscription": 3}, {"name": "t3", "servers": 16, "switches": 3}]}]


@pytest.mark.parametrize("spec", TOPOS, ids=lambda d: d["name"])
@pytest.mark.parametrize("ecmp", ["expected", "sample"])
def test_conservation(spec, ecmp):
    """Bytes leaving every GPU = bytes on its first-hop links (NVLink up + NIC up, all planes); every switch tier
    carries up what it carries down; the sample moves the same bytes per tier as the expectation."""
    topo = topology_from_dict(spec, f"{spec['name']}.yaml")
    pf = random_flows(np.random.default_rng(1), 3000, topo.gpus)
    links, _ = route(pf, topo, ecmp=ecmp, pxn=False, qps=3, seed=7)
    sent = np.bincount(pf.src, weights=pf.bytes, minlength=topo.gpus)
    first = np.zeros(topo.gpus)
    for tier in ("nvlink", "host"):
        d = links[(links["tier"] == tier) & (links["direction"] == "up")]
        np.add.at(first, d["lower"].to_numpy(), d["bytes"].to_numpy())
    np.testing.assert_allclose(first, sent, rtol=1e-12)
    recv = np.bincount(pf.dst, weights=pf.bytes, minlength=topo.gpus)
    last = np.zeros(topo.gpus)
    for tier in ("nvlink", "host"):
        d = links[(links["tier"] == tier) & (links["direction"] == "down")]
        np.add.at(last, d["lower"].to_numpy(), d["bytes"].to_numpy())
    np.testing.assert_allclose(last, recv, rtol=1e-12)
    by = links.groupby(["tier", "direction"], observed=True)["bytes"].sum()
    for tier in topo.link_tiers[2:]:
        assert by[(tier, "up")] == pytest.approx(by[(tier, "down")], rel=1e-12)
    ref, _ = route(pf, topo, ecmp="expected", pxn=False)
    ref_by = ref.groupby(["tier", "direction"], observed=True)["bytes"].sum()
    pd.testing.assert_series_equal(by, ref_by, rtol=1e-12)
    # capacity never below what the published ratios give: uplinks of a tier add up to C_down / oversubscription
    for k in range(len(topo.tiers) - 1):
        per_domain = topo.switches_per_domain(k) * topo.tiers[k].uplinks * topo.port_bandwidth(k)
        gpus = topo.tiers[k].servers * topo.gpus_per_server
        ratio = np.prod([t.oversubscription for t in topo.tiers[: k + 1]])
        assert per_domain == pytest.approx(gpus * topo.nic_bandwidth / topo.planes / ratio)


def test_conservation_with_pxn_per_server():
    """With PXN a GPU also relays its server's cross-rail traffic: per server, NVLink + NIC bytes out of the
    server's GPUs = bytes its GPUs send + bytes relayed inside it."""
    topo = rail()
    pf = random_flows(np.random.default_rng(2), 2000, topo.gpus)
    links, _ = route(pf, topo, pxn=True)
    nic = R.relay(topo, pf.src, pf.dst, True)
    relayed = np.bincount(nic[nic != pf.src] // 4, weights=pf.bytes[nic != pf.src], minlength=4)
    sent = np.bincount(pf.src // 4, weights=pf.bytes, minlength=4)
    up = links[(links["direction"] == "up") & links["tier"].isin(["nvlink", "host"])]
    out = np.bincount(up["lower"].to_numpy() // 4, weights=up["bytes"].to_numpy(), minlength=4)
    np.testing.assert_allclose(out, sent + relayed, rtol=1e-12)
    # and the NIC bytes alone are the scale-out bytes
    host = links[(links["tier"] == "host") & (links["direction"] == "up")]
    scale_out = R.scale_up_domain(topo, pf.src) != R.scale_up_domain(topo, pf.dst)
    assert host["bytes"].sum() == pytest.approx(pf.bytes[scale_out].sum(), rel=1e-12)


@pytest.mark.parametrize("ecmp", ["expected", "sample"])
def test_rail_aligned_traffic_never_on_a_spine(ecmp):
    topo = load_topology("dgx-superpod-h100")
    rng = np.random.default_rng(3)
    n = 5000
    su = rng.integers(0, 4, n)
    src_server = su * 32 + rng.integers(0, 32, n)
    dst_server = su * 32 + (src_server % 32 + rng.integers(1, 32, n)) % 32
    r = rng.integers(0, 8, n)
    pf = PairFlows((src_server * 8 + r).astype(np.int64), (dst_server * 8 + r).astype(np.int64),
                   rng.uniform(1, 1e6, n), np.zeros(n, np.int8), ("dp",))
    for pxn in (False, True):
        links, reach = route(pf, topo, ecmp=ecmp, pxn=pxn)
        assert "leaf-spine" not in set(links["tier"])
        assert reach.set_index("reach")["share"]["leaf"] == pytest.approx(1.0)
    # a Megatron job of one SU: DP and PP groups are rail-aligned, none of their bytes reaches the spine (the
    # few bytes of the model-parallel group's optimizer all-reduces cross rails and do)
    model = ModelSpec(name="m", num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8,
                      vocab_size=1000, seq_length=128)
    t = predict_traffic(model, ParallelConfig(tp=8, pp=4, dp=8, micro_batch=1, global_batch=16))
    L = link_loads(t, topo, ecmp=ecmp, pxn=False)
    r = L.reach.set_index(["parallelism", "reach"])["bytes"]
    assert r[("dp", "spine")] == 0 and r[("pp", "spine")] == 0 and r[("dp", "leaf")] > 0 and r[("pp", "leaf")] > 0


def test_sampled_ecmp_is_seeded_and_uneven():
    model = ModelSpec(name="m", num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8,
                      vocab_size=1000, seq_length=128)
    t = predict_traffic(model, ParallelConfig(tp=4, pp=2, dp=16, micro_batch=1, global_batch=32))
    topo = load_topology("llama3-24k")
    a = link_loads(t, topo, ecmp="sample", seed=5)
    b = link_loads(t, topo, ecmp="sample", seed=5)
    pd.testing.assert_frame_equal(a.links, b.links)
    e = link_loads(t, topo, ecmp="expected")
    tier = "tor-cluster"
    assert a.tiers.set_index("tier").loc[tier, "imbalance"] > e.tiers.set_index("tier").loc[tier, "imbalance"]
    assert a.tiers.set_index("tier").loc[tier, "bytes"] == pytest.approx(e.tiers.set_index("tier").loc[tier, "bytes"])


# ---------------------------------------------------------------------------------------- placement
def test_placement_policies():
    topo = load_topology("llama3-24k")
    assert np.array_equal(place(32, topo), np.arange(32))
    br = place(64, topo, "by_rack")  # 8 servers over 4 racks of 2: server j -> rack j mod 4
    assert list(br[::8] // 8) == [0, 2, 4, 6, 1, 3, 5, 7]
    assert np.array_equal(br % 8, np.arange(64) % 8)  # GPU index inside a server kept
    r1, r2 = place(64, topo, "random", seed=3), place(64, topo, "random", seed=3)
    assert np.array_equal(r1, r2) and len(np.unique(r1)) == 64 and not np.array_equal(r1, place(64, topo, "random"))
    m = place(4, topo, np.array([7, 6, 5, 4]))
    assert list(m) == [7, 6, 5, 4]
    m = place(2, topo, pd.DataFrame({"rank": [1, 0], "gpu": [10, 20]}))
    assert list(m) == [20, 10]
    with pytest.raises(ConfigError, match="holds more than one rank"):
        place(3, topo, np.array([1, 1, 2]))
    with pytest.raises(ConfigError, match="outside"):
        place(2, topo, np.array([0, topo.gpus]))
    with pytest.raises(ConfigError, match="does not fit"):
        place(topo.gpus + 8, topo)
    with pytest.raises(ConfigError, match="not one of"):
        place(8, topo, "packed")
    assert topo.for_world(131072).gpus == 43 * 3072 and topo.for_world(131072).extended_from == 3072


# ---------------------------------------------------------------------------------------- topology files
def test_catalogue_loads_and_cites():
    names = list_topologies()
    assert {"llama3-24k", "dgx-superpod-h100", "gb200-nvl72", "alibaba-hpn"} <= set(names)
    for n in names:
        t = load_topology(n)
        assert t.source, n
    llama = load_topology("llama3-24k")
    assert llama.gpus == 24576 and llama.tiers[0].servers * 8 == 16 and llama.tiers[1].servers * 8 == 3072
    # 1:7 at the aggregation layer: a pod's uplinks carry a seventh of what its ToRs can send
    pod_up = llama.switches_per_domain(1) * llama.tiers[1].uplinks * llama.port_bandwidth(1)
    assert pod_up == pytest.approx(3072 * 50e9 / 7)
    pod = load_topology("dgx-superpod-h100")
    assert pod.rail_optimized and pod.switch_count(0) == 32 and pod.switch_count(1) == 16
    assert pod.switch_count(0) * pod.tiers[0].uplinks == 1024  # the RA's 1,024 spine-leaf cables


BAD = [
    ({"tiers": [{"name": "leaf", "servers": 2, "uplinks": 4}, {"name": "spine", "servers": 3, "switches": 2}]},
     r"bad\.yaml: tiers\[1\]\.servers=3 must be a multiple of tiers\[0\]\.servers=2"),
    ({"nic_bandwidth": -1}, r"bad\.yaml: nic_bandwidth=-1\.0 must be a number > 0"),
    ({"nic_bandwidth": "fast"}, r"bad\.yaml: nic_bandwidth='fast' must be a number"),
    ({"gpus_per_server": 0}, r"bad\.yaml: gpus_per_server=0 must be an integer >= 1"),
    ({"scale_up_gpus": 6}, r"bad\.yaml: scale_up_gpus=6 must be a multiple of gpus_per_server=4"),
    ({"rails": True}, r"bad\.yaml: unknown field\(s\) \['rails'\]"),
    ({"tiers": [{"name": "leaf", "servers": 2, "uplinks": 3}, {"name": "spine", "servers": 4, "switches": 2}]},
     r"bad\.yaml: tiers\[0\]\.uplinks=3 must be a multiple of tiers\[1\]\.switches=2"),
    ({"tiers": [{"name": "leaf", "servers": 2, "uplinks": 4, "oversubscription": 0.5},
                {"name": "spine", "servers": 4, "switches": 2}]}, r"tiers\[0\]\.oversubscription=0\.5 must be"),
    ({"tiers": [{"name": "leaf", "servers": 2, "uplinks": 4}, {"name": "spine", "servers": 4, "uplinks": 2}]},
     r"tiers\[1\]\.uplinks=2 must be 0 on the top tier"),
    ({"tiers": [{"name": "leaf", "servers": 2}, {"name": "spine", "servers": 4}]}, r"tiers\[0\]\.uplinks=0 must be >= 1"),
    ({"tiers": [{"name": "leaf", "servers": 2, "uplinks": 4, "speed": 1}, {"name": "spine", "servers": 4}]},
     r"tiers\[0\]: unknown field\(s\) \['speed'\]"),
    ({"tiers": [{"name": "host", "servers": 4}]}, r"tiers\[0\]\.name='host' must be a unique name"),
    ({"rail_optimized": "yes"}, r"rail_optimized='yes' must be true or false"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_topology_files_name_the_field(tmp_path, change, message):
    import yaml

    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({**FAT, **change}))
    with pytest.raises(ConfigError, match=message):
        load_topology(str(p))


def test_missing_fields_and_unknown_name(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\ngpus_per_server: 8\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: missing required field\(s\) \['scale_up_gpus'"):
        load_topology(str(p))
    with pytest.raises(ConfigError, match="not found; known: "):
        load_topology("no-such-topology")


# ---------------------------------------------------------------------------------------- what-if
def test_off_rail_counts_scale_out_bytes_between_rails():
    from llmcomm.network.whatif import off_rail_table

    topo = rail()
    # 0 -> 4: rail 0 to rail 0 (other server); 0 -> 5: rail 0 to rail 1 (other server); 0 -> 1: same server
    pf = PairFlows(np.array([0, 0, 0]), np.array([4, 5, 1]), np.array([S, 3 * S, 5 * S]), np.array([0, 1, 1], np.int8),
                   ("dp", "ep"))
    t = off_rail_table(pf, topo).set_index("parallelism")
    assert t.loc["dp", "off_rail_share"] == 0.0 and t.loc["ep", "off_rail_bytes"] == 3 * S
    assert t.loc["all", "scale_out_bytes"] == 4 * S and t.loc["all", "off_rail_share"] == 0.75


def test_scenarios_oversubscription_and_order():
    from llmcomm.network.whatif import scenarios, with_oversubscription

    spec = {"name": "three", "gpus_per_server": 4, "scale_up_gpus": 4, "nvlink_bandwidth": 100.0,
            "nic_bandwidth": 10.0, "tiers": [{"name": "tor", "servers": 2, "uplinks": 4},
                                             {"name": "pod", "servers": 4, "switches": 2, "uplinks": 4,
                                              "oversubscription": 4},
                                             {"name": "core", "servers": 8, "switches": 2}]}
    topo = topology_from_dict(spec, "three.yaml")
    full = with_oversubscription(topo, {"pod": 1})
    assert full.port_bandwidth(1) == pytest.approx(4 * topo.port_bandwidth(1))
    with pytest.raises(ConfigError, match="not tiers below the top"):
        with_oversubscription(topo, {"core": 2})
    model = ModelSpec(name="m", num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8,
                      vocab_size=1000, seq_length=128)
    par = ParallelConfig(tp=4, pp=2, dp=4, micro_batch=1, global_batch=8)
    tab, loads = scenarios(model, par, topo, [
        {"label": "pp out", "order": "tp-cp-ep-dp-pp"}, {"label": "dp out", "order": "tp-cp-pp-dp"},
        {"label": "dp out, 1:1", "order": "tp-cp-pp-dp", "oversubscription": {"pod": 1}}])
    peak = tab[tab["link_tier"] == "pod-core"].set_index("scenario")["peak_busy_s"]
    assert peak["dp out"] == pytest.approx(4 * peak["dp out, 1:1"])
    r = loads["dp out"].reach.set_index(["parallelism", "reach"])["bytes"]
    assert r[("pp", "core")] == 0 and r[("dp", "core")] > 0  # DP outermost: DP crosses pods, PP stays in
    r = loads["pp out"].reach.set_index(["parallelism", "reach"])["bytes"]
    assert r[("pp", "core")] > 0 and r[("dp", "core")] == 0
    with pytest.raises(ConfigError, match="unknown key"):
        scenarios(model, par, topo, [{"orderr": "tp-pp-dp"}])


@pytest.mark.parametrize("spec", TOPOS, ids=lambda d: d["name"])
def test_sampled_paths_are_connected(spec):
    """Every hashed path climbs inside the source's domains, turns at one top switch and descends inside the
    destination's domains through links that switch really has (port mod switches = the switch)."""
    topo = topology_from_dict(spec, f"{spec['name']}.yaml")
    pf = random_flows(np.random.default_rng(4), 4000, topo.gpus)
    src, dst = pf.src, pf.dst
    rch = R.reach(topo, src, dst)
    qp = np.zeros(len(src), np.int64)
    plane, up, down = R.sample_paths(topo, src, dst, qp, rch, seed=3)
    assert ((plane >= 0) & (plane < topo.planes)).all()
    top_up, top_down = {}, {}
    for k in range(len(topo.tiers) - 1):
        idx, lower, port = up[k]
        dom = lower // topo.switches_per_domain(k)
        assert np.array_equal(dom, R.domain(topo, src[idx], k) if k else R.domain(topo, src[idx], 0))
        assert ((port >= 0) & (port < topo.tiers[k].uplinks)).all()
        upper = R.upper_switch(topo, k, lower, port)
        last = rch[idx] == k + 2
        top_up.update(zip(idx[last].tolist(), upper[last].tolist(), strict=True))
        idx, lower, port = down[k]
        assert np.array_equal(lower // topo.switches_per_domain(k), R.domain(topo, dst[idx], k))
        if k == 0:
            assert np.array_equal(lower, R.tier0_switch(topo, dst[idx]))
        upper = R.upper_switch(topo, k, lower, port)
        last = rch[idx] == k + 2
        top_down.update(zip(idx[last].tolist(), upper[last].tolist(), strict=True))
    assert top_up == top_down and len(top_up) == int((rch >= 2).sum())
    for k in range(len(topo.tiers) - 2):  # each hop starts where the one below it ended
        for hops in (up, down):
            i0, lo0, p0 = hops[k]
            i1, lo1, _ = hops[k + 1]
            ends = dict(zip(i0.tolist(), R.upper_switch(topo, k, lo0, p0).tolist(), strict=True))
            assert all(ends[i] == j for i, j in zip(i1.tolist(), lo1.tolist(), strict=True))
