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
# # 00 · Models and rank layouts
#
# **Question.** Every prediction in this kit starts from two things: a model architecture and a mapping of
# ranks to parallel groups. Are the catalogue's architectures the published ones (does the parameter count
# computed from layers, hidden size, heads, FFN size, experts and vocabulary reproduce the totals the papers
# print)? And which GPU ends up in which TP, DP, PP and EP group, on which node, under Megatron-LM's
# `tp-cp-ep-dp-pp` order?

# %% tags=["parameters"]
out_dir = None  # where figures and results go; None: the repository's figures/ folder
# configurations whose rank layout is drawn: (title, ParallelConfig keyword arguments)
layouts = [
    ["tp2 pp4 dp2 on 16 GPUs", {"tp": 2, "pp": 4, "dp": 2}],
    ["tp4 dp4 ep2 (MoE) on 16 GPUs", {"tp": 4, "dp": 4, "ep": 2}],
    ["tp8 pp2 dp2 on 32 GPUs", {"tp": 8, "pp": 2, "dp": 2}],
]
gpus_per_node = 8
tolerance = 0.02  # relative, or equal at the published rounding

# %%
import matplotlib.pyplot as plt

import llmcomm as lc
from llmcomm.catalogue import catalogue_table, published_ok
from llmcomm.plots import apply_style, layout_grid, parameter_check
from llmcomm.reproduce import Outputs

apply_style()
out = Outputs("00_models_and_layouts", out_dir)

# %% [markdown]
# ## Method: parameter counts from the architecture
#
# `ModelSpec.num_parameters()` adds attention (Q, K, V with grouped-query heads, output), the MLP (two or
# three matrices), MoE experts, router and shared experts, norms, embeddings and the untied output layer,
# with biases where the model has them. The table compares it to the figure each source prints.

# %%
tab = catalogue_table()
tab[["name", "kind", "layers", "hidden", "heads", "kv_heads", "experts", "top_k", "computed", "published", "rel_error"]]

# %%
fig, ax = plt.subplots(figsize=(6.5, 7))
parameter_check(tab.sort_values("computed"), x="rel_error", y="name", hue="family", ax=ax, tolerance=tolerance)
ax.set_title(f"computed vs published parameter counts, {len(tab)} catalogue models")
out.figure(fig, "parameter_counts")

# %% [markdown]
# ## Method: rank layouts
#
# `llmcomm.Layout` numbers ranks TP-fastest and PP-slowest. Each panel colours the GPUs of one node row by
# the group they belong to for one parallelism: TP groups sit inside a node, DP and PP stride across it.

# %%
for title, kw in layouts:
    L = lc.Layout(lc.ParallelConfig(**kw), gpus_per_node=gpus_per_node)
    table = L.group_table()
    dims = [p for p in ("tp", "dp", "pp", "ep") if (kw.get(p, 1) > 1)]
    fig, axes = plt.subplots(1, len(dims), figsize=(4.2 * len(dims), 0.55 * table["node"].nunique() + 1.2),
                             squeeze=False)
    for ax, p in zip(axes[0], dims, strict=True):
        layout_grid(table, x="rank", y="node", hue=f"{p}_group", ax=ax, gpus_per_node=gpus_per_node,
                    title=f"{p.upper()} groups")
    fig.suptitle(f"{title}, order {L.parallel.order}   (cell: r = global rank, g = group id)", y=1.04)
    out.figure(fig, "layout_" + "_".join(f"{k}{v}" for k, v in kw.items()))

# %% [markdown]
# ## Checks
#
# Every catalogue entry must match its published total (within the tolerance, or equal at the precision the
# source printed), MoE active counts likewise; every layout's groups must partition the ranks, and under the
# default order TP groups never cross a node when `tp` divides the GPUs of a node.

# %%
ok = [published_ok(r.computed, r.published, r.published_is_nominal, tolerance) for r in tab.itertuples()]
exact = tab[~tab["published_is_nominal"]]  # models whose published size is a parameter count, not a name
nominal = tab[tab["published_is_nominal"]]
worst = exact.loc[exact["rel_error"].abs().idxmax()]
out.value("max_abs_rel_error", float(exact["rel_error"].abs().max()))
out.value("nominal_models", {r.name: round(float(r.rel_error), 4) for r in nominal.itertuples()})
out.value("models", len(tab))
out.check("parameter_counts_match_published", all(ok),
          value=dict(zip(tab["name"], tab["rel_error"].round(4), strict=True)),
          expect=f"|rel_error| <= {tolerance} or equal at published precision")
moe = tab[tab.kind == "MoE"]
act = ((moe.active_computed - moe.active_published) / moe.active_published).abs()
out.check("active_parameter_counts_match", bool((act <= tolerance).all()),
          value=dict(zip(moe["name"], act.round(4), strict=True)), expect=f"<= {tolerance}")
tp_inside = {}
for title, kw in layouts:
    L = lc.Layout(lc.ParallelConfig(**kw), gpus_per_node=gpus_per_node)
    for p in ("tp", "dp", "pp", "ep"):
        g = L.groups(p)
        out.check(f"{title}: {p} groups partition the ranks", sorted(g.ravel().tolist()) == list(range(L.world_size)))
    if gpus_per_node % L.size("tp") == 0:
        nodes = L.coords["node"].to_numpy()[L.groups("tp")]
        tp_inside[title] = bool((nodes == nodes[:, :1]).all())
        out.check(f"{title}: tp groups inside one node", tp_inside[title])

# %% [markdown]
# ## Result

# %%
why = ("within the tolerance" if abs(worst["rel_error"]) <= tolerance
       else "equal at the precision the source printed" if worst["matches_published"] else "a mismatch")
out.say(
    f"**Result.** The parameter counts computed from the architecture match the published totals for "
    f"{sum(ok)} of {len(tab)} catalogue models ({len(moe)} of them MoE, whose active counts match too); the "
    f"largest deviation is {100 * worst['rel_error']:+.2f}% ({worst['name']}: {worst['computed']:,.0f} computed vs "
    f"{worst['published']:,.0f} published, {why}); "
    f"{len(nominal)} models are published by name only ({', '.join(nominal['name'])}: within "
    f"{100 * nominal['rel_error'].abs().max():.1f}% of the size in the name). "
    f"In all {len(layouts)} layouts every parallelism's groups partition the ranks, and TP groups stay inside "
    f"one node in {sum(tp_inside.values())} of the {len(tp_inside)} layouts whose TP size divides a node."
)
out.save()
