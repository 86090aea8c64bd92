"""Validation without refitting: the shipped calibration (utilization fitted on single-node runs, bandwidth on
nccl-tests sweeps) predicts vTrain's 109 multi-node iteration times (64–512 A100 GPUs), which no number of the
kit was fitted on.

Reported: mean absolute percentage error, median and worst absolute percentage error, and Spearman's rank
correlation of predicted and measured time within each model group. For context, vTrain (a profiling-driven
simulator with kernels measured on a GPU) reports 8.37% MAPE on its single-node and 14.73% on its multi-node
data (Bang et al., vTrain, MICRO 2024).

:func:`validate` is the one entry point: ``validate("vtrain-multi")`` (the above) and ``validate("nemo-h100")``:
NVIDIA's 48 published DGX-H100 pre-training rows (:mod:`llmcomm.overhead.nemo_rows`), each predicted by the
current formulation or refused with the mechanisms it needs named (``needs``; :func:`refusal_needs`):
``model:<why>`` (the catalogue cannot express it), ``unknown:<setting>`` (the recipe files do not state it: the
row is not timed at a guess), ``setting:<name>`` (a recipe setting :class:`~llmcomm.specs.ParallelConfig` has no
field for) or ``rule:<name>`` (a rule of :mod:`llmcomm.rules` that
:func:`~llmcomm.overhead.iteration.iteration_times` raises). A recipe setting becomes a candidate column as soon
as ParallelConfig has a field of its Megatron name: nothing here lists what is supported. The only parameter
fitted on these rows is the FP8 GEMM factor (:mod:`llmcomm.overhead.fp8_fit`: on one container release, named in
the summary's ``fitted_on``; ``not_fitted_on`` is the error on the others). ``relax`` names settings to drop
(time them as if off) for a diagnostic number; the table's ``relaxed`` column and the summary say which, and the
default is none.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, UsageError
from ..specs import Cluster, load_cluster, load_model
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


def _plan(row: pd.Series, relax: tuple[str, ...]) -> tuple[nemo_rows.RowSettings, dict[str, Any], list[str],
                                                          list[str]]:
    """The row's settings, its candidate row, the settings the kit has no field for (``name=value``), and what
    was relaxed. Which settings become columns is decided by :func:`llmcomm.overhead.nemo_rows.settings` from
    :class:`~llmcomm.specs.ParallelConfig`'s fields alone: nothing here lists what is supported."""
    st = nemo_rows.settings(row)
    cand = dict(st.columns)
    missing, relaxed = [], []
    for k, v in st.setting.items():  # recipe settings with no ParallelConfig field
        if nemo_rows.is_off(k, v):
            continue
        if k in relax:
            relaxed.append(f"{k}={v}")
        else:
            missing.append(f"{k}={v}")
    for k in relax:  # a relaxed column is timed at the formulation's default
        if k in cand and k not in nemo_rows.TABLE_OWNED and not nemo_rows.is_off(k, cand[k]):
            relaxed.append(f"{k}={cand.pop(k)}")
    return st, cand, missing, relaxed


RULE = re.compile(r"breaks the rule '([\w-]+)'")


def refusal_needs(model_issue: str, unknown: dict[str, str], missing: list[str], rule_msg: str) -> list[str]:
    """The mechanism names a refused row needs, each once: ``model:<why>`` (the catalogue cannot express the
    model: ``model:mamba-hybrid``, ``model:not-in-catalogue``; alone, as nothing else can be judged without it),
    ``unknown:<setting>`` (the recipe file does not state it), ``setting:<name>`` (a recipe setting the kit has
    no field for), ``rule:<name>`` (a rule :func:`~llmcomm.overhead.iteration.iteration_times` raises: the
    formulation refuses a value; :mod:`llmcomm.rules` names them)."""
    out = []
    if model_issue:  # nothing else can be judged without the model
        return [model_issue if model_issue.startswith("model:") else "model:not-in-catalogue"]
    out += [f"unknown:{k}" for k in sorted(unknown)]
    out += [f"setting:{m.split('=', 1)[0]}" for m in missing]
    if rule_msg:
        names = RULE.findall(rule_msg)
        out += [f"rule:{n}" for n in names] or ["rule:(unnamed ConfigError)"]
    return list(dict.fromkeys(out))


def predict_nemo(rows: pd.DataFrame, cluster: Cluster | None = None, bandwidth: Any = None,
                 utilization: Utilization | None = None, relax: tuple[str, ...] = ()) -> pd.DataFrame:
    """Every row with ``predicted_s`` and ``ape`` where predicted, else ``refused`` (what is missing, in words)
    and ``needs`` (the mechanism names, :func:`refusal_needs`, ``;``-joined); plus ``model_name``, ``relaxed``,
    ``unknown`` (settings the recipe file leaves unknown), ``ignored``, ``caveats`` and ``columns`` (the
    candidate row as timed). A row with an unknown setting is refused: it is not timed at a guessed value."""
    cluster = cluster or load_cluster(nemo_rows.CLUSTER)
    out = rows.copy()
    for c in ("predicted_s", "ape", "exposed_comm_s", *INTERVAL):
        out[c] = np.nan
    for c in ("refused", "needs", "model_name", "relaxed", "unknown", "ignored", "caveats", "columns"):
        out[c] = ""
    for i, row in rows.iterrows():
        st, cand, missing, relaxed = _plan(row, relax)
        out.at[i, "model_name"] = st.model or ""
        out.at[i, "relaxed"] = ", ".join(relaxed)
        out.at[i, "unknown"] = ", ".join(sorted(st.unknown))
        out.at[i, "ignored"] = ", ".join(sorted(st.ignored))
        out.at[i, "caveats"] = ", ".join(sorted(st.caveats))
        out.at[i, "columns"] = repr(cand)
        unknown = {k: v for k, v in st.unknown.items() if k not in relax}
        rule, r = "", None
        if st.model is not None and not unknown:  # with a setting unknown, a rule would judge a guess
            try:
                model = load_model(st.model)
                r = iteration_times(model, pd.DataFrame([cand]), cluster.for_world(int(row["num_gpus"])),
                                    bandwidth, utilization, overlap_grad_reduce=bool(cand.get("overlap_grad_reduce")))
            except ConfigError as e:
                rule = str(e)
        issue = nemo_rows.MODEL_NEEDS.get(row["group"], "model:not-in-catalogue") if st.model is None else ""
        needs = refusal_needs(issue, unknown, missing, rule)
        if needs:
            words = ([f"model: {st.model_issue}"] if st.model is None else []) \
                + [f"unknown: {k} ({v})" for k, v in sorted(unknown.items())] \
                + ([f"not in the kit: {', '.join(missing)}"] if missing else []) + ([f"formulation: {rule}"] if rule else [])
            out.at[i, "refused"] = "; ".join(words)
            out.at[i, "needs"] = ";".join(needs)
            continue
        assert r is not None
        out.at[i, "predicted_s"] = float(r["total_s"].iloc[0])
        out.at[i, "exposed_comm_s"] = float(r["exposed_comm_s"].iloc[0])
        for c in INTERVAL:
            if c in r.columns:
                out.at[i, c] = float(r[c].iloc[0])
    out["ape"] = (out["predicted_s"] - out["time_s"]).abs() / out["time_s"]
    return out


def summary_nemo(pred: pd.DataFrame, relax: tuple[str, ...] = (), fitted_on: list[str] | None = None
                 ) -> dict[str, Any]:
    """Coverage (rows predicted of all), MAPE / median / worst APE and mean signed error on the predicted rows as
    measured (also without the rows the source flags, and on those whose recipe is fully known and agrees with
    the table), per model group and per container, the 90 % interval's coverage, and ``needs``: per mechanism
    name (:func:`refusal_needs`), the rows that need it (a row needing two counts in both). ``fitted_on``: the
    rows (``container/model/num_gpus``) any parameter used here was fitted on (none but the FP8 factor's, if
    one is shipped: :mod:`llmcomm.overhead.fp8_fit`)."""
    p = pred[pred["predicted_s"].notna()]
    clean = p[~p["flagged"]]

    def err(d: pd.DataFrame) -> dict[str, Any]:
        if d.empty:
            return {"rows": 0, "mape": None, "median_ape": None, "worst_ape": None, "mean_signed": None}
        return {"rows": int(len(d)), "mape": float(d["ape"].mean()), "median_ape": float(d["ape"].median()),
                "worst_ape": float(d["ape"].max()), "mean_signed": float(((d["predicted_s"] - d["time_s"])
                                                                          / d["time_s"]).mean())}

    refused = pred[pred["predicted_s"].isna()]
    needs: dict[str, int] = {}
    col = refused["needs"] if "needs" in refused.columns else pd.Series("", index=refused.index)
    for v in col.fillna(""):
        for name in filter(None, str(v).split(";")):
            needs[name] = needs.get(name, 0) + 1
    has_iv = (p[list(INTERVAL)].notna().all(axis=1) if len(p) and set(INTERVAL) <= set(p.columns)
              else pd.Series(False, index=p.index))
    iv = p[has_iv]
    coverage_90 = (float(((iv["total_s_lo"] <= iv["time_s"]) & (iv["time_s"] <= iv["total_s_hi"])).mean())
                   if len(iv) else None)
    known = p[(p["unknown"] == "") & ((p["caveats"] == "") if "caveats" in p.columns else True)]
    per_container = ({str(c): err(d) for c, d in p.groupby("container", sort=False)} if "container" in p.columns
                     else {})
    if fitted_on and {"container", "model", "num_gpus"} <= set(p.columns):
        names = p["container"].astype(str) + "/" + p["model"].astype(str) + "/" + p["num_gpus"].astype(int).astype(str)
        held = err(p[~names.isin(set(fitted_on))])
    else:
        held = err(p)
    return {**err(p), "rows": int(len(pred)), "predicted": int(len(p)), "refused": int(len(refused)),
            "coverage": float(len(p) / len(pred)) if len(pred) else 0.0, "unflagged": err(clean),
            "recipe_fully_known": err(known), "not_fitted_on": held,
            "groups": {str(g): err(d) for g, d in p.groupby("group", sort=False)},
            "containers": per_container,
            "needs": dict(sorted(needs.items(), key=lambda kv: (-kv[1], kv[0]))),
            "interval_coverage_90": coverage_90, "interval_rows": int(len(iv)), "relaxed": list(relax),
            "fitted_on": list(fitted_on or []), "fitted_on_these_rows": bool(fitted_on),
            "cluster": nemo_rows.CLUSTER,
            "measured": "step_time_s_derived = gbs*seq/(tokens/s/GPU * GPUs) of each published row"}


def validate_nemo(relax: tuple[str, ...] = (), bandwidth: Any = None, utilization: Utilization | None = None
                  ) -> tuple[pd.DataFrame, dict]:
    """Predict or refuse every DGX-H100 row (module docstring) and summarise."""
    pred = predict_nemo(nemo_rows.read(), None, bandwidth, utilization, tuple(relax))
    return pred, summary_nemo(pred, tuple(relax), fitted_on=fp8_fitted_on())


def fp8_fitted_on() -> list[str]:
    """The rows (``container/model/num_gpus``) the shipped FP8 factor was fitted on
    (``data/calibration/gemm_fp8.json``, :mod:`llmcomm.overhead.fp8_fit`); none without one."""
    import json

    from ..specs import data_dir
    from .gemm import FP8_CALIBRATION

    p = data_dir() / FP8_CALIBRATION
    return list(json.loads(p.read_text(encoding="utf-8")).get("fitted_on") or []) if p.is_file() else []
