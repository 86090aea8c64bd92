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
# # 09 · MoE predictability: what is fixed, what only bounded (finding F4)
#
# **Question.** For dense models the traffic is fixed before the run (F1–F3). The paper's MoE finding is the
# contrast: an MoE layer's expert-parallel all-to-all is only *semi*-predictable. Its shape, its call count
# and order, and what each rank sends in total are fixed by tokens × top-k; the rank × rank matrix follows the
# router, which changes every iteration and (with a load-balancing loss) grows more uniform over training.
# On real routing — small MoE models trained with torch.distributed on CPU, the router's token counts recorded
# every iteration — and on AICB's A100 MoE replay we ask: (a) which calls vary between iterations, dense
# against MoE; (b) are the four all-to-alls of a layer (dispatch and combine, forward and backward) the same
# matrix or its transpose; (c) how uniform is the matrix over training, with and without load balancing;
# (d) how well can the next iteration's matrix be predicted; (e) what share of the bytes is exact before the
# run and what only bounded; (f) what envelope a network planner should provision.

# %% tags=["parameters"]
out_dir = None                        # None: the project's figures/ (llmcomm reproduce sets it)
dense_trace = "gpt_tp2pp2_timeline"   # curated dense run (data/traces), 12 iterations
moe_trace = "moe8e_ep4_aux"           # curated MoE run, aux-loss balancing on, 2,000 iterations of routing
moe_trace_noaux = "moe8e_ep4_noaux"   # the same with the balancing loss off
identity_traces = ["moe8e_ep4_aux", "moe8e_ep4_noaux", "moe_ep4dp4", "moe_ep2tp2"]  # recorded events checked
aicb_file = "aicb/A100_example.csv"   # AICB's Megatron MoE replay on 8xA100 (data/external.yaml)
layer = 1                             # the MoE layer shown in the per-layer figures (the table shows all)
smooth_window = 50                    # iterations of the rolling mean drawn over raw curves
phase_window = 200                    # early: the first, late: the last phase_window iterations
ema_alpha = 0.3                       # EMA predictor weight (fixed, not fitted)
history_window = 10                   # window-mean predictor length (fixed, not fitted)
acf_lags = 100                        # lags of the expert-load autocorrelation
envelope_samples = 500                # routings drawn from the uniform distribution for the envelope

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import llmcomm.analysis.api as A
from llmcomm import data, ingest_trace, plots, plots_moe, read_trace
from llmcomm.predict import predict_traffic
from llmcomm.predict.envelope import a2a_envelope, sample_routing
from llmcomm.reproduce import Outputs
from llmcomm.specs import ModelSpec, ParallelConfig, data_dir

plots.apply_style()
out = Outputs("09_moe_predictability", out_dir)


def load(name: str):
    return read_trace(data_dir() / "traces" / f"{name}.parquet")


dense, moe, noaux = load(dense_trace), load(moe_trace), load(moe_trace_noaux)
runs = {"balancing on": moe, "balancing off": noaux}
for name, t in {"dense": dense, **runs}.items():
    m = t.meta
    print(f"{name:>14}: {m['model']}, {m['parallel']}, {m['iterations']} iterations "
          f"(events for {m['record_iterations']}), aux coef {m['run_config'].get('aux_loss_coef', 0.01)}, "
          f"{m['wall_seconds']:.0f} s")

# %% [markdown]
# **Method.** One table shape carries every path, so the same functions (`llmcomm.analysis.moe`) run on the
# dense and the MoE trace. (a) Each rank's calls of an iteration, in issue order, are compared position by
# position with the same rank's reference iteration on (op, group, bytes); the whole-trace matrix of each
# iteration (logical flows) is compared with the previous iteration's by relative L1,
# `‖M_t − M_{t−1}‖₁ / ‖M_{t−1}‖₁`. (b) Rank r's `split_bytes` is row r of its all-to-all's matrix; the four
# payload all-to-alls of each layer and micro-batch are compared byte for byte (equal, transpose, neither).
# (c) From the routing counts, the dispatch matrix `D[r, j] = Σ_{e on j} tokens(r → e) · h · act` and the
# expert load per layer and iteration; uniformity as CV, Gini, max/mean and normalized entropy. (d) Four
# predictors of the next iteration's matrix — uniform (what `predict_traffic` gives without routing), last
# iteration, EMA (α fixed), window mean (w fixed) — use only earlier iterations; their error is the relative
# L1. (e) Over training, each cell's min/mean/max bytes: exact cells never change; the rest are bounded.

# %% [markdown]
# ## (a) Dense against MoE: which calls vary

# %%
ev_d = dense.events[dense.events["phase"] != "setup"]
ev_m = moe.events
aicb = ingest_trace(data.path(aicb_file))
ev_a = aicb.events[aicb.events["phase"] != "setup"]
side = A.call_variation_table({"dense": dense, "MoE": moe, "AICB replay": aicb}, replays=["AICB replay"])
moe_var = A.sequence_variation(ev_m, reference_iteration=A.reference_iteration(ev_m))
side

# %%
moe_var

# %%
long = side.drop(columns="iterations compared").reset_index().melt(id_vars="trace", var_name="metric",
                                                                    value_name="value")
change = long["metric"] == "matrix change per iteration (rel. L1)"
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 1.3]})
plots_moe.metric_bars(long[~change], x="metric", y="value", hue="trace", ax=axes[0], fmt="{:.0%}",
                      ylabel="share identical to the reference\n(1 = repeats exactly)",
                      title="recorded iterations against the reference iteration")
plots_moe.metric_bars(long[change], x="metric", y="value", hue="trace", ax=axes[1], fmt="{:.2f}",
                      ylabel="‖M_t − M_t−1‖₁ / ‖M_t−1‖₁\n(0 = repeats exactly)", title="matrix change")
axes[0].set_ylim(0, 1.3)
axes[1].get_legend().remove()
axes[1].set_xticks([0], ["per iteration (rel. L1)"], rotation=0, ha="center")
fig.tight_layout()
out.figure(fig, "dense_vs_moe")
vary = moe_var[moe_var["identical"] < 1]
print(f"Dense: {side.loc['dense', 'identical call sequences']:.0%} of iterations repeat the reference call "
      f"sequence and the matrix changes by {side.loc['dense', 'matrix change per iteration (rel. L1)']:.3f}. "
      f"MoE: {side.loc['MoE', 'identical call order (op, group)']:.0%} of iterations repeat the call order, "
      f"{side.loc['MoE', 'identical call sequences']:.0%} the sequence with sizes; "
      f"{side.loc['MoE', 'calls identical to reference']:.1%} of calls are identical, the matrix changes by "
      f"{side.loc['MoE', 'matrix change per iteration (rel. L1)']:.3f} per iteration. AICB's replay: "
      f"{side.loc['AICB replay', 'identical call sequences']:.0%} identical sequences, matrix change "
      f"{side.loc['AICB replay', 'matrix change per iteration (rel. L1)']:.3f}. The MoE calls that vary: "
      + "; ".join(f"{r.op} {r.phase} slot {r.slot} ({r.identical:.0%} identical, {r.bytes_min:.0f}–{r.bytes_max:.0f} B)"
                  for r in vary.itertuples()))

# %% [markdown]
# Slot 0 of a layer's forward payload all-to-alls is the dispatch (its size, what the rank sends, is
# tokens × top-k × h × act: fixed), slot 1 the combine (its size is what the rank *received* in the dispatch:
# it varies). Backward, the combine's gradient comes first with the dispatch's splits.

# %% [markdown]
# ## (b) The four all-to-alls of an MoE layer

# %%
ids = []
checks_rt = []
for name in identity_traces:
    t = load(name)
    ids.append(A.identity_summary(A.a2a_identities(t.events)).assign(trace=name))
    checks_rt.append(A.routing_vs_events(t).assign(trace=name))
ids = pd.concat(ids, ignore_index=True)
rt = pd.concat(checks_rt, ignore_index=True)
id_table = A.pooled_identity_summary(ids)
id_table

# %%
panels = A.identity_panel_cells(A.a2a_cells(ev_m), iteration=1, microbatch=0, layer=layer)
fig = plots_moe.identity_panels(panels, x="dst", y="src", hue="value", col="panel",
                                title=f"{moe_trace}: the four all-to-alls of MoE layer {layer}, iteration 1, "
                                      "micro-batch 0 (KiB from sender to receiver)")
out.figure(fig, "four_all_to_alls")
print(f"{int(ids['compared'].sum() / 6)} layer-micro-batches in {len(identity_traces)} recorded traces; "
      f"routing counts reproduce every recorded dispatch to "
      f"{rt['max_abs_diff_bytes'].max():.0f} bytes ({len(rt)} matrices).")

# %% [markdown]
# ## (c) Uniformity over training, with and without load balancing

# %%
load_u, uni, dist = A.uniformity_over_training(runs)
n_it = int(moe.meta["iterations"])
training = {"window": phase_window, "iterations": n_it}   # early: the first, late: the last phase_window
table_c = A.phase_means({"expert-load CV": (load_u, "cv"), "expert-load max/mean": (load_u, "max_over_mean"),
                         "matrix CV (off-diagonal)": (uni, "cv"), "matrix norm. entropy": (uni, "norm_entropy"),
                         "matrix change per iteration": (dist, "rel_l1")}, list(runs), **training)
per_layer = A.phase_pivot(load_u, "cv", "layer", **training)
table_c

# %%
per_layer  # expert-load CV per layer

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
layers = f"mean of the {load_u['layer'].nunique()} MoE layers"  # what the tables and the README quote
plots_moe.over_training(load_u, x="iteration", y="cv", hue="run", window=smooth_window, ax=axes[0],
                        ylabel="CV of expert load", title=f"expert load ({layers})")
plots_moe.over_training(uni, x="iteration", y="norm_entropy", hue="run", window=smooth_window, ax=axes[1],
                        ylabel="normalized entropy", title=f"all-to-all matrix, off-diagonal ({layers})")
plots_moe.over_training(dist, x="iteration", y="rel_l1", hue="run", window=smooth_window, ax=axes[2],
                        ylabel="‖M_t − M_t−1‖₁ / ‖M_t−1‖₁", title=f"change per iteration ({layers})")
fig.tight_layout()
out.figure(fig, "uniformity_over_training")
cv = table_c.loc["expert-load CV"]
print(f"Mean over layers, with balancing the expert-load CV falls from {cv[('balancing on', 'early')]:.2f} "
      f"(first {phase_window} iterations) to {cv[('balancing on', 'late')]:.2f} (last {phase_window}); "
      f"without it, from {cv[('balancing off', 'early')]:.2f} to {cv[('balancing off', 'late')]:.2f}. Per layer, "
      "late: " + "; ".join(f"{run} layer {la}: {per_layer.loc[run, ('late', la)]:.2f}"
                          for run in runs for la in per_layer["late"].columns) + ".")
out.value("expert_load_cv_per_layer", {f"{run} {phase} layer {la}": per_layer.loc[run, (phase, la)]
                                       for run in runs for phase in ("early", "late")
                                       for la in per_layer[phase].columns})

# %%
acf = pd.concat([A.load_autocorrelation(t.routing, layer, acf_lags,
                                        iterations=range(n_it - 4 * phase_window, n_it)).assign(run=name)
                 for name, t in runs.items()], ignore_index=True)
ax = plots_moe.acf_lines(acf, hue="run", n_obs=4 * phase_window,
                         title=f"layer {layer}: ACF of each expert's load share, last {4 * phase_window} iterations")
out.figure(ax.figure, "expert_load_acf")
acf1 = acf[acf["lag"] == 1].groupby("run")["acf"].mean()
print("lag-1 autocorrelation of expert load share (mean over experts): "
      + ", ".join(f"{k} {v:.2f}" for k, v in acf1.items()))

# %% [markdown]
# ## (d) Predicting the next iteration's matrix

# %%
spec = ModelSpec.from_dict(moe.meta["model_spec"])
par = ParallelConfig.from_dict(moe.meta["parallel"])
pred = predict_traffic(spec, par, framework="torch").events
uniform_split = int(pred.query("op == 'all_to_all' and dtype == 'fp32'")["split_bytes"].iloc[0][0])
routed_uniform, n_rows = A.routed_uniform_split(moe)
print(f"predict_traffic without routing: {uniform_split} B per pair and micro-batch; recorded dispatch row totals "
      f"/ ep: {routed_uniform:.0f} B in every one of {n_rows} (iteration, layer, micro-batch, rank) rows")

# %%
errs = pd.concat([A.predictor_errors(A.routing_matrices(t), alpha=ema_alpha, window=history_window)
                  .assign(run=name) for name, t in runs.items()], ignore_index=True)
err_tab = A.phase_pivot(errs, "rel_l1", "predictor", **training)
err_tab

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 3.6), sharey=True)
for ax, (name, _) in zip(axes, runs.items(), strict=True):
    e = errs[errs["run"] == name]
    plots_moe.over_training(e, x="iteration", y="rel_l1", hue="predictor", window=smooth_window, ax=ax,
                            ylabel="relative L1 error of the predicted matrix",
                            title=f"{name} (mean of the {e['layer'].nunique()} MoE layers)")
fig.tight_layout()
out.figure(fig, "predictor_error")
best_late = err_tab["late"].idxmin(axis=1)
print("Late in training the lowest mean error: " + "; ".join(
    f"{run}: {best_late[run]} {err_tab.loc[run, ('late', best_late[run])]:.3f} against uniform "
    f"{err_tab.loc[run, ('late', 'uniform')]:.3f}" for run in runs))

# %% [markdown]
# ## (e) Exact before the run, or only bounded

# %%
ck = ["microbatch", "layer", "group", "call", "src", "dst"]
split_ev = A.exact_bounded_split(A.a2a_cells(ev_m, payload_only=False), ck).assign(
    scope=f"recorded events, {ev_m['iteration'].nunique()} iterations")
splits = pd.concat([split_ev, A.dispatch_exact_bounded(runs, phases=("all", "late"), **training)],
                   ignore_index=True)
fig = plots_moe.exact_bounded_bars(splits, x="share", y="scope", hue="quantity",
                                   title="all-to-all bytes: exact before the run, or only bounded")
out.figure(fig, "exact_vs_bounded")
split_tab = splits.pivot_table(index="scope", columns="quantity", values="share", sort=False)
split_tab

# %%
s = split_tab.iloc[0]
print(f"On the recorded events (count exchange and the four payload all-to-alls): "
      f"{s['exact_pairs']:.2%} of bytes lie in pairs that never change (the token-count exchange), "
      f"{s['exact_send_totals']:.0%} in per-rank send totals that never change (dispatch rows), "
      f"{s['exact_recv_totals']:.0%} in receive totals that never change (combine columns), "
      f"{s['exact_call_totals']:.0%} in call totals that never change; the per-pair band (max − min) sums to "
      f"{s['bounded_band']:.0%} of the mean bytes.")

# %% [markdown]
# ## (f) The envelope a network planner sees

# %%
hist = A.training_phase(moe.routing, "late", **training)
env_hist = a2a_envelope(spec, par, hist, framework="torch").assign(source=f"recorded, last {phase_window}")
draws = sample_routing(spec, par, np.full(spec.num_experts, 1 / spec.num_experts), envelope_samples, seed=0,
                       framework="torch")
env_uni = a2a_envelope(spec, par, draws, framework="torch").assign(source="uniform router, sampled")
env = pd.concat([env_hist, env_uni], ignore_index=True)
sel = env[(env["layer"] == layer) & (env["microbatch"] == 0)]
ax = plots_moe.envelope_ranges(sel, title=f"layer {layer}: dispatch bytes per pair and micro-batch")
out.figure(ax.figure, "envelope")
envsum = A.envelope_summary(env, by="source")
envsum

# %% [markdown]
# ## AICB's A100 MoE replay

# %%
ref_a = A.reference_iteration(ev_a, skip_first=False)
rep_a = A.moe_repeatability(ev_a, reference_iteration=ref_a)
var_a = A.sequence_variation(ev_a, reference_iteration=ref_a, by=("parallelism", "op"))
dur_tab = A.position_duration_spread(ev_a, by=("parallelism", "op"))
print(f"AICB: {rep_a['iteration'].nunique()} iterations of {int(rep_a['calls'].median())} calls; "
      f"{rep_a['identical'].mean():.0%} repeat the first iteration's (op, group, bytes) sequence exactly. "
      "Its all-to-all splits are even by construction (AICB replays msg_size/n per peer), so its matrices "
      "say nothing about routing: only sizes and times are measured.")
var_a.merge(dur_tab, on=["parallelism", "op"])

# %% [markdown]
# **Checks.** The finding holds if (1) every dense iteration repeats its call sequence and matrix exactly
# while MoE iterations do not; (2) on every recorded layer and micro-batch the forward combine is the
# transpose of the dispatch, the backward of the combine equals the dispatch and the backward of the dispatch
# equals the combine, and the routing counts reproduce the recorded dispatch to the byte; (3) with balancing
# the expert load is more uniform late than early and more uniform than without balancing; (4) history
# predictors do not reach the dense case's zero error; (5) per-rank send totals and call totals are exact
# while per-pair bytes are not; (6) AICB's replay repeats its sizes in every iteration.

# %%
out.value("side_by_side", side.to_dict(orient="index"))
out.value("uniformity", {f"{k[0]} {k[1]}": v for k, v in table_c.to_dict().items()})
out.value("predictor_error", {f"{ph} {run} {pred}": float(err_tab.loc[run, (ph, pred)])
                             for run in runs for ph in ("early", "late") for pred in err_tab[ph].columns})
out.value("exact_bounded", {sc: split_tab.loc[sc].to_dict() for sc in split_tab.index})
out.value("envelope", envsum.to_dict(orient="index"))
out.value("acf_lag1", acf1.to_dict())
out.value("wall_seconds", {name: t.meta["wall_seconds"] for name, t in runs.items()})
out.check("dense_repeats_exactly", side.loc["dense", "identical call sequences"] == 1.0
          and side.loc["dense", "matrix change per iteration (rel. L1)"] == 0.0,
          value=side.loc["dense"].to_dict(), expect="identical sequences 1.0 and matrix change 0")
out.check("moe_call_order_fixed", side.loc["MoE", "identical call order (op, group)"] == 1.0,
          value=side.loc["MoE", "identical call order (op, group)"], expect="1.0 (count and order fixed)")
out.check("uniform_predictor_is_predict_traffic", uniform_split == routed_uniform, value=[uniform_split, routed_uniform],
          expect="predict_traffic's uniform split = recorded row total / ep (bytes)")
out.check("moe_varies", side.loc["MoE", "identical call sequences"] < 1.0
          and side.loc["MoE", "matrix change per iteration (rel. L1)"] > 0.0,
          value=side.loc["MoE"].to_dict(), expect="identical sequences < 1.0 and matrix change > 0")
expected = {("forward 0", "forward 1"): "transpose", ("forward 0", "backward 0"): "equal",
            ("forward 1", "backward 1"): "equal", ("backward 0", "backward 1"): "transpose"}
holds = {f"{a} ~ {b}": float(id_table.loc[(a, b), v] + id_table.loc[(a, b), "equal+transpose"])
         for (a, b), v in expected.items()}  # a symmetric matrix is its own transpose
out.check("four_all_to_all_identities", all(h == 1.0 for h in holds.values()), value=holds,
          expect="share 1.0 for each identity (symmetric matrices count for both)")
out.check("routing_explains_dispatch", float(rt["max_abs_diff_bytes"].max()) == 0.0,
          value=float(rt["max_abs_diff_bytes"].max()), expect="0 bytes")
out.check("balancing_makes_load_uniform",
          cv[("balancing on", "late")] < cv[("balancing on", "early")]
          and cv[("balancing on", "late")] < cv[("balancing off", "late")],
          value={k[0] + " " + k[1]: float(v) for k, v in cv.items()},
          expect="CV late < early with balancing, and < CV late without")
out.check("history_predictors_not_exact", float(err_tab["late"].min().min()) > 0.0,
          value=float(err_tab["late"].min().min()), expect="best late error > 0 (dense: 0)")
out.check("send_totals_exact_pairs_bounded",
          s["exact_call_totals"] == 1.0 and s["exact_send_totals"] >= 0.5 and s["bounded_pairs"] > 0.9,
          value=s.to_dict(), expect="call totals 1.0, send totals >= 0.5, bounded pairs > 0.9 of bytes")
out.check("aicb_sizes_repeat", bool(rep_a["identical"].all()), value=float(rep_a["identical"].mean()),
          expect="1.0")
out.save()
