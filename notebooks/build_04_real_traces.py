"""Build notebooks/04_real_traces.ipynb with nbformat: `.venv/bin/python notebooks/build_04_real_traces.py`."""
from pathlib import Path

import nbformat as nbf
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = []
md = lambda s: cells.append(new_markdown_cell(s.strip()))  # noqa: E731
code = lambda s, tags=None: cells.append(new_code_cell(s.strip(), metadata={"tags": tags or []}))  # noqa: E731

md("""
# 04 · Real traces: what repeats, who talks to whom, and how fast the links are

**Question.** Do communication traces recorded by others show the predictability the paper claims —
the same collectives with the same message sizes in every iteration, while only their *times* vary — and
what bandwidth do real collectives reach as message size, group size and node boundaries change?

We use only third-party files, fetched and checksum-verified through the data manifest
(`data/external.yaml`, `llmcomm.data.path`):
AICB's replay of a Megatron MoE job on 8×A100 (10 iterations, measured per-call times), PARAM's Kineto traces
of all 8 ranks of a DLRM job, Echo's `nccl-tests` all-reduce logs on 1–128 A100s (Azure ND A100 v4), and
vTrain's all-reduce tables inside one node (A100 and V100, 2–8 GPUs).
""")
code('out_dir = "../figures"\ntop_collectives = 10', tags=["parameters"])
code("""
import numpy as np
import pandas as pd
import matplotlib.pyplot as plt

from llmcomm import data, plots
from llmcomm.ingest import ingest_bandwidth, ingest_trace
from llmcomm.ingest import summary
from llmcomm.reproduce import Outputs

plots.apply_style()
out = Outputs("04_real_traces", out_dir)
""")
md("""
## 1 · AICB MoE replay: identical sizes, varying times

**Method.** `ingest_trace` reads the AICB CSV into the events table (one rank's view; TP=2, DP=4 from the
group sizes the file states; AICB does not give the EP group size, so EP = DP = 4 is assumed and recorded in
`trace.meta`). Rows before the first `epoch_end` are setup; the 10 training iterations follow. Each call
gets its position `seq` within its iteration, so the *same* call can be followed across iterations.
""")
code("""
moe = ingest_trace(data.path("aicb/A100_example.csv"))
seq = summary.call_sequence(moe)  # iterations 1..10
rep = summary.size_repeatability(seq)
spread = summary.duration_spread(seq)
print(moe, moe.meta["assumptions"])
print(f"{len(rep)} calls per iteration, seen in {rep['iterations'].min()}-{rep['iterations'].max()} iterations; "
      f"distinct sizes per call: max {rep['sizes'].max()}, distinct ops per call: max {rep['ops'].max()}")
spread.head(12)
""")
code("""
out.check("aicb_every_call_in_every_iteration", bool((rep["iterations"] == 10).all()),
          value=int(rep["iterations"].min()), expect="each of the calls appears in all 10 iterations")
out.check("aicb_sizes_identical_across_iterations", bool((rep["sizes"] == 1).all() and (rep["ops"] == 1).all()),
          value=int(rep["sizes"].max()), expect="1 distinct message size (and op) per call position")
big = spread[spread["calls"] >= 20]
ratio = (big["max_us"] / big["min_us"]).min()
out.check("aicb_times_vary", bool(ratio > 1.05), value=float(ratio),
          expect="every collective with >= 20 calls has max/min duration > 1.05")
ep = spread[spread["collective"].str.startswith("all_to_all/ep/")].iloc[0]
out.value("aicb_ep_all_to_all", {"collective": ep["collective"], "calls": int(ep["calls"]),
                                 "median_us": float(ep["median_us"]), "max_us": float(ep["max_us"])})
per_iter = seq.groupby("iteration")["duration_us"].sum() / 1e3
out.value("aicb_comm_ms_per_iteration", per_iter.round(2).to_dict())
fig, ax = plt.subplots(figsize=(7.5, 0.45 * top_collectives + 1.4))
plots.call_duration_spread(seq, ax=ax, top=top_collectives,
                           title="AICB MoE replay on 8xA100: time per call, same sizes every iteration")
out.figure(fig, "aicb_duration_spread")
""")
md("""
**Result.** Every one of the calls of an iteration recurs in all ten iterations with the same operation and
the same message size — the communication *volume* is fully repeatable — while the time of a given
collective spreads (box: quartiles, whiskers: 1st–99th percentile); the expert-parallel 32 MiB all-to-all has
a typical time near 0.2 ms and rare stalls orders of magnitude longer.
""")
md("""
## 2 · DLRM: the all-to-all matrix across 8 ranks

**Method.** `ingest_trace` reads the 8 Kineto rank files straight from the tar archive (members checked,
nothing extracted). These traces predate PyTorch's `record_param_comms` metadata, so the per-peer split
sizes were not recorded; what *was* recorded is what each rank sent (the input of each all-to-all) and received
(the output tensor of the enclosing `c10d::alltoall_base_`). The matrix below has exactly those row and
column sums; its cells are the maximum-entropy estimate `s_i·r_j/Σr` given them.
""")
code("""
dlrm = ingest_trace(data.path("param/dlrm_kineto.tar.gz"))
mat, margins = summary.a2a_matrix_estimate(dlrm)
print(dlrm)
print(dlrm.events.groupby(["op", "phase"]).agg(calls=("bytes", "size"), bytes=("bytes", "sum")))
margins
""")
code("""
out.check("dlrm_margins_balance", bool(np.isclose(margins["sent"].sum(), margins["received"].sum())),
          value=[float(margins["sent"].sum()), float(margins["received"].sum())],
          expect="all bytes sent in the all-to-alls are received")
out.check("dlrm_even_send_uneven_receive",
          bool(margins["sent"].nunique() == 1 and margins["received"].max() / margins["received"].min() > 1.5),
          value=float(margins["received"].max() / margins["received"].min()),
          expect="every rank sends the same, receivers differ by > 1.5x (sparse-feature ownership)")
out.value("dlrm_received_bytes", margins.set_index("rank")["received"].astype(int).to_dict())
fig, axes = plt.subplots(1, 2, figsize=(11, 4.3), gridspec_kw={"width_ratios": [1.3, 1]})
plots.a2a_matrix_heatmap(mat, ax=axes[0], title="DLRM all-to-all, 8xV100 (KiB; margins measured)")
m = margins.melt(id_vars="rank", value_vars=["sent", "received"], var_name="direction", value_name="bytes")
import seaborn as sns
sns.barplot(data=m.assign(KiB=m["bytes"] / 1024), x="rank", y="KiB", hue="direction", ax=axes[1])
axes[1].set(title="bytes per rank in one iteration's all-to-alls")
out.figure(fig, "dlrm_all_to_all")
""")
md("""
**Result.** Every rank sends the same amount, but what it receives depends on which embedding tables (sparse
features) it owns: one rank receives about twice as much as the others. This is the data-dependent part of
all-to-all traffic that a configuration alone does not determine — the same effect the paper reports for MoE
expert parallelism.
""")
md("""
## 3 · Bus bandwidth vs message size and scale, inside and across nodes

**Method.** `ingest_bandwidth` reads Echo's raw `nccl-tests` logs (MPI prefixes removed, ranks and nodes
from the device list) and vTrain's all-reduce tables into one table. Bus bandwidth follows nccl-tests:
`busbw = algbw · 2(n−1)/n` for all-reduce.
""")
code("""
bw = ingest_bandwidth([data.path(f"echo/nccl-test-log/nccl_{n}.log") for n in (1, 2, 4, 8, 16, 32, 64, 128)]
                      + [data.path(f"vtrain/allreduce_lut/{g}/AR_GPU{n}_1M_1024M_LUT")
                         for g in ("a100", "v100") for n in range(2, 9)])
peaks = summary.bandwidth_summary(bw)
peaks[peaks["placement"] == "out-of-place"]
""")
code("""
echo = bw[bw["source"].str.startswith("nccl_") & (bw["ranks"] > 1)]
pk = peaks[(peaks["placement"] == "out-of-place")].set_index("source")
intra = pk[pk.index.str.startswith("nccl_") & (pk["nodes"] == 1) & (pk["ranks"] > 1)]["peak_busbw"]
inter = pk[pk.index.str.startswith("nccl_") & (pk["nodes"] > 1)]["peak_busbw"]
out.check("echo_intra_node_faster", bool(intra.min() > 1.4 * inter.max()),
          value={"intra_min": float(intra.min()), "inter_max": float(inter.max())},
          expect="peak busbw inside one node > 1.4x the best across nodes")
small = echo[(echo["bytes"] <= 64 * 1024) & (echo["placement"] == "out-of-place")]
frac = (small.groupby("ranks")["busbw"].max() / echo.groupby("ranks")["busbw"].max()).max()
out.check("busbw_needs_large_messages", bool(frac < 0.1), value=float(frac),
          expect="messages <= 64 KiB reach < 10% of peak bus bandwidth at every scale")
a100_8 = float(pk.loc["a100/AR_GPU8_1M_1024M_LUT", "peak_busbw"])
echo_8 = float(pk.loc["nccl_8.log", "peak_busbw"])
out.check("two_sources_agree_on_8xA100", bool(abs(a100_8 / echo_8 - 1) < 0.05), value=[a100_8, echo_8],
          expect="vTrain and Echo peak busbw on 8 A100 in one node within 5%")
inter_spread = float(inter.max() / inter.min())
out.check("inter_node_flat_in_scale", bool(inter_spread < 1.1), value=inter_spread,
          expect="across 2-16 nodes, peak busbw varies < 10% (ring busbw is scale-free)")
out.value("peak_busbw_gbs", pk["peak_busbw"].to_dict())
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
plots.busbw_curves(echo, ax=axes[0], title="Echo all-reduce, A100 (1-16 nodes of 8)")
vt = bw[bw["source"].str.contains("AR_GPU")].assign(GPU=lambda d: d["device"].str.upper())
plots.busbw_curves(vt, ax=axes[1], hue="ranks", style="GPU", title="vTrain all-reduce inside one node")
out.figure(fig, "busbw_vs_size")
out.save()
""")
md("""
**Result.** Bus bandwidth grows with message size and saturates only above tens of MiB; small messages
reach a few percent of it. Inside one 8×A100 node all-reduce reaches ≈230 GB/s (NVLink); as soon as the ring
crosses nodes it drops to ≈130 GB/s (8×200 Gb/s InfiniBand per node) and then stays flat from 2 to 16 nodes.
Two independent sources (Echo's and vTrain's A100 nodes) agree on the intra-node peak. On V100 nodes the
bandwidth is not even monotonic in the number of GPUs (8 > 7 ≈ 4 > 6 ≈ 3 > 5 > 2): it follows the NVLink
topology between the chosen GPUs rather than their count. Bandwidth thus depends
on message size and on whether a group spans nodes — the "effective bandwidth" factors of the paper's model.
""")

for i, c in enumerate(cells):  # stable ids: rebuilding gives the same file
    c.id = f"cell-{i:02d}"
nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                         "language": "python"}})
nbf.write(nb, Path(__file__).resolve().parent / "04_real_traces.ipynb")
