"""A prediction interval for the iteration time from the calibration residuals.

The utilization model is fitted on vTrain's 1,440 single-node A100 runs (:mod:`llmcomm.overhead.calibrate`); on
those same rows the shipped formulation leaves relative residuals ``r = predicted / measured − 1``. Their 5 % and
95 % quantiles ``(r_lo, r_hi)`` give the 90 % interval of any prediction ``T``::

    total_s_lo = T / (1 + r_hi),   total_s_hi = T / (1 + r_lo)

(a measured time ``M`` with ``T/M − 1`` inside ``[r_lo, r_hi]`` lies inside the interval). Stated carry: the
residuals are those of single-node A100 runs; applied to multi-node runs and other GPUs the interval covers only
what the calibration rows could show (the validations report its coverage, measured). Fitted on the calibration
rows only, never on a validation set. ``python -m llmcomm.overhead.interval`` regenerates
``data/calibration/interval.json``.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import write_bytes
from ..errors import DataError
from ..specs import data_dir

FILE = "calibration/interval.json"
QUANTILES = (0.05, 0.95)
COMMAND = "python -m llmcomm.overhead.interval"


def fit() -> dict[str, Any]:
    """The residual quantiles on the single-node calibration rows (needs the vTrain data)."""
    from . import measured
    from .validation import predict_rows

    rows = measured.read("single")
    pred = predict_rows(rows, interval=False)
    r = (pred["predicted_s"] / pred["time_s"] - 1.0).to_numpy()
    lo, hi = (float(np.quantile(r, q)) for q in QUANTILES)
    return {"quantiles": list(QUANTILES), "r_lo": lo, "r_hi": hi, "rows": int(len(r)),
            "fitted_on": "vtrain/ground_truth_single.csv (the utilization calibration rows), shipped calibration",
            "command": COMMAND}


def save(d: dict[str, Any], path: str | Path | None = None) -> Path:
    p = Path(path) if path else data_dir() / FILE
    write_bytes(p, (json.dumps(d, indent=1, sort_keys=True) + "\n").encode())
    return p


@lru_cache(maxsize=2)
def _load(path: str, stamp: int) -> tuple[float, float]:
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
        return float(d["r_lo"]), float(d["r_hi"])
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"{path}: cannot read the interval calibration ({e}); regenerate it with `{COMMAND}`") from None


def bounds() -> tuple[float, float] | None:
    """``(r_lo, r_hi)`` of the shipped file, or ``None`` when it is absent (no interval columns then)."""
    p = data_dir() / FILE
    if not p.is_file():
        return None
    return _load(str(p), p.stat().st_mtime_ns)


def apply(total: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(total_s_lo, total_s_hi)`` of predictions ``total`` (module docstring), or ``None`` without the file."""
    b = bounds()
    if b is None:
        return None
    lo, hi = b
    t = np.asarray(total, dtype=np.float64)
    return t / (1.0 + hi), t / (1.0 + lo)


def main() -> int:
    d = fit()
    print(f"wrote {save(d)}: r_lo={d['r_lo']:.4f} r_hi={d['r_hi']:.4f} on {d['rows']} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
