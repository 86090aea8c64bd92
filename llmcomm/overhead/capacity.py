"""Whether a configuration fits in GPU memory: the one rule that ``llmcomm time`` and
:func:`llmcomm.overhead.iteration_time` apply, on the kit's own memory model (:func:`llmcomm.overhead.memory`:
weights, gradients, optimizer states and activations of the most loaded pipeline stage, per GPU).

A configuration fits when that total is at most the GPU's memory (``Cluster.gpu_memory_bytes``). The model is an
estimate (Korthikanti et al.'s activation count, Megatron-LM's optimizer bytes) and leaves out the CUDA
context, NCCL buffers and fragmentation, so "fits" is necessary, not sufficient; the tuner keeps a margin on top
(``memory_fraction``). The command refuses a configuration that does not fit; the API warns with
:class:`MemoryWarning`, naming the numbers, because a time for a configuration that could not run is still a
legitimate what-if (the F5 sweep's LLaMA-3 70B case is one).
"""

from __future__ import annotations

import functools
import warnings

from ..errors import ConfigError
from ..specs import Cluster, ModelSpec, ParallelConfig
from .memory import MemoryBreakdown, memory


class MemoryWarning(UserWarning):
    """A configuration whose memory (by :func:`llmcomm.overhead.memory`) exceeds the GPU's."""


@functools.lru_cache(maxsize=256)
def _memory(model: ModelSpec, parallel: ParallelConfig) -> MemoryBreakdown:
    return memory(model, parallel)  # ~7 ms; cached because sweeps time one configuration many times


def overflow_message(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster) -> str | None:
    """``None`` when the configuration fits on ``cluster``'s GPUs, else the sentence saying by how much."""
    try:
        m = _memory(model, parallel)
    except TypeError:  # a spec with an unhashable field: not cached
        m = memory(model, parallel)
    if m.total <= cluster.gpu_memory_bytes:
        return None
    state = m.weights + m.gradients + m.optimizer
    return (f"{model.name} under tp={parallel.tp} pp={parallel.pp} dp={parallel.dp} ep={parallel.ep} "
            f"micro-batch {parallel.micro_batch} (recompute {parallel.recompute}) needs {m.total / 1e9:.1f} GB per "
            f"GPU on pipeline stage {m.stage}: {m.activations / 1e9:.1f} GB of activations and "
            f"{state / 1e9:.1f} GB of weights, gradients and optimizer state (llmcomm.overhead.memory); "
            f"{cluster.name}'s GPUs hold {cluster.gpu_memory_bytes / 1e9:.0f} GB")


def check_fits(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, *, action: str = "warn",
               hint: str = "") -> None:
    """Apply the rule of the module docstring: ``action="raise"`` raises :class:`ConfigError`, ``"warn"`` warns
    with :class:`MemoryWarning`; ``hint`` is appended to the message (what to change)."""
    if action not in ("raise", "warn"):
        raise ValueError(f"action={action!r} is not 'raise' or 'warn'")
    msg = overflow_message(model, parallel, cluster)
    if msg is None:
        return
    msg += hint
    if action == "raise":
        raise ConfigError(msg)
    warnings.warn(msg, MemoryWarning, stacklevel=3)
