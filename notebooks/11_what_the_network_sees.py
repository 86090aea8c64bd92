# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 11 · What the network sees
#
# **Question.** Predictability matters to the people who build and run the network: rail-optimized fabrics,
# oversubscribed upper tiers, job placement. Given a job's predicted (or recorded, or imported) iteration, what
# does each link of a *named, real* cluster topology carry — per tier, per parallelism, per link, over the
# iteration — and how do Megatron's rank order, the placement and the topology change it?
#
# The topologies are data (`data/topologies/*.yaml`, each citing its source): Llama 3's three-tier RoCE
# fat-tree (16 GPUs per rack, 3,072-GPU pods at full bisection, 1:7 at the aggregation layer), NVIDIA's DGX
# SuperPOD H100 (rail-optimized, 32-node scalable units, one leaf per rail), GB200 NVL72 racks and Alibaba
# HPN's dual-plane pod. Routing is stated in `llmcomm.network.routing`: NVLink inside a scale-up domain;
# rail-aligned traffic stays on its rail's leaf; NCCL's PXN relays cross-rail point-to-point traffic over
# NVLink; everything else climbs the tree with ECMP, as its expectation (even split) or a seeded per-flow
# hash sample.

# %% tags=["parameters"]
out_dir = None  # None: the project's figures/
model = "gpt3-175b"  # the dense job: GPT-3 175B on 16,384 GPUs (Narayanan et al. 2021's grid, DP 128)
config = {"tp": 8, "pp": 16, "dp": 128, "micro_batch": 1, "global_batch": 2048, "seq_len": 2048}
topology = "llama3-24k"
placement = "contiguous"
moe_model = "mixtral-8x7b"  # the MoE job on the same grid, experts over 8 DP ranks
moe_config = {"tp": 8, "pp": 16, "dp": 128, "ep": 8, "sp": True, "micro_batch": 1, "global_batch": 2048,
              "seq_len": 4096}
ecmp_seed = 0
qps = 1  # NCCL_IB_QPS_PER_CONNECTION in the ECMP sample
rail_topology = "dgx-superpod-h100"
rail_cases = {  # dense vs MoE on the SuperPOD (1,024 GPUs): what a rail-only network relays off-rail
    "GPT-3 175B tp8 pp8 dp16": ("gpt3-175b", {"tp": 8, "pp": 8, "dp": 16, "micro_batch": 1, "global_batch": 128}),
    "GPT-3 175B tp2 pp8 dp64": ("gpt3-175b", {"tp": 2, "pp": 8, "dp": 64, "micro_batch": 1, "global_batch": 128}),
    "Mixtral 8x7B tp8 ep8 pp4 dp32": ("mixtral-8x7b", {"tp": 8, "pp": 4, "dp": 32, "ep": 8, "sp": True,
                                                       "micro_batch": 1, "global_batch": 256}),
    "Mixtral 8x7B tp2 ep8 pp4 dp128": ("mixtral-8x7b", {"tp": 2, "pp": 4, "dp": 128, "ep": 8, "sp": True,
                                                        "micro_batch": 1, "global_batch": 256}),
}
recorded_trace = "traces/gpt_tp2pp2_timeline.parquet"  # a curated recorded run with timings (notebook 03)
timeline_model = "gpt3-13b"  # the job whose predicted timeline drives link demand over time
timeline_config = {"tp": 8, "pp": 4, "dp": 8, "micro_batch": 1, "global_batch": 64, "seq_len": 2048}
timeline_cluster = "h100-80g-ndr400"
demand_bins = 120
aicb_model = "tiny-moe"  # the AICB export round trip
aicb_config = {"tp": 2, "pp": 2, "dp": 4, "ep": 2, "sp": True, "distributed_optimizer": True, "global_batch": 8}

# %%
import tempfile
from pathlib import Path

import pandas as pd

from llmcomm import ParallelConfig, Trace, ingest_trace, load_cluster, load_model, plots, read_trace
from llmcomm import plots_network as PN
from llmcomm.analysis.temporal import with_pipeline_stage
from llmcomm.compare import compare
from llmcomm.network import link_loads, list_topologies, load_topology
from llmcomm.network.demand import fabric_bound_share, link_demand
from llmcomm.network.export import flow_list, to_aicb
from llmcomm.network.whatif import off_rail, scenarios
from llmcomm.overhead import iteration_time
from llmcomm.overhead.timeline import compare_timelines, predicted_timeline
from llmcomm.predict import predict_traffic
from llmcomm.reproduce import Outputs, data_file
from llmcomm.units import format_bytes

plots.apply_style()
out = Outputs("11_what_the_network_sees", out_dir)
pd.DataFrame([{"topology": n, "describe": load_topology(n).describe().split(": ", 1)[1],
               "source": load_topology(n).source[:90] + "…"} for n in list_topologies()])

# %% [markdown]
# **Method.** `llmcomm.network.link_loads(trace, topology, placement=...)` takes the trace's communication
# matrix one parallelism at a time (ring flows for the collectives, as NCCL's rings put them on the wire;
# all-to-alls per peer), places ranks on GPU slots, routes every GPU pair and sums bytes per link with
# `numpy.bincount`; a link's `busy_s` is its bytes over its capacity — the seconds it needs at line rate per
# iteration. A topology smaller than the job is widened at the top tier (more pods), which the tables say.

# %%
dense = predict_traffic(load_model(model), ParallelConfig(**config))
topo = load_topology(topology).for_world(dense.world_size)
L = link_loads(dense, topo, placement)
moe = predict_traffic(load_model(moe_model), ParallelConfig(**moe_config))
Lm = link_loads(moe, load_topology(topology).for_world(moe.world_size), placement)
print(topo.describe())
tiers = pd.concat([L.tiers.assign(job=model), Lm.tiers.assign(job=moe_model)])
tiers.assign(bytes=tiers["bytes"].map(format_bytes), up_bytes=tiers["up_bytes"].map(format_bytes),
             max_bytes=tiers["max_bytes"].map(format_bytes),
             max_busy_ms=1e3 * tiers["max_busy_s"]).drop(columns=["mean_bytes", "max_busy_s"])

# %%
reach = pd.concat([L.reach.assign(parallelism=model + " · " + L.reach["parallelism"]),
                   Lm.reach.assign(parallelism=moe_model + " · " + Lm.reach["parallelism"])])
reach = reach[reach.groupby("parallelism")["bytes"].transform("sum") > 0]
ax = PN.reach_bars(reach, x="parallelism", y="share", hue="reach",
                   title=f"where each parallelism's bytes go on {topo.name} ({dense.world_size:,} GPUs, {placement})")
out.figure(ax.figure, "reach_by_parallelism")

# %%
hot = L.hottest(8)
hot.assign(bytes=hot["bytes"].map(format_bytes), busy_ms=1e3 * hot["busy_s"]).drop(columns=["busy_s"])

# %% [markdown]
# **ECMP, stated two ways.** The expectation splits every flow evenly over its equal-cost uplinks; the sample
# hashes each GPU pair's connection (and each of its `qps` queue pairs) to one port per hop with a seed, the
# way switches hash a RoCE flow — few, large flows collide, which is the known cause of ECMP imbalance. The
# figure shows both for the dense job: per link tier the spread of per-link busy time.

# %%
Ls = link_loads(dense, topo, placement, ecmp="sample", seed=ecmp_seed, qps=qps)
spread = pd.concat([L.links.assign(ecmp="expected"), Ls.links.assign(ecmp=f"sample (seed {ecmp_seed}, {qps} QP)")])
spread = spread[spread["tier"].isin(list(topo.link_tiers[1:]))]
ax = PN.link_load_spread(spread, x="busy_s", y="tier", hue="ecmp",
                         title=f"{model} on {topo.name}: per-link busy time, ECMP expected vs hashed")
out.figure(ax.figure, "ecmp_spread")
imb = pd.DataFrame({"expected": L.tiers.set_index("tier")["imbalance"],
                    "sample": Ls.tiers.set_index("tier")["imbalance"]})
imb

# %% [markdown]
# **Over time.** `llmcomm.overhead.timeline.predicted_timeline` times every call of one iteration from the cost
# model (the predictor's calls in schedule order, `Bandwidth.time` per call, `Utilization.layer_pass` per layer,
# sends matched to receives across stages). First its order and on-off rhythm against the curated recorded run
# of notebook 03 (tiny GPT, TP 2 × PP 2, torch's own APIs on gloo/CPU: its absolute times are a CPU's, not the
# model's H100); then the predicted timeline of a larger job drives each link's demand over the iteration.

# %%
rec = read_trace(data_file(recorded_trace))
rec_par = ParallelConfig.from_dict(rec.meta["parallel"])
tiny = load_model(rec.meta["model"])
pred_small = predict_traffic(tiny, rec_par, framework="torch", aggregate=False)
tl_small = predicted_timeline(pred_small, tiny, rec_par, cluster=timeline_cluster)
cmp_t = compare_timelines(tl_small.trace(pred_small.meta), rec)
last = int(rec.events["iteration"].max())
fig_rec = with_pipeline_stage(rec.events[rec.events["iteration"] == last], rec.meta["parallel"])
fig_pred = with_pipeline_stage(tl_small.events, rec.meta["parallel"])
import matplotlib.pyplot as plt  # noqa: E402

fig, axes = plt.subplots(2, 1, figsize=(10, 6.2))
plots.comm_timeline(fig_pred, x="t_start_ns", y="rank", hue="parallelism", x_end="t_end_ns", row_group="stage",
                    marks=["phase", "microbatch"], ax=axes[0], min_width_s=2e-5,
                    title=f"predicted on {timeline_cluster}: one iteration ({tl_small.iteration_s * 1e3:.1f} ms)")
plots.comm_timeline(fig_rec, x="t_start_ns", y="rank", hue="parallelism", x_end="t_end_ns", row_group="stage",
                    marks=["phase", "microbatch"], ax=axes[1],
                    title=f"recorded (gloo on CPU): iteration {last}")
fig.tight_layout()
out.figure(fig, "timeline_predicted_vs_recorded")
cmp_t

# %%
tm = load_model(timeline_model)
tpar = ParallelConfig(**timeline_config)
pred_t = predict_traffic(tm, tpar, aggregate=False)
tl = predicted_timeline(pred_t, tm, tpar, cluster=timeline_cluster)
timed = tl.trace(pred_t.meta)
dem = link_demand(timed, topology, placement, bins=demand_bins)
ax = PN.demand_lines(dem, title=f"{timeline_model} tp{tpar.tp}·pp{tpar.pp}·dp{tpar.dp} on {topology}: peak link "
                                f"demand over one predicted iteration ({tl.iteration_s * 1e3:.0f} ms)")
out.figure(ax.figure, "link_demand_over_time")
bound = fabric_bound_share(dem)
bound

# %% [markdown]
# **What-if.** One job, varied: Megatron's default rank order (`tp-cp-ep-dp-pp`: PP outermost) against DP
# outermost (`tp-cp-pp-dp`, Llama 3's choice), full bisection instead of 1:7 at the aggregation layer, and a
# random (fragmented) or rack-strided placement — answered in bytes per tier and the peak link's busy time,
# beside the job's predicted iteration time (`llmcomm.overhead.iteration_time`, H100 NDR400 calibration). Then
# what a rail-only network would have to relay off-rail, dense against MoE.

# %%
par = ParallelConfig(**config)
cases = [{"label": "PP outermost (Megatron default), 1:7", "order": "tp-cp-ep-dp-pp"},
         {"label": "DP outermost (Llama 3), 1:7", "order": "tp-cp-pp-dp"},
         {"label": "DP outermost, full bisection", "order": "tp-cp-pp-dp", "oversubscription": {"cluster": 1}},
         {"label": "DP outermost, by rack", "order": "tp-cp-pp-dp", "placement": "by_rack"},
         {"label": "DP outermost, random placement", "order": "tp-cp-pp-dp", "placement": "random"}]
wi, wi_loads = scenarios(model, par, topology, cases)
t_iter = iteration_time(load_model(model), par, load_cluster(timeline_cluster)).total_s
peaks = wi[wi["link_tier"].notna() & wi["link_tier"].isin(list(topo.link_tiers[1:]))]
ax = PN.scenario_bars(peaks, reference=t_iter, reference_label="predicted iteration time",
                      title=f"{model} on {dense.world_size:,} GPUs of {topology}: the busiest link per tier")
out.figure(ax.figure, "what_if_peak_links")
shares = wi[wi["reach"].notna()].pivot(index="scenario", columns="reach", values="share")
shares

# %%
rails = pd.concat([off_rail(m_, ParallelConfig(**c_), rail_topology).assign(job=label)
                   for label, (m_, c_) in rail_cases.items()])
rails_all = rails[rails["parallelism"] == "all"].set_index("job")
rails[rails["scale_out_bytes"] > 0].assign(scale_out=lambda d: d["scale_out_bytes"].map(format_bytes),
                                           off_rail=lambda d: d["off_rail_bytes"].map(format_bytes))[
    ["job", "parallelism", "scale_out", "off_rail", "off_rail_share"]]

# %% [markdown]
# **Export.** A predicted iteration in AICB's workload format (what SimAI replays) and as a plain flow list
# (`src, dst, bytes, start_ns` plus tags; columns in `llmcomm.network.export`). The AICB file is read back with
# `ingest_trace` and compared with what was written.

# %%
am = load_model(aicb_model)
apar = ParallelConfig(**aicb_config)
at = predict_traffic(am, apar, aggregate=False)
text, written, dropped = to_aicb(at, rank=0)
path = Path(tempfile.mkdtemp()) / "workload.csv"
path.write_text(text)
back = compare(ingest_trace(path, apar, rank=0), Trace.from_events(written, meta=at.meta), model=am, parallel=apar)
flows = flow_list(timed, topology=topology, placement=placement)
print("\n".join(line[:110] for line in text.splitlines()[:4]))
flows.head()

# %% [markdown]
# **Checks.** Bytes are conserved (every scale-out byte leaves through one NIC and arrives through one); TP
# (inside a server) never leaves NVLink; on the rail-optimized SuperPOD a dense job's DP and PP bytes never
# reach a spine inside a scalable unit; hashing makes the busiest uplink busier than the even split; full
# bisection divides the aggregation layer's peak busy time by 7 for the same bytes; DP outermost keeps PP inside
# the pods; the
# predicted timeline issues the recorded run's calls in the same order on every rank; demand over time sums
# to the iteration's link bytes; the AICB round trip is exact.

# %%
by = L.links.groupby(["tier", "direction"], observed=True)["bytes"].sum()
scale_out = float(L.reach[L.reach["reach"] != "nvlink"]["bytes"].sum())
r = L.reach.set_index(["parallelism", "reach"])["share"]
rail_dense = link_loads(pred_t, rail_topology)  # the timeline job fills one scalable unit
rr = rail_dense.reach.set_index(["parallelism", "reach"])["bytes"]
agg = topo.link_tiers[-1]
pk = peaks.set_index(["scenario", "link_tier"])["peak_busy_s"]
ratio = pk[(cases[1]["label"], agg)] / pk[(cases[2]["label"], agg)]
pp_out = wi_loads[cases[1]["label"]].reach.set_index(["parallelism", "reach"])["bytes"][("pp", topo.tier_names[-1])]
dem_bytes = dem.groupby("tier", observed=True)["bytes"].sum()
tl_bytes = link_loads(timed, topology, placement).links.groupby("tier", observed=True)["bytes"].sum()
imb_tor = (imb.loc[topo.link_tiers[2], "sample"], imb.loc[topo.link_tiers[2], "expected"])

out.value("tier_bytes_dense", {k: float(v) for k, v in L.tier_bytes().items()})
out.value("tier_bytes_moe", {k: float(v) for k, v in Lm.tier_bytes().items()})
out.value("ecmp_imbalance", imb.to_dict())
out.value("what_if_peak_busy_s", {f"{a} | {b}": float(v) for (a, b), v in pk.items()})
out.value("iteration_time_s", t_iter)
out.value("off_rail_share", rails_all["off_rail_share"].to_dict())
out.value("timeline_gap_rank_correlation", cmp_t["gap_rank_correlation"].tolist())
out.value("fabric_bound", bound.set_index("tier")["over_capacity_share"].to_dict())
out.check("bytes_conserved", abs(by[("host", "up")] - scale_out) <= 1e-9 * scale_out
          and abs(by[("host", "down")] - scale_out) <= 1e-9 * scale_out, value=float(by[("host", "up")]),
          expect=f"host up = host down = scale-out bytes {scale_out:.6g}")
out.check("tp_stays_on_nvlink", r[("tp", "nvlink")] == 1.0, value=float(r[("tp", "nvlink")]), expect="1.0")
out.check("rail_aligned_off_the_spine", rr[("dp", "spine")] == 0 and rr[("pp", "spine")] == 0,
          value=float(rr[("dp", "spine")] + rr[("pp", "spine")]), expect="0 DP/PP bytes on the spine")
out.check("hashing_is_uneven", imb_tor[0] > imb_tor[1], value=imb_tor, expect="sampled peak/mean > expected")
out.check("full_bisection_7x", abs(ratio - 7.0) < 1e-6, value=float(ratio), expect="7 (same bytes, 7x capacity)")
out.check("dp_outermost_keeps_pp_in_pods", pp_out == 0, value=float(pp_out), expect="0 PP bytes at the top tier")
out.check("timeline_order_matches_recorded", bool(cmp_t["same_order"].all()), value=cmp_t["same_order"].tolist(),
          expect="same order on every rank")
out.check("demand_conserves_bytes", all(abs(dem_bytes[t] - tl_bytes[t]) <= 1e-9 * tl_bytes[t] for t in tl_bytes.index),
          value={str(t): float(dem_bytes[t]) for t in tl_bytes.index}, expect="= link bytes of the iteration")
out.check("aicb_round_trip_exact", back.exact, value=len(written), expect="every written call read back")

# %% [markdown]
# ## Result

# %%
up_bytes = L.tiers.set_index("tier")["up_bytes"]
agg_share = {lab: float(wi[(wi["scenario"] == lab) & (wi["reach"] == topo.tier_names[-1])]["share"].iloc[0])
             for lab in (c["label"] for c in cases)}
out.say(
    f"**Result.** GPT-3 175B on {dense.world_size:,} GPUs of Llama 3's fat-tree ({placement}, Megatron's order) puts "
    f"{format_bytes(up_bytes['nvlink'])} per iteration onto NVLink, {format_bytes(up_bytes['host'])} "
    f"into the NICs and {format_bytes(up_bytes[agg])} up the aggregation uplinks; TP never leaves the "
    f"server, and with PP outermost {100 * r[('pp', topo.tier_names[-1])]:.0f}% of PP's bytes cross pods. The "
    f"busiest NIC needs {1e3 * L.tiers.set_index('tier').loc['host', 'max_busy_s']:.0f} ms at line rate per "
    f"iteration. Hashing each connection to one uplink (seed {ecmp_seed}, {qps} QP) makes the busiest ToR "
    f"uplink {imb_tor[0]:.1f}× the mean where the even split gives {imb_tor[1]:.2f}×. "
    f"DP outermost (Llama 3's order) keeps PP inside the pods and sends {100 * agg_share[cases[1]['label']]:.1f}% "
    f"of all bytes over the 1:7 layer (PP outermost: {100 * agg_share[cases[0]['label']]:.1f}%); its busiest "
    f"aggregation uplink needs {1e3 * pk[(cases[1]['label'], agg)]:.0f} ms per iteration at 1:7 and "
    f"{1e3 * pk[(cases[2]['label'], agg)]:.0f} ms at full bisection, against a predicted iteration of "
    f"{t_iter:.2f} s; a random placement raises it to {1e3 * pk[(cases[4]['label'], agg)]:.0f} ms. "
    f"A rail-only network would relay off-rail {100 * rails_all['off_rail_share'].iloc[0]:.2g}% of the scale-out "
    f"bytes of {list(rail_cases)[0]}, {100 * rails_all['off_rail_share'].iloc[1]:.0f}% of {list(rail_cases)[1]} "
    f"(its DP rings hop from GPU 6 of one server to GPU 0 of the next), "
    f"{100 * rails_all['off_rail_share'].iloc[2]:.2g}% of {list(rail_cases)[2]} and "
    f"{100 * rails_all['off_rail_share'].iloc[3]:.0f}% of {list(rail_cases)[3]} (its expert all-to-alls join GPUs "
    f"of different local index). The predicted timeline issues the recorded run's calls in the same order on all "
    f"{len(cmp_t)} ranks; the gaps between calls rank alike (Spearman "
    f"{cmp_t['gap_rank_correlation'].min():.2f}–{cmp_t['gap_rank_correlation'].max():.2f}) while the share of time "
    f"in calls differs ({100 * cmp_t['on_share_predicted'].mean():.0f}% predicted on H100, "
    f"{100 * cmp_t['on_share_recorded'].mean():.0f}% recorded on CPU/gloo). Over {timeline_model}'s predicted "
    f"iteration the busiest link of any tier peaks at {bound['max_peak_demand'].max():.2f}× its capacity "
    f"({bound.loc[bound['max_peak_demand'].idxmax(), 'tier']}); the AICB export of {len(written)} calls reads back "
    f"exactly ({len(dropped)} calls on groups AICB cannot name are listed, not written)."
)
out.save()
