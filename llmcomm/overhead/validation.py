"""Validation without refitting: the shipped calibration (utilization fitted on single-node runs, bandwidth on
nccl-tests sweeps) predicts vTrain's 109 multi-node iteration times (64–512 A100 GPUs), which no number of the
kit was fitted on.

Reported: mean absolute percentage error, median and worst absolute percentage error, and Spearman's rank
correlation of predicted and measured time within each model group. For context, vTrain (a profiling-driven
simulator with kernels measured on a GPU) reports 8.37% MAPE on its single-node and 14.73% on its multi-node
data (Bang et al., vTrain, MICRO 2024).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..specs import Cluster, load_cluster
from . import measured
from .iteration import TERMS, iteration_times
from .utilization import Utilization

VTRAIN_REPORTED = {"single_node_mape": 0.0837, "multi_node_mape": 0.1473}
CLUSTER = "vtrain-a100"


def predict_rows(rows: pd.DataFrame, cluster: Cluster | None = None, bandwidth: Any = None,
                 utilization: Utilization | None = None) -> pd.DataFrame:
    """``rows`` (from :func:`llmcomm.overhead.measured.read`) with the predicted breakdown of each row and
    ``predicted_s``, ``ape`` (absolute percentage error as a fraction)."""
    cluster = cluster or load_cluster(CLUSTER)
    parts = []
    for model, g in measured.by_model(rows):
        r = iteration_times(model, measured.candidates(g), cluster, bandwidth, utilization)
        r.index = g.index
        parts.append(pd.concat([g, r[[*TERMS, "total_s", "exposed_comm_s", "comm_overhead", "critical"]]], axis=1))
    out = pd.concat(parts).loc[rows.index]
    out["predicted_s"] = out["total_s"]
    out["ape"] = (out["predicted_s"] - out["time_s"]).abs() / out["time_s"]
    return out


def summary(pred: pd.DataFrame) -> dict[str, Any]:
    """MAPE, median and worst APE overall, and per model group the same plus Spearman's rho."""
    from scipy.stats import spearmanr

    groups = {}
    for gname, g in pred.groupby("group", sort=False):
        rho = float(spearmanr(g["predicted_s"], g["time_s"]).statistic) if len(g) > 2 else float("nan")
        groups[str(gname)] = {"rows": int(len(g)), "mape": float(g["ape"].mean()),
                              "median_ape": float(g["ape"].median()), "worst_ape": float(g["ape"].max()),
                              "spearman": rho}
    return {"rows": int(len(pred)), "mape": float(pred["ape"].mean()), "median_ape": float(pred["ape"].median()),
            "worst_ape": float(pred["ape"].max()), "min_group_spearman": float(np.nanmin(
                [g["spearman"] for g in groups.values()])), "groups": groups, "vtrain_reported": VTRAIN_REPORTED}


def validate_multi(bandwidth: Any = None, utilization: Utilization | None = None) -> tuple[pd.DataFrame, dict]:
    """Predict every multi-node row with the shipped calibration (or the given models) and summarise."""
    pred = predict_rows(measured.read("multi"), None, bandwidth, utilization)
    return pred, summary(pred)
