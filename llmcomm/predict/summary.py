"""Former home of the traffic summaries, kept so that existing notebooks and scripts still import them.

The analyses live in :mod:`llmcomm.analysis` (``bytes_by``, ``pair_classes``, ``tp_share``...), the
prediction sweeps in :mod:`llmcomm.predict.sweeps`; import them from there.
"""

from __future__ import annotations

from ..analysis.pairs import pair_class_table, pair_classes, support_violations
from ..analysis.volumes import bytes_by, first_crossing, tp_share, volume_table
from .sweeps import predict_cases, tp_share_vs_microbatches

__all__ = ["bytes_by", "first_crossing", "pair_class_table", "pair_classes", "predict_cases", "support_violations",
           "tp_share", "tp_share_vs_microbatches", "volume_table"]
