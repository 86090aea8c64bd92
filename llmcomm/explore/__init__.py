"""An interactive explorer for teaching: choose a model, a cluster and a parallel configuration and see the rank
layout, the communication matrix per parallelism (logical and ring), the bytes per parallelism, one rank's call
sequence for a micro-batch and the iteration-time breakdown change together.

``llmcomm.explore.explore()`` in JupyterLab; ``llmcomm explore`` serves the same widgets as a page with Voilà.
It holds no logic of its own: :mod:`.view` calls the package's public functions, :mod:`.panels` draws with
:mod:`llmcomm.plots`, :mod:`.widget` wires ipywidgets to them.
"""

from __future__ import annotations

from .view import GPU_LEVEL_MAX, Choice, View, compute

__all__ = ["Choice", "View", "compute", "GPU_LEVEL_MAX", "Explorer", "explore"]


def __getattr__(name: str):  # ipywidgets is imported only when the widgets are asked for
    if name in ("Explorer", "explore"):
        from . import widget

        return getattr(widget, name)
    raise AttributeError(name)
