"""ConfigTuner (finding F7): choose the parallel configuration with the iteration-time formulation.

* :mod:`.space` — the valid configurations of a model on a GPU count and batch;
* :mod:`.search` — memory filter, pruning rules that keep the optimum, ranking (:func:`tune`);
* :mod:`.measured` — the tuner's picks against measured runs and published configurations.
"""

from .search import TuneResult, rule_of_thumb, to_parallel, tune
from .space import SearchSpace, enumerate_candidates

__all__ = ["SearchSpace", "TuneResult", "enumerate_candidates", "rule_of_thumb", "to_parallel", "tune"]
