"""What communication costs: effective bandwidth, GPU utilization and the iteration-time formulation
(findings F5, F6). Exports one per line."""

from __future__ import annotations

from .iteration import (
    Breakdown,
    iteration_time,
    iteration_times,
)
from .utilization import (
    Utilization,
)

__all__ = [
    "Breakdown",
    "Utilization",
    "iteration_time",
    "iteration_times",
]
