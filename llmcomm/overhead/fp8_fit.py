"""The FP8 GEMM factor: fitted on one container release of NVIDIA's published DGX-H100 rows, validated on the others.

No FP8 GEMM measurement is in the shared data (:mod:`llmcomm.overhead.gemm`: its FP8 *rule* runs the measured
bf16 mechanism at the FP8 datasheet peak, 1,978.9 TFLOP/s, with the bf16 ceiling fraction, i.e. FP8 GEMMs exactly
twice as fast as BF16). On Hopper they are not: TransformerEngine's FP8 linears run cuBLASLt FP8 GEMMs whose
operands must be K-major (wgmma reads FP8 only in that layout, so dgrad/wgrad need transposed FP8 copies, TE's
``cast_transpose``), whose epilogue writes a BF16 output and applies the per-tensor scales, and whose main loop at
twice the MMA rate is more often starved by operand loads and the epilogue than the BF16 one. The casts, amax
passes and transposes' traffic are already element-wise HBM work in the formulation
(:func:`llmcomm.overhead.iteration._compute`); what is left is the GEMM's own rate, one factor ``f``::

    t_fp8(m, n, k) = rule time at peak  f · P_fp8,  ceiling  f · (ceiling_bf16 / P_bf16) · P_fp8

``f`` ∈ [0.5, 1]: 0.5 is FP8 no faster than the BF16 mechanism at its own peak, 1 the bare rule. It is fitted by
minimising the mean absolute log error of the predicted step times of one release's predicted FP8 rows
(:func:`fit`; scipy's bounded scalar minimiser) and reported on every other release it was not fitted on. It
absorbs whatever else the formulation misses on those rows: the fit reports whether it sits on a bound (a
finding, not a result), and is refit with ``python -m llmcomm.overhead.fp8_fit --fit-on RELEASE --write`` whenever
the formulation changes. Written to ``data/calibration/gemm_fp8.json`` with the rows it was fitted on.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd

from ..atomic import write_bytes
from ..errors import UsageError
from ..specs import data_dir
from . import gemm, nemo_rows

BOUNDS = (0.5, 1.0)
COMMAND = "python -m llmcomm.overhead.fp8_fit --fit-on 24.07 --write"


@contextmanager
def trial_factor(f: float):
    """Every GEMM model loaded inside uses FP8 factor ``f`` (:func:`llmcomm.overhead.gemm.fp8_factor`)."""
    gemm._FP8_OVERRIDE.append(float(f))
    try:
        yield
    finally:
        gemm._FP8_OVERRIDE.pop()


def _fp8_rows(rows: pd.DataFrame) -> pd.Series:
    return rows["precision"].fillna("").str.startswith("FP8")


def predict_at(f: float, rows: pd.DataFrame) -> pd.DataFrame:
    """:func:`llmcomm.overhead.validation.predict_nemo` of ``rows`` with the FP8 factor ``f``."""
    from .validation import predict_nemo

    with trial_factor(f):
        return predict_nemo(rows)


def row_names(d: pd.DataFrame) -> list[str]:
    return [f"{r.container}/{r.model}/{int(r.num_gpus)}" for r in d.itertuples()]


def fit(release: str = "24.07", rows: pd.DataFrame | None = None) -> dict[str, Any]:
    """Fit ``f`` on the FP8 rows of ``release`` the formulation predicts; report the error per release (the
    others are not fitted on) at the fitted ``f`` and at the bare rule (``f = 1``)."""
    from scipy.optimize import minimize_scalar

    rows = nemo_rows.read() if rows is None else rows
    if release not in set(rows["container"].astype(str)):
        raise UsageError(f"fp8_fit: release {release!r} is not one of {sorted(set(rows['container']))}")
    train = rows[(rows["container"].astype(str) == release) & _fp8_rows(rows)]
    base = predict_at(1.0, train)
    train = train[base["predicted_s"].notna().to_numpy()]
    if train.empty:
        raise UsageError(f"fp8_fit: release {release!r} has no FP8 row the formulation predicts")

    def loss(f: float) -> float:
        p = predict_at(f, train)
        return float(np.mean(np.abs(np.log(p["predicted_s"] / p["time_s"]))))

    res = minimize_scalar(loss, bounds=BOUNDS, method="bounded", options={"xatol": 1e-4})
    f = float(res.x)
    at_bound = bool(min(abs(f - b) for b in BOUNDS) < 2e-3)
    fitted = predict_at(f, rows)
    bare = predict_at(1.0, rows)

    def per_release(p: pd.DataFrame) -> dict[str, Any]:
        q = p[p["predicted_s"].notna() & _fp8_rows(p)]
        return {str(c): {"rows": int(len(d)), "mape": float(d["ape"].mean()),
                         "mean_signed": float(((d["predicted_s"] - d["time_s"]) / d["time_s"]).mean())}
                for c, d in q.groupby("container", sort=False)}

    held = fitted[(fitted["container"].astype(str) != release) & fitted["predicted_s"].notna() & _fp8_rows(fitted)]
    return {"factor": f, "bounds": list(BOUNDS), "at_bound": at_bound, "loss": float(res.fun),
            "fitted_on_release": release, "fitted_on": row_names(train),
            "effective_fp8_ceiling_tflops": None,
            "held_out_mape": float(held["ape"].mean()) if len(held) else None, "held_out_rows": row_names(held),
            "per_release_fitted": per_release(fitted), "per_release_bare_rule": per_release(bare),
            "objective": "mean |log(predicted/measured)| of the fitted release's predicted FP8 rows",
            "command": COMMAND, "note": "refit whenever the formulation changes: the factor absorbs what else it "
                                        "misses on the fitted rows"}


def write(doc: dict[str, Any]) -> None:
    p = data_dir() / gemm.FP8_CALIBRATION
    write_bytes(p, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmcomm.overhead.fp8_fit", description=__doc__.splitlines()[0])
    ap.add_argument("--fit-on", default="24.07", help="the container release to fit on (default 24.07)")
    ap.add_argument("--write", action="store_true", help=f"write data/{gemm.FP8_CALIBRATION}")
    args = ap.parse_args(argv)
    doc = fit(args.fit_on)
    m = gemm.load_gemm_model("H100")
    with trial_factor(doc["factor"]):
        m = gemm.load_gemm_model("H100")
        doc["effective_fp8_ceiling_tflops"] = m.ceiling("fp8") / 1e12
    if args.write:
        write(doc)
    json.dump(doc, sys.stdout, indent=1)
    print()
    return 0 if math.isfinite(doc["factor"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
