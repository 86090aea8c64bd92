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
# # 12 · Explore: change the configuration, watch the communication change
#
# **Question.** A parallel configuration fixes which GPUs talk, how many bytes they move and how long the
# iteration takes. What does one change of one number — the tensor-parallel size — do to the rank layout, the
# communication matrix, the bytes per parallelism, one rank's calls and the iteration time?
#
# This notebook is for a class. In JupyterLab the explorer below is live: change the model, the cluster,
# tp/pp/dp/cp/ep/vpp, SP and the batch, and every panel is recomputed; an impossible choice shows the rule it
# breaks (the same message as the `llmcomm` command) and keeps the last valid view. `llmcomm explore` serves the
# same explorer as a page without code. Run through papermill, the notebook saves a static snapshot of the
# starting configuration and works the exercise out in numbers.

# %% tags=["parameters"]
out_dir = None  # where figures and results go; None: the repository's figures/ folder
model = "gpt3-6.7b"  # 32 heads, 32 layers: tp up to 32 divides it
cluster = "a100-80g-hdr200"  # 8 GPUs per node, NVLink 300 GB/s, one 25 GB/s NIC per GPU
start = {"tp": 8, "pp": 4, "dp": 1, "micro_batch": 1, "global_batch": 32}  # 32 GPUs, TP inside a node
exercise = {"tp": 16, "pp": 2}  # the same 32 GPUs with TP across two nodes

# %%
import pandas as pd

from llmcomm.analysis.api import pair_classes
from llmcomm.explore import Choice, compute, explore
from llmcomm.explore.panels import FIGURES, PANEL_TITLES
from llmcomm.plots import apply_style
from llmcomm.reproduce import Outputs

apply_style()
out = Outputs("12_explore", out_dir)
first = Choice(model=model, cluster=cluster, **start)

# %% [markdown]
# ## The explorer
#
# Each panel is drawn by the package's own functions: the rank layout from `llmcomm.Layout` (Megatron's
# `tp-cp-ep-dp-pp` order, nodes of the cluster), the matrices from `predict_traffic` and `Trace.matrix`
# (logical: who talks to whom; ring: what NCCL's ring puts on the wire), the bytes from `Trace.volumes`, the call
# sequence from the predictor's stage program, and the time from the iteration-time formulation
# (`llmcomm.overhead.iteration.iteration_time`, with the 90% interval of `llmcomm.overhead.interval` from the
# single-node calibration residuals).

# %%
explorer = explore(first)
explorer

# %% [markdown]
# ## Snapshot of the starting configuration
#
# What the explorer shows before anything is changed (saved as figures, so the notebook also reads without a
# browser).

# %%
view = compute(first)
for name, draw in FIGURES.items():
    out.figure(draw(view), f"panel_{name}")
{name: PANEL_TITLES[name] for name in FIGURES}

# %% [markdown]
# ## Exercise for the class: make TP cross a node boundary
#
# In the explorer, set **TP to 16 and PP to 2** (the same 32 GPUs). Before looking, predict: which blocks of the
# matrix change, does the number of bytes TP moves change, and what happens to the iteration time? Then
# compare with the panels. Below, the same change worked out in numbers.

# %%
changed = compute(first.replace(**exercise))
rows = []
for v in (view, changed):
    span = v.group_summary.set_index("parallelism")["nodes_per_group"]
    wire = pair_classes(v.trace, v.cluster.gpus_per_node, "ring")
    tp_wire = wire[wire.parallelism == "tp"]
    rows.append({"configuration": v.choice.label(), "tp_nodes_per_group": int(span["tp"]),
                 "tp_bytes_GiB": float(v.volumes.set_index("parallelism").loc["tp", "bytes"]) / 2**30,
                 "tp_inter_node_wire_share": float(tp_wire.loc[tp_wire.pair_class == "inter-node", "bytes"].sum()
                                                   / tp_wire["bytes"].sum()),
                 "tp_comm_s": v.breakdown.tp_comm_s, "total_s": v.breakdown.total_s,
                 "comm_overhead": v.breakdown.comm_overhead})
table = pd.DataFrame(rows, index=["start", "exercise"])
table

# %%
out.figure(FIGURES["matrix"](changed), "exercise_matrix")
out.figure(FIGURES["time"](changed), "exercise_time")

# %% [markdown]
# ## Checks
#
# The snapshot's TP groups sit inside a node and the exercise's span two; the TP all-reduces then run partly over
# the 25 GB/s NICs instead of NVLink, so the exposed TP time must grow, and with it the iteration.

# %%
s, e = table.loc["start"], table.loc["exercise"]
for k in table.columns[1:]:
    out.value(f"start_{k}", float(s[k]))
    out.value(f"exercise_{k}", float(e[k]))
out.check("start: TP inside one node", s.tp_nodes_per_group == 1 and s.tp_inter_node_wire_share == 0.0,
          value=float(s.tp_inter_node_wire_share))
out.check("exercise: TP group spans two nodes", e.tp_nodes_per_group == 2 and e.tp_inter_node_wire_share > 0,
          value=float(e.tp_inter_node_wire_share))
out.check("exercise: exposed TP time grows", e.tp_comm_s > s.tp_comm_s, value=[float(s.tp_comm_s), float(e.tp_comm_s)])
out.check("exercise: iteration time grows", e.total_s > s.total_s, value=[float(s.total_s), float(e.total_s)])

# %% [markdown]
# ## Result

# %%
out.say(
    f"**Result.** With {first.label()} on {view.world_size} GPUs ({view.cluster.gpus_per_node} per node) every TP "
    f"group sits inside one node: the TP blocks of the matrix lie on the node diagonal and none of TP's ring "
    f"bytes cross a node. With {changed.choice.label()} each TP group spans {int(e.tp_nodes_per_group)} nodes: "
    f"TP moves {e.tp_bytes_GiB:,.0f} GiB per iteration instead of {s.tp_bytes_GiB:,.0f} GiB (more "
    f"micro-batches per stage, each all-reduce over more ranks), {100 * e.tp_inter_node_wire_share:.1f}% of its "
    f"ring bytes now cross a node boundary, and the exposed TP time grows from {s.tp_comm_s:.3f} s to "
    f"{e.tp_comm_s:.3f} s: the iteration takes {e.total_s:.3f} s instead of {s.total_s:.3f} s "
    f"({100 * s.comm_overhead:.1f}% → {100 * e.comm_overhead:.1f}% exposed communication)."
)
out.save()
