"""A bandwidth model fitted on a user's nccl-tests logs that says, per regime, which data timed it.

A user's logs rarely cover every regime a configuration needs: one node's ``nccl_8.log`` has no inter-node
measurements, a 16-GPU log alone none inside a node. :class:`SourcedBandwidth` times a regime (op, group size
``n``, ranks per node ``k``) from the user's fit when the logs hold measurements of that scope (intra- or
inter-node; carried inside the scope by :class:`~llmcomm.overhead.bandwidth.Bandwidth`'s rules), and otherwise
from the fallback — the shipped calibration carried to the cluster (:meth:`Bandwidth.default`), itself from real
sweeps, rather than the datasheet link figures, which are optimistic. It records every regime it resolved
with its source, so a report can say which data timed each call (:meth:`SourcedBandwidth.sources`) and warn
about the ones the logs do not hold.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from ..specs import Cluster
from .bandwidth import Bandwidth

USER = "your nccl-tests logs"
SHIPPED = "shipped calibration"
DATASHEET = "datasheet (the cluster's vendor link figures)"


@dataclasses.dataclass(frozen=True, eq=False)
class SourcedBandwidth(Bandwidth):
    """:class:`Bandwidth` fitted on user logs, with ``fallback`` for the scopes they do not cover (module
    docstring). ``used``: ``(op, n, k) -> (source, detail)`` for every regime resolved so far."""

    fallback: Bandwidth | None = None
    fallback_label: str = SHIPPED
    used: dict[tuple[str, int, int], tuple[str, str]] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def from_logs(cls, paths: Any, cluster: Cluster, fallback: Bandwidth | None = None) -> SourcedBandwidth:
        """Fit ``paths`` (:meth:`Bandwidth.from_nccl_tests`); ``fallback`` defaults to the shipped calibration
        carried to ``cluster``."""
        user = Bandwidth.from_nccl_tests(paths, cluster=cluster)
        fields = {f.name: getattr(user, f.name) for f in dataclasses.fields(Bandwidth) if f.init}
        return cls(**fields, fallback=fallback if fallback is not None else Bandwidth.default(cluster))

    def _own_rows(self, op: str, scope: str) -> pd.DataFrame:
        p = self.params
        for src in (op, {"send": "recv", "recv": "send"}.get(op, op), "all_reduce"):
            rows = p[(p["op"] == src) & (p["scope"] == scope)] if len(p) else p
            if len(rows):
                return rows
        return p.iloc[:0]

    def _resolve(self, op: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m = -(-n // k)
        scope = "intra" if m == 1 else "inter"
        rows = self._own_rows(op, scope)
        if len(rows):
            out = super()._resolve(op, n, k)
            measured = rows[(rows["group_size"] == n) & (rows["ranks_per_node"] == k)]
            src_op = str(rows["op"].iloc[0])
            if len(measured) and src_op == op:
                detail = "measured"
            else:
                detail = f"carried from your {src_op} over {self._picked(rows, out[0])}"
            self.used[(op, n, k)] = (USER, detail)
            return out
        if self.fallback is not None:
            self.used[(op, n, k)] = (self.fallback_label, f"your logs hold no {scope}-node measurements")
            return self.fallback.regime(op, n, k)
        self.used[(op, n, k)] = (DATASHEET, f"your logs hold no {scope}-node measurements")
        return super()._resolve(op, n, k)

    @staticmethod
    def _picked(rows: pd.DataFrame, x_lo: np.ndarray) -> str:
        """The measured regime the carrying rules took: the one whose pieces start where the result's do (the
        rules scale α and β, never the piece boundaries), when exactly one does."""
        hits = [(int(g), int(r)) for (g, r), grp in rows.groupby(["group_size", "ranks_per_node"], sort=True)
                if np.array_equal(grp.sort_values("piece")["x_lo"].to_numpy(float), x_lo)]
        if len(hits) != 1:  # piece boundaries shared by several regimes: name the candidates
            hits = sorted({(int(g), int(r)) for g, r in zip(rows["group_size"], rows["ranks_per_node"], strict=True)})
            return "one of " + ", ".join(f"{g} ranks ({r}/node)" for g, r in hits)
        return f"{hits[0][0]} ranks ({hits[0][1]}/node)"

    def sources(self) -> pd.DataFrame:
        """One row per regime resolved so far: ``op, group_size, ranks_per_node, nodes, source, detail``."""
        rows = [{"op": op, "group_size": n, "ranks_per_node": k, "nodes": -(-n // k), "source": s, "detail": d}
                for (op, n, k), (s, d) in sorted(self.used.items())]
        return pd.DataFrame(rows, columns=["op", "group_size", "ranks_per_node", "nodes", "source", "detail"])

    def not_in_logs(self) -> pd.DataFrame:
        """The resolved regimes whose scope (intra- or inter-node) the user's logs do not hold at all."""
        s = self.sources()
        return s[s["source"] != USER].reset_index(drop=True)
