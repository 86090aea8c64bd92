"""Build notebooks 01 (communication matrix, F1) and 02 (traffic volume, F2) with nbformat.

    .venv/bin/python notebooks/build_predict_notebooks.py
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent


def params(src: str):
    c = new_code_cell(src)
    c.metadata["tags"] = ["parameters"]
    return c


def write(name: str, cells: list) -> None:
    for i, c in enumerate(cells):  # stable ids: rebuilding gives the same file
        c.id = f"cell-{i:02d}"
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, HERE / f"{name}.ipynb")


NB01 = [
    new_markdown_cell("""# 01 · Who talks to whom: the communication matrix (finding F1)

**Question.** The paper finds that for dense (GPT-style) models the communication matrix — which GPU pairs
exchange bytes, and how many — is fixed before training starts by the parallel configuration and its mapping
onto GPUs: TP groups appear as all-reduce blocks, DP and PP as diagonal lines (PP two: activations forward,
gradients backward). Does the analytical predictor, which knows only the model, the parallel configuration
and the rank layout, give these patterns, and does every byte stay inside a group of the layout?"""),
    params("""out_dir = "../figures"
model = "gpt3-6.7b"            # dense model for the 32-GPU configurations (32 heads, 32 layers)
moe_model = "mixtral-8x7b"     # for the EP-only panel
seq_len = 2048
gpus_per_node = 8
# 32 GPUs = 4 nodes x 8: label -> ParallelConfig keyword arguments (global batch sets the micro-batches)
configs = {
    "TP-only (tp32)": {"tp": 32, "global_batch": 4},
    "PP-only (pp32)": {"pp": 32, "global_batch": 8},
    "DP-only (dp32)": {"dp": 32, "global_batch": 32},
    "hybrid tp8 pp2 dp2": {"tp": 8, "pp": 2, "dp": 2, "global_batch": 16},
    "hybrid tp2 pp4 dp4 (order tp-pp-dp)": {"tp": 2, "pp": 4, "dp": 4, "global_batch": 32, "order": "tp-pp-dp"},
}
ep_config = {"ep": 8, "dp": 32, "global_batch": 32}
large_model = "gpt3-175b"
large_config = {"tp": 8, "pp": 16, "dp": 8, "global_batch": 64}   # 1,024 GPUs, binned for display
interactive = False   # True in a live Jupyter session: widgets to explore other configurations"""),
    new_code_cell("""import matplotlib.pyplot as plt
import numpy as np

import llmcomm as lc
from llmcomm.plots import apply_style, comm_matrix, comm_matrix_grid
from llmcomm.predict import predict_traffic
from llmcomm.predict.summary import bytes_by, predict_cases, support_violations
from llmcomm.reproduce import Outputs

apply_style()
out = Outputs("01_communication_matrix", out_dir)"""),
    new_markdown_cell("""## Method

`llmcomm.predict_traffic(model, parallel)` lists every call every rank issues in one iteration (Megatron-LM's
TP, PP, DP and EP calls, in the order the pipeline schedule issues them). The matrix is the sum of the
calls' flows: `algorithm="direct"` books a collective as logical traffic between every pair of its group
(an all-reduce of `S` bytes sends `2S/n` to each peer), `algorithm="ring"` as what an NCCL ring puts on the
wire (each rank to its successor only). Node boundaries (8 GPUs per node) are white lines."""),
    new_code_cell("""cases = {k: (model, {**v, "seq_len": seq_len}) for k, v in configs.items()}
cases["EP-only (ep8 within dp32)"] = (moe_model, {**ep_config, "seq_len": seq_len})
traces = predict_cases(cases)
{k: f"{len(t):,} calls" for k, t in traces.items()}"""),
    new_code_cell("""panels = []
for label, t in traces.items():
    sel = {"parallelism": "ep"} if label.startswith("EP") else {}
    panels.append((f"{label}\\ndirect", t.matrix("direct", **sel)))
    panels.append((f"{label}\\nring", t.matrix("ring", **sel)))
fig = comm_matrix_grid(panels, gpus_per_node=gpus_per_node, ncols=4)
out.figure(fig, "matrices_32gpu")"""),
    new_markdown_cell("""### Per parallelism in one hybrid configuration

The hybrid job's matrix split by the parallelism that issued each call: TP blocks inside a node, PP
send/recv lines one stage (8·2 = 16 ranks) apart, DP lines linking the same TP position of the replicas."""),
    new_code_cell("""hyb = traces["hybrid tp8 pp2 dp2"]
pars = [p for p in ("tp", "pp", "dp") if p in set(hyb.events["parallelism"])]
fig = comm_matrix_grid([(f"{p} (direct)", hyb.matrix("direct", world_size=hyb.world_size, parallelism=p))
                        for p in pars] + [("all (direct)", hyb.matrix("direct"))], gpus_per_node=gpus_per_node)
out.figure(fig, "hybrid_per_parallelism")
bytes_by(hyb)"""),
    new_markdown_cell("""### A large job

GPT-3 175B on 1,024 GPUs (ranks binned for display; the matrix itself stays sparse)."""),
    new_code_cell("""big = predict_traffic(lc.load_model(large_model), lc.ParallelConfig(**large_config, seq_len=seq_len))
fig, ax = plt.subplots(figsize=(6, 5))
comm_matrix(big.matrix("direct"), gpus_per_node=gpus_per_node, ax=ax,
            title=f"{large_model}, {big.world_size:,} GPUs (direct)")
out.figure(fig, "large_job")
out.value("large_job_nonzero_pairs", int(big.matrix("direct").nnz))"""),
    new_markdown_cell("""## Checks

Every nonzero entry must join two ranks of one group of the issuing parallelism in the layout (TP, PP, DP
or expert-DP, EP); PP must have exactly two lines (forward and backward), and TP must be symmetric."""),
    new_code_cell("""for label, t in {**traces, "large": big}.items():
    bad = support_violations(t)
    out.check(f"support_in_groups[{label}]", len(bad) == 0, value=len(bad), expect="0 pairs outside groups")
pp_only = traces["PP-only (pp32)"].matrix("direct", parallelism="pp").tocoo()
offs = set((pp_only.col - pp_only.row).tolist())
out.check("pp_two_diagonals", offs <= {1, -1, 31, -31} and {1, -1} <= offs, value=sorted(offs),
          expect="+1 (forward) and -1 (backward); +-31 only from the tied-embedding all-reduce")
tpm = traces["TP-only (tp32)"].matrix("direct", parallelism="tp")
out.check("tp_symmetric", abs(tpm - tpm.T).max() == 0, value=float(abs(tpm - tpm.T).max()), expect="0")"""),
    new_markdown_cell("""## Explore (interactive)

Run with `interactive = True` in Jupyter: pick a model and a parallel configuration; the matrix and the
bytes per parallelism update. Papermill runs keep it off."""),
    new_code_cell("""if interactive:
    import ipywidgets as w
    from IPython.display import display

    def show(model_name, tp, pp, dp, microbatches, algorithm):
        try:
            t = predict_traffic(lc.load_model(model_name),
                                lc.ParallelConfig(tp=tp, pp=pp, dp=dp, seq_len=seq_len, global_batch=microbatches * dp))
        except lc.ConfigError as e:
            print(f"not a valid configuration: {e}")
            return
        fig, ax = plt.subplots(figsize=(5.5, 4.5))
        comm_matrix(t.matrix(algorithm), gpus_per_node=gpus_per_node, ax=ax, title=f"{model_name}: {algorithm}")
        plt.show()
        display(bytes_by(t))

    w.interact(show, model_name=w.Dropdown(options=lc.list_models(), value=model),
               tp=w.SelectionSlider(options=[1, 2, 4, 8], value=4), pp=w.SelectionSlider(options=[1, 2, 4, 8], value=2),
               dp=w.SelectionSlider(options=[1, 2, 4, 8], value=2), microbatches=w.IntSlider(min=1, max=32, value=4),
               algorithm=w.ToggleButtons(options=["direct", "ring"]))"""),
    new_code_cell("out.save()"),
]

NB02 = [
    new_markdown_cell("""# 02 · How many bytes: traffic volume per parallelism (finding F2)

**Question.** The paper finds that the bytes on every GPU pair follow exactly from the model architecture
(layers, hidden size, sequence, micro-batch, dtypes), and that tensor parallelism carries almost all of
them — over 99% when an iteration has many micro-batches — while DP and PP are small. How do the volumes
split for large published training configurations, from how many micro-batches does TP pass 99%, and how
much of it stays inside a node?"""),
    params("""out_dir = "../figures"
gpus_per_node = 8
# published (or, where marked, adapted) training configurations: label -> (model, ParallelConfig kwargs)
cases = {
    "GPT-3 175B": ["gpt3-175b", {"tp": 8, "pp": 16, "dp": 12, "micro_batch": 1, "global_batch": 1536,
                                 "seq_len": 2048}],
    "LLaMA-3 70B": ["llama3-70b", {"tp": 4, "pp": 4, "vpp": 5, "cp": 2, "dp": 4, "sp": True, "micro_batch": 1,
                                   "global_batch": 512, "seq_len": 8192, "distributed_optimizer": True}],
    "GPT-3 175B, no PP (tp8 dp192)": ["gpt3-175b", {"tp": 8, "dp": 192, "micro_batch": 1, "global_batch": 1536,
                                                    "seq_len": 2048}],
    "Mixtral 8x7B": ["mixtral-8x7b", {"tp": 1, "pp": 4, "dp": 16, "ep": 8, "micro_batch": 1,
                                      "global_batch": 256, "seq_len": 4096, "distributed_optimizer": True}],
}
microbatches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
threshold = 0.99"""),
    new_code_cell("""import matplotlib.pyplot as plt
import pandas as pd

import llmcomm as lc
from llmcomm.plots import apply_style, pair_class_bars, tp_share_curve, volume_bars
from llmcomm.predict.summary import (first_crossing, pair_class_table, predict_cases, tp_share_vs_microbatches,
                                     volume_table)
from llmcomm.reproduce import Outputs

apply_style()
out = Outputs("02_traffic_volume", out_dir)"""),
    new_markdown_cell("""## Configurations

* **GPT-3 175B** — Narayanan et al., *Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM* (SC '21), Table 1: TP 8, PP 16, 1,536 GPUs (so DP 12), global batch 1,536, micro-batch 1,
  sequence 2,048.
* **GPT-3 175B, no PP** — the same job with the 16 pipeline stages folded into data parallelism (TP 8,
  DP 192): not a configuration that fits in GPU memory, but it isolates how PP caps the TP share.
* **LLaMA-3 70B** — the parallel layout of NVIDIA NeMo's Llama-3 70B pre-training recipe (TP 4, PP 4,
  virtual pipeline 5, CP 2, sequence parallel, sequence 8,192, micro-batch 1, distributed optimizer) on
  128 GPUs (DP 4), global batch 512. CP traffic is the ring-attention K/V exchange of `llmcomm.predict.cp`
  (an approximation of Transformer Engine's schedule).
* **Mixtral 8x7B** — *adapted* from the Megatron-Core MoE / NeMo Mixtral recipes (EP 8, PP 4, TP 1,
  sequence 4,096, micro-batch 1, distributed optimizer); DP 16 on 64 GPUs, global batch 256; uniform
  routing (the expected all-to-all sizes).

## Method

`predict_traffic` gives each call's nccl-tests size (message bytes: the all-reduced buffer, the gathered
output, the scattered input, the sent tensor); the ring flows give the bytes each rank puts on links (wire
bytes). Both are summed over all ranks of one iteration."""),
    new_code_cell("""traces = predict_cases({k: (m, p) for k, (m, p) in cases.items()})
vol = volume_table(traces)
wire = volume_table(traces, algorithm="ring")
vol.pivot_table(index="config", columns="parallelism", values="share").round(4)"""),
    new_code_cell("""fig, axes = plt.subplots(1, 2, figsize=(11, 4))
volume_bars(vol, ax=axes[0], title="message bytes per iteration (total above each bar)", normalize=True,
            legend=False)
volume_bars(wire, ax=axes[1], title="wire bytes (ring) per iteration (total above each bar)", normalize=True)
out.figure(fig, "volume_per_parallelism")"""),
    new_markdown_cell("""## TP share against the number of micro-batches

TP and PP bytes scale with the number of micro-batches `m`, DP bytes are paid once per iteration, so the TP
share `m·t / (m·t + m·p + d)` rises with `m` towards `t / (t + p)`. The configurations above, with the
global batch varied. For GPT-3 with 16 stages of 6 layers, a micro-batch costs each rank `t = 24` TP
all-reduces of `A = b·s·h·2` bytes against `p = 2` PP sends of `A`, so TP's share is capped at
about `24/26 ≈ 92%` of message bytes (exactly `(4L·A + 2A + CE)/(… + 2(pp−1)·A)` with the embedding,
output-layer and cross-entropy calls) however many micro-batches there are; without PP the cap is 100%."""),
    new_code_cell("""curves = pd.concat([tp_share_vs_microbatches(lc.load_model(m), lc.ParallelConfig(**p),
                                              [k for k in microbatches if k % (p["pp"] if p.get("vpp", 1) > 1 else 1) == 0])
                    .assign(model=label) for label, (m, p) in cases.items() if p.get("tp", 1) > 1],
                   ignore_index=True)   # (Mixtral runs with tp 1: no TP bytes at all, EP dominates)
fig, ax = plt.subplots(figsize=(6.5, 4))
tp_share_curve(curves, ax=ax, threshold=threshold)
out.figure(fig, "tp_share_vs_microbatches")
crossings = {label: first_crossing(curves[curves["model"] == label], threshold) for label in set(curves["model"])}
out.value("microbatches_to_99pct_tp", crossings)
crossings"""),
    new_markdown_cell("""## Pair classes

Wire bytes (ring) between GPUs of one node (NVLink) and of different nodes (network), per parallelism."""),
    new_code_cell("""pc_tab = pair_class_table(traces, gpus_per_node)
ax = pair_class_bars(pc_tab)
out.figure(ax.figure, "pair_classes")
pc_tab"""),
    new_markdown_cell("""## Checks

* TP dominates the GPT-3 configuration's bytes and passes 99% at some number of micro-batches;
* exactness: for GPT-3, the TP message bytes equal the closed form
  `m · (world/pp) · (4·L·A + 2·A + 3·4·b·s)` with `A = b·s·h·2` computed here by hand from the architecture;
* with TP inside a node (tp 8 = one node), every TP byte is intra-node."""),
    new_code_cell("""g = traces["GPT-3 175B"]
mdl, p = lc.load_model(cases["GPT-3 175B"][0]), lc.ParallelConfig(**cases["GPT-3 175B"][1])
A = p.micro_batch * p.sequence_length(mdl) * mdl.hidden_size * 2          # b·s·h bf16
ce = 3 * p.micro_batch * p.sequence_length(mdl) * 4                      # 3 fp32 all-reduces of b·s
# per micro-batch along the pipeline: 2 fwd + 2 bwd all-reduces per layer, the embedding's forward
# all-reduce, the output layer's backward all-reduce and the cross-entropy; every TP rank of a stage issues it
expected_tp = p.num_microbatches * (p.world_size // p.pp) * (4 * mdl.num_layers * A + 2 * A + ce)
got_tp = int(vol[(vol.config == "GPT-3 175B") & (vol.parallelism == "tp")]["bytes"].iloc[0])
out.check("gpt3_tp_bytes_closed_form", got_tp == expected_tp, value=got_tp, expect=f"{int(expected_tp)}")
share = float(vol[(vol.config == "GPT-3 175B") & (vol.parallelism == "tp")]["share"].iloc[0])
out.check("gpt3_tp_dominates", share > 0.8, value=share, expect="> 0.8 of message bytes at m = 128")
t_mb = 4 * mdl.num_layers * A + 2 * A + ce           # TP bytes of one micro-batch along the pipeline
cap = t_mb / (t_mb + 2 * (p.pp - 1) * A)               # + PP sends: forward and backward per boundary
top = float(curves[curves["model"] == "GPT-3 175B"]["tp_share"].max())
out.check("gpt3_tp_share_below_pp_cap", top < cap and cap - top < 0.01, value=top,
          expect=f"just under the analytic cap t/(t+p) = {cap:.4f}")
nopp = crossings["GPT-3 175B, no PP (tp8 dp192)"]
out.check("tp_passes_99pct_without_pp", nopp is not None, value=nopp,
          expect=f"some m in {microbatches} with TP share >= {threshold}")
tp_inter = pc_tab[(pc_tab.config == "GPT-3 175B") & (pc_tab.parallelism == "tp") & (pc_tab.pair_class == "inter-node")]
out.check("gpt3_tp_intra_node", tp_inter.empty or float(tp_inter["bytes"].sum()) == 0,
          value=float(tp_inter["bytes"].sum()) if len(tp_inter) else 0.0, expect="0 inter-node TP bytes")"""),
    new_code_cell("out.save()"),
]

if __name__ == "__main__":
    write("01_communication_matrix", NB01)
    write("02_traffic_volume", NB02)
