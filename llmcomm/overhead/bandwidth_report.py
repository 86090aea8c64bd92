"""Tables that report how well the α–β bandwidth model (:mod:`llmcomm.overhead.bandwidth`) fits real sweeps
and reproduces rows it was not fitted on (notebook 05, finding F5).

Every error is relative and signed, ``(predicted − measured) / measured``; ``abs`` columns are its magnitude.
Systems are named as in :data:`~llmcomm.overhead.bandwidth.CALIBRATION_SYSTEMS`; ``tables`` maps a system to
its bandwidth table (:func:`llmcomm.ingest_bandwidth`) and ``fits`` to its :func:`fit_sweeps` result.

* :func:`fit_busbw`: the fitted rows with measured and fitted bus bandwidth (GB/s).
* :func:`residual_table`: per system and sweep, the fitted rows' |error| (median, 95th percentile, worst).
* :func:`piece_table`: a fit report, one row per piece: α (µs) and bus bandwidth (GB/s) with 95 % intervals.
* :func:`one_line_vs_pieces`: the same sweeps fitted with one line per regime against up to three pieces.
* :func:`held_out_rows`, :func:`held_out_summary`: every other size held out, per system.
* :func:`leave_one_out`: one group size held out at a time.
* :func:`model_on_fitted_rows`: another model (e.g. vendor figures) timing the rows a fit used.
* :func:`bus_bandwidth`, :func:`large_message_busbw`, :func:`equals_calibration`: single numbers of a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .bandwidth import Bandwidth, CalibratedSystem, fit_sweeps, held_out, load_calibration, residual_summary

MID_SIZES = (2**20, 2**24)   # 1–16 MiB: where NCCL switches protocol and one line per regime misses most
LARGE_BYTES = 2**20          # leave-one-out also reports messages of at least 1 MiB
PIECE_COLUMNS = ("alpha_us_estimate", "alpha_us_ci_low", "alpha_us_ci_high",
                 "busbw_GBps_estimate", "busbw_GBps_ci_low", "busbw_GBps_ci_high")


def _residuals(bw: Bandwidth) -> pd.DataFrame:
    if bw.residuals is None:
        raise ConfigError("this Bandwidth has no residuals (not fitted)")
    return bw.residuals


def fit_busbw(bw: Bandwidth) -> pd.DataFrame:
    """The rows of a fit (:attr:`Bandwidth.residuals`, spikes included) with ``busbw`` measured and
    ``busbw_fit`` fitted, in GB/s: bus bytes ``x`` over the measured or predicted time, / 1e9."""
    return _residuals(bw).assign(busbw=lambda d: d["x"] / d["time_s"] / 1e9,
                                 busbw_fit=lambda d: d["x"] / d["pred_s"] / 1e9)


def residual_table(fits: Mapping[str, Bandwidth]) -> pd.DataFrame:
    """:func:`residual_summary` of each system's fit, one row per sweep (group size, nodes), with ``system``."""
    return pd.concat([residual_summary(bw).assign(system=s) for s, bw in fits.items()], ignore_index=True)


def piece_table(report: pd.DataFrame) -> pd.DataFrame:
    """A fit report (:attr:`Bandwidth.fit`) one row per piece: ``group_size, nodes, piece, bytes_lo, bytes_hi,
    n_rows, r2, rel_median_abs, rel_max_abs`` and :data:`PIECE_COLUMNS` (α in µs and bus bandwidth in GB/s,
    estimate and 95 % interval)."""
    r = report[report["parameter"].isin(["alpha_us", "busbw_GBps"])]
    w = r.pivot_table(index=["group_size", "nodes", "piece", "bytes_lo", "bytes_hi", "n_rows", "r2",
                             "rel_median_abs", "rel_max_abs"],
                      columns="parameter", values=["estimate", "ci_low", "ci_high"])
    w.columns = [f"{p}_{v}" for v, p in w.columns]
    return w[list(PIECE_COLUMNS)].reset_index()


def _errors(bw: Bandwidth) -> dict[str, float]:
    r = _residuals(bw)
    r = r[r["used"]]
    mid = r[(r["bytes"] >= MID_SIZES[0]) & (r["bytes"] <= MID_SIZES[1])]
    return {"median_abs": r["rel_err"].abs().median(), "max_abs": r["rel_err"].abs().max(),
            "median_abs_1_16MiB": mid["rel_err"].abs().median(), "max_abs_1_16MiB": mid["rel_err"].abs().max()}


def one_line_vs_pieces(tables: Mapping[str, pd.DataFrame], fits: Mapping[str, Bandwidth]) -> pd.DataFrame:
    """Is the piecewise form needed? Per system, the fitted rows' |error| (spikes excluded) of one line per
    regime (refitted with ``max_pieces=1``) and of ``fits`` (up to three pieces): ``system, form,
    median_abs, max_abs, median_abs_1_16MiB, max_abs_1_16MiB`` (the last two over 1–16 MiB messages)."""
    rows = []
    for s, t in tables.items():
        for label, bw in (("one line", fit_sweeps(t, origin=s, max_pieces=1)), ("up to 3 pieces", fits[s])):
            rows.append({"system": s, "form": label, **_errors(bw)})
    return pd.DataFrame(rows)


def held_out_rows(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Every other size of every sweep held out (:func:`held_out`, ``every_other``), for each system: the
    held-out rows with ``system`` and ``abs_err = |rel_err|``."""
    ho = pd.concat([held_out(t, s).assign(system=s) for s, t in tables.items()], ignore_index=True)
    ho["abs_err"] = ho["rel_err"].abs()
    return ho


def held_out_summary(rows: pd.DataFrame, by: str = "system") -> pd.DataFrame:
    """Per ``by`` of :func:`held_out_rows`: ``rows``, ``median_abs``, ``p95_abs``, ``max_abs`` of the held-out
    |error| and ``within_fit_max``, the share of rows within the worst |error| the fit reported for their sweep
    (``fit_max_abs``)."""
    def p95(e: pd.Series) -> float:
        return e.quantile(0.95)

    def within_fit_max(e: pd.Series) -> float:
        return float((e <= rows.loc[e.index, "fit_max_abs"]).mean())

    return (rows.groupby(by)
            .agg(rows=("abs_err", "size"), median_abs=("abs_err", "median"), p95_abs=("abs_err", p95),
                 max_abs=("abs_err", "max"), within_fit_max=("abs_err", within_fit_max))
            .reset_index())


def leave_one_out(tables: Mapping[str, pd.DataFrame], leave_out: Mapping[str, Sequence[int]]) -> pd.DataFrame:
    """Each group size of ``leave_out[system]`` held out of its system's fit in turn (:func:`held_out`,
    ``group_size``): ``system, left_out, rows, median_abs, median_signed, median_abs_ge_1MiB``. Systems missing
    from ``leave_out`` are skipped."""
    rows = []
    for s, t in tables.items():
        for n in leave_out.get(s, []):
            h = held_out(t, s, "group_size", n)
            rows.append({"system": s, "left_out": n, "rows": len(h), "median_abs": h["rel_err"].abs().median(),
                         "median_signed": h["rel_err"].median(),
                         "median_abs_ge_1MiB": h[h["bytes"] >= LARGE_BYTES]["rel_err"].abs().median()})
    return pd.DataFrame(rows)


def model_on_fitted_rows(model: Bandwidth, fitted: Bandwidth, op: str = "all_reduce") -> pd.DataFrame:
    """``model`` (another calibration, or :meth:`Bandwidth.from_cluster`'s vendor figures) timing the rows
    ``fitted`` was fitted on (spikes excluded): ``bytes, group_size, ranks_per_node, time_s`` (measured),
    ``pred_s`` (the model's) and ``rel_err``."""
    r = _residuals(fitted)
    r = r[r["used"]]
    pred = model.time(op, r["bytes"].to_numpy(), r["group_size"].to_numpy(), r["ranks_per_node"].to_numpy())
    t = r["time_s"].to_numpy()
    return pd.DataFrame({"bytes": r["bytes"].to_numpy(), "group_size": r["group_size"].to_numpy(),
                         "ranks_per_node": r["ranks_per_node"].to_numpy(), "time_s": t, "pred_s": pred,
                         "rel_err": (pred - t) / t})


def bus_bandwidth(bw: Bandwidth, group_size: int, ranks_per_node: int, nbytes: float,
                  op: str = "all_reduce") -> float:
    """One call's bus bandwidth (GB/s, :meth:`Bandwidth.busbw`) in a group of ``group_size`` ranks,
    ``ranks_per_node`` to a node."""
    return float(bw.busbw(op, nbytes, group_size, ranks_per_node))


def large_message_busbw(bw: Bandwidth) -> pd.Series:
    """The bus bandwidth (GB/s, ``1/β``) of each group size's last piece (the largest messages), indexed by
    ``group_size``."""
    v = bw.to_frame()
    return v.sort_values("piece").groupby("group_size").tail(1).set_index("group_size")["busbw_GBps"]


def equals_calibration(fits: Mapping[str, Bandwidth], calibration: Mapping[str, CalibratedSystem] | None = None,
                       rtol: float = 1e-9) -> bool:
    """Whether every system's α and β in ``fits`` equal the shipped calibration's (:func:`load_calibration`,
    or ``calibration``) to ``rtol``, piece by piece in order. Relative only (no absolute tolerance): β is
    ~1e-11 s/byte, below numpy's default ``atol``, which would let any β pass."""
    cal = load_calibration() if calibration is None else calibration
    return all(np.allclose(cal[s].bandwidth.params[["alpha_s", "beta_s_per_byte"]].to_numpy(float),
                           bw.params[["alpha_s", "beta_s_per_byte"]].to_numpy(float), rtol=rtol, atol=0.0)
               for s, bw in fits.items())
