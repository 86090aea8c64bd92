"""NVIDIA's published DGX-H100 pre-training rows (NeMo 24.07, Megatron-Bridge containers 25.09–26.06) as a tidy
table, each row with the recipe settings read from NVIDIA's own performance scripts, in Megatron-LM's names.

Data: ``nemo/h100_pretraining.csv`` (through :func:`llmcomm.data.path`: every DGX-H100 row of the two published
tables, numbers as printed, ``step_time_s_derived = gbs·seq/(tokens/s/GPU · GPUs)``, ``notes`` flagging rows that
are inconsistent in the source) and ``data/published/nemo_h100_recipes.yaml`` (per row, the settings read from
Megatron-Bridge's ``scripts/performance`` at the commit that published the row, each with its file and line;
settings not read are ``unknown``). Compare the derived step time, not TFLOP/s: 24.07 counts attention FLOPs
non-causally, later releases causally.

:func:`settings` turns one row into the candidate columns of :func:`llmcomm.overhead.iteration.iteration_times`
and into the settings the formulation may not yet express, all in Megatron-LM's argument names (``fp8``,
``tp_comm_overlap``, ``overlap_param_gather``, ``recompute_num_layers``, ``account_for_embedding_in_pipeline_split``,
``attention_backend``, ``cp``, ``fsdp``, ...). Parallel sizes come from the table (the measurement's own
statement); everything else from the recipe file, never guessed: a setting the recipe file leaves unknown is
named in ``unknown`` and the formulation's default is used for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pandas as pd
import yaml

from ..errors import DataError
from ..paths import data_dir

FILE = "nemo/h100_pretraining.csv"
RECIPES = "published/nemo_h100_recipes.yaml"
CLUSTER = "h100-80g-ndr400"  # DGX H100: 8x H100 SXM5, NVLink 4, 8x ConnectX-7 NDR 400 Gb/s
NEED = ("source_file", "container", "precision", "model", "num_gpus", "gbs", "mbs", "seq_len", "fsdp", "tp", "pp",
        "cp", "vp", "ep", "step_time_s_derived", "notes", "source_line")
# the table's model names -> the kit's catalogue (data/models); other models are not in the catalogue
CATALOGUE = {"GPT3-5B": "gpt3-5b", "GPT3-20B": "gpt3-20b", "Nemotron-8B": "nemotron3-8b",
             "Nemotron-22B": "nemotron3-22b", "GPT3-175B": "gpt3-175b", "LLAMA2-7B": "llama2-7b", "LLAMA2-13B": "llama2-13b",
             "LLAMA2-70B": "llama2-70b", "LLAMA3-8B": "llama3-8b", "LLAMA3_8B": "llama3-8b",
             "LLAMA3-70B": "llama3-70b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3.1-405b",
             "Nemotron-340B": "nemotron4-340b", "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_235B_a22B": "qwen3-235b-a22b",
             "GPT OSS 120B": "gpt-oss-120b", "DeepSeekV3": "deepseek-v3"}
NOT_EXPRESSIBLE = {
    "Nemotron_3_Nano": "hybrid Mamba-Transformer MoE: Mamba layers are not expressible in ModelSpec",
}
# the mechanism a model the catalogue cannot hold needs (the refusal's name)
MODEL_NEEDS = {"Nemotron_3_Nano": "model:mamba-hybrid"}
# Megatron-LM / Megatron-Bridge / NeMo recipe names -> the ParallelConfig field of the same setting (Megatron's
# argument and TransformerConfig names the kit spells differently); every other recipe name is looked up as is
ALIASES = {"use_megatron_fsdp": "fsdp", "use_distributed_optimizer": "distributed_optimizer",
           "expert_tensor_parallel_size": "etp", "context_parallel_size": "cp",
           "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
           "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage"}
RECIPE_NAMES = ALIASES  # the former name of this table
# settings the table states (the measurement's own statement of its parallel layout): the recipe's are checks only
TABLE_OWNED = frozenset({"tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "global_batch", "seq_len", "sp",
                         "fsdp", "schedule"})
# what the formulation does when a setting is absent: a row whose setting has this value needs no mechanism
OFF: dict[str, Any] = {
    "fp8": None, "fp8_recipe": None, "fp8_param_gather": False, "first_last_layers_bf16": False,
    "tp_comm_overlap": False, "overlap_param_gather": False, "overlap_grad_reduce": False,
    "recompute_num_layers": None, "recompute_modules": None, "recompute_method": None,
    "account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False,
    "pp_layout": None, "pipeline_model_parallel_layout": None, "cp": 1, "fsdp": False, "attention_backend": "unfused",
    "cpu_offloading_num_layers": None, "fp8_dot_product_attention": None, "moe_a2a_overlap": False,
    "overlap_p2p_comm": False, "etp": None, "moe_shared_expert_overlap": False, "moe_flex_dispatcher_backend": None,
    "num_layers_in_first_pipeline_stage": None, "num_layers_in_last_pipeline_stage": None, "cp_comm_type": None,
    # multi-token prediction: the catalogue's DeepSeek-V3 has its layer's parameters, but no MTP layer's compute or
    # calls are in the step description, the formulation or the predictor (setting:mtp_num_layers when set)
    "mtp_num_layers": 0,
}
# settings with no effect on the formulation's terms (said so, not silently dropped)
IGNORED = {
    "cuda_graph_impl": "CUDA graphs remove host launch cost; the formulation's launch floor is fitted, not modelled",
    "cuda_graph_scope": "see cuda_graph_impl", "nccl_ub": "NCCL user buffers: no modelled effect",
    "tp_comm_overlap_cfg": "the userbuffers configuration of tp_comm_overlap", "sequence_parallel": "sp column",
    "megatron_amp_O2": "NeMo 1.0: bf16 parameters with fp32 main weights, the formulation's default",
    "fp8_enabled": "NeMo 1.0 config's fp8 switch, read into fp8 (the format) by the recipe file",
    "fp8_hybrid": "read into fp8 by the recipe file", "fp8_e4m3": "read into fp8 by the recipe file",
    "use_megatron_fsdp": "fsdp column (the table's FSDP)", "fsdp": "fsdp column (the table's FSDP)",
    # token drop and forced balancing (Megatron-Bridge 25.09's MoE rows): the formulation's MoE layer already times
    # balanced routing, every expert k·T/E tokens (llmcomm.overhead.iteration gemms: "balanced routing")
    "moe_expert_capacity_factor": "1.0 with padding to capacity: every expert gets exactly its balanced share k·T/E "
                                  "of the tokens, what the formulation times (balanced routing)",
    "moe_pad_expert_input_to_capacity": "see moe_expert_capacity_factor",
    "moe_router_force_load_balancing": "forced balanced routing: what the formulation times (balanced routing)",
}


def _fields() -> frozenset[str]:
    import dataclasses

    from ..specs import ParallelConfig

    return frozenset(f.name for f in dataclasses.fields(ParallelConfig))


@lru_cache(maxsize=2)
def _recipes(path: str, stamp: int) -> dict[tuple[str, str, int], dict[str, Any]]:
    try:
        doc = yaml.safe_load(open(path, encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise DataError(f"{path}: cannot read the recipe file: {e}") from None
    out = {}
    for i, r in enumerate(doc.get("rows") or []):
        try:
            k = r["row"]
            out[(str(k["container"]), str(k["model"]), int(k["source_line"]))] = r
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{path}: rows[{i}] has no row key (container, model, source_line): {e}") from None
    return out


def recipes() -> dict[tuple[str, str, int], dict[str, Any]]:
    """The recipe file's rows by (container, model, source_line)."""
    p = data_dir() / RECIPES
    if not p.is_file():
        raise DataError(f"{p}: missing; regenerate it with data/published/read_nemo_recipes.py")
    return _recipes(str(p), p.stat().st_mtime_ns)


def read(file: str | None = None) -> pd.DataFrame:
    """The 48 rows with numeric ``num_gpus, gbs, mbs, seq_len, tp, pp, cp, vp, ep, fsdp`` (absent: 1, ``vp`` 1,
    ``fsdp`` 0), ``dp = num_gpus / (tp·pp·cp)``, ``time_s`` (the derived step time), ``group`` (the model),
    ``flagged`` (the source is inconsistent: the notes say so). :class:`DataError` names the file, row and rule."""
    from .. import data

    p = file or data.path(FILE)
    try:
        df = pd.read_csv(p, dtype={"container": str})
    except (OSError, ValueError) as e:
        raise DataError(f"{p}: cannot read as CSV: {e}") from None
    missing = [c for c in NEED if c not in df.columns]
    if missing:
        raise DataError(f"{p}: missing column(s) {missing}")
    for c, default in (("num_gpus", None), ("gbs", None), ("mbs", None), ("seq_len", None), ("tp", 1), ("pp", 1),
                       ("cp", 1), ("vp", 1), ("ep", 1), ("fsdp", 0)):
        v = pd.to_numeric(df[c].replace("n/a", None), errors="coerce")
        if default is None and v.isna().any():
            i = int(v.isna().to_numpy().argmax())
            raise DataError(f"{p}: row {i}: column {c!r}={df[c].iloc[i]!r} must be a number")
        df[c] = v.fillna(default).astype(int)
    t = pd.to_numeric(df["step_time_s_derived"], errors="coerce")
    if not (t > 0).all():
        i = int((~(t > 0)).to_numpy().argmax())
        raise DataError(f"{p}: row {i}: step_time_s_derived={df['step_time_s_derived'].iloc[i]!r} must be > 0")
    df["time_s"] = t
    denom = df["tp"] * df["pp"] * df["cp"]
    if (df["num_gpus"] % denom).any():
        i = int((df["num_gpus"] % denom != 0).to_numpy().argmax())
        raise DataError(f"{p}: row {i}: tp*pp*cp={denom.iloc[i]} does not divide num_gpus={df['num_gpus'].iloc[i]}")
    df["dp"] = df["num_gpus"] // denom
    notes = df["notes"].fillna("")
    df["flagged"] = notes.str.contains("INCONSISTENT|does not divide", regex=True)
    df["group"] = df["model"].str.replace(r"\s*\((dropless|tokendrop)\)$", "", regex=True)
    return df


@dataclass
class RowSettings:
    """One row in the kit's terms: the ``model`` catalogue name (or ``None`` with ``model_issue``), the
    candidate ``columns``, every recipe ``setting`` (Megatron's names, value; ``cites`` file:line), the settings
    the recipe file leaves ``unknown`` (not read), those it read and found not set (``defaulted``: the
    library's default applies), and the ``ignored`` ones with why."""

    model: str | None
    model_issue: str = ""
    columns: dict[str, Any] = field(default_factory=dict)
    setting: dict[str, Any] = field(default_factory=dict)
    cites: dict[str, str] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)
    defaulted: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)
    caveats: dict[str, str] = field(default_factory=dict)


def settings(row: pd.Series) -> RowSettings:
    """The kit's view of one row (module docstring). Generic: every recipe setting whose Megatron name
    (:data:`ALIASES` where the kit spells it differently) is a :class:`~llmcomm.specs.ParallelConfig` field becomes
    a candidate column; the rest stay in ``setting`` for the caller to refuse unless off (:func:`is_off`). Only
    the recipe dialects are translated here: NeMo 1.0's names (``optimizer``, ``grad_sync_dtype``,
    ``use_flash_attention``) and Megatron's recompute triple (granularity, method, layers) into the ``recompute``
    column, with ``recompute_method``/``recompute_num_layers`` as their own columns where they are not uniform
    of 1 (the kit's ``recompute='full'`` alone)."""
    key = (str(row["container"]), str(row["model"]), int(row["source_line"]))
    rec = recipes().get(key)
    model = CATALOGUE.get(row["group"])
    issue = "" if model else NOT_EXPRESSIBLE.get(row["group"], f"model {row['group']!r} is not in the catalogue "
                                                                "(data/models)")
    out = RowSettings(model=model, model_issue=issue)
    tp, pp, cp, vp, ep = (int(row[c]) for c in ("tp", "pp", "cp", "vp", "ep"))
    where = f"{row['source_file']}:{row['source_line']}"
    out.columns = {"tp": tp, "pp": pp, "dp": int(row["dp"]), "ep": ep, "cp": cp, "vpp": vp,
                   "micro_batch": int(row["mbs"]), "global_batch": int(row["gbs"]), "seq_len": int(row["seq_len"]),
                   "sp": tp > 1, "schedule": "interleaved" if vp > 1 else "1f1b", "act_dtype": "bf16",
                   "param_dtype": "bf16", "create_attention_mask_in_dataloader": False, "fsdp": bool(row["fsdp"] > 0)}
    out.cites = {c: where for c in ("tp", "pp", "dp", "ep", "cp", "vpp", "micro_batch", "global_batch", "seq_len",
                                    "fsdp")}
    prec = row["precision"] if isinstance(row["precision"], str) else ""
    if rec is None:
        out.unknown["recipe"] = f"no entry for {key} in data/{RECIPES}"
        return out
    for k, why in (rec.get("unknown") or {}).items():
        if k in IGNORED:  # a setting with no modelled effect: not knowing it refuses nothing
            out.ignored[k] = f"{IGNORED[k]} (not known for this row: {why})"
        elif str(why).startswith("not set in the library recipe or the perf script"):
            out.defaulted[k] = str(why)  # read, and not set: the library's default applies
        else:
            out.unknown[k] = str(why)
    out.caveats = {str(k): str(v) for k, v in (rec.get("caveats") or {}).items()}
    raw = {ALIASES.get(k, k): v.get("value") for k, v in (rec.get("settings") or {}).items() if k not in IGNORED}
    cites = {ALIASES.get(k, k): str(v.get("cite", "")) for k, v in (rec.get("settings") or {}).items()}
    out.ignored.update({k: IGNORED[k] for k in (rec.get("settings") or {}) if k in IGNORED})
    if prec == "BF16":
        raw.setdefault("fp8", None)
    elif not prec and "fp8" not in raw and "fp8" not in out.unknown:
        out.unknown.setdefault("precision", "the table prints no precision for this row")
    elif prec.startswith("FP8") and "fp8" not in raw and "fp8" not in out.unknown:
        out.unknown["fp8"] = "the table says FP8; the recipe's FP8 format was not read"
    # NeMo 1.0 names (24.07 rows) -> Megatron's
    if "optimizer" in raw:
        raw["distributed_optimizer"] = raw.pop("optimizer") == "distributed_fused_adam"
        cites["distributed_optimizer"] = cites.pop("optimizer", "")
    for src_, to in (("grad_sync_dtype", lambda v: str(v) in ("fp32", "float32")), ("grad_reduce_in_fp32", bool)):
        if src_ in raw:
            v = raw.pop(src_)
            out.columns["grad_reduce_dtype"] = "fp32" if to(v) else "bf16"
            out.cites["grad_reduce_dtype"] = cites.pop(src_, "")
    if "use_flash_attention" in raw:  # False/None: Transformer Engine chooses (Megatron's AttnBackend.auto)
        v = raw.pop("use_flash_attention")
        if "attention_backend" in raw:  # read from the job's environment (NVTE_FUSED_ATTN), what TE selects by
            out.ignored["use_flash_attention"] = (f"use_flash_attention={v!r}: TransformerEngine picks its kernel from "
                                                  "the job's environment, read as attention_backend")
        else:
            raw["attention_backend"] = "flash" if v else None
    if "attention_backend" in raw and raw["attention_backend"] is None:
        raw["attention_backend"] = "auto"  # Megatron-Bridge's None: Megatron's AttnBackend.auto (TE picks)
    # Megatron's recompute (granularity, method, num_layers, modules) -> the kit's recompute column
    gran = raw.pop("recompute_granularity", None)
    if gran is None and raw.get("recompute_modules") is not None:
        # Megatron-Bridge's perf scripts: recompute_modules set -> granularity "selective"
        # (scripts/performance/utils/overrides.py _set_recompute_overrides, :149-151 at 17a381f)
        gran = "selective"
    if gran is None or raw.get("recompute_num_layers") == 0:
        for k in ("recompute_method", "recompute_num_layers", "recompute_modules"):
            if k in raw and raw[k] is not None:
                out.ignored[k] = f"{k}={raw.pop(k)!r} has no effect: recompute granularity is {gran!r}"
        out.columns["recompute"] = "none"
    elif gran == "full":
        out.columns["recompute"] = "full"
        if raw.get("recompute_method") == "uniform" and raw.get("recompute_num_layers") == 1:
            for k in ("recompute_method", "recompute_num_layers"):
                out.ignored[k] = f"{k}={raw.pop(k)!r}: every layer recomputed, the kit's recompute='full'"
        raw.pop("recompute_modules", None)
    elif gran == "selective":
        out.columns["recompute"] = "selective"
        if raw.get("recompute_modules") in (None, ["core_attn"]):
            raw.pop("recompute_modules", None)  # Megatron's default selective modules: the kit's 'selective'
        for k in ("recompute_method", "recompute_num_layers"):
            if raw.get(k) is not None:
                out.ignored[k] = f"{k}={raw.pop(k)!r} has no effect with selective recompute"
    # the flex dispatcher's backend is read only by the flex dispatcher (megatron/core/transformer/moe)
    if raw.get("moe_token_dispatcher_type", "alltoall") != "flex" and raw.get("moe_flex_dispatcher_backend"):
        out.ignored["moe_flex_dispatcher_backend"] = (f"moe_flex_dispatcher_backend={raw.pop('moe_flex_dispatcher_backend')!r} "
                                                      "has no effect: moe_token_dispatcher_type is not 'flex'")
    # the table's FSDP on a Megatron-Bridge recipe is Megatron-FSDP (use_megatron_fsdp, optim_grads_params), which runs
    # with the distributed optimizer: the kit's fsdp=True with distributed_optimizer=True (rules.py: "fsdp with
    # distributed_optimizer is Megatron-FSDP"); NeMo 1.0's fsdp (24.07) is torch FSDP without it
    if out.columns["fsdp"] and raw.get("distributed_optimizer") and str(row["source_file"]).startswith("nemo_"):
        raw.pop("distributed_optimizer")
        out.ignored["distributed_optimizer"] = ("NeMo 1.0's fsdp is torch FSDP; the kit's fsdp (without "
                                                "distributed_optimizer) includes its sharding")
    # delay_wgrad_compute under moe_a2a_overlap (Megatron-Bridge's perf scripts set both,
    # scripts/performance/utils/overrides.py _set_moe_a2a_overlap_overrides; Megatron allows it only with the overlap,
    # transformer_config.py:1927-1930): the combined 1F1B schedule overlap.a2a_pair_exposed times is the delayed one
    if raw.get("delay_wgrad_compute") and raw.get("moe_a2a_overlap"):
        raw.pop("delay_wgrad_compute")
        out.ignored["delay_wgrad_compute"] = ("delay_wgrad_compute=True with moe_a2a_overlap: the schedule "
                                              "llmcomm.overhead.overlap.a2a_pair_exposed times (the MLP's weight "
                                              "gradient after dispatch_bwd is issued, under it)")
    # settings Megatron reads only in another layout (no effect here: said so)
    for k, cond, why in (("cp_comm_type", cp == 1, "no context parallelism (cp=1)"),
                         ("overlap_p2p_comm", vp == 1, "valid only with virtual pipeline stages (vp > 1; NeMo "
                          "launcher configs' own comment on overlap_p2p_comm)"),
                         ("tp_comm_overlap", tp == 1, "nothing to overlap at tp=1 (Megatron-Bridge turns it off)")):
        if k in raw and cond and raw[k] not in (None, False):
            out.ignored[k] = f"{k}={raw.pop(k)!r} has no effect: {why}"
    fields = _fields()
    for name, v in raw.items():
        if name in TABLE_OWNED:  # the table states the layout; a disagreement is in the recipe file's checks
            continue
        out.cites[name] = cites.get(name, "")
        if name in fields and v != "unknown":
            out.columns[name] = tuple(v) if isinstance(v, list) else v
        else:
            out.setting[name] = v
    return out


def is_off(name: str, value: Any) -> bool:
    """Whether ``value`` of setting ``name`` is what the formulation does without it (:data:`OFF`)."""
    if name not in OFF:
        return value in (None, False)
    off = OFF[name]
    if isinstance(off, float) and isinstance(value, float):
        return math.isclose(off, value)
    return value == off
