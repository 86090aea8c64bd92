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
# # 10 · Your trace against its prediction
#
# **Question.** The kit's strongest result is that the communication of a dense training run is known before
# it runs: predicted equals recorded, call by call. Does that hold for *your* trace — a run recorded with
# `llmcomm.record`, a Kineto profile, an AICB workload — and where it does not, which calls differ and why?
#
# `llmcomm.compare.compare(measured)` predicts the trace's own configuration and aligns the two on every rank as
# multisets of calls keyed by (phase, op, group, peer, bytes). What is left over on either side is listed, grouped
# by what it is; the per-pair matrices are compared; each parallelism gets a one-line verdict. The same function
# is the project's validation test (`tests/test_predict_vs_recorded.py`) and the `llmcomm compare` command.
#
# Two inputs: a curated recorded run (torch's own TP/PP/DP on 8 CPU ranks, `data/traces/`), where the match must
# be exact, and AICB's replay of a Megatron MoE job on 8×A100 (`aicb/A100_example.csv`, third-party), compared with
# Megatron-LM's program for the architecture its message sizes fit (Mixtral 8x7B: 32 layers, hidden 4,096,
# 8 experts, top-2; its TP all-reduce of b·s·h bf16 elements is 16 MiB at sequence 2,048).

# %% tags=["parameters"]
out_dir = None  # None: the project's figures/
trace = "gpt_tp2pp2dp2"  # a curated trace name, an external-data name or a path to your own trace
framework = "torch"  # what issued the calls: "torch" (llmcomm.collect) or "megatron"
model = None  # None: from the trace's metadata
parallel = None  # None: from the trace's metadata; else a dict such as {"tp": 2, "dp": 4}
aicb_trace = "aicb/A100_example.csv"
aicb_model = "mixtral-8x7b"
aicb_parallel = {"tp": 2, "dp": 4, "ep": 4, "sp": True, "distributed_optimizer": True, "global_batch": 8,
                 "seq_len": 2048}
top = 12  # one-sided call groups listed

# %%
import pandas as pd
from IPython.display import Markdown, display

from llmcomm import plots
from llmcomm.compare import compare, load_measured
from llmcomm.reproduce import Outputs

plots.apply_style()
out = Outputs("10_compare_your_trace", out_dir)

# %% [markdown]
# ## A recorded run: the prediction is exact
# The curated run records every call of every rank. Compared with the prediction of the same configuration for
# the framework that issued it, every call should be matched, on every rank, in order.

# %%
measured = load_measured(trace)
mine = compare(measured, model=model, parallel=parallel, framework=framework)
display(mine.verdicts)
display(mine.by_kind)

# %%
sides = {"measured (recorded)": mine.measured, f"predicted (framework={framework})": mine.predicted}
flows = pd.concat([t.flows("direct")[["src", "dst", "bytes"]].assign(side=k) for k, t in sides.items()])
fig = plots.comparison_matrices(flows, x="dst", y="src", hue="bytes", col="side",
                                world_size=mine.measured.world_size)
fig.suptitle(f"{mine.meta['trace']} — {mine.meta['model']}, {mine.meta['parallel']}: direct communication "
             f"matrix of iteration {mine.iteration}", fontsize=9)
out.figure(fig, "recorded_vs_predicted_matrix")

# %%
out.value("recorded_calls", int(mine.by_kind["calls_measured"].sum()))
out.value("recorded_ranks_in_order", mine.ordered_ranks)
out.check("recorded_run_matches_exactly", mine.exact and mine.ordered_ranks == len(mine.ranks),
          value=len(mine.one_sided), expect="no call on one side only, every rank in order")
display(Markdown(
    f"**Result.** All {out.values['recorded_calls']:,} calls of iteration {mine.iteration} of `{mine.meta['trace']}` "
    f"match the prediction on {mine.ordered_ranks} of {len(mine.ranks)} ranks, in order; the per-pair bytes differ "
    f"nowhere (largest difference {abs(mine.pairs['diff']).max():g} bytes). Verdicts: "
    + "; ".join(mine.verdict_lines()) + "."))

# %% [markdown]
# ## The same run in Megatron-LM's terms
# What would a user see who compares this torch run with Megatron-LM's program? The differences are the
# framework's, not the model's: they are listed rather than hidden.

# %%
megatron = compare(measured, model=model, parallel=parallel, framework="megatron")
display(megatron.verdicts)
display(megatron.one_sided[["side", "phase", "parallelism", "op", "bytes", "calls_per_rank", "what"]])
out.value("megatron_view_one_sided_groups", len(megatron.one_sided))
display(Markdown(
    f"**Result.** Against Megatron-LM's program the same trace has {len(megatron.one_sided)} groups of calls on one "
    "side only: " + "; ".join(megatron.verdict_lines()) + ". Each is a known difference between torch's "
    "APIs and Megatron-LM (listed in `llmcomm/collect/WHAT_TORCH_ISSUES.md`)."))

# %% [markdown]
# ## AICB's MoE replay: real differences
# AICB generates the collectives of a Megatron MoE job from its own model of Megatron and times them on real
# A100s. Its file holds rank 0 only, so rank 0 is compared.

# %%
aicb = compare(load_measured(aicb_trace), model=aicb_model, parallel=aicb_parallel, framework="megatron")
display(aicb.verdicts)
display(aicb.largest_differences(top)[["side", "phase", "parallelism", "op", "bytes", "calls_per_rank", "what"]])

# %%
ax = plots.comparison_bars(aicb.by_kind, x="parallelism", y=["bytes_measured", "bytes_predicted"], hue="side",
                          title=f"AICB A100 MoE replay vs Megatron-LM ({aicb_model}), rank 0")
out.figure(ax, "aicb_bytes_per_parallelism")

# %%

timed = aicb.measured.events
ax = plots.comm_timeline(timed[timed["rank"] == 0], x="t_start_ns", y="rank", hue="parallelism", title=f"AICB replay, rank 0, iteration {aicb.iteration}: measured calls")
out.figure(ax, "aicb_timeline")

# %%
measured_only = aicb.one_sided[aicb.one_sided["side"] == "measured"]
predicted_only = aicb.one_sided[aicb.one_sided["side"] == "predicted"]
out.value("aicb_measured_only_groups", len(measured_only))
out.value("aicb_predicted_only_groups", len(predicted_only))
ep = aicb.by_kind[aicb.by_kind["parallelism"] == "ep"]
# Megatron-LM's EP calls besides the token all-to-alls (the largest ones): the routing-probability
# all-to-alls and the token-count all-gather, which AICB does not issue
pe = aicb.predicted.events
pe = pe[pe["parallelism"] == "ep"]
routing_extra = int(pe.loc[(pe["op"] != "all_to_all") | (pe["bytes"] < pe["bytes"].max()), "bytes"].sum())
out.value("aicb_ep_bytes", [int(ep["bytes_measured"].sum()), int(ep["bytes_predicted"].sum()) - routing_extra])
out.value("megatron_routing_extra_bytes", routing_extra)
out.check("aicb_differs_both_ways", len(measured_only) > 0 and len(predicted_only) > 0,
          value=[len(measured_only), len(predicted_only)],
          expect="AICB issues calls Megatron-LM does not and omits some it does")
out.check("aicb_all_to_all_bytes_agree", out.values["aicb_ep_bytes"][0] == out.values["aicb_ep_bytes"][1],
          value=out.values["aicb_ep_bytes"], expect="same token all-to-all bytes per iteration")
display(Markdown(
    f"**Result.** AICB's replay differs from Megatron-LM's program in {len(measured_only)} groups of calls that only "
    f"AICB issues and {len(predicted_only)} that only Megatron-LM issues. The token all-to-alls carry the same bytes "
    f"on both sides ({out.values['aicb_ep_bytes'][0] / 2**30:.2f} GiB per iteration on rank 0); Megatron-LM adds "
    f"{out.values['megatron_routing_extra_bytes'] / 2**10:.0f} KiB of routing-probability all-to-alls and "
    "token-count all-gathers that AICB omits; AICB labels all "
    "four all-to-alls of an MoE layer `forward`, so none is matched in the backward pass. Verdicts: "
    + "; ".join(aicb.verdict_lines()) + ". The largest one-sided calls: "
    + "; ".join(aicb.largest_differences(4)["what"]) + "."))
out.save()
