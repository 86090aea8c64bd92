"""What the CPU collector can run, checked in the parent process before any worker starts.

A configuration the workers would reject minutes later (a reshape traceback for ``--tp 3`` on a 4-head
model, a ``ValueError`` for a model the tiny workload does not implement) is refused at once with a
:class:`~llmcomm.errors.ConfigError` naming the rule:

* every rule of :func:`llmcomm.specs.validate` (TP divides heads, query groups and FFN width; PP divides
  layers; EP divides experts; SP needs TP to divide the sequence);
* the workload (:mod:`llmcomm.collect.model`) is an untied, bias-free, non-gated GPT with rotary positions
  and LayerNorm, without shared experts; sequence parallelism is not applied to MoE layers;
* it trains on CPU: at most :data:`MAX_PARAMETERS` parameters (each rank builds the whole model first);
* ``torch.distributed.pipelining``'s 1F1B needs at least as many micro-batches as stages;
* at least one iteration, and ``record_iters`` (when given) at least one.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..specs import ModelSpec, ParallelConfig, validate

MAX_PARAMETERS = 20_000_000  # a CPU training step per rank in seconds, not minutes
SCHEDULES = ("1f1b", "gpipe")


def check_workload(spec: ModelSpec) -> None:
    """Raise :class:`ConfigError` when ``spec`` is not a model the workload implements (module docstring);
    :meth:`llmcomm.collect.model.ModelArgs.from_spec` asks the same."""
    name = spec.name
    unsupported = [f for f, bad in (("gated_mlp", spec.gated_mlp), ("add_bias_linear", spec.add_bias_linear),
                                    ("tied_embeddings", spec.tied_embeddings),
                                    ("num_shared_experts", bool(spec.num_shared_experts))) if bad]
    if unsupported:
        raise ConfigError(f"model {name}: {', '.join(unsupported)} set, but the collect workload is an untied, "
                          "bias-free, non-gated GPT without shared experts (e.g. tiny-gpt, tiny-moe)")
    if spec.position_embedding_type != "rope" or spec.normalization != "LayerNorm":
        raise ConfigError(f"model {name}: position_embedding_type={spec.position_embedding_type}, "
                          f"normalization={spec.normalization}, but the collect workload uses rope and LayerNorm")


def check_collectable(spec: ModelSpec, parallel: ParallelConfig, iters: int,
                      record_iters: int | None = None) -> None:
    """Raise :class:`ConfigError` naming the first rule (module docstring) this run would break."""
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ConfigError(f"iters={iters!r}: a recorded run needs at least one iteration")
    if record_iters is not None and record_iters < 1:
        raise ConfigError(f"record_iters={record_iters!r}: keep events for at least one iteration "
                          "(leave it unset to keep all)")
    name = spec.name
    check_workload(spec)
    n = spec.num_parameters()
    if n > MAX_PARAMETERS:
        raise ConfigError(f"model {name}: {n:,} parameters; the CPU collector trains models of at most "
                          f"{MAX_PARAMETERS:,} (e.g. tiny-gpt, tiny-moe)")
    if parallel.cp > 1 or parallel.vpp > 1:
        raise ConfigError(f"cp={parallel.cp}, vpp={parallel.vpp}: the collect workload has no context "
                          "parallelism or virtual pipeline stages (both must be 1)")
    if parallel.schedule not in SCHEDULES:
        raise ConfigError(f"schedule={parallel.schedule!r}: the collect workload runs {' or '.join(SCHEDULES)}")
    if parallel.sp and spec.is_moe:
        raise ConfigError(f"model {name}: sequence parallelism with MoE layers is not supported by the "
                          "collect workload")
    validate(spec, parallel)
    if parallel.pp > 1 and parallel.schedule == "1f1b" and parallel.num_microbatches < parallel.pp:
        raise ConfigError(f"num_microbatches={parallel.num_microbatches} < pp={parallel.pp}: torch's 1F1B "
                          "schedule needs at least one micro-batch per stage (raise --global-batch)")
