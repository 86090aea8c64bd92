"""A measured trace against its prediction, call by call: where a training run's communication matches the
model and where it does not.

``compare(measured)`` predicts the measured trace's own configuration (model and parallel config from the
arguments or from the trace's metadata) and aligns the two **per rank** as multisets of calls keyed by

    (phase, op, group, peer, bytes)

— the columns every source fills, the group as a set of ranks (for send/recv: the pair of ranks). A Kineto or
AICB trace has no layer numbers, and micro-batch numbering differs between frameworks, so they are reported,
not matched on. For each rank and key, ``matched = min(n_measured, n_predicted)``; the remainder on either side
is a call present on one side only. The parallelism label is not part of the key (AICB labels
sequence-parallel gathers ``tp`` where the predictor says ``sp``): a matched call keeps the predicted label, a
one-sided call its own side's label.

Only one iteration is compared (``iteration=``; default: the last one the measured trace marks), on the ranks the
measured trace holds (an AICB workload holds rank 0 only); ``setup`` calls (initialization) are set aside and
listed. For MoE traces with recorded routing, the prediction is fed that iteration's routing, so all-to-all
splits can match exactly.

Tables of :class:`Comparison` (all tidy DataFrames):

* ``by_kind``: per (parallelism, phase, op) calls and bytes on each side and ``bytes_ratio = measured /
  predicted``;
* ``one_sided``: the unmatched calls grouped by (side, phase, parallelism, op, bytes, group size) with the ranks
  involved, the count per iteration and per micro-batch, and a sentence saying what they are;
* ``pairs``: per (src, dst) bytes of the direct matrix on both sides and their difference;
* ``verdicts``: one line per parallelism: ``exact`` (every call matched), ``same bytes, different calls``, or
  ``differs by X%`` (measured bytes relative to predicted).

Modules: :mod:`.align` (inputs, alignment, :func:`compare`), :mod:`.comparison` (:class:`Comparison`),
:mod:`.report` (the one builder of its Markdown and HTML reports), :mod:`.load` (:func:`load_measured`).
"""

from .align import KEY, WORK_PHASES, compare, trace_framework
from .comparison import Comparison
from .load import load_measured

__all__ = ["KEY", "WORK_PHASES", "Comparison", "compare", "load_measured", "trace_framework"]
