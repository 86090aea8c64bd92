"""Generate data/published/nemo_h100_recipes.yaml: each DGX-H100 row's recipe settings, read (never executed) from
Megatron-Bridge's scripts/performance at the commit that published the row, or (NeMo 24.07) from
NeMo-Framework-Launcher's training configs at its 24.07 tag.

    python data/published/read_nemo_recipes.py --git-dir MB_CLONE --launcher-git-dir NFL_CLONE CSV OUT
"""
import argparse
import ast
import csv
import functools
import re
import subprocess
import sys

import yaml

GIT_DIR = ""  # a clone of NVIDIA-NeMo/Megatron-Bridge (set by --git-dir)

REPO = "NVIDIA-NeMo/Megatron-Bridge"
# the commit that first added "## <container> NeMo Container" (H100 rows) to docs/performance-summary*.md
PUBLISHED = {
    "25.09": ("fa0315ae2684693a666be9d247adf9baf1e30028", "2025-10-10 update 25.09 performance summary (#916)"),
    "25.11": ("97ad8cc6fb27a58bb79ff51ce73897c3887aa2c6", "2025-12-04 Added 25.11 starter pack (#1596)"),
    "26.02": ("c0b9a00031b79b731ccefb56d0aba9629b4dd01b", "2026-02-25 26.02 perf summary (#2492)"),
    "26.02.01": ("cfeddcd9445817a85ff58549d407fa700b1f8ace", "2026-03-21 2602_perf_table_reorder and patch container data (#2872)"),
    "26.04": ("74695a06d759adcab3d782193127969213e4f005", "2026-04-17 2604 perf summary (#3377)"),
    "26.04.01": ("17a381f9569ef68dde89bfef0be1e0d33192b9e8", "2026-05-16 2604_patch_perf_summary (#3818)"),
    "26.06": ("63b08b397a3ee37edf439c7be0b24d7439d8cf23", "2026-06-15 26.06 perf summary (#4318)"),
}
# table model name -> (family dir, perf file stem, recipe name, library recipe function)
MODELS = {
    "LLAMA3_8B": ("llama", "llama3", "llama3_8b", "llama3_8b_pretrain_config"),
    "LLAMA3_70B": ("llama", "llama3", "llama3_70b", "llama3_70b_pretrain_config"),
    "LLAMA3.1_405B": ("llama", "llama31", "llama31_405b", "llama31_405b_pretrain_config"),
    "GPT OSS 120B": ("gpt_oss", "gpt_oss", "gpt_oss_120b", "gpt_oss_120b_pretrain_config"),
    "Qwen3_30B_a3B": ("qwen", "qwen3", "qwen3_30b_a3b", "qwen3_30b_a3b_pretrain_config"),
    "Qwen3_235B_a22B": ("qwen", "qwen3", "qwen3_235b_a22b", "qwen3_235b_a22b_pretrain_config"),
    "Nemotron_3_Nano": ("nemotronh", "nemotron_3_nano", "nemotron_3_nano", None),
    "DeepSeekV3": ("deepseek", "deepseek", "deepseek_v3", None),
}
PREC = {"FP8": "FP8_CS", "FP8-CS": "FP8_CS", "BF16": "BF16"}
LIB = "src/megatron/bridge/recipes/llama/llama3.py"
# family -> (library recipe file, its shared builder: absent at some commits, then only the model's function is read)
LIBS = {"llama": (LIB, "_llama3_common"), "qwen": ("src/megatron/bridge/recipes/qwen/qwen3_moe.py", "_qwen3_moe_common"),
        "gpt_oss": ("src/megatron/bridge/recipes/gpt_oss/gpt_oss.py", "_gpt_oss_common")}
OVERRIDES = "scripts/performance/utils/overrides.py"
FLEX = "src/megatron/bridge/training/flex_dispatcher_backend.py"


def cite(path, line, what=""):
    return f"{path}:{line}" + (f" ({what})" if what else "")


def base_model(name):
    return re.sub(r"\s*\((dropless|tokendrop)\)$", "", name)


def workload(commit, fam, stem, recipe, prec, gbs, row=None):
    path = f"scripts/performance/configs/{fam}/{stem}_workload_base_configs.py"
    try:
        cs = consts(commit, path)
    except Exception as e:  # noqa: BLE001
        return path, None, f"cannot read {path}: {type(e).__name__}"
    names = [n for n in cs if n.startswith(f"{recipe}_PRETRAIN_CONFIG_H100_{prec}".upper())]
    names = [n for n in names if n.endswith(("_BASE_CONFIG", "_V1", "_V2", "_V3"))]
    if not names:
        return path, None, f"no {recipe.upper()}_PRETRAIN_CONFIG_H100_{prec}* constant in {path}"
    match = [n for n in names if cs[n].get("global_batch_size", (None,))[0] == gbs]
    full = [n for n in match if row is not None and all(_same(cs[n].get(f, (None,))[0], row[c])
                                                          for f, c in SIZE_FIELDS.items())]
    pick = (full or match or names)[-1]
    rule = ("the H100 constant of this precision whose parallel sizes and batch sizes all equal the table's" if full
            else "the H100 constant of this precision whose global_batch_size equals the table's (none matches all "
                 "the table's sizes)" if match
            else "the H100 constant of this precision (none has the table's global batch size)")
    return path, (pick, cs[pick]), rule


SIZE_FIELDS = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "context_parallel_size": "cp",
               "virtual_pipeline_model_parallel_size": "vp", "expert_model_parallel_size": "ep",
               "micro_batch_size": "mbs", "global_batch_size": "gbs"}


def _same(recipe, table):
    """A recipe size equals the table's (absent/None/1 alike; the table prints n/a or nothing for unset)."""
    t = None if table in ("", "n/a", None) else int(float(table))
    return recipe == t or (t in (None, 1) and recipe in (None, 1))


def fn_rows(commit, path, fname):
    try:
        return function(commit, path, fname)
    except Exception:  # noqa: BLE001
        return None


def last(rows, kinds, names):
    hit = None
    for k, t, v, line in rows or []:
        if k in kinds and t in names:
            hit = (v, line)
    return hit


def mb_row(r):
    cont, model = r["container"], base_model(r["model"])
    commit, why = PUBLISHED[cont]
    out = {"recipe_source": {"repo": REPO, "commit": commit, "commit_subject": why,
                             "rule": "scripts/performance as of the commit that published this container's table "
                                     "(main branch; the container's own release branch may differ)"}}
    s, unknown, checks = {}, {}, {}
    if model not in MODELS:
        out["status"] = "not_read"
        out["unknown"] = {"all": f"no perf recipe mapping for {model!r} in this reader"}
        return out
    fam, stem, recipe, libfn = MODELS[model]
    prec_tab = r["precision"] or ""
    if cont == "25.09":
        return {**out, **perf_matrix_2509(r, commit, model)}
    prec = PREC.get(prec_tab)
    if prec is None:
        unknown["precision"] = f"precision {prec_tab!r} not mapped"
        out["status"] = "partial"
        out["unknown"] = unknown
        return out
    wpath, w, rule = workload(commit, fam, stem, recipe, prec, int(r["gbs"]), r)
    if w is None:
        out["status"] = "not_read"
        out["unknown"] = {"workload": rule}
        return out
    cname, fields = w
    out["workload_config"] = {"file": wpath, "name": cname, "line": fields["__def__"][1], "rule": rule}
    tab = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "context_parallel_size": "cp",
           "virtual_pipeline_model_parallel_size": "vp", "expert_model_parallel_size": "ep",
           "micro_batch_size": "mbs", "global_batch_size": "gbs"}
    defaults = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
                "virtual_pipeline_model_parallel_size": None, "expert_model_parallel_size": 1, "micro_batch_size": 1,
                "global_batch_size": 1}
    for f, col in tab.items():
        v, line = fields.get(f, (defaults[f], None))
        t = r[col]
        tv = None if t in ("", "n/a") else int(float(t))
        checks[col] = {"table": tv, "recipe": v, "agree": (tv == v) or (tv in (None, 1) and v in (None, 1)),
                       "cite": cite(wpath, line) if line else "WorkloadBaseConfig default (scripts/performance/utils/utils.py)"}
    fs = fields.get("use_megatron_fsdp", (None, None))
    tf = r["fsdp"]
    checks["fsdp"] = {"table": None if tf in ("", "n/a") else int(float(tf)), "recipe": fs[0],
                      "agree": (tf in ("", "n/a", "0", "0.0")) == (not fs[0]),
                      "cite": cite(wpath, fs[1]) if fs[1] else "WorkloadBaseConfig default use_megatron_fsdp=None"}
    for f in ("use_megatron_fsdp", "recompute_num_layers", "recompute_modules", "cuda_graph_impl", "cuda_graph_scope",
              "pp_layout", "cpu_offloading_num_layers", "moe_flex_dispatcher_backend", "moe_a2a_overlap",
              "fp8_dot_product_attention", "nccl_ub", "expert_tensor_parallel_size"):
        if f in fields:
            s[f] = {"value": fields[f][0], "cite": cite(wpath, fields[f][1], cname)}
    tp = fields.get("tensor_model_parallel_size", (1,))[0]
    s["sequence_parallel"] = {"value": bool(tp > 1), "cite": "scripts/performance/utils/utils.py "
                              "(WorkloadBaseConfig.sequence_parallel = tensor_model_parallel_size > 1), applied by "
                              "scripts/performance/utils/overrides.py set_workload_base_configs"}
    # precision
    pp = "scripts/performance/utils/precision.py"
    prow = fn_rows(commit, pp, "get_precision_config")
    if prec == "FP8_CS":
        mp = "src/megatron/bridge/training/mixed_precision.py"
        mrow = fn_rows(commit, mp, "bf16_with_fp8_current_scaling_mixed")
        for name, tgt in (("fp8", "cfg.fp8"), ("fp8_recipe", "cfg.fp8_recipe"), ("fp8_param_gather", "cfg.fp8_param_gather")):
            h = last(mrow, ("assign",), (tgt,))
            if h:
                s[name] = {"value": h[0], "cite": cite(mp, h[1], "bf16_with_fp8_current_scaling_mixed")}
            else:
                unknown[name] = f"not found in {mp} bf16_with_fp8_current_scaling_mixed at this commit"
        h = last(prow, ("assign",), ("current_scaling_cfg.first_last_layers_bf16",))
        if h:
            s["first_last_layers_bf16"] = {"value": h[0], "cite": cite(pp, h[1], "get_precision_config('fp8_cs')")}
    else:
        s["fp8"] = {"value": None, "cite": f"{pp} get_precision_config('bf16') -> bf16_mixed()"}
    # perf function for H100
    perf = f"scripts/performance/configs/{fam}/{stem}_llm_pretrain.py"
    hrow = fn_rows(commit, perf, f"{recipe}_pretrain_config_h100")
    if hrow is None:
        unknown["perf_function"] = f"{recipe}_pretrain_config_h100 not found in {perf}"
    if libfn is None:
        out["status"] = "partial"
        unknown["library_recipe"] = "library recipe defaults (overlap, optimizer, recompute) of this model not read"
    else:
        lib, common = LIBS[fam]
        lrow = fn_rows(commit, lib, libfn)
        if lrow is None:
            unknown["library_recipe"] = f"{libfn} not found in {lib} at this commit"
            lrow = []
        crow = fn_rows(commit, lib, common) or []
        com = fn_rows(commit, perf, f"set_{stem}_common_configs") or []
        chain = [(lib, common, crow), (lib, libfn, lrow), (perf, f"set_{stem}_common_configs", com),
                 (perf, f"{recipe}_pretrain_config_h100", hrow or [])]
        workload_set = set(s)  # set_workload_base_configs runs last: what the workload states wins

        def resolve(name, targets, kws=(), keys=()):
            found = []
            for path, fn, rows in chain:
                for k, t, v, line in rows:
                    if (k == "assign" and t in targets) or (k == "kw" and t in kws) or (k == "key" and t in keys) \
                            or (k == "default" and t in keys):
                        found.append((v, cite(path, line, fn)))
            if isinstance(found[-1][0] if found else None, str) and found[-1][0].startswith("base_cfg."):
                f = found[-1][0][len("base_cfg."):]  # the perf function copies a workload field
                v, line = fields.get(f, (None, None))
                found.append((v, cite(wpath, line, cname) if line else f"scripts/performance/utils/utils.py "
                              f"(WorkloadBaseConfig default {f}=None; {cname} does not set it)"))
            if name in workload_set:
                if found:
                    s[name].setdefault("overrides", [c for _, c in found])
                return
            if not found:
                unknown[name] = "not set in the library recipe or the perf script at this commit (the library default applies)"
                return
            s[name] = {"value": found[-1][0], "cite": found[-1][1], **({"overrides": [c for _, c in found[:-1]]} if len(found) > 1 else {})}

        resolve("overlap_grad_reduce", ("cfg.ddp.overlap_grad_reduce",), ("overlap_grad_reduce",))
        resolve("overlap_param_gather", ("cfg.ddp.overlap_param_gather",), ("overlap_param_gather",))
        resolve("use_distributed_optimizer", ("cfg.ddp.use_distributed_optimizer",), ("use_distributed_optimizer",))
        resolve("grad_reduce_in_fp32", ("cfg.ddp.grad_reduce_in_fp32",), ("grad_reduce_in_fp32",))
        resolve("tp_comm_overlap", ("cfg.comm_overlap.tp_comm_overlap",), ("tp_comm_overlap",))
        resolve("tp_comm_overlap_cfg", ("cfg.comm_overlap.tp_comm_overlap_cfg", "comm_overlap_cfg"), ("tp_comm_overlap_cfg",))
        resolve("recompute_granularity", ("cfg.model.recompute_granularity",), (), ("recompute_granularity",))
        resolve("account_for_embedding_in_pipeline_split", ("cfg.model.account_for_embedding_in_pipeline_split",),
                (), ("account_for_embedding_in_pipeline_split",))
        resolve("account_for_loss_in_pipeline_split", ("cfg.model.account_for_loss_in_pipeline_split",),
                (), ("account_for_loss_in_pipeline_split",))
        resolve("cp_comm_type", ("cfg.model.cp_comm_type",), (), ("cp_comm_type",))
        resolve("attention_backend", ("cfg.model.attention_backend",), (), ("attention_backend",))
        for f in ("recompute_method", "recompute_num_layers", "recompute_modules", "moe_token_dispatcher_type",
                  "moe_flex_dispatcher_backend", "pipeline_model_parallel_layout",
                  "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage", "moe_shared_expert_overlap"):
            resolve(f, (f"cfg.model.{f}", "model_cfg." + f), (f,), (f,))
        if "moe_token_dispatcher_type" in s or "moe_flex_dispatcher_backend" in s:
            # set_workload_base_configs, at commits that have it: a workload backend -> apply_flex_dispatcher_backend,
            # which on compute capability 9 (H100) sets moe_token_dispatcher_type='flex'
            ov = fn_rows(commit, OVERRIDES, "set_workload_base_configs") or []
            call = [line for k, t, v, line in ov if k == "call" and t == "apply_flex_dispatcher_backend"]
            wl = fields.get("moe_flex_dispatcher_backend", (None, None))
            if call and wl[0]:
                s["moe_token_dispatcher_type"] = {"value": "flex", "cite": cite(OVERRIDES, call[0], "set_workload_base_configs: "
                                                  f"apply_flex_dispatcher_backend(cfg.model, {wl[0]!r})") + f" and {FLEX} "
                                                  "(device major 9, Hopper: moe_token_dispatcher_type = 'flex')"}
                s["moe_flex_dispatcher_backend"] = {"value": wl[0], "cite": cite(wpath, wl[1], cname)}
            elif call:
                alt = [line for k, t, v, line in ov if k == "assign" and t == "cfg.model.moe_token_dispatcher_type"]
                s["moe_token_dispatcher_type"] = {"value": "alltoall", "cite": cite(OVERRIDES, alt[0] if alt else call[0],
                                                  "set_workload_base_configs: no workload backend -> alltoall")}
        v = s.get("tp_comm_overlap", {}).get("value")
        if v == "bool(cfg.model.tensor_model_parallel_size > 1)":
            s["tp_comm_overlap"]["value"] = bool(tp > 1)
            s["tp_comm_overlap"]["note"] = f"the recipe's expression {v} evaluated at tensor_model_parallel_size={tp}"
        if s.get("tp_comm_overlap_cfg", {}).get("value") == "comm_overlap_cfg":
            want = "fp8" if prec == "FP8_CS" else "bf16"
            for k, t, v, line in hrow or []:
                if k == "assign" and t == "comm_overlap_cfg" and isinstance(v, str) and f"_{want}_" in f"_{v}":
                    s["tp_comm_overlap_cfg"] = {"value": v, "cite": cite(perf, line, f"{recipe}_pretrain_config_h100, "
                                                                      f"{prec.lower()} branch")}
        p2p = pp_overlap(commit, r, chain)
        if p2p is not None:
            s["overlap_p2p_comm"] = p2p
        out["status"] = "read"
    # set_workload_base_configs -> _set_recompute_overrides, last: the workload's recompute fields when not None
    if w is not None and fields.get("recompute_num_layers", (None,))[0] is not None:
        s["recompute_granularity"] = {"value": "full", "cite": f"{OVERRIDES} _set_recompute_overrides "
                                      "(recompute_num_layers set -> granularity full, method block)"}
        s["recompute_method"] = {"value": "block", "cite": s["recompute_granularity"]["cite"]}
        s["recompute_num_layers"] = {"value": fields["recompute_num_layers"][0],
                                     "cite": cite(wpath, fields["recompute_num_layers"][1], cname)}
    if w is not None and fields.get("recompute_modules", (None,))[0] is not None:
        s["recompute_granularity"] = {"value": "selective", "cite": f"{OVERRIDES} _set_recompute_overrides "
                                      "(recompute_modules set -> granularity selective)"}
        s["recompute_modules"] = {"value": fields["recompute_modules"][0],
                                  "cite": cite(wpath, fields["recompute_modules"][1], cname)}
    # set_workload_base_configs -> _set_moe_a2a_overlap_overrides: the workload's moe_a2a_overlap turns on
    # Megatron's overlap_moe_expert_parallel_comm with delay_wgrad_compute, and moe_shared_expert_overlap off
    if w is not None and fields.get("moe_a2a_overlap", (None,))[0] is True:
        fn = r"def _set_moe_a2a_overlap_overrides\("
        what = f"_set_moe_a2a_overlap_overrides: {cname}.moe_a2a_overlap"
        s["delay_wgrad_compute"] = {"value": True, "cite": at(commit, OVERRIDES, r"\.delay_wgrad_compute = True", fn,
                                                              what)}
        prev = s.get("moe_shared_expert_overlap")
        s["moe_shared_expert_overlap"] = {"value": False, "cite": at(commit, OVERRIDES,
                                                                     r"\.moe_shared_expert_overlap = False", fn, what),
                                          **({"overrides": [prev["cite"]]} if prev else {})}
        unknown.pop("moe_shared_expert_overlap", None)
    out["settings"], out["unknown"], out["checks"] = s, unknown, checks
    if not all(c["agree"] for c in checks.values()):
        out["caveats"] = {"workload_sizes": f"the workload constant {cname}'s sizes differ from the table's (see "
                          "checks): the sizes are the table's, the other settings the constant's and the recipe's"}
    out["not_in_repo"] = "the command line of the published runs (any CLI overrides) is not in the repository"
    return out


CONFIG_PY = "src/megatron/bridge/training/config.py"
CO = "src/megatron/bridge/training/comm_overlap.py"
CO_MODEL = r"def _get_model_comm_overlap_cfgs"


def pp_overlap(commit, r, chain):
    """overlap_p2p_comm of a row read on the generic path (releases after 25.09), or None where no line sets it.

    runtime_config_update (config.py) runs ``cfg.comm_overlap.setup`` only when the recipe holds a
    CommOverlapConfig; its _get_model_comm_overlap_cfgs (comm_overlap.py) sets, for pipeline_model_parallel_size > 1,
    overlap_p2p_comm = True (batch_p2p_comm = False) with virtual_pipeline_model_parallel_size > 1, else
    overlap_p2p_comm = False (batch_p2p_comm = True), then _override_user_cfgs puts back every field the user's
    CommOverlapConfig(...) set (not None), and _apply_cfgs copies them onto the model config. The sizes are the
    table's. A row whose chain builds no CommOverlapConfig (GPT-OSS before 26.06 on H100) keeps the model
    config's own value, which no line of its chain states: nothing is recorded. pp = 1 is not recorded either
    (off, the formulation's default). batch_p2p_comm is not recorded: the kit has no field for it."""
    pp = int(float(r["pp"] or 1))
    vp = None if r["vp"] in ("", "n/a", None) else int(float(r["vp"]))
    made = None
    for path, fn, rows in chain:
        for k, t, v, line in rows:
            if ((k == "assign" and t == "cfg.comm_overlap") or (k in ("kw", "key", "default")
                                                               and t == "comm_overlap_config")):
                if v is None or (isinstance(v, str) and v.startswith("CommOverlapConfig(")):
                    made = (v, cite(path, line, fn))
    if pp <= 1 or made is None or made[0] is None:
        return None
    user = [(v, cite(path, line, fn)) for path, fn, rows in chain for k, t, v, line in rows
            if (k == "kw" and t == "overlap_p2p_comm") or (k == "assign" and t in (
                "cfg.comm_overlap.overlap_p2p_comm", "cfg.model.overlap_p2p_comm"))]
    setup = at(commit, CONFIG_PY, r"cfg\.comm_overlap\.setup\(", r"def runtime_config_update", "runtime_config_update")
    if user and user[-1][0] is not None:
        return {"value": user[-1][0], "cite": f"{user[-1][1]} (the user value wins: "
                f"{at(commit, CO, r'if user_value is not None', r'def _override_user_cfgs')})",
                "overrides": [at(commit, CO, r"comm_overlap_cfg\.overlap_p2p_comm = ", CO_MODEL)]}
    on = bool(vp and vp > 1)
    line = at(commit, CO, r"comm_overlap_cfg\.overlap_p2p_comm = True" if on else
              r"comm_overlap_cfg\.overlap_p2p_comm = False", r"if model_cfg\.pipeline_model_parallel_size > 1",
              "_get_model_comm_overlap_cfgs")
    return {"value": on, "cite": f"{line} (pipeline_model_parallel_size={pp} > 1, "
            f"virtual_pipeline_model_parallel_size={vp}; the recipe's CommOverlapConfig {made[1]}, set up by "
            f"{setup}; no user overlap_p2p_comm in the recipe chain)"}


NFL_DIR = ""  # a clone of NVIDIA/NeMo-Framework-Launcher (set by --launcher-git-dir)
NFL_REPO = "NVIDIA/NeMo-Framework-Launcher"
NFL_TAG = "24.07"
NFL_CONFIGS = {"GPT3-5B": "gpt3/5b", "GPT3-20B": "gpt3/20b", "GPT3-175B": "gpt3/175b", "LLAMA2-7B": "llama/llama2_7b",
               "LLAMA2-13B": "llama/llama2_13b", "LLAMA2-70B": "llama/llama2_70b", "LLAMA3-8B": "llama/llama3_8b",
               "LLAMA3-70B": "llama/llama3_70b", "Nemotron-8B": "nemotron/nemotron_8b",
               "Nemotron-22B": "nemotron/nemotron_22b", "Nemotron-340B": "nemotron/nemotron_340b"}
NFL_KEYS = {  # NeMo 1.0 config key (under model.) -> Megatron-LM name
    "ub_tp_comm_overlap": "tp_comm_overlap", "optim.overlap_grad_sync": "overlap_grad_reduce",
    "optim.overlap_param_sync": "overlap_param_gather", "optim.grad_sync_dtype": "grad_sync_dtype",
    "activations_checkpoint_granularity": "recompute_granularity", "activations_checkpoint_method": "recompute_method",
    "activations_checkpoint_num_layers": "recompute_num_layers", "sequence_parallel": "sequence_parallel",
    "use_flash_attention": "use_flash_attention", "fp8": "fp8_enabled", "fp8_hybrid": "fp8_hybrid",
    "fp8_e4m3": "fp8_e4m3", "overlap_p2p_comm": "overlap_p2p_comm", "fsdp": "fsdp", "optim.name": "optimizer",
    "megatron_amp_O2": "megatron_amp_O2", "tp_comm_overlap_cfg": "tp_comm_overlap_cfg",
}
NFL_SIZES = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
             "virtual_pipeline_model_parallel_size": "vp", "context_parallel_size": "cp", "micro_batch_size": "mbs",
             "global_batch_size": "gbs"}


def yaml_lines(text):
    """dotted key -> (value, 1-based line) of a YAML mapping, from the composed node tree (no tags executed)."""
    out = {}

    def walk(node, prefix):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = f"{prefix}{k.value}"
                if isinstance(v, yaml.ScalarNode):
                    out[key] = (yaml.safe_load(v.value) if v.value not in ("", "~") else None, v.start_mark.line + 1)
                walk(v, key + ".")

    walk(yaml.compose(text), "")
    return out


PM_2509 = {"LLAMA3_8B": "llama3/llama3_8b", "LLAMA3_70B": "llama3/llama3_70b", "LLAMA3.1_405B": "llama31/llama31_405b",
           "DeepSeekV3": "deepseek/deepseek_v3", "Qwen3_30B_a3B": "qwen3/qwen3_30b_a3b",
           "Qwen3_235B_a22B": "qwen3/qwen3_235b_a22b"}
PM_SIZES = {"tp": "tp", "pp": "pp", "cp": "cp", "vp": "vp", "ep": "ep", "mbs": "mbs", "gbs": "gbs"}


def perf_matrix_2509(r, commit, model):
    """25.09: scripts/performance/configs/<family>/<model>_llm_pretrain.yaml holds a perf_matrix per GPU and GPU
    count with a common block and one block per precision; the table prints no precision, so the precisions whose
    sizes (and FSDP) match the table's row are listed, and settings are recorded only where they all agree."""
    path = f"scripts/performance/configs/{PM_2509[model]}_llm_pretrain.yaml"
    try:
        kv = yaml_lines(src(commit, path))
    except Exception as e:  # noqa: BLE001
        return {"status": "not_read", "unknown": {"all": f"cannot read {path}: {type(e).__name__}"}}
    pre = f"perf_matrix.h100.num_gpus_{int(r['num_gpus'])}."
    variants = sorted({k[len(pre):].split(".")[0] for k in kv if k.startswith(pre)} - {"common"})
    table = {c: (None if r[c] in ("", "n/a") else int(float(r[c]))) for c in PM_SIZES.values()}
    fsdp_t = bool(float(r["fsdp"] or 0) > 0)
    match, cites = [], {}
    for v in variants:
        def get(key, v=v):
            for blk in (v, "common"):
                hit = kv.get(f"{pre}{blk}.{key}")
                if hit is not None:
                    return hit[0], f"{path}:{hit[1]}"
            return None, None
        ok = True
        for key, col in PM_SIZES.items():
            val, c = get(key)
            tv = table[col]
            if not (val == tv or (tv in (None, 1) and val in (None, 1))):
                ok = False
            cites[(v, key)] = c
        f = get("use_megatron_fsdp")[0] or get("fsdp")[0] or False
        ok = ok and bool(f) == fsdp_t
        if ok:
            match.append(v)
    checks = {}
    for v in match[:1]:  # a matching block agrees with every size by construction: the first one's lines are cited
        for key, col in PM_SIZES.items():
            hit = kv.get(f"{pre}{v}.{key}") or kv.get(f"{pre}common.{key}")
            checks[col] = {"table": table[col], "recipe": hit[0] if hit else None, "agree": True,
                           "cite": f"{path}:{hit[1]}" if hit else f"{path} (not set in the block: the default)"}
    res = {"checks": checks, "status": "partial", "perf_matrix": {"file": path, "variants": variants, "matching_table": match,
                                                "rule": "precision blocks whose tp/pp/cp/vp/ep/mbs/gbs and FSDP equal "
                                                        "the table's row"}}
    unknown = {"recipe": "library recipe defaults (overlap, optimizer, recompute) of 25.09 not read"}
    fp8 = [v for v in match if v.startswith("fp8")]
    if match and len(fp8) == len(match):
        # scripts/performance/utils/helpers.py get_precision_config(compute_dtype, fp8_recipe) at this commit: the
        # block's suffix is the run_script's --fp8_recipe (ds, cs, ...), each one mixed-precision function
        hp = "scripts/performance/utils/helpers.py"
        hrows = fn_rows(commit, hp, "get_precision_config") or []
        mp = "src/megatron/bridge/training/mixed_precision.py"
        per = {}
        for v in fp8:
            suffix = v.split("_", 1)[1]
            fn = {"ds": "bf16_with_fp8_delayed_scaling_mixed", "cs": "bf16_with_fp8_current_scaling_mixed"}.get(suffix)
            rows_ = fn_rows(commit, mp, fn) if fn else None
            if not rows_:
                per[v] = None
                continue
            got = {}
            for name, tgt in (("fp8", "cfg.fp8"), ("fp8_recipe", "cfg.fp8_recipe"),
                              ("fp8_param_gather", "cfg.fp8_param_gather")):
                h = last(rows_, ("assign",), (tgt,))
                if h:
                    got[name] = (h[0], cite(mp, h[1], fn))
            line = next((ln for k, t, val, ln in hrows if k == "call" or k == "return"
                         if fn in str(val)), None)
            got["_via"] = cite(hp, line, f"get_precision_config('fp8', {suffix!r})") if line else hp
            per[v] = got
        settings_ = {}
        for name in ("fp8", "fp8_recipe", "fp8_param_gather"):
            vals = {g[name][0] for g in per.values() if g and name in g}
            if len(vals) == 1 and all(g and name in g for g in per.values()):
                g0 = next(iter(per.values()))
                settings_[name] = {"value": vals.pop(), "cite": f"{g0[name][1]} via {g0['_via']}; the perf matrix "
                                   f"blocks matching the row: {match} ({path})"}
            else:
                unknown[name] = (f"the row's sizes match the perf matrix blocks {match} ({path}), whose {name} differ "
                                 f"({ {v: (g or {}).get(name, ('?',))[0] for v, g in per.items()} }): which ran is "
                                 "not stated")
        res["settings"] = settings_
    else:
        paren = _paren_rule_2509(r, match, path)
        if paren is None:
            unknown["precision"] = (f"the 25.09 table prints no precision and the perf matrix blocks matching the row "
                                    f"are {match or 'none'}")
        else:
            variant, why = paren
            res["settings"] = _fp8_settings_2509(commit, variant, f"{why}; {path}")
            res["precision_rule"] = why
            match = [variant]
    res["settings"] = {**library_2509(r, commit, model, match, unknown), **(res.get("settings") or {})}
    if res["settings"].get("fp8_recipe", {}).get("value") == "tensorwise":  # fp8_cs: helpers.py turns the BF16 edges off
        res["settings"]["first_last_layers_bf16"] = {"value": False, "cite": at(
            commit, "scripts/performance/utils/helpers.py", r"current_scaling_cfg.first_last_layers_bf16 = False",
            None, "get_precision_config('fp8', 'cs')")}
    del unknown["recipe"]
    lib_default = "not set in the library recipe or the perf script at this commit"
    res["status"] = "read" if all(str(v).startswith(lib_default) for v in unknown.values()) else "partial"
    res["unknown"] = unknown
    return res


# the 25.09 page's note (docs/performance-summary.md:80 at the publishing commit; the archive copy
# megatron_bridge_performance-summary-archive.md:635): "The numbers in parentheses indicate the use of different
# quantization granularities: ... For H100 system, 128x128 for weights and 1x128 for activations" -- the blockwise
# FP8 recipe, the perf matrix's fp8_ss block (bf16_with_fp8_subchannel_scaling_mixed: fp8_recipe 'blockwise').
# A row printed with a parenthesized number therefore ran its main number in FP8 at the other granularity: the one
# FP8 block of its perf matrix that is not fp8_ss (BF16 has no quantization granularity).
DOC_2509 = "docs/performance-summary.md:80 (megatron_bridge_performance-summary-archive.md:635)"


def _paren_rule_2509(r, match, path):
    if not str(r.get("model_tflops_per_gpu_paren") or "").strip():
        return None
    other = [v for v in match if v.startswith("fp8") and v != "fp8_ss"]
    if "fp8_ss" not in match or len(other) != 1:
        return None
    return other[0], (f"the row prints a parenthesized number, which {DOC_2509} says is the 128x128/1x128 "
                      f"(blockwise, fp8_ss) granularity: the main number is FP8 at the other granularity, the "
                      f"matrix's only other FP8 block {other[0]!r}")


def _fp8_settings_2509(commit, variant, why):
    mp = "src/megatron/bridge/training/mixed_precision.py"
    fn = {"ds": "bf16_with_fp8_delayed_scaling_mixed", "cs": "bf16_with_fp8_current_scaling_mixed"}[variant.split("_", 1)[1]]
    rows_ = fn_rows(commit, mp, fn) or []
    out = {}
    for name, tgt in (("fp8", "cfg.fp8"), ("fp8_recipe", "cfg.fp8_recipe"), ("fp8_param_gather", "cfg.fp8_param_gather")):
        h = last(rows_, ("assign",), (tgt,))
        if h:
            out[name] = {"value": h[0], "cite": f"{cite(mp, h[1], fn)}; {why}"}
    return out


RUN_2509 = "scripts/performance/run_script.py"
HELP_2509 = "scripts/performance/utils/helpers.py"
CO_2509 = "src/megatron/bridge/training/comm_overlap.py"


def at(commit, path, pattern, after=None, what="", until=None):
    """path:line of the first line matching ``pattern`` (after the first line matching ``after``); the reader
    stops (KeyError) where the source does not say it, so a cite is never typed by hand."""
    lines = src(commit, path).splitlines()
    start = 0
    if after is not None:
        start = next(i for i, ln in enumerate(lines) if re.search(after, ln)) + 1
    if after is not None and until is None:
        until = r"^def " if path.endswith(".py") and after.startswith("def ") else None
    for i in range(start, len(lines)):
        if until is not None and re.search(until, lines[i]):
            break
        if re.search(pattern, lines[i]):
            return cite(path, i + 1, what)
    raise KeyError(f"{path}: no line matches {pattern!r} (after {after!r})")


def library_2509(r, commit, model, match, unknown):
    """25.09's recipe chain, as run_script.py at the commit runs it: the library recipe (Megatron-Bridge's
    src/megatron/bridge/recipes), run_script.py's per-model lines for --gpu h100, the perf YAML's ConfigContainer
    block and perf-matrix block, then ConfigContainer's setup (config.py: mixed_precision.setup copies
    grad_reduce_in_fp32 into the DDP config, comm_overlap.setup sets the DP/PP overlap when a CommOverlapConfig is
    present). Each value is what the line cited states; a setting none of them states is 'defaulted' (unknown
    with the library-default wording), as for the other releases."""
    s = {}
    tp, pp, cp = (int(float(r[c])) for c in ("tp", "pp", "cp"))
    vp = None if r["vp"] in ("", "n/a") else int(float(r["vp"]))
    dp = int(r["num_gpus"]) // (tp * pp * cp)
    yml = f"scripts/performance/configs/{PM_2509[model]}_llm_pretrain.yaml"
    branch = {"LLAMA3_8B": r'model_size == "8b"', "LLAMA3_70B": r'model_size == "70b"',
              "LLAMA3.1_405B": r'model_size == "405b"', "DeepSeekV3": r'model_size == "v3"',
              "Qwen3_30B_a3B": r'model_size == "30b_a3b"', "Qwen3_235B_a22B": r'model_size == "235b_a22b"'}[model]
    run = lambda pat, what="": at(commit, RUN_2509, pat, branch, what, r"^    elif args|^    else:")  # noqa: E731
    ngk = f"num_gpus_{int(r['num_gpus'])}:"

    def put(name, value, where, over=None):
        s[name] = {"value": value, "cite": where, **({"overrides": over} if over else {})}

    gr = at(commit, yml, r"grad_reduce_in_fp32: false", r"mixed_precision:")
    put("grad_reduce_in_fp32", False, f"{gr} (ConfigContainer.mixed_precision, copied into the DDP config by "
        f"{at(commit, 'src/megatron/bridge/training/config.py', r'mixed_precision.setup')} -> "
        f"{at(commit, 'src/megatron/bridge/training/mixed_precision.py', r'ddp_config = update_config_with_precision_overrides')})")
    if model.startswith("LLAMA"):
        lib = LIB
        fn = {"LLAMA3_8B": "llama3_8b_pretrain_config", "LLAMA3_70B": "llama3_70b_pretrain_config",
              "LLAMA3.1_405B": "llama31_405b_pretrain_config"}[model]
        common = r"def _llama3_common"
        put("use_distributed_optimizer", True, at(commit, lib, r"use_distributed_optimizer=True", common, "_llama3_common"))
        ddp_og = at(commit, lib, r"overlap_grad_reduce=True", common, "_llama3_common")
        ddp_op = at(commit, lib, r"overlap_param_gather=True", common, "_llama3_common")
        for k, pat in (("account_for_embedding_in_pipeline_split", r'"account_for_embedding_in_pipeline_split": True'),
                       ("account_for_loss_in_pipeline_split", r'"account_for_loss_in_pipeline_split": True')):
            try:
                put(k, True, at(commit, lib, pat, rf"def {fn}\(", fn))
            except KeyError:
                put(k, False, at(commit, lib, rf"{k}: bool = False", common, "_llama3_common default"))
        try:
            where = at(commit, lib, r"tp_comm_overlap=True", rf"def {fn}\(", fn)
            has_co = True
        except KeyError:
            has_co = False
        if has_co:
            put("tp_comm_overlap", True, f"{where}; kept on at tp={tp} with sequence_parallel "
                f"({at(commit, HELP_2509, r'sequence_parallel = bool')}; {at(commit, CO_2509, r'if model_cfg.tensor_model_parallel_size < 2')})")
            key = {"LLAMA3_70B": "llama3_70b", "LLAMA3.1_405B": "llama31_405b"}[model]
            cfgs = {}
            for dt in ("bf16", "fp8"):
                cfgs[dt] = re.search(rf'"{dt}": (\w+)', src(commit, HELP_2509).split(f'"{key}"')[1].split('"b200"')[0]).group(1)
            dts = {"fp8" if v.startswith("fp8") else "bf16" for v in match}
            val = cfgs[dts.pop()] if len(dts) == 1 else None
            if val is not None:
                put("tp_comm_overlap_cfg", val, f"{at(commit, HELP_2509, val)} (COMM_OVERLAP_CONFIG_MAP, h100), set by "
                    f"{at(commit, RUN_2509, r'recipe.comm_overlap.tp_comm_overlap_cfg = ub_cfg')}")
            else:
                unknown["tp_comm_overlap_cfg"] = f"COMM_OVERLAP_CONFIG_MAP's h100 entry differs by precision ({cfgs}); the precision is unknown"
        else:
            c1 = at(commit, lib, r"comm_overlap_config: Optional\[CommOverlapConfig\] = None", common)
            c2 = run(r"pretrain_config\(mock=True, precision_config=precision_config\)")
            put("tp_comm_overlap", False, f"{c1} (no CommOverlapConfig: {fn} passes none, {c2})")
        co = has_co
    else:
        co = True  # DeepSeek-V3's recipe adds CommOverlapConfig(tp_comm_overlap=False); Qwen3's run_script passes one
    if model.startswith("Qwen3"):
        lib = "src/megatron/bridge/recipes/qwen/qwen3_moe.py"
        fn = {"Qwen3_30B_a3B": "qwen3_30b_a3b_pretrain_config", "Qwen3_235B_a22B": "qwen3_235b_a22b_pretrain_config"}[model]
        common = r"def _qwen3_moe_common"
        put("use_distributed_optimizer", True, at(commit, lib, r"use_distributed_optimizer=True", common, "_qwen3_moe_common"))
        ddp_og = at(commit, lib, r"overlap_grad_reduce=True", common, "_qwen3_moe_common")
        ddp_op = at(commit, lib, r"overlap_param_gather=True", common, "_qwen3_moe_common")
        s["grad_reduce_in_fp32"]["overrides"] = [at(commit, lib, r"precision_config.grad_reduce_in_fp32 = False", common)]
        for k in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
            try:
                put(k, True, at(commit, lib, rf'"{k}": True', rf"def {fn}\(", fn))
            except KeyError:
                put(k, False, at(commit, lib, rf"{k}: bool = False", common, "_qwen3_moe_common default"))
        c1 = run(r"CommOverlapConfig\(tp_comm_overlap=True\)")
        c2 = at(commit, CO_2509, r"if model_cfg.tensor_model_parallel_size < 2")
        put("tp_comm_overlap", tp > 1, c1 + ("" if tp > 1 else f"; off at tp=1: {c2}"))
        # recompute: the 30B recipe's enable_recompute (full/uniform/1) is cleared by the perf YAML
        for k in ("recompute_granularity", "recompute_method", "recompute_num_layers"):
            over = []
            try:
                at(commit, lib, r'"enable_recompute": True', rf"def {fn}\(")
                over = [at(commit, lib, rf"model_cfg.{k} = ", common, "_qwen3_moe_common, enable_recompute")]
            except KeyError:
                pass
            put(k, None, at(commit, yml, rf"{k}: null", r"ConfigContainer:") + " (ConfigContainer.model, merged after "
                f"the recipe: {at(commit, RUN_2509, r'merged_omega_conf = OmegaConf.merge')})", over)
        put("moe_token_dispatcher_type", "alltoall", at(commit, "src/megatron/bridge/models/qwen/qwen_provider.py",
            r'moe_token_dispatcher_type: str = "alltoall"', None, "Qwen3MoEModelProvider default") + "; token drop needs it: "
            + at(commit, "src/megatron/bridge/training/utils/moe_token_drop.py", r'"alltoall",'))
        tdrop = run(r"apply_moe_token_drop\(recipe.model\)")
        put("moe_expert_capacity_factor", 1.0, f"{at(commit, 'src/megatron/bridge/training/utils/moe_token_drop.py', r'moe_expert_capacity_factor: float = 1.0')} via {tdrop}")
        put("moe_pad_expert_input_to_capacity", True, f"{at(commit, 'src/megatron/bridge/training/utils/moe_token_drop.py', r'moe_pad_expert_input_to_capacity: bool = True')} via {tdrop}")
        etp = at(commit, yml, r"etp: 1", ngk)
        put("expert_tensor_parallel_size", 1, f"{etp} (perf matrix, applied by {at(commit, HELP_2509, r'expert_tensor_parallel_size = perf_overrides')})")
    if model == "DeepSeekV3":
        lib = "src/megatron/bridge/recipes/deepseek/deepseek_v3.py"
        pc = r"def pretrain_config\("
        put("use_distributed_optimizer", True, at(commit, lib, r"use_distributed_optimizer=True", pc, "pretrain_config"))
        ddp_og = run(r"recipe.comm_overlap.overlap_grad_reduce = False", "--gpu h100")
        ddp_op = at(commit, lib, r"overlap_param_gather=True", pc, "pretrain_config")
        s["grad_reduce_in_fp32"]["overrides"] = [at(commit, lib, r"grad_reduce_in_fp32=False", pc)]
        put("tp_comm_overlap", False, at(commit, lib, r"tp_comm_overlap=False", pc, "pretrain_config: no CommOverlapConfig given"))
        for k in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                  "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
            put(k, False if k.startswith("account") else None, at(commit, lib, rf"cfg.{k} = ", r"def model_config\(", "model_config"))
        c1 = run(r'layout="Et\|')
        c2 = at(commit, yml, r"pipeline_model_parallel_layout:")
        put("pipeline_model_parallel_layout", "Et|(tt|)*30mL", f"{c1} and {c2}")
        put("mtp_num_layers", 1, at(commit, lib, r"mtp_num_layers: Optional\[int\] = 1", pc, "pretrain_config default"))
        dee = run(r'enable_deepep = bool\(args.gpu.lower\(\) in \["h100"\]\)', "--gpu h100")
        c1 = at(commit, lib, r'cfg.moe_token_dispatcher_type = "flex"')
        put("moe_token_dispatcher_type", "flex", f"{c1} with {dee}")
        put("moe_flex_dispatcher_backend", "deepep", f"{at(commit, lib, r'cfg.moe_enable_deepep = True')} with {dee}")
        put("moe_router_force_load_balancing", True, run(r"moe_router_force_load_balancing = True"))
        put("moe_a2a_overlap", True, run(r"overlap_moe_expert_parallel_comm = True", "A2A_1F1B: --gpu h100"))
        put("delay_wgrad_compute", True, run(r"delay_wgrad_compute = True", "A2A_1F1B: --gpu h100"))
        put("moe_shared_expert_overlap", False, run(r"moe_shared_expert_overlap = False", "A2A_1F1B: --gpu h100"))
        put("recompute_granularity", "selective", at(commit, yml, r'recompute_granularity: "selective"'))
        put("recompute_modules", ["mla_up_proj", "mlp"], run(r'recompute_modules = \["mla_up_proj", "mlp"\]', "--gpu h100"))
        put("expert_tensor_parallel_size", 1, f"{at(commit, yml, r'etp: 1', ngk)} "
            f"(perf matrix, applied by {at(commit, HELP_2509, r'expert_tensor_parallel_size = perf_overrides')})")
    # DP/PP overlap: CommOverlapConfig.setup (config.py) sets them from the parallel sizes, over the DDP config's
    if co:
        if dp > 1:
            og = at(commit, CO_2509, r"comm_overlap_cfg.overlap_grad_reduce = True")
            op = at(commit, CO_2509, r"comm_overlap_cfg.overlap_param_gather = True")
            if model == "DeepSeekV3":
                put("overlap_grad_reduce", False, ddp_og + f" (the user value wins: {at(commit, CO_2509, r'if user_value is not None')})", [og])
            else:
                put("overlap_grad_reduce", True, f"{og} (data_parallel_size={dp} > 1)", [ddp_og])
            put("overlap_param_gather", True, f"{op} (data_parallel_size={dp} > 1)", [ddp_op])
        if pp > 1:
            v = bool(vp and vp > 1)
            put("overlap_p2p_comm", v, at(commit, CO_2509, r"comm_overlap_cfg.overlap_p2p_comm = True" if v
                                          else r"comm_overlap_cfg.overlap_p2p_comm = False"))
    else:
        put("overlap_grad_reduce", True, ddp_og)
        put("overlap_param_gather", True, ddp_op)
    # perf matrix: FSDP, CUDA graphs, recompute and offloading (helpers.py apply_perf_matrix_overrides)
    pre = f"perf_matrix.h100.num_gpus_{int(r['num_gpus'])}."
    kv = yaml_lines(src(commit, yml))
    per = {}
    for v in match:
        got = {}
        for key in ("use_megatron_fsdp", "fsdp", "cuda_graphs", "recompute_num_layers", "cpu_offloading_num_layers",
                    "nccl_ub", "keep_fp8_transpose_cache_when_using_custom_fsdp"):
            for blk in (v, "common"):
                hit = kv.get(f"{pre}{blk}.{key}")
                if hit is not None:
                    got[key] = (hit[0], f"{yml}:{hit[1]}")
                    break
        per[v] = got
    keys = set().union(*[set(g) for g in per.values()]) if per else set()
    for key in sorted(keys):
        vals = {str(g.get(key, (None,))[0]) for g in per.values()}
        if len(vals) != 1:
            unknown[key] = f"the matching perf matrix blocks {match} differ in {key}"
            continue
        val, where = next(iter(per.values()))[key]
        if key in ("use_megatron_fsdp", "fsdp"):
            put("use_megatron_fsdp", bool(val), f"{where} (applied by {at(commit, HELP_2509, r'def set_megatron_fsdp_overrides')}"
                + (f": optim_grads_params {at(commit, HELP_2509, r'data_parallel_sharding_strategy = ')}" if val else "") + ")")
        elif key == "cuda_graphs":
            put("cuda_graph_impl", None if not val else "local", f"{where} ({at(commit, HELP_2509, r'enable_cuda_graph = perf_overrides')})")
        elif key == "recompute_num_layers" and val is not None:
            rc = at(commit, HELP_2509, r'recompute_method = "block"')
            put("recompute_granularity", "full", f"{rc} (set_recompute_overrides)")
            put("recompute_method", "block", rc)
            put("recompute_num_layers", val, where)
        elif key == "cpu_offloading_num_layers" and val:
            put("cpu_offloading_num_layers", val, where)
        elif key == "nccl_ub":
            put("nccl_ub", val, where)
    # what none of the files sets: the library default (Megatron-Bridge's model provider / Megatron-Core)
    for k in ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
              "attention_backend", "cp_comm_type", "moe_token_dispatcher_type", "pipeline_model_parallel_layout",
              "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage", "moe_shared_expert_overlap",
              "tp_comm_overlap_cfg"):
        if k not in s and k not in unknown:
            if k.startswith("moe_") and not model.startswith(("Qwen3", "DeepSeek")):
                continue
            unknown[k] = "not set in the library recipe or the perf script at this commit (the library default applies)"
    return s


NFL_SCRIPTS = {  # table model -> NeMo-Framework-Launcher's H100 FP8 example command lines (examples/training/...)
    "GPT3-5B": "gpt/h100/5b_fp8_", "GPT3-20B": "gpt/h100/20b_fp8_", "GPT3-175B": "gpt/h100/175b_fp8_",
    "LLAMA2-7B": "llama/h100/llama2_7b_fp8", "LLAMA2-13B": "llama/h100/llama2_13b_fp8",
    "LLAMA2-70B": "llama/h100/llama2_70b_fp8", "LLAMA3-8B": "llama/h100/llama3_8b_fp8",
    "LLAMA3-70B": "llama/h100/llama3_70b_fp8", "Nemotron-8B": "nemotron/h100/nemotron_8b_fp8",
    "Nemotron-22B": "nemotron/h100/nemotron_22b_fp8"}
# settings an FP8 example script states for its model whatever its node count (the precision recipe)
NFL_MODEL_LEVEL = ("fp8", "fp8_hybrid", "fp8_e4m3", "optim.grad_sync_dtype")
# NeMo 1.0 -> Megatron-Core: the FP8 format (NeMo's build_transformer_config) and the only recipe of that Megatron-Core
NEMO_FP8_FORMAT = ("NVIDIA/NeMo nemo/collections/nlp/models/language_modeling/megatron_base_model.py "
                   "build_transformer_config: fp8 = None unless cfg.fp8, else 'e4m3' if cfg.fp8_e4m3 else 'hybrid' if "
                   "cfg.fp8_hybrid (ValueError if neither) -> TransformerConfig.fp8 = Megatron's --fp8-format")
MCORE_DELAYED = ("NVIDIA/Megatron-LM core_r0.8.0 megatron/core/transformer/transformer_block.py:382 (fp8_recipe = "
                 "TEDelayedScaling(...): Megatron-Core of mid-2024 has no fp8_recipe setting, every FP8 run uses "
                 "TransformerEngine's DelayedScaling); its margin/interval/amax_history_len/amax_compute_algo are the "
                 "config's fp8_margin, fp8_interval, fp8_amax_history_len, fp8_amax_compute_algo")


def nfl_script_overrides(text):
    """key (under model./trainer.) -> (value, 1-based line) of a launcher command line's ``training.X=V`` args."""
    out = {}
    for i, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*\+?training\.(model|trainer)\.([\w.]+)=(\S+?)\s*\\?$", line)
        if m:
            out[f"{m.group(1)}.{m.group(2)}"] = (yaml.safe_load(m.group(3)), i)
        m = re.match(r"\s*training/tp_overlap@training\.model\.ub_tp_comm_overlap_cfg=(\S+?)\s*\\?$", line)
        if m:
            out["model.tp_comm_overlap_cfg"] = (m.group(1), i)
        m = re.match(r"\s*\+?env_vars\.(NVTE_\w+)=(\S+?)\s*\\?$", line)  # the job's environment (stages.py)
        if m:
            out[f"env_vars.{m.group(1)}"] = (yaml.safe_load(m.group(2)), i)
    return out


NFL_MAIN = "launcher_scripts/conf/config.yaml"  # the launcher's main config: its env_vars are the job's environment
# TransformerEngine's attention selection from the environment (the TE of NeMo 24.07: 1.8.0.dev0, NeMo Framework
# user guide "Software Component Versions"; before 1.11 no FlashAttention-3 path): FlashAttention (the flash-attn 2 package) unless NVTE_FLASH_ATTN=0, cuDNN FusedAttention
# unless NVTE_FUSED_ATTN=0, cuDNN preferred on Hopper when both can run
TE_ENV = ("NVIDIA/TransformerEngine v1.8 transformer_engine/pytorch/attention.py:4429-4433 (NVTE_FLASH_ATTN, default 1), "
          ":4445-4449 (NVTE_FUSED_ATTN, default 1), :5158-5166 (FusedAttention preferred on sm90 when both run)")


def nfl_attention(ref, kv, path, here):
    """The attention backend a 24.07 job ran, in Megatron-LM's ``attention_backend`` names, from the environment
    TransformerEngine reads (:data:`TE_ENV`): the launcher's main config ``env_vars`` (exported into the job:
    launcher_scripts/nemo_launcher/core/stages.py:511-523 ``get_env_vars``), then the training config's own
    ``env_vars`` block where it has one, then the example script at this node count (``+env_vars.X=V``).
    ``flash`` (NVTE_FUSED_ATTN=0: TE's FlashAttention, what Megatron-LM's ``attention_backend=flash`` sets,
    megatron/core/models/common/language_module/language_module.py:112-115), else None (``auto``: TE chooses)."""
    main = yaml_lines(subprocess.run(["git", "-C", NFL_DIR, "show", f"{ref}:{NFL_MAIN}"], capture_output=True,
                                     text=True, check=True).stdout)
    env = {}
    for k in ("NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN"):
        for hit, where in ((main.get(f"env_vars.{k}"), NFL_MAIN), (kv.get(f"env_vars.{k}"), path),
                           *((o.get(f"env_vars.{k}"), n) for n, o in here[:1])):
            if hit is not None and hit[0] is not None:
                env[k] = (int(hit[0]), f"{where}:{hit[1]}")
    fused, flash = env.get("NVTE_FUSED_ATTN", (1, "")), env.get("NVTE_FLASH_ATTN", (1, ""))
    where = fused[1] or flash[1] or NFL_MAIN
    said = (f"{where} (NVTE_FUSED_ATTN={fused[0]}{'' if fused[1] else ', TE default'}; NVTE_FLASH_ATTN={flash[0]}"
            + (f" at {flash[1]})" if flash[1] else ", TE default)"))
    if fused[0] == 0 and flash[0] != 0:
        return {"value": "flash", "cite": f"{said}: cuDNN FusedAttention off, TE's FlashAttention runs; {TE_ENV}"}
    if fused[0] == 0:
        return {"value": "unfused", "cite": f"{said}: both fused kernels off; {TE_ENV}"}
    return {"value": None, "cite": f"{said}: TE chooses (attention_backend auto); {TE_ENV}"}


def nfl_scripts(model, ref=None):
    """[(path, overrides)] of the model's H100 FP8 example scripts at the launcher tag (or ``ref``)."""
    ref = ref or NFL_TAG
    if model not in NFL_SCRIPTS:
        return []
    names = subprocess.run(["git", "-C", NFL_DIR, "ls-tree", "-r", "--name-only", ref, "examples/training"],
                           capture_output=True, text=True, check=True).stdout.split()
    pre = f"examples/training/{NFL_SCRIPTS[model]}"
    out = []
    for n in sorted(x for x in names if x.startswith(pre) and x.endswith(".sh")):
        text = subprocess.run(["git", "-C", NFL_DIR, "show", f"{ref}:{n}"], capture_output=True, text=True,
                              check=True).stdout
        out.append((n, nfl_script_overrides(text)))
    return out


def nemo_row_at(r, ref=None, config=None, scripts_apply=True):
    """One 24.07 row read from ``config`` (default: the model's, :data:`NFL_CONFIGS`) at launcher ``ref`` (default:
    the tag), with the model's FP8 example scripts at ``ref`` applied (unless ``scripts_apply`` is False: a config
    no example script runs)."""
    model = r["model"]
    ref = ref or NFL_TAG
    base = {"recipe_source": {"repo": NFL_REPO, "tag": NFL_TAG, "rule": NFL_RULE}}
    if ref != NFL_TAG:
        base["recipe_source"]["read_at"] = ref
    if model not in NFL_CONFIGS or not NFL_DIR:
        return {**base, "status": "not_read", "unknown": {"all": "no launcher config mapped for this model"}}
    path = f"launcher_scripts/conf/training/{config or NFL_CONFIGS[model]}.yaml"
    text = subprocess.run(["git", "-C", NFL_DIR, "show", f"{ref}:{path}"], capture_output=True, text=True,
                          check=True).stdout
    kv = yaml_lines(text)
    s, unknown, checks = {}, {}, {}
    for key, name in NFL_KEYS.items():
        hit = kv.get(f"model.{key}")
        if hit is not None:
            s[name] = {"value": hit[0], "cite": f"{path}:{hit[1]}"}
    for line_no, line in enumerate(text.splitlines(), 1):
        if "tp_overlap@model.ub_tp_comm_overlap_cfg" in line:
            s["tp_comm_overlap_cfg"] = {"value": line.split(":", 1)[1].strip(), "cite": f"{path}:{line_no}"}
    # the model's FP8 example command lines: the one at this row's node count overrides everything it states;
    # the precision keys every script of the model agrees on apply at any node count
    nodes = int(r["num_gpus"]) // 8
    scripts = nfl_scripts(model, ref) if r["precision"].startswith("FP8") and scripts_apply else []
    here = [(n, o) for n, o in scripts if o.get("trainer.num_nodes", (None,))[0] == nodes]
    applied = {}
    for key in NFL_MODEL_LEVEL:
        vals = {o[f"model.{key}"][0] for _, o in scripts if f"model.{key}" in o}
        if len(vals) == 1 and scripts and all(f"model.{key}" in o for _, o in scripts):
            n, o = (here or scripts)[0]
            applied[key] = (o[f"model.{key}"][0], f"{n}:{o[f'model.{key}'][1]}"
                            + ("" if here else f" (every FP8 example script of the model sets it: "
                                              f"{[x for x, _ in scripts]}; none at {nodes} nodes)"))
    for n, o in here[:1]:
        for k, (v, line) in o.items():
            if k.startswith("model.") and k[6:] not in applied and (k[6:] in NFL_KEYS or k[6:] in NFL_SIZES):
                applied[k[6:]] = (v, f"{n}:{line}")
    sizes_over = {}
    for key, (v, c) in applied.items():
        if key in NFL_SIZES:
            sizes_over[key] = (v, c)
            continue
        name = NFL_KEYS.get(key, key)
        prev = s.get(name)
        s[name] = {"value": v, "cite": c, **({"overrides": [prev["cite"]]} if prev else {})}
    if scripts:
        base["example_scripts"] = {"scripts": [n for n, _ in scripts], "at_this_node_count": [n for n, _ in here]}
    for key, col in NFL_SIZES.items():
        v, line = kv.get(f"model.{key}", (None, None))
        c = f"{path}:{line}" if line else "not in the config"
        if key in sizes_over:
            v, c = sizes_over[key]
        t = r[col]
        tv = None if t in ("", "n/a") else int(float(t))
        checks[col] = {"table": tv, "recipe": v, "agree": tv == v or (tv in (None, 1) and v in (None, 1)), "cite": c}
    if not scripts_apply:  # a config run as is: its node count is the run's too
        v, line = kv.get("trainer.num_nodes", (None, None))
        checks["nodes"] = {"table": nodes, "recipe": v, "agree": v == nodes,
                           "cite": f"{path}:{line}" if line else "not in the config"}
    s["attention_backend"] = nfl_attention(ref, kv, path, here)
    if r["precision"].startswith("FP8"):
        ub_fp8_buf(s, ref)
        on = s.get("fp8_enabled", {}).get("value")
        e4, hy = s.get("fp8_e4m3", {}).get("value"), s.get("fp8_hybrid", {}).get("value")
        fmt = "e4m3" if e4 else "hybrid" if hy else None
        if fmt is None:
            unknown["fp8"] = (f"the table says FP8 but neither fp8_e4m3 nor fp8_hybrid is set in {path} or an FP8 "
                              "example script of the model (NeMo refuses fp8 without one): the format the run used "
                              "is not stated")
        else:
            src_ = s["fp8_e4m3" if e4 else "fp8_hybrid"]["cite"]
            s["fp8"] = {"value": fmt, "cite": f"{src_} ({'fp8_e4m3' if e4 else 'fp8_hybrid'}; the table's precision "
                        f"FP8, nemo_performance_summary.md:{r['source_line']}), read as {NEMO_FP8_FORMAT}",
                        **({"note": f"fp8 itself is {on!r} at {s['fp8_enabled']['cite']}: the run enabled it on "
                                    "its command line"} if on is not True else {})}
            lines = [kv.get(f"model.{k}", (None, None))[1] for k in ("fp8_margin", "fp8_interval",
                                                                  "fp8_amax_history_len", "fp8_amax_compute_algo")]
            lines = [x for x in lines if x]
            s["fp8_recipe"] = {"value": "delayed", "cite": (f"{path}:{min(lines)}-{max(lines)} (fp8_margin, "
                                                            "fp8_interval, fp8_amax_history_len, "
                                                            "fp8_amax_compute_algo: DelayedScaling's parameters); "
                                                            if lines else f"{path}; ") + MCORE_DELAYED}
            amp = s.get("megatron_amp_O2", {}).get("cite", path)
            s["fp8_param_gather"] = {"value": False, "cite": f"{amp} (megatron_amp_O2: bf16 parameters; neither the "
                                     "config nor the script has an FP8-parameter option, Megatron-Core core_r0.8.0 "
                                     "none of --fp8-param-gather's kind)"}
    elif r["precision"] == "BF16":
        s["fp8"] = {"value": None, "cite": f"{path} (the table's precision BF16, nemo_performance_summary.md:"
                    f"{r['source_line']})"}
    caveats = {}
    if not all(c["agree"] for c in checks.values()):
        caveats["run_overrides"] = ("the table's sizes differ from this config and its example script at this node "
                                    "count (see checks): the published run overrode them on a command line that is "
                                    "not in the repository; the sizes are the table's, the other settings the "
                                    "config's and the scripts'")
    return {**base, "status": "partial" if unknown else "read", "config_file": path, "settings": s,
            "unknown": unknown, "caveats": caveats, "checks": checks}


UB_RS_LAYERS = ("proj_fprop", "fc2_fprop")  # TE initialize_ub honours fp8_buf for these only (llmcomm.predict.fp8_wire)


def ub_fp8_buf(s, ref):
    """``tp_comm_overlap_fp8_buf``: the row-parallel fprop layers whose userbuffers config (the row's
    ``tp_comm_overlap_cfg``, launcher_scripts/conf/training/tp_overlap/<cfg>.yaml at ``ref``) sets ``fp8_buf``
    (their reduce-scatter then moves the FP8 GEMM output); none where no config is named (TE's defaults)."""
    name = s.get("tp_comm_overlap_cfg", {}).get("value")
    if not name:
        return
    path = f"launcher_scripts/conf/training/tp_overlap/{name}.yaml"
    kv = yaml_lines(subprocess.run(["git", "-C", NFL_DIR, "show", f"{ref}:{path}"], capture_output=True, text=True,
                                   check=True).stdout)
    on = [(n, kv[f"{n}.fp8_buf"][1]) for n in UB_RS_LAYERS if kv.get(f"{n}.fp8_buf", (None,))[0]]
    s["tp_comm_overlap_fp8_buf"] = {
        "value": [n for n, _ in on],
        "cite": (f"{path}:" + ",".join(str(x) for _, x in on) + " (fp8_buf)" if on else
                 f"{path} (no fp8_buf under {' or '.join(UB_RS_LAYERS)})")}


NFL_RULE = ("NeMo 24.07 (NeMo 1.0) trains with the NeMo-Framework-Launcher's training configs; read at the launcher's "
            "24.07 tag, with the command-line overrides of the launcher's H100 FP8 example script of the model "
            "(examples/training/<family>/h100/*_fp8*.sh)")
# The perf team's configs of the 24.07 numbers: NVIDIA/NeMo-Framework-Launcher PR #384 ('cleanup', Sangkug Lym),
# merged into main on 2024-08-13 as 20ab57b3, the day before the 24.07 table was first published (NVIDIA/NeMo
# 164b0097f8, 2024-08-14, docs/source/performance/performance_summary.md; its later numbers 9c5c5e9709 (2024-09-09)
# co-authored by Sangkug Lym). Its commits change GPT-3 175B's VP to 6 (77b69bba, the table's VP) and add the 64-node
# GPT-3 175B config of the table's 512-GPU row (121c975d, 175b_mlperf.yaml; the table links that row to MLPerf).
NFL_PERF_REV = "20ab57b3f258d1ab404379cd24b2142a7dbe9cee"
NFL_PERF_EXTRA = {"GPT3-175B": ("gpt3/175b_mlperf",)}  # configs at NFL_PERF_REV no example script runs
NFL_LAYOUT = ("tp", "pp", "vp", "cp")


def _agree(body):
    return all(c["agree"] for c in body.get("checks", {}).values())


def _later_layout_rev(path, r):
    """The first commit after the tag (on the launcher's main line) at which ``path`` states the table's parallel
    layout (tp, pp, vp, cp), with its key -> (value, line) and the keys it states twice; None if none does."""
    revs = subprocess.run(["git", "-C", NFL_DIR, "log", "--reverse", "--format=%H", f"{NFL_TAG}..HEAD", "--", path],
                          capture_output=True, text=True, check=True).stdout.split()
    want = {c: (None if r[c] in ("", "n/a") else int(float(r[c]))) for c in NFL_LAYOUT}
    for rev in revs:
        text = subprocess.run(["git", "-C", NFL_DIR, "show", f"{rev}:{path}"], capture_output=True, text=True,
                              check=False).stdout
        if not text:
            continue
        kv = yaml_lines(text)
        got = {col: kv.get(f"model.{key}", (None, None))[0] for key, col in NFL_SIZES.items() if col in NFL_LAYOUT}
        if all(got[c] == want[c] or (want[c] in (None, 1) and got[c] in (None, 1)) for c in NFL_LAYOUT):
            keys = [ln.split(":", 1)[0].strip() for ln in text.splitlines() if re.match(r"^  [a-z_]+:", ln)]
            dup = {k for k in keys if keys.count(k) > 1}
            return rev, kv, dup
    return None


def nemo_row(r):
    """A 24.07 row's recipe. (1) The model's config and FP8 example scripts at the 24.07 tag; (2) where the table's
    sizes disagree there, the perf team's revision (:data:`NFL_PERF_REV`): the model's config with its scripts,
    then the configs no script runs (:data:`NFL_PERF_EXTRA`, their node count checked too); the first whose sizes
    all agree with the table is the row's recipe; (3) where none agrees, the tag's reading, and if a later revision
    of the config is the first to state the table's parallel layout, every setting that revision states otherwise
    (or twice: OmegaConf refuses duplicate keys) is unknown (settings the example scripts set excepted): the run's command line is not in the repository and
    the only config of its layout disagrees with the tag's."""
    body = nemo_row_at(r)
    if body.get("status") == "not_read" or _agree(body):
        return body
    for config, apply in ((None, True), *((c, False) for c in NFL_PERF_EXTRA.get(r["model"], ()))):
        alt = nemo_row_at(r, NFL_PERF_REV, config, apply)
        if _agree(alt):
            alt["recipe_source"]["why"] = (f"the table's sizes disagree with the tag's config (see tag_checks); every "
                                           f"size agrees with this config at {NFL_PERF_REV[:8]} (the perf team's "
                                           "revision of the 24.07 numbers, NFL_PERF_REV in read_nemo_recipes.py)")
            alt["tag_checks"] = body["checks"]
            return alt
    perf = nemo_row_at(r, NFL_PERF_REV)
    got, was = perf["settings"].get("attention_backend", {}), body["settings"].get("attention_backend", {})
    if got.get("value") != was.get("value"):  # the environment is the scripts', not the config's
        body["unknown"]["attention_backend"] = (f"the tag's environment gives {was.get('value')!r} ({was.get('cite')}); "
                                                f"at {NFL_PERF_REV[:8]}, the perf team's revision, {got.get('value')!r} "
                                                f"({got.get('cite')}); the run's command line is not in the repository")
        body["status"] = "partial"
    tag_layout = all(body["checks"][c]["agree"] for c in NFL_LAYOUT)
    later = None if tag_layout else _later_layout_rev(body["config_file"], r)
    if later is not None:
        rev, kv, dup = later
        for key, name in NFL_KEYS.items():
            if (name not in body["settings"] or name == "tp_comm_overlap_cfg"
                    or not body["settings"][name]["cite"].startswith(body["config_file"])):
                continue  # what an example script sets is the script's, whatever the config says
            hit = kv.get(f"model.{key}")
            was = body["settings"][name]
            if key in dup or (hit is not None and hit[0] != was["value"]):
                said = "states it twice (OmegaConf refuses duplicate keys)" if key in dup else f"sets {hit[0]!r}"
                body["unknown"][name] = (f"{was['cite']} sets {was['value']!r} at the tag, whose layout is not the "
                                         f"table's; {body['config_file']} at {rev[:8]}, the first revision with the "
                                         f"table's tp/pp/vp/cp, {said}" + (f" (line {hit[1]})" if hit else "") +
                                         "; the run's command line is not in the repository")
        body["status"] = "partial" if body["unknown"] else body["status"]
        body["caveats"]["layout_revision"] = (f"{body['config_file']} at {rev[:8]} is the first revision with the "
                                              "table's tp/pp/vp/cp; settings it states otherwise are unknown, the "
                                              "others read at the tag" + ("" if body["unknown"] else
                                                                         " (it states none otherwise)"))
    return body


@functools.cache
def src(commit, path):
    return subprocess.run(["git", "-C", GIT_DIR, "show", f"{commit}:{path}"], capture_output=True, text=True, check=True).stdout

def _val(node, text):
    try:
        return ast.literal_eval(node)
    except Exception:
        return ast.get_source_segment(text, node)


def consts(commit, path):
    """NAME -> {field: (value, line)} for WorkloadBaseConfig(...) / replace(BASE, ...) chains."""
    text = src(commit, path)
    tree = ast.parse(text)
    raw = {}
    for st in tree.body:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            raw[st.targets[0].id] = (st.value, st.lineno)
    out = {}

    def resolve(name, depth=0):
        if name in out:
            return out[name]
        if name not in raw or depth > 20:
            return None
        v, line = raw[name]
        res = {}
        if isinstance(v, ast.Name):
            res = dict(resolve(v.id, depth + 1) or {})
        elif isinstance(v, ast.Call):
            f = ast.get_source_segment(text, v.func)
            if f == "replace" and v.args and isinstance(v.args[0], ast.Name):
                res = dict(resolve(v.args[0].id, depth + 1) or {})
            for kw in v.keywords:
                if kw.arg:
                    res[kw.arg] = (_val(kw.value, text), kw.value.lineno)
            res["__def__"] = (name, line)
        out[name] = res
        return res
    for n in raw:
        resolve(n)
    return out


def function(commit, path, fname):
    """[(kind, target, value, line)] of a function's assignments and calls (nested blocks included)."""
    text = src(commit, path)
    tree = ast.parse(text)
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fname), None)
    if fn is None:
        return None
    rows = [("def", fname, "", fn.lineno)]
    for a, d in zip(fn.args.args[len(fn.args.args) - len(fn.args.defaults):], fn.args.defaults, strict=True):
        rows.append(("default", a.arg, _val(d, text), d.lineno))
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                rows.append(("assign", ast.get_source_segment(text, t), _val(n.value, text), n.lineno))
        elif isinstance(n, ast.Expr) and isinstance(n.value, ast.Call):
            rows.append(("call", ast.get_source_segment(text, n.value.func), ast.get_source_segment(text, n.value)[:200], n.lineno))
        elif isinstance(n, ast.keyword) and n.arg:
            rows.append(("kw", n.arg, _val(n.value, text), n.value.lineno))
        elif isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values, strict=True):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    rows.append(("key", k.value, _val(v, text), v.lineno))
        elif isinstance(n, ast.Return) and n.value is not None:
            rows.append(("return", "", ast.get_source_segment(text, n.value)[:300], n.lineno))
    return sorted(rows, key=lambda r: r[3])


def main(csv_path, out_path):
    rows = list(csv.DictReader(open(csv_path, encoding="utf-8")))
    doc = {"about": "Recipe settings of NVIDIA's published DGX-H100 pre-training rows (nemo/h100_pretraining.csv), "
                    "each read from NVIDIA's own performance scripts with the file and line it was read from; "
                    "'unknown' where the scripts were not read or do not state it. Generated by "
                    "data/published/read_nemo_recipes.py, reading Megatron-Bridge's Python files with ast and the "
                    "YAML files (Megatron-Bridge 25.09 perf matrices, NeMo-Framework-Launcher 24.07 training configs) "
                    "with yaml.compose, never executing them, at the commits/tags named; paths are relative to the "
                    "repository named per row. 'checks' compare the table's sizes with the recipe's (disagreements "
                    "kept as found).",
           "rows": []}
    for r in rows:
        key = {"container": r["container"], "model": r["model"], "num_gpus": int(r["num_gpus"]),
               "source_file": r["source_file"], "source_line": int(r["source_line"])}
        body = nemo_row(r) if r["source_file"].startswith("nemo_") else mb_row(r)
        doc["rows"].append({"row": key, **body})
    open(out_path, "w").write(yaml.safe_dump(doc, sort_keys=False, width=140, allow_unicode=True))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--git-dir", required=True, help="a clone (or bare mirror) of NVIDIA-NeMo/Megatron-Bridge")
    ap.add_argument("--launcher-git-dir", default="", help="a clone of NVIDIA/NeMo-Framework-Launcher (24.07 rows)")
    ap.add_argument("csv", help="nemo/h100_pretraining.csv (llmcomm.data.path)")
    ap.add_argument("out", help="where to write the YAML")
    args = ap.parse_args()
    GIT_DIR = args.git_dir
    NFL_DIR = args.launcher_git_dir
    main(args.csv, args.out)
    sys.exit(0)
