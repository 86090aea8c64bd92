"""Fit the utilization model (:mod:`llmcomm.overhead.utilization`) on vTrain's 1,440 single-node iteration
times, and write the shipped calibration ``data/calibration/utilization.json``.

Regenerate with ``python -m llmcomm.overhead.calibrate`` (needs ``vtrain/ground_truth_single.csv`` through
:func:`llmcomm.data.path`). The multi-node file is never read here.

Method. For every measured row the formulation (:mod:`llmcomm.overhead.iteration`) gives

    T = m·c_crit + (Σ_r c_r − c_crit)/v + dp_exposed + optimizer,   c_r = X_r·θ + comm_r

where ``X_r`` are stage ``r``'s utilization features per micro-batch (all passes) and ``comm_r`` its modelled
TP/PP communication (the shipped :class:`~llmcomm.overhead.bandwidth.Bandwidth` of the ``vtrain-a100``
cluster). With the critical stage fixed this is linear in θ::

    T − [m·comm_crit + (Σ comm_r − comm_crit)/v + dp_exposed + optimizer] = [m·X_crit + (Σ X_r − X_crit)/v]·θ

so θ is fitted by weighted least squares (statsmodels WLS, weights 1/T², i.e. relative error), re-identifying
the critical stage with the new θ until it no longer changes. Cross-validation holds out whole model shapes
(leave-one-shape-out over the 8 (hidden, layers) shapes) and, as an extrapolation check, all hidden-2,048 rows
when fitting on hidden 1,024.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..specs import Cluster, load_cluster
from . import iteration as it
from . import measured
from . import utilization as U
from .bandwidth import BandwidthModel

CLUSTER = "vtrain-a100"
START = (1.5, 1.0, 2e-4, 2e-4, 1e-4)  # only to pick the first critical stage
COMMAND = "python -m llmcomm.overhead.calibrate"
LOWER = {"gemm": 1.0}  # physical bounds of the coefficients (others: >= 0)


@dataclass
class Prepared:
    """The rows with what the fit needs, independent of θ."""

    rows: pd.DataFrame
    stages: list[tuple[np.ndarray, it.Stages]]  # (row positions, stages of one model shape)


def prepare(rows: pd.DataFrame, cluster: Cluster, bandwidth: BandwidthModel) -> Prepared:
    rows = rows.reset_index(drop=True)
    out = []
    for model, g in measured.by_model(rows):
        t = it.candidate_table(model, measured.candidates(g))
        out.append((g.index.to_numpy(), it.stages(model, t, cluster, bandwidth)))
    return Prepared(rows, out)


def design(prep: Prepared, util: U.Utilization) -> tuple[np.ndarray, np.ndarray]:
    """``(X, offset)``: the linear design of every row under the critical stages ``util`` implies."""
    n = len(prep.rows)
    X = np.zeros((n, U.K))
    off = np.zeros(n)
    for idx, st in prep.stages:
        r = it.combine(st, util)
        crit = r["critical_index"]
        pp, v, m = st.pp, st.vpp, st.m
        mult = {"first": np.ones(len(pp)), "mid": np.where(pp >= 3, pp - 2, 0), "last": np.where(pp >= 2, 1, 0)}
        xs, cs = [], []
        tot_x = np.zeros((len(pp), U.K))
        tot_c = np.zeros(len(pp))
        for cls in it.CLASSES:
            q = st.cls[cls]
            x = it.class_design(q["q"], util)
            cm = q["tp"] + q["ep"] + q["pp"]
            xs.append(x)
            cs.append(cm)
            tot_x += mult[cls][:, None] * x
            tot_c += mult[cls] * cm
        ar = np.arange(len(pp))
        xc = np.stack(xs)[crit, ar]
        cc = np.stack(cs)[crit, ar]
        X[idx] = m[:, None] * xc + (tot_x - xc) / v[:, None]
        off[idx] = m * cc + (tot_c - cc) / v + r["dp_comm_s"] + r["optimizer_s"]
    return X, off


def fit(prep: Prepared, max_iter: int = 30, lower: dict[str, float] | None = None) -> tuple[U.Utilization, Any]:
    """WLS fit of θ, alternating with the assignment of critical stages and ``max`` sides until the
    assignment repeats. A coefficient must be physical (:data:`LOWER`: no matmul runs faster than the GPU's
    peak, so ``θ_gemm >= 1``; every fixed cost is ``>= 0``): a coefficient that comes out below its bound is
    fixed at the bound and the rest refitted. ``lower`` replaces :data:`LOWER` (a diagnostic: where an
    unbounded coefficient would land, :mod:`llmcomm.overhead.tp_diagnosis`; features it omits keep 0). Returns
    the :class:`Utilization` and the statsmodels results."""
    import warnings

    import statsmodels.api as sm
    from statsmodels.tools.sm_exceptions import SingularMatrixWarning

    y = prep.rows["time_s"].to_numpy()
    keep = np.ones(U.K, bool)
    fixed = np.zeros(U.K)
    while True:
        util = U.Utilization(coef=START)
        seen: list[np.ndarray] = []
        res = None
        for _ in range(max_iter):
            X, off = design(prep, util)
            off = off + X[:, ~keep] @ fixed[~keep]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SingularMatrixWarning)
                res = sm.WLS(y - off, X[:, keep], weights=1.0 / y**2).fit()
            theta = fixed.copy()
            theta[keep] = res.params
            util = U.Utilization(coef=tuple(float(x) for x in theta))
            state = np.concatenate([np.concatenate([it.combine(st, util)["critical_index"]] + [
                b for k in it.CLASSES for x in ("Ld", "Lm") for b in util.launch_bound(st.cls[k]["q"][x])])
                for _, st in prep.stages])
            if any(np.array_equal(state, s) for s in seen):
                break
            seen.append(state)
        low = np.array([(LOWER if lower is None else lower).get(f, 0.0) for f in U.FEATURES])
        below = keep & (theta < low)
        if not below.any():
            break
        keep &= ~below
        fixed[below] = low[below]
    se, lo, hi = np.zeros(U.K), np.zeros(U.K), np.zeros(U.K)
    assert res is not None  # the loop fits at least once
    ci = res.conf_int(0.05)
    se[keep], lo[keep], hi[keep] = res.bse, ci[:, 0], ci[:, 1]
    return U.Utilization(coef=tuple(float(x) for x in theta), stderr=tuple(float(x) for x in se),
                         ci_low=tuple(float(x) for x in lo), ci_high=tuple(float(x) for x in hi)), res


def predict(prep: Prepared, util: U.Utilization) -> np.ndarray:
    """Predicted iteration seconds of every prepared row."""
    out = np.zeros(len(prep.rows))
    for idx, st in prep.stages:
        r = it.combine(st, util)
        out[idx] = sum(r[t] for t in it.TERMS)
    return out


def subset(prep: Prepared, mask: np.ndarray) -> Prepared:
    """The prepared rows where ``mask`` holds (whole model shapes only)."""
    keep = [(idx, st) for idx, st in prep.stages if mask[idx].all()]
    if any(mask[idx].any() and not mask[idx].all() for idx, _ in prep.stages):
        raise ValueError("subset must keep or drop whole model shapes")
    pos = np.flatnonzero(mask)
    remap = -np.ones(len(mask), np.int64)
    remap[pos] = np.arange(len(pos))
    return Prepared(prep.rows[mask].reset_index(drop=True), [(remap[idx], st) for idx, st in keep])


def errors(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    ape = np.abs(pred - meas) / meas
    return {"mape": float(ape.mean()), "median_ape": float(np.median(ape)), "worst_ape": float(ape.max()),
            "rows": int(len(ape))}


def cross_validate(prep: Prepared) -> pd.DataFrame:
    """Leave-one-model-shape-out: one row per held-out shape with its rows' errors under a fit on the rest."""
    groups = prep.rows["group"].to_numpy()
    out = []
    for gname in sorted(set(groups)):
        test = groups == gname
        u, _ = fit(subset(prep, ~test))
        te = subset(prep, test)
        out.append({"held_out": gname, **errors(predict(te, u), te.rows["time_s"].to_numpy())})
    return pd.DataFrame(out)


def extrapolation(prep: Prepared) -> dict[str, float]:
    """Fit on hidden 1,024, predict hidden 2,048."""
    small = prep.rows["hidden"].to_numpy() == prep.rows["hidden"].min()
    u, _ = fit(subset(prep, small))
    te = subset(prep, ~small)
    return errors(predict(te, u), te.rows["time_s"].to_numpy())


def calibrate(bandwidth: BandwidthModel | None = None, cv: bool = True) -> tuple[U.Utilization, Prepared]:
    """Fit on all single-node rows; with ``cv`` also record cross-validated errors in ``metrics``."""
    cluster = load_cluster(CLUSTER)
    bw, _ = it._resolve(cluster, bandwidth, U.Utilization(coef=START))
    prep = prepare(measured.read("single"), cluster, bw)
    util, res = fit(prep)
    metrics: dict[str, Any] = {"in_sample": errors(predict(prep, util), prep.rows["time_s"].to_numpy()),
                               "r2_wls": float(res.rsquared)}
    if cv:
        folds = cross_validate(prep)
        ape_rows = float((folds["mape"] * folds["rows"]).sum() / folds["rows"].sum())
        metrics["cv_leave_one_shape_out"] = {"mape": ape_rows, "worst_fold_mape": float(folds["mape"].max()),
                                             "worst_ape": float(folds["worst_ape"].max()),
                                             "folds": folds.to_dict(orient="records")}
        metrics["extrapolation_h1024_to_h2048"] = extrapolation(prep)
    import dataclasses

    util = dataclasses.replace(util, metrics=metrics, command=COMMAND,
                               fitted_on="vtrain/ground_truth_single.csv (1,440 single-node A100 runs) on cluster "
                                         f"{CLUSTER} with the shipped bandwidth model")
    return util, prep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="where to write (default: data/calibration/utilization.json)")
    ap.add_argument("--no-cv", action="store_true")
    args = ap.parse_args(argv)
    from ..specs import data_dir

    util, _ = calibrate(cv=not args.no_cv)
    p = util.save(args.out or data_dir() / U.CALIBRATION)
    print(util.table().to_string(index=False))
    print({k: v for k, v in util.metrics.items() if k != "cv_leave_one_shape_out"})
    print(f"written: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
