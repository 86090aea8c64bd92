"""Generate data/published/nemo_h100_recipes.yaml: each DGX-H100 row's recipe settings, read (never executed) from
Megatron-Bridge's scripts/performance at the commit that published the row, or (NeMo 24.07) from
NeMo-Framework-Launcher's training configs at its 24.07 tag.

    python data/published/read_nemo_recipes.py --git-dir MB_CLONE --launcher-git-dir NFL_CLONE CSV OUT
"""
import argparse
import ast
import csv
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
    "GPT OSS 120B": ("gpt_oss", "gpt_oss", "gpt_oss_120b", None),
    "Qwen3_30B_a3B": ("qwen", "qwen3", "qwen3_30b_a3b", None),
    "Qwen3_235B_a22B": ("qwen", "qwen3", "qwen3_235b_a22b", None),
    "Nemotron_3_Nano": ("nemotronh", "nemotron_3_nano", "nemotron_3_nano", None),
    "DeepSeekV3": ("deepseek", "deepseek", "deepseek_v3", None),
}
PREC = {"FP8": "FP8_CS", "FP8-CS": "FP8_CS", "BF16": "BF16"}
LIB = "src/megatron/bridge/recipes/llama/llama3.py"


def cite(path, line, what=""):
    return f"{path}:{line}" + (f" ({what})" if what else "")


def base_model(name):
    return re.sub(r"\s*\((dropless|tokendrop)\)$", "", name)


def workload(commit, fam, stem, recipe, prec, gbs):
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
    pick = (match or names)[-1]
    rule = ("the H100 constant of this precision whose global_batch_size equals the table's"
            if match else "the H100 constant of this precision (none has the table's global batch size)")
    return path, (pick, cs[pick]), rule


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
    wpath, w, rule = workload(commit, fam, stem, recipe, prec, int(r["gbs"]))
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
        lrow = fn_rows(commit, LIB, libfn) or []
        crow = fn_rows(commit, LIB, "_llama3_common") or []
        com = fn_rows(commit, perf, f"set_{stem}_common_configs") or []
        chain = [(LIB, "_llama3_common", crow), (LIB, libfn, lrow), (perf, f"set_{stem}_common_configs", com),
                 (perf, f"{recipe}_pretrain_config_h100", hrow or [])]

        def resolve(name, targets, kws=(), keys=()):
            found = []
            for path, fn, rows in chain:
                for k, t, v, line in rows:
                    if (k == "assign" and t in targets) or (k == "kw" and t in kws) or (k == "key" and t in keys) \
                            or (k == "default" and t in keys):
                        found.append((v, cite(path, line, fn)))
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
        out["status"] = "read"
    if "recompute_num_layers" in s:
        s["recompute_granularity"] = {"value": "full", "cite": "scripts/performance/utils/overrides.py "
                                      "_set_recompute_overrides (recompute_num_layers set -> granularity full, method block)"}
        s["recompute_method"] = {"value": "block", "cite": s["recompute_granularity"]["cite"]}
    out["settings"], out["unknown"], out["checks"] = s, unknown, checks
    out["not_in_repo"] = "the command line of the published runs (any CLI overrides) is not in the repository"
    return out


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
    res = {"status": "partial", "perf_matrix": {"file": path, "variants": variants, "matching_table": match,
                                                "rule": "precision blocks whose tp/pp/cp/vp/ep/mbs/gbs and FSDP equal "
                                                        "the table's row"}}
    unknown = {"recipe": "library recipe defaults (overlap, optimizer, recompute) of 25.09 not read"}
    fp8 = [v for v in match if v.startswith("fp8")]
    if match and len(fp8) == len(match):
        res["settings"] = {"fp8": {"value": "unknown", "cite": f"{path} (only FP8 blocks {match} match the row)"}}
        unknown["fp8"] = f"the row matches the FP8 blocks {match} of the perf matrix; which FP8 recipe ran is not stated"
    else:
        unknown["precision"] = (f"the 25.09 table prints no precision and the perf matrix blocks matching the row "
                                f"are {match or 'none'}")
    res["unknown"] = unknown
    return res


def nemo_row(r):
    model = r["model"]
    base = {"recipe_source": {"repo": NFL_REPO, "tag": NFL_TAG, "rule": "NeMo 24.07 (NeMo 1.0) trains with the "
                              "NeMo-Framework-Launcher's training configs; read at the launcher's 24.07 tag"}}
    if model not in NFL_CONFIGS or not NFL_DIR:
        return {**base, "status": "not_read", "unknown": {"all": "no launcher config mapped for this model"}}
    path = f"launcher_scripts/conf/training/{NFL_CONFIGS[model]}.yaml"
    text = subprocess.run(["git", "-C", NFL_DIR, "show", f"{NFL_TAG}:{path}"], capture_output=True, text=True,
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
    for key, col in NFL_SIZES.items():
        v, line = kv.get(f"model.{key}", (None, None))
        t = r[col]
        tv = None if t in ("", "n/a") else int(float(t))
        checks[col] = {"table": tv, "recipe": v, "agree": tv == v or (tv in (None, 1) and v in (None, 1)),
                       "cite": f"{path}:{line}" if line else "not in the config"}
    fp8_on = s.get("fp8_enabled", {}).get("value")
    if fp8_on is not True:
        unknown["fp8"] = (f"the config states fp8: {fp8_on} ({s.get('fp8_enabled', {}).get('cite', path)}) while the "
                          "table's heading says FP8: the published run set FP8 (and its format) outside this file")
    if not all(c["agree"] for c in checks.values()):
        unknown["run_overrides"] = ("the table's sizes differ from this config (see checks): the published run "
                                    "overrode it; settings here are the config's, which the run may also have overridden")
    return {**base, "status": "partial", "config_file": path, "settings": s, "unknown": unknown, "checks": checks}

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
