"""Where the project's folders are: the one place that knows where ``data/`` lives."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # the checkout: data/, notebooks/, figures/
ENV_DATA = "LLMCOMM_DATA"


def data_dir() -> Path:
    """The project's ``data/`` folder (model and cluster catalogues, curated traces, the external-data
    manifest); ``$LLMCOMM_DATA`` overrides it."""
    env = os.environ.get(ENV_DATA)
    return Path(env) if env else PROJECT_ROOT / "data"
