"""A bandwidth model for tests worked by hand: 1 µs per call plus 1 ns per byte, whatever the op and group."""

from __future__ import annotations

import numpy as np


class StubBandwidth:
    """1 µs per call plus 1 ns per byte, whatever the op and group (easy to add up by hand)."""

    def time(self, op, nbytes, group_size, ranks_per_node):  # noqa: ANN001, ANN201
        return 1e-6 + np.asarray(nbytes, dtype=float) * 1e-9


def call(nbytes: float) -> float:
    """:class:`StubBandwidth`'s seconds for one call of ``nbytes``."""
    return 1e-6 + nbytes * 1e-9
