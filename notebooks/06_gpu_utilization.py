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
# # 06 · GPU utilization: what a layer's work costs on one GPU (F5, first half)
#
# **Question.** Communication overhead depends on how fast the GPU finishes the work that communication could
# hide behind. How much of its peak FLOP/s does a transformer layer's work reach, which factors of the
# configuration set that (tokens per micro-batch, hidden size per TP rank, FFN and heads per TP rank), and how
# does it extrapolate from the small models it can be measured on to GPT-3's hidden size of 12,288?
#
# **Data.** vTrain's 1,440 measured iteration times of GPT models trained with Megatron-DeepSpeed on one node
# of 2–8 A100 GPUs (`vtrain/ground_truth_single.csv`: hidden 1,024 and 2,048, 12–24 layers, sequence 1,024,
# every TP/DP/PP split, micro-batch 1–8, full recomputation, 1F1B). The multi-node file is not read here.

# %% tags=["parameters"]
out_dir = None  # None: the project's figures/
cluster = "vtrain-a100"  # the cluster of the calibration data (data/clusters/vtrain-a100.yaml)
refit_cv = True  # refit every leave-one-shape-out fold here (False: report the folds stored with the calibration)
extrapolate_clusters = ["vtrain-a100", "h100-80g-ndr400"]
hidden_sizes = [512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
tps = [1, 2, 4, 8]
tokens = 4096  # b·s of the extrapolated layer (micro-batch 2 at sequence 2,048)

# %%
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

import llmcomm as lc
from llmcomm import plots
from llmcomm.overhead import Utilization, calibrate, tp_diagnosis
from llmcomm.overhead import extrapolate as X
from llmcomm.reproduce import Outputs

plots.apply_style()
out = Outputs("06_gpu_utilization", out_dir)

# %% [markdown]
# ## Method
# The time of one *layer pass* (a forward pass is one pass, a backward pass two, a recomputed forward one more)
# on one GPU is modelled as
#
# $$t_\text{pass} = \max\left(\theta_{Lg},\; \theta_\text{gemm}\,\frac{F_\text{gemm}+F_\text{attn}}{P}\right)
# + \max\left(\theta_{Lm},\; \theta_\text{mem}\,\frac{B}{H}\right) + \theta_{tp}\log_2 tp$$
#
# with $F_\text{gemm} = 2bs\,(4h^2 + 2hf)/tp$ the layer's weight matmuls on one TP rank, $F_\text{attn} =
# 4bs^2h/tp$ the attention core, $B = 2\,(16\,bsh + 2\,bsf/tp + 5\,b\,(a/tp)\,s^2)$ the bytes the elementwise
# kernels move (LayerNorms, dropouts and residual adds on the full activation; bias-GeLU on the FFN activation;
# softmax, mask and dropout on the scores), $P$ the GPU's peak FLOP/s and $H$ its memory bandwidth. Kernels run
# asynchronously: a side of the pass whose GPU work is shorter than the host's time to launch it ($\theta_{Lg}$,
# $\theta_{Lm}$) costs the launch time. The output layer and cross-entropy (vocabulary $V' = 50{,}304$) are
# added on the last pipeline stage; the iteration is assembled by the formulation of notebook 07, with the
# TP/PP/DP communication timed by the calibrated bandwidth model of notebook 05. With the critical pipeline stage
# and the side of each `max` fixed, the measured time is linear in θ: weighted least squares (statsmodels WLS,
# weights 1/T²), alternating with the reassignment until it repeats. No matmul can beat peak: $\theta_\text{gemm}
# \ge 1$; fixed costs are $\ge 0$ — a coefficient below its bound is fixed at it. Such a coefficient is a *bound*,
# not an estimate: the table marks it `at bound` and gives it no standard error or interval (the table below says
# which; θ_gemm's identification hangs on the element-wise bytes counted per kernel, `llmcomm.overhead.utilization`).

# %%
util, prep = calibrate.calibrate(cv=refit_cv)
shipped = Utilization.default()
display(util.table().round(6))
print(f"fitted on: {util.fitted_on}")
same = np.allclose(util.coef, shipped.coef, rtol=1e-6, atol=1e-12)
out.check("refit_equals_shipped_calibration", same, value=list(util.coef), expect=f"= {list(shipped.coef)}")
for f, c in zip(util.table()["feature"], util.coef, strict=True):
    out.value(f"theta_{f}", c)
on_bound = list(util.table().query("status == 'at bound'")["feature"])
out.say("On its bound (a finding, not an estimate): " + (", ".join(f"θ_{f}" for f in on_bound) if on_bound else "none")
        + (" — the single-node runs give the TP collectives no time beyond what the bandwidth model already charges"
           if "tp" in on_bound else "") + ".")
out.value("coefficients_at_bound", on_bound)

# %% [markdown]
# ## Why θ_tp sits on its bound
# A TP cost per layer pass ($\theta_\text{tp}\log_2 tp$, or any cost growing with TP) can only make every larger
# TP dearer together. Three looks at the single-node runs (`llmcomm.overhead.tp_diagnosis`) say whether the data
# could pin such a cost: the fit's signed mean error per TP size, the same fit with $\theta_\text{tp}$ allowed to
# go negative, and the cells whose measured time per micro-batch *fell* when the micro-batch doubled. First, the
# TP all-reduces themselves: the kit times them from vTrain's own measured all-reduce tables of the same node
# (`tp_diagnosis.allreduce_vs_measured`, at the message sizes these runs issue, $b\cdot s\cdot h$ in FP16).

# %%
act_bytes = np.unique(prep.rows["micro_batch"] * prep.rows["seq_len"] * prep.rows["hidden"] * 2)
ar = tp_diagnosis.allreduce_vs_measured(lc.overhead.Bandwidth.default(lc.load_cluster(cluster)), act_bytes)
ar_err = ar.groupby("group_size")["error"].apply(lambda e: float(e.abs().max()))
by_tp = tp_diagnosis.residual_by_tp(prep, util)
free = tp_diagnosis.unbounded_theta_tp(prep)
theta_tp_free = float(free.coef[list(util.table()["feature"]).index("tp")])
inv = tp_diagnosis.microbatch_inversions(prep.rows).assign(faster=lambda t: t["ratio"] < 1)
inv_by_tp = inv.groupby("tp")["faster"].agg(["sum", "count"])
display(pd.DataFrame({"signed mean error": by_tp.round(4), "micro-batch doublings that ran faster": inv_by_tp["sum"],
                      "doublings": inv_by_tp["count"]}))
out.say("TP all-reduce, kit against vTrain's measured tables, largest error: "
        + ", ".join(f"{n} GPUs {e:.1%}" for n, e in ar_err.items()) + ".")
out.say(f"Signed mean error by TP {', '.join(f'tp {t}: {e:+.1%}' for t, e in by_tp.items())}: the sign changes "
        f"with TP, so no cost growing with TP fits both; left unbounded, θ_tp comes out at {theta_tp_free * 1e6:+.0f} µs "
        f"per log2(tp) per pass. {int(inv_by_tp['sum'].sum())} of {int(inv_by_tp['count'].sum())} micro-batch "
        "doublings ran faster per micro-batch — no model whose time grows with work can produce that. The bound is "
        "a finding about the data, not a mechanism.")
out.value("tp_allreduce_max_error", {int(n): e for n, e in ar_err.items()})
out.value("residual_by_tp", {int(t): float(e) for t, e in by_tp.items()})
out.value("theta_tp_unbounded_s", theta_tp_free)
out.value("microbatch_doublings_faster", int(inv_by_tp["sum"].sum()))
out.value("microbatch_doublings", int(inv_by_tp["count"].sum()))
out.check("theta_tp_bound_explained", "tp" not in on_bound or (theta_tp_free <= 0 and by_tp.min() < 0 < by_tp.max()),
          value={"theta_tp_unbounded_s": theta_tp_free, "residual_by_tp": by_tp.round(4).to_dict()},
          expect="θ_tp on its bound only where the unbounded fit wants it <= 0 and the residual changes sign with TP")

# %% [markdown]
# ## How well it fits, and on rows it was not fitted on
# Cross-validation holds out whole model shapes (each of the 8 (hidden, layers) shapes in turn), so a fold never
# sees a row of the shape it predicts. A harder check fits on hidden 1,024 alone and predicts hidden 2,048.

# %%
metrics = util.metrics if refit_cv else shipped.metrics
cv = metrics["cv_leave_one_shape_out"]
display(pd.DataFrame(cv["folds"]).round(4))
ins, ext = metrics["in_sample"], metrics["extrapolation_h1024_to_h2048"]
print(f"in-sample MAPE {ins['mape']:.1%} (median {ins['median_ape']:.1%}, worst {ins['worst_ape']:.1%}); "
      f"leave-one-shape-out MAPE {cv['mape']:.1%} (worst fold {cv['worst_fold_mape']:.1%}, worst row "
      f"{cv['worst_ape']:.1%}); fit on hidden 1,024 -> hidden 2,048: MAPE {ext['mape']:.1%}")
out.value("in_sample_mape", ins["mape"])
out.value("cv_mape", cv["mape"])
out.value("extrapolation_h1024_to_h2048_mape", ext["mape"])
out.check("cv_mape_bound", cv["mape"] <= 0.08, value=cv["mape"], expect="<= 0.08")

pred = prep.rows.assign(predicted_s=calibrate.predict(prep, util))
ax = plots.predicted_vs_measured(pred.assign(TP=pred["tp"]), x="time_s", y="predicted_s", hue="TP",
                                 title=f"single node, {len(pred):,} runs (in sample)")
out.figure(ax, "single_node_fit")

# %% [markdown]
# ## Which factors matter
# Where one layer pass's time goes at the shapes of the calibration data and beyond it: at small per-GPU work
# (small hidden size, high TP, micro-batch 1) both sides are launch-bound and the pass costs a fixed floor
# whatever its FLOPs; as the work per GPU grows the matmuls take over.

# %%
shapes = [{"hidden": h, "heads": a, "tp": tp, "micro_batch": b}
          for h, a in ((1024, 16), (2048, 16), (12288, 96)) for tp in (1, 8) for b in (1, 8)]
comp = X.layer_components(util, lc.load_cluster(cluster), shapes=shapes, seq=1024)
display(comp.round(3))
floor_ms = util.launch_floor() * 1e3
print(f"launch floor per layer pass: {floor_ms:.2f} ms, i.e. {4 * floor_ms:.1f} ms per layer per micro-batch "
      "with full recomputation (4 passes)")
out.value("launch_floor_ms_per_pass", floor_ms)

# %% [markdown]
# ## How it extrapolates
# The achieved FLOP/s of a GPT layer pass ($b\cdot s$ = `tokens`) as the hidden size grows, on the calibration
# cluster and carried to H100 (FLOP terms scale with peak FLOP/s, byte terms with HBM bandwidth, launch costs
# stay as measured). The curves rise out of the launch floor towards $1/\theta_\text{gemm}$ (dashed) and never pass
# it, whatever the size; at the largest hidden size shown they are still rising — the limit is approached, not
# reached, at the sizes of today's models. GPT-3 175B's hidden size is marked. The second panel is the A100 fit
# *carried over*: that is what the formulation uses for a GPU without a measured GEMM table (B200 today); on H100
# and H200 it times the GEMMs from XLA's measurements instead (next section), whose ceiling is 82 % of the
# datasheet peak, not the carried $1/\theta_\text{gemm}$.

# %%
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, len(extrapolate_clusters), figsize=(5.2 * len(extrapolate_clusters), 3.9),
                         sharey=True, squeeze=False)
curves = {}
for ax, name in zip(axes[0], extrapolate_clusters, strict=True):
    c = lc.load_cluster(name)
    curves[name] = X.layer_utilization(util, c, hidden=hidden_sizes, tps=tps, tokens=tokens)
    plots.utilization_curves(curves[name], x="hidden", y="utilization", hue="tp", ax=ax,
                             limit=util.gemm_efficiency(), calibrated=(1024, 2048),
                             marks={"GPT-3 175B: h = 12,288": 12288}, title=f"{name} ({c.gpu})" + ("" if name == extrapolate_clusters[0] else ", A100 fit carried"))
    ax.title.set_fontsize(9)
out.figure(fig, "utilization_extrapolation")
a100 = curves[extrapolate_clusters[0]]
at_12k = a100[a100["hidden"] == 12288].set_index("tp")["utilization"]
print("achieved fraction of peak at hidden 12,288: " + ", ".join(f"TP {k}: {v:.0%}" for k, v in at_12k.items()))
out.value("utilization_at_h12288", {f"tp{k}": v for k, v in at_12k.items()})
out.check("saturates_below_limit", X.saturates_below(a100, util.gemm_efficiency()),
          value=float(a100["utilization"].max()), expect=f"non-decreasing in h and <= {util.gemm_efficiency():.3f}")

# %% [markdown]
# ## H100: GEMMs from measured kernels
# For H100 (and H200) the linear GEMMs are timed by `llmcomm.overhead.gemm`: a tile/wave model (132 SMs, Hopper
# tiles, split-K, an HBM roofline, a launch cost) **fitted on XLA's 375 measured H100 bf16 shapes** (b ≤ 4,
# m, n, k ≤ 4,096) and **judged by leaving each (m, n, k) out of the fit** (and by fitting on shapes ≤ 2,048 and
# predicting those with a 4,096): the vTrain rows never enter it. Its main-loop efficiency η comes out above the
# table's best measured throughput, so a large LLM GEMM is predicted *at the measured ceiling* (808.7 TFLOP/s,
# 82 % of the datasheet): a clamp, not a measurement beyond 4,096.

# %%
from llmcomm.overhead.gemm import load_gemm_model

h100 = load_gemm_model("H100")
display(h100.table())
big = float(h100.efficiency(16384, 12288, 12288, dtype="bf16")[()])
ceiling_fraction = h100.ceiling("bf16") / h100.peak["bf16"]
display(Markdown(
    f"**Result.** A GPT-3-sized GEMM (16,384 × 12,288 × 12,288) is predicted at {big:.1%} of the bf16 peak, the "
    f"measured ceiling ({ceiling_fraction:.1%}): beyond the table the model is clamped there."))
out.value("h100_gemm_large_shape_efficiency", big)
out.check("h100_gemm_never_above_measured_ceiling", big <= ceiling_fraction + 1e-12, value=big,
          expect=f"<= {ceiling_fraction:.4f} (XLA's best measured bf16 GEMM / datasheet peak)")

# %%
out.save()
