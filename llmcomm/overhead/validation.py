"""Validation without refitting: the shipped calibration (utilization fitted on single-node runs, bandwidth on
nccl-tests sweeps) predicts vTrain's 109 multi-node iteration times (64–512 A100 GPUs), which no number of the
kit was fitted on.

Reported: mean absolute percentage error, median and worst absolute percentage error, and Spearman's rank
correlation of predicted and measured time within each model group. For context, vTrain (a profiling-driven
simulator with kernels measured on a GPU) reports 8.37% MAPE on its single-node and 14.73% on its multi-node
data (Bang et al., vTrain, MICRO 2024).

:func:`validate` is the one entry point: ``validate("vtrain-multi")`` (the above) and ``validate("nemo-h100")``:
NVIDIA's 48 published DGX-H100 pre-training rows (:mod:`llmcomm.overhead.nemo_rows`), each predicted by the
current formulation or refused with what is missing named — a model the catalogue cannot express, a recipe
setting (Megatron's name and value) that :func:`~llmcomm.overhead.iteration.iteration_times` has no column for
(the columns it accepts are :data:`~llmcomm.overhead.iteration.CANDIDATE_DEFAULTS`' keys), or the rule
``iteration_times`` itself raises (e.g. ``cp``, ``fsdp``, an uneven pipeline split). A setting becomes predicted
as soon as the formulation accepts its column: nothing here lists what is supported. Nothing is fitted on these
rows. ``relax`` names settings to drop (time them as if off) for a diagnostic number; the table's ``relaxed``
column and the summary say which, and the default is none.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, UsageError
from ..specs import Cluster, load_cluster, load_model
from . import iteration as it
from . import measured, nemo_rows
from .iteration import TERMS, iteration_times
from .utilization import Utilization

VTRAIN_REPORTED = {"single_node_mape": 0.0837, "multi_node_mape": 0.1473}
CLUSTER = "vtrain-a100"


def predict_rows(rows: pd.DataFrame, cluster: Cluster | None = None, bandwidth: Any = None,
                 utilization: Utilization | None = None, interval: bool = True) -> pd.DataFrame:
    """``rows`` (from :func:`llmcomm.overhead.measured.read`) with the predicted breakdown of each row and
    ``predicted_s``, ``ape`` (absolute percentage error as a fraction)."""
    cluster = cluster or load_cluster(CLUSTER)
    parts = []
    for model, g in measured.by_model(rows):
        r = iteration_times(model, measured.candidates(g), cluster, bandwidth, utilization, interval=interval)
        r.index = g.index
        iv = [c for c in INTERVAL if c in r.columns]
        parts.append(pd.concat([g, r[[*TERMS, "total_s", "exposed_comm_s", "comm_overhead", "critical", *iv]]],
                               axis=1))
    out = pd.concat(parts).loc[rows.index]
    out["predicted_s"] = out["total_s"]
    out["ape"] = (out["predicted_s"] - out["time_s"]).abs() / out["time_s"]
    return out


INTERVAL = ("total_s_lo", "total_s_hi")  # columns iteration_times gives when it carries intervals


def summary(pred: pd.DataFrame) -> dict[str, Any]:
    """MAPE, median and worst APE overall, and per model group the same plus Spearman's rho."""
    from scipy.stats import spearmanr

    groups = {}
    for gname, g in pred.groupby("group", sort=False):
        rho = float(spearmanr(g["predicted_s"], g["time_s"]).statistic) if len(g) > 2 else float("nan")
        groups[str(gname)] = {"rows": int(len(g)), "mape": float(g["ape"].mean()),
                              "median_ape": float(g["ape"].median()), "worst_ape": float(g["ape"].max()),
                              "spearman": rho}
    cov = (float(((pred["total_s_lo"] <= pred["time_s"]) & (pred["time_s"] <= pred["total_s_hi"])).mean())
           if "total_s_lo" in pred.columns else None)
    return {"interval_coverage_90": cov,
            "rows": int(len(pred)), "mape": float(pred["ape"].mean()), "median_ape": float(pred["ape"].median()),
            "worst_ape": float(pred["ape"].max()), "min_group_spearman": float(np.nanmin(
                [g["spearman"] for g in groups.values()])), "groups": groups, "vtrain_reported": VTRAIN_REPORTED}


def validate_multi(bandwidth: Any = None, utilization: Utilization | None = None) -> tuple[pd.DataFrame, dict]:
    """Predict every multi-node row with the shipped calibration (or the given models) and summarise."""
    pred = predict_rows(measured.read("multi"), None, bandwidth, utilization)
    return pred, summary(pred)


NAMES = ("vtrain-multi", "nemo-h100")
ALWAYS_COLUMNS = frozenset({"tp", "pp", "dp", "global_batch", "seq_len"})


def validate(name: str, *, relax: tuple[str, ...] = (), bandwidth: Any = None,
             utilization: Utilization | None = None) -> tuple[pd.DataFrame, dict]:
    """``(table, summary)`` of one validation set (:data:`NAMES`; module docstring). Never fits anything."""
    if name == "vtrain-multi":
        if relax:
            raise UsageError("validate('vtrain-multi') takes no relax")
        return validate_multi(bandwidth, utilization)
    if name == "nemo-h100":
        return validate_nemo(relax=relax, bandwidth=bandwidth, utilization=utilization)
    raise UsageError(f"validate: {name!r} is not one of {list(NAMES)}")


def _accepted() -> frozenset[str]:
    """Settings the formulation takes: the candidate columns of ``iteration_times`` (its
    ``CANDIDATE_DEFAULTS`` where it has them, and the :class:`~llmcomm.specs.ParallelConfig` fields a table of
    configurations is named by, less those it declares ``UNMODELLED_FIELDS``), and ``overlap_grad_reduce`` (a
    keyword of ``iteration_times``)."""
    import dataclasses

    from ..specs import ParallelConfig

    fields = {f.name for f in dataclasses.fields(ParallelConfig)} - set(getattr(it, "UNMODELLED_FIELDS", ()))
    return ALWAYS_COLUMNS | frozenset(getattr(it, "CANDIDATE_DEFAULTS", {})) | fields | {"overlap_grad_reduce"}


def _plan(row: pd.Series, relax: tuple[str, ...]) -> tuple[nemo_rows.RowSettings, dict[str, Any], list[str],
                                                          list[str]]:
    """The row's settings, its candidate row, what refuses it, and what was relaxed."""
    st = nemo_rows.settings(row)
    cand = dict(st.columns)
    missing, relaxed = [], []
    accepted = _accepted()
    for k, v in st.setting.items():
        if nemo_rows.is_off(k, v):
            continue
        if k in relax:
            relaxed.append(f"{k}={v}")
            continue
        if v == "unknown":  # the recipe file did not say which value: nothing to time it with
            missing.append(f"{k}={v}")
        elif k in accepted or k in ("cp", "fsdp"):  # cp and fsdp: iteration_times names its own rule
            cand[k] = v
        else:
            missing.append(f"{k}={v}")
    return st, cand, missing, relaxed


def predict_nemo(rows: pd.DataFrame, cluster: Cluster | None = None, bandwidth: Any = None,
                 utilization: Utilization | None = None, relax: tuple[str, ...] = ()) -> pd.DataFrame:
    """Every row with ``predicted_s`` and ``ape`` where predicted, else ``refused`` naming what is missing;
    plus ``model_name``, ``relaxed``, ``unknown`` (settings the recipe file leaves unknown), ``ignored``."""
    cluster = cluster or load_cluster(nemo_rows.CLUSTER)
    out = rows.copy()
    for c in ("predicted_s", "ape", "exposed_comm_s", *INTERVAL):
        out[c] = np.nan
    out["refused"] = ""
    out["model_name"] = ""
    out["relaxed"] = ""
    out["unknown"] = ""
    out["ignored"] = ""
    for i, row in rows.iterrows():
        st, cand, missing, relaxed = _plan(row, relax)
        out.at[i, "model_name"] = st.model or ""
        out.at[i, "relaxed"] = ", ".join(relaxed)
        out.at[i, "unknown"] = ", ".join(sorted(st.unknown))
        out.at[i, "ignored"] = ", ".join(sorted(st.ignored))
        if st.model is None:
            out.at[i, "refused"] = f"model: {st.model_issue}"
            continue
        if "fp8" in st.unknown and "fp8" not in st.setting:
            out.at[i, "refused"] = f"unknown: {st.unknown['fp8']} (FP8 or BF16 changes every GEMM's rate)"
            continue
        try:
            model = load_model(st.model)
            r = iteration_times(model, pd.DataFrame([cand]), cluster.for_world(int(row["num_gpus"])), bandwidth,
                                utilization, overlap_grad_reduce=bool(st.setting.get("overlap_grad_reduce"))
                                and "overlap_grad_reduce" not in cand)
            rule = ""
        except ConfigError as e:
            rule = f"formulation: {e}"
        if missing or rule:  # both named: the settings it has no column for, and the rule it raises on the rest
            out.at[i, "refused"] = "; ".join(
                ([f"not in the formulation: {', '.join(missing)}"] if missing else []) + ([rule] if rule else []))
            continue
        out.at[i, "predicted_s"] = float(r["total_s"].iloc[0])
        out.at[i, "exposed_comm_s"] = float(r["exposed_comm_s"].iloc[0])
        for c in INTERVAL:
            if c in r.columns:
                out.at[i, c] = float(r[c].iloc[0])
    out["ape"] = (out["predicted_s"] - out["time_s"]).abs() / out["time_s"]
    return out


def _refusal_kind(msg: str) -> str:
    """What a refusal is for: ``model``, ``unknown``, the missing setting names, and/or the formulation's rule."""
    if msg.startswith(("model:", "unknown:")):
        return msg.split(":", 1)[0]
    parts = []
    for part in msg.split("; "):
        if part.startswith("not in the formulation:"):
            names = re.findall(r"(?:^|, )(\w+)=", part.split(":", 1)[1].strip())
            parts.append(", ".join(sorted(set(names))))
        else:
            parts.append(part)
    return " + ".join(parts)


def summary_nemo(pred: pd.DataFrame, relax: tuple[str, ...] = ()) -> dict[str, Any]:
    """Coverage (rows predicted of all), MAPE / median / worst APE on the predicted rows as measured (also
    without the rows the source flags), per model group, the refusals by what is missing, and the share of
    measured times inside the 90 % interval where the formulation gives one."""
    p = pred[pred["predicted_s"].notna()]
    clean = p[~p["flagged"]]

    def err(d: pd.DataFrame) -> dict[str, Any]:
        if d.empty:
            return {"rows": 0, "mape": None, "median_ape": None, "worst_ape": None}
        return {"rows": int(len(d)), "mape": float(d["ape"].mean()), "median_ape": float(d["ape"].median()),
                "worst_ape": float(d["ape"].max()), "mean_signed": float(((d["predicted_s"] - d["time_s"])
                                                                          / d["time_s"]).mean())}

    refused = pred[pred["predicted_s"].isna()]
    reasons = refused["refused"].map(_refusal_kind).value_counts().to_dict()
    needs: dict[str, int] = {}  # per missing setting or rule: the rows that need it
    for msg in refused["refused"]:
        for part in _refusal_kind(msg).split(" + "):
            for name in (part.split(", ") if not part.startswith("formulation:") else [part]):
                needs[name] = needs.get(name, 0) + 1
    has_iv = p[list(INTERVAL)].notna().all(axis=1) if len(p) else pd.Series(dtype=bool)
    iv = p[has_iv] if len(p) else p
    coverage_90 = (float(((iv["total_s_lo"] <= iv["time_s"]) & (iv["time_s"] <= iv["total_s_hi"])).mean())
                   if len(iv) else None)
    known = p[p["unknown"] == ""]
    return {**err(p), "rows": int(len(pred)), "predicted": int(len(p)), "refused": int(len(refused)),
            "coverage": float(len(p) / len(pred)) if len(pred) else 0.0, "unflagged": err(clean),
            "recipe_fully_known": err(known),
            "groups": {str(g): err(d) for g, d in p.groupby("group", sort=False)},
            "refusals": {str(k): int(v) for k, v in reasons.items()},
            "needs": dict(sorted(needs.items(), key=lambda kv: (-kv[1], kv[0]))),
            "interval_coverage_90": coverage_90, "interval_rows": int(len(iv)), "relaxed": list(relax),
            "fitted_on_these_rows": False, "cluster": nemo_rows.CLUSTER,
            "measured": "step_time_s_derived = gbs*seq/(tokens/s/GPU * GPUs) of each published row"}


def validate_nemo(relax: tuple[str, ...] = (), bandwidth: Any = None, utilization: Utilization | None = None
                  ) -> tuple[pd.DataFrame, dict]:
    """Predict or refuse every DGX-H100 row (module docstring) and summarise."""
    pred = predict_nemo(nemo_rows.read(), None, bandwidth, utilization, tuple(relax))
    return pred, summary_nemo(pred, tuple(relax))
