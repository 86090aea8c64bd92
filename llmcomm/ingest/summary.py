"""Former home of the real-trace summaries, kept so that existing notebooks and scripts still import them;
they live in :mod:`llmcomm.analysis` now."""

from __future__ import annotations

from ..analysis.alltoall import a2a_matrix_estimate
from ..analysis.bandwidth import bandwidth_summary
from ..analysis.repeatability import call_sequence, duration_spread, size_repeatability

__all__ = ["a2a_matrix_estimate", "bandwidth_summary", "call_sequence", "duration_spread", "size_repeatability"]
