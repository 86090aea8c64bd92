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
# # 01 · Who talks to whom: the communication matrix (finding F1)
#
# **Question.** The paper finds that for dense (GPT-style) models the communication matrix — which GPU pairs
# exchange bytes, and how many — is fixed before training starts by the parallel configuration and its mapping
# onto GPUs: TP groups appear as all-reduce blocks, DP and PP as diagonal lines (PP two: activations forward,
# gradients backward). Does the analytical predictor, which knows only the model, the parallel configuration
# and the rank layout, give these patterns, and does every byte stay inside a group of the layout?

# %% tags=["parameters"]
out_dir = None  # where figures and results go; None: the repository's figures/ folder
model = "gpt3-6.7b"            # dense model for the 32-GPU configurations (32 heads, 32 layers)
moe_model = "mixtral-8x7b"     # for the EP-only panel
seq_len = 2048
gpus_per_node = 8
# 32 GPUs = 4 nodes x 8: label -> ParallelConfig keyword arguments (global batch sets the micro-batches).
# A configuration that does not fit the model (e.g. tp32 for a model with 40 heads) is skipped, and said so.
configs = {
    "TP-only (tp32)": {"tp": 32, "global_batch": 4},
    "PP-only (pp32)": {"pp": 32, "global_batch": 8},
    "DP-only (dp32)": {"dp": 32, "global_batch": 32},
    "hybrid tp8 pp2 dp2": {"tp": 8, "pp": 2, "dp": 2, "global_batch": 16},
    "hybrid tp2 pp4 dp4 (order tp-pp-dp)": {"tp": 2, "pp": 4, "dp": 4, "global_batch": 32, "order": "tp-pp-dp"},
}
ep_config = {"ep": 8, "dp": 32, "global_batch": 32}
hybrid = "hybrid tp8 pp2 dp2"  # the configuration split by parallelism
large_model = "gpt3-175b"
large_config = {"tp": 8, "pp": 16, "dp": 8, "global_batch": 64}   # 1,024 GPUs, binned for display
interactive = False   # True in a live Jupyter session: widgets to explore other configurations

# %%
import matplotlib.pyplot as plt
import pandas as pd

import llmcomm as lc
from llmcomm.analysis.api import bytes_by, diagonal_offsets, matrix_asymmetry, support_violations
from llmcomm.analysis.sweeps import predict_cases, valid_cases
from llmcomm.matrix import binned_flows
from llmcomm.plots import apply_style, comm_matrix, comm_matrix_grid
from llmcomm.predict import predict_traffic
from llmcomm.reproduce import Outputs

apply_style()
out = Outputs("01_communication_matrix", out_dir)

# %% [markdown]
# ## Method
#
# `llmcomm.predict_traffic(model, parallel)` lists every call every rank issues in one iteration (Megatron-LM's
# TP, PP, DP and EP calls, in the order the pipeline schedule issues them). The matrix is the sum of the
# calls' flows: `algorithm="direct"` books a collective as logical traffic between every pair of its group
# (an all-reduce of `S` bytes sends `2S/n` to each peer), `algorithm="ring"` as what an NCCL ring puts on the
# wire (each rank to its successor only). Node boundaries (8 GPUs per node) are dashed grey lines; all panels
# share one colour scale. Cells under 10⁻⁶ of the largest cell are left white, and the colour bar says so
# (`plots.MATRIX_FLOOR`): the 4-byte loss and gradient-norm all-reduces ("other") would otherwise paint every pair
# of their group at 10⁻¹⁰ of a PP pair's bytes and hide the pattern; the checks below use every call. First,
# each configuration is checked against the model (heads, layers, experts divisible by the group sizes); one that
# does not fit is skipped here, visibly.

# %%
cases = {k: (model, {**v, "seq_len": seq_len}) for k, v in configs.items()}
cases["EP-only (ep8 within dp32)"] = (moe_model, {**ep_config, "seq_len": seq_len})
valid, skipped = valid_cases(cases)
for label, why in skipped.items():
    print(f"skipped {label}: {why}")
out.value("skipped_configurations", skipped)
traces = predict_cases(valid)
{k: f"{len(t):,} calls" for k, t in traces.items()}

# %%
world = 32
panels = []
for label, t in traces.items():
    sel = {"parallelism": "ep"} if label.startswith("EP") else {}
    for alg in ("direct", "ring"):
        panels.append(t.flows(alg, **sel)[["src", "dst", "bytes"]].assign(panel=f"{label}\n{alg}"))
fig = comm_matrix_grid(pd.concat(panels, ignore_index=True), x="dst", y="src", hue="bytes", col="panel",
                       world_size=world, gpus_per_node=gpus_per_node, ncols=4)
fig.suptitle(f"{model} (EP panel: {moe_model}) on {world} GPUs, {gpus_per_node} per node, seq {seq_len}"
             + (f"; skipped: {', '.join(skipped)}" if skipped else ""), y=1.02)
out.figure(fig, "matrices_32gpu")

# %% [markdown]
# ### Per parallelism in one hybrid configuration
#
# The hybrid job's matrix split by the parallelism that issued each call: TP blocks inside a node, PP
# send/recv lines one stage (8·2 = 16 ranks) apart, DP lines linking the same TP position of the replicas.

# %%
if hybrid in traces:
    hyb = traces[hybrid]
    pars = [p for p in ("tp", "pp", "dp") if p in set(hyb.events["parallelism"])]
    flows = [hyb.flows("direct", parallelism=p)[["src", "dst", "bytes"]].assign(panel=f"{p} (direct)") for p in pars]
    flows.append(hyb.flows("direct")[["src", "dst", "bytes"]].assign(panel="all (direct)"))
    fig = comm_matrix_grid(pd.concat(flows, ignore_index=True), col="panel", world_size=hyb.world_size,
                           gpus_per_node=gpus_per_node)
    fig.suptitle(f"{model}, {hybrid}, by parallelism", y=1.04)
    out.figure(fig, "hybrid_per_parallelism")
    display_table = bytes_by(hyb)
else:
    display_table = f"{hybrid} skipped: {skipped.get(hybrid, 'not in configs')}"
display_table

# %% [markdown]
# ### A large job
#
# GPT-3 175B on 1,024 GPUs (ranks binned for display; the matrix itself stays sparse).

# %%
big = predict_traffic(lc.load_model(large_model), lc.ParallelConfig(**large_config, seq_len=seq_len))
big_matrix = big.matrix("direct")
fig, ax = plt.subplots(figsize=(6, 5))
comm_matrix(binned_flows(big, "direct"), x="dst", y="src", hue="bytes", ax=ax,
            world_size=big.world_size, gpus_per_node=gpus_per_node,
            title=f"{large_model}, " + " ".join(f"{k}{v}" for k, v in large_config.items() if k != "global_batch")
            + f", {big.world_size:,} GPUs (direct)")
out.figure(fig, "large_job")
out.value("large_job_nonzero_pairs", int(big_matrix.nnz))

# %% [markdown]
# ## Checks
#
# Every nonzero entry must join two ranks of one group of the issuing parallelism in the layout (TP, PP, DP
# or expert-DP, EP); PP must have exactly two lines (forward and backward), and TP must be symmetric.

# %%
violations = {}
for label, t in {**traces, "large": big}.items():
    violations[label] = len(support_violations(t))
    out.check(f"support_in_groups[{label}]", violations[label] == 0, value=violations[label],
              expect="0 pairs outside groups")
pp_label = next((k for k in traces if k.startswith("PP-only")), None)
if pp_label:
    n_pp = configs[pp_label]["pp"]
    offs = diagonal_offsets(traces[pp_label], "direct", parallelism="pp")
    out.check("pp_two_diagonals", set(offs) <= {1, -1, n_pp - 1, 1 - n_pp} and {1, -1} <= set(offs), value=offs,
              expect=f"+1 (forward) and -1 (backward); +-{n_pp - 1} only from the tied-embedding all-reduce")
tp_label = next((k for k in traces if k.startswith("TP-only")), None)
if tp_label:
    asymmetry = matrix_asymmetry(traces[tp_label], "direct", parallelism="tp")
    out.check("tp_symmetric", asymmetry == 0, value=asymmetry, expect="0")
pairs = {label: int(t.matrix("direct").nnz) for label, t in traces.items()}
out.value("nonzero_pairs_32gpu", pairs)

# %% [markdown]
# ## Result

# %%
out.say(
    f"**Result.** For {model} on {world} GPUs, {len(traces)} configurations were predicted"
    + (f" ({len(skipped)} skipped because they do not fit the model: {'; '.join(f'{k}: {v}' for k, v in skipped.items())})"
       if skipped else "")
    + ". The number of GPU pairs that exchange bytes differs by configuration: "
    + ", ".join(f"{k} {v} of {world * world}" for k, v in pairs.items())
    + f". In every configuration, and in {large_model} on {big.world_size:,} GPUs ({int(big_matrix.nnz):,} "
    f"nonzero pairs of {big.world_size ** 2:,}), {sum(violations.values())} byte-carrying pairs fall outside a "
    f"group of the issuing parallelism: the matrix is fixed by the configuration and the rank layout."
    + (f" PP-only traffic lies on the diagonals {offs} (forward +1, backward −1)." if pp_label else "")
)

# %% [markdown]
# ## Explore (interactive)
#
# Run with `interactive = True` in Jupyter: pick a model and a parallel configuration; the matrix and the
# bytes per parallelism update. Papermill runs keep it off.

# %%
if interactive:
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
        comm_matrix(t.flows(algorithm), x="dst", y="src", hue="bytes", ax=ax, world_size=t.world_size,
                    gpus_per_node=gpus_per_node, title=f"{model_name} tp{tp} pp{pp} dp{dp}: {algorithm}")
        plt.show()
        display(bytes_by(t))

    w.interact(show, model_name=w.Dropdown(options=lc.list_models(), value=model),
               tp=w.SelectionSlider(options=[1, 2, 4, 8], value=4), pp=w.SelectionSlider(options=[1, 2, 4, 8], value=2),
               dp=w.SelectionSlider(options=[1, 2, 4, 8], value=2), microbatches=w.IntSlider(min=1, max=32, value=4),
               algorithm=w.ToggleButtons(options=["direct", "ring"]))

# %%
out.save()
