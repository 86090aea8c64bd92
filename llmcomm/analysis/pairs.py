"""Which GPU pairs talk: bytes per pair class, and bytes outside every group (finding F1).

A pair ``(src, dst)`` is intra-node when ``src // gpus_per_node == dst // gpus_per_node``, else inter-node.
A flow of parallelism ``p`` is *supported* when its two ranks share a group of ``p`` in the trace's
:class:`~llmcomm.layout.Layout` (``tp`` for tp, ``tp`` or ``etp`` (expert TP) for sp; ``dp``, ``edp`` or
``dpcp`` (DP with CP folded in) for dp; ``cp``, ``pp`` for themselves; ``ep``, ``tpep``, ``tpcp`` or ``tpdpcp`` (the
MoE token dispatchers' and router's groups) for ep; for ``other`` — the per-iteration scalars and the batch broadcast —
``mp`` (tp x pp), ``world``, ``pp``, ``tpcp``, ``dp`` or ``tp``).

The shape of a communication matrix ``M`` (:meth:`~llmcomm.trace.Trace.matrix`, bytes from row to column):
:func:`diagonal_offsets`, the offsets ``dst − src`` of its nonzero entries (a pipeline's forward sends lie on
``+1``, its backward sends on ``−1``); :func:`matrix_asymmetry`, ``max |M − Mᵀ|`` (0 for collectives whose
every pair exchanges the same bytes both ways).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..errors import AnalysisError
from ..vocab import AlgorithmName
from .events import TraceOrEvents, trace_of
from .volumes import with_share

GROUP_KINDS_OF = {"tp": ("tp",), "sp": ("tp", "etp"), "cp": ("cp",), "pp": ("pp",), "dp": ("dp", "edp", "dpcp"),
                  "ep": ("ep", "tpep", "tpcp", "tpdpcp"),
                  "other": ("mp", "world", "pp", "tpcp", "dp", "tp")}
VIOLATION_COLUMNS = ["parallelism", "src", "dst", "bytes"]


def pair_classes(data: TraceOrEvents, gpus_per_node: int = 8, algorithm: AlgorithmName = "ring") -> pd.DataFrame:
    """Wire bytes per parallelism and pair class (``intra-node``/``inter-node``), with ``share``."""
    flows = trace_of(data).flows(algorithm)
    same_node = flows["src"].to_numpy() // gpus_per_node == flows["dst"].to_numpy() // gpus_per_node
    pair_class = np.where(same_node, "intra-node", "inter-node")
    table = (pd.DataFrame({"parallelism": flows["parallelism"].to_numpy(), "pair_class": pair_class,
                           "bytes": flows["bytes"]})
             .groupby(["parallelism", "pair_class"], observed=True)["bytes"].sum().reset_index())
    return with_share(table)


def pair_class_table(traces: Mapping[str, TraceOrEvents], gpus_per_node: int = 8, algorithm: AlgorithmName = "ring") -> pd.DataFrame:
    """Tidy ``config, parallelism, pair_class, bytes, share`` over several traces."""
    return pd.concat([pair_classes(trace, gpus_per_node, algorithm).assign(config=label)
                      for label, trace in traces.items()], ignore_index=True)


def support_violations(data: TraceOrEvents, algorithm: AlgorithmName = "direct") -> pd.DataFrame:
    """Nonzero matrix entries ``(parallelism, src, dst, bytes)`` whose two ranks share no group of that
    parallelism in the trace's layout (see the module docstring). Empty when every byte flows inside a
    group — finding F1's "determined by the parallel config and the rank mapping"."""
    from ..layout import Layout

    trace = trace_of(data)
    if "parallel" not in trace.meta:
        raise AnalysisError("trace meta has no field 'parallel': the layout that defines the groups is unknown")
    layout = Layout(trace.parallel_config(), int(trace.meta.get("gpus_per_node", 8)))
    flows = trace.flows(algorithm)
    flows = flows[flows["bytes"] > 0]
    violations = []
    for parallelism, part in flows.groupby("parallelism", observed=True):
        supported = np.zeros(len(part), dtype=bool)
        src, dst = part["src"].to_numpy(), part["dst"].to_numpy()
        for kind in GROUP_KINDS_OF.get(str(parallelism), ()):
            group_of_rank = layout.group_index(kind)
            supported |= group_of_rank[src] == group_of_rank[dst]
        violations.append(part.loc[~supported, VIOLATION_COLUMNS])
    return pd.concat(violations, ignore_index=True) if violations else pd.DataFrame(columns=VIOLATION_COLUMNS)


def diagonal_offsets(data: TraceOrEvents, algorithm: AlgorithmName = "direct", **filters: Any) -> list[int]:
    """The diagonals the nonzero entries of the communication matrix lie on: the distinct ``dst − src`` of
    its entries with bytes, ascending; ``filters`` select events first (``parallelism="pp"``...)."""
    matrix = trace_of(data).matrix(algorithm, **filters).tocoo()
    nonzero = matrix.data != 0
    return sorted(set((matrix.col[nonzero] - matrix.row[nonzero]).tolist()))


def matrix_asymmetry(data: TraceOrEvents, algorithm: AlgorithmName = "direct", **filters: Any) -> float:
    """``max |M − Mᵀ|`` over the communication matrix's entries (bytes; 0 when symmetric); ``filters``
    select events first."""
    matrix = trace_of(data).matrix(algorithm, **filters)
    return float(abs(matrix - matrix.T).max())
