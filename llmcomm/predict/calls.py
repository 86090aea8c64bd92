"""The unit the predictor works in: a :class:`Call` template (one communication call of one pipeline stage,
with its group named by kind rather than by ranks, ``llmcomm.vocab.CALL_GROUP_KINDS``), and :class:`Context`, the sizes every generator needs.

Sizes (``b`` micro-batch, ``s`` sequence, ``h`` hidden, ``cp`` context-parallel size, ``tp`` tensor-parallel
size, ``act`` bytes per activation element)::

    tokens      = b · s / cp                       tokens of one micro-batch held by one TP group
    act_bytes   = tokens · h · act                 a full (b, s, h) activation buffer (TP collectives)
    p2p_bytes   = act_bytes / tp  with SP (Megatron's p2p tensor_shape) or DeepSpeed's partitioned pipeline,
                  else act_bytes
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .. import step
from ..errors import ConfigError
from ..specs import ModelSpec, ParallelConfig
from ..vocab import FRAMEWORKS, FrameworkName, OpName, ParallelismName, PhaseName, RouteName, dtype_bytes


@dataclass(frozen=True)
class Call:
    """One call of a stage's program. ``group`` is a kind from ``CALL_GROUP_KINDS``; ``peer`` for send/recv is a
    stage offset (+1 next, -1 previous, wrapping); ``route`` marks a routed all-to-all
    (``"dispatch"``: rank -> experts, ``"combine"``: experts -> rank) whose splits come from routing."""

    phase: PhaseName
    parallelism: ParallelismName
    op: OpName
    group: str  # one of CALL_GROUP_KINDS
    bytes: int
    dtype: str  # a short dtype name (vocab.ELEMENT_BYTES)
    layer: int = -1
    microbatch: int = -1
    peer: int = 0
    route: RouteName = ""


def _parallel_field(name: str, doc: str) -> property:
    """A read-only attribute of :class:`Context` passed through from its ``ParallelConfig``."""
    return property(lambda ctx: getattr(ctx.parallel, name), doc=doc)


@dataclass(frozen=True)
class Context:
    """Model, parallel config and framework with the derived sizes used by every generator."""

    model: ModelSpec
    parallel: ParallelConfig
    framework: FrameworkName = "megatron"

    def __post_init__(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise ConfigError(f"framework={self.framework!r} is not one of {FRAMEWORKS}")

    # -- sizes ------------------------------------------------------------------------------------
    tp = _parallel_field("tp", "Tensor-parallel size.")
    pp = _parallel_field("pp", "Pipeline-parallel size (stages).")
    vpp = _parallel_field("vpp", "Model chunks per pipeline rank (virtual stages; 1 without interleaving).")
    sp = _parallel_field("sp", "Whether sequence parallelism turns TP all-reduces into all-gathers and "
                               "reduce-scatters.")
    act_dtype = _parallel_field("act_dtype", "Activation dtype name (``bf16``...).")

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per iteration: ``global_batch / (micro_batch · dp)``."""
        return self.parallel.num_microbatches

    @property
    def seq(self) -> int:
        """Sequence length ``s``."""
        return self.parallel.sequence_length(self.model)

    @property
    def act(self) -> int:
        """``act``: bytes per activation element."""
        return dtype_bytes(self.parallel.act_dtype)

    @property
    def tokens(self) -> int:
        """``b · s / cp``: tokens of one micro-batch in one TP group."""
        return self.parallel.micro_batch * self.seq // self.parallel.cp

    @property
    def local_tokens(self) -> int:
        """Tokens one rank holds between TP regions: ``tokens / tp`` with SP, else ``tokens``."""
        return self.tokens // self.tp if self.sp else self.tokens

    @property
    def probs_dtype(self) -> str:
        """The routing probabilities' dtype: ``moe_router_dtype`` (``--moe-router-dtype``), else the activation
        dtype (``topk_routing_with_score_function`` returns ``probs.type_as(logits)``, the router's logits are in
        the router dtype: core/transformer/moe/router.py)."""
        return self.parallel.moe_router_dtype or self.parallel.act_dtype

    @property
    def probs_bytes(self) -> int:
        """Bytes per routing-probability element (:attr:`probs_dtype`)."""
        return dtype_bytes(self.probs_dtype)

    @property
    def act_bytes(self) -> int:
        """``b · s · h · act / cp``: the full activation buffer of a TP collective."""
        return self.tokens * self.model.hidden_size * self.act

    @property
    def pipe_partitioned(self) -> bool:
        """The pipeline tensors cross stages split over TP and are all-gathered on arrival (DeepSpeed's
        PipelineEngine, :attr:`ParallelConfig.pipe_partitioned`; nothing to split at ``tp == 1``)."""
        return self.parallel.pipe_partitioned and self.tp > 1

    @property
    def p2p_bytes(self) -> int:
        """Pipeline send/recv tensor: ``(tokens / tp)·h·act`` with SP or :attr:`pipe_partitioned`, else
        ``act_bytes``."""
        tokens = self.tokens // self.tp if self.sp or self.pipe_partitioned else self.tokens
        return tokens * self.model.hidden_size * self.act

    # -- layers and stages --------------------------------------------------------------------------

    @property
    def last_virtual(self) -> int:
        return self.pp * self.vpp - 1

    def virtual_stage(self, stage: int, chunk: int) -> int:
        """Megatron's virtual pipeline rank: ``chunk · pp + stage``."""
        return chunk * self.pp + stage

    def chunk_layers(self, stage: int, chunk: int) -> range:
        """Global layer indices of model chunk ``chunk`` on stage ``stage``."""
        return step.chunk_layers(self.model.num_layers, self.parallel, stage, chunk)

    def stage_layers(self, stage: int) -> list[int]:
        return step.stage_layers(self.model.num_layers, self.parallel, stage)

    @cached_property
    def moe_pattern(self) -> tuple[bool, ...]:
        return self.model.moe_layer_pattern()

    def holds_embedding(self, stage: int) -> bool:
        return stage == 0

    def holds_output(self, stage: int) -> bool:
        return stage == self.pp - 1
