"""The closed vocabularies every module shares: what the columns of the events and routing tables may hold,
which groups a rank belongs to, and the names a :class:`~llmcomm.specs.ParallelConfig` accepts.

A closed value set is a :class:`~enum.StrEnum` whose values are the strings written in traces, configs and
figures (``Op.ALL_REDUCE == "all_reduce"``), so code may compare with either; the matching ``tuple`` of plain
strings (``OPS``) keeps the order used to encode a column as small integers, and the matching ``Literal``
(``OpName``) types the fields and arguments that hold one of them (a test checks each against its enum).

Events table (one row = one communication call as one rank issued it; ``EVENTS_SCHEMA``)::

    rank, iteration, microbatch (-1: none), layer (-1: none)          int32
    phase (Phase), parallelism (Parallelism), op (Op)                  string
    group (global ranks), peer (send/recv partner, -1 otherwise)       list<int32>, int32
    bytes (nccl-tests convention), dtype (short name, ELEMENT_BYTES)   int64, string
    split_bytes (per group member, all_to_all only)                    list<int64>, nullable
    t_start_ns, t_end_ns (null for predictions)                        int64, nullable
    source (predicted, recorded, kineto, ...), count (calls per row)   string, int64

Routing table (MoE; ``ROUTING_SCHEMA``): ``tokens`` that ``src_rank`` routed to ``expert`` in ``layer`` of
``microbatch`` in ``iteration``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, cast

import pyarrow as pa

from .errors import ConfigError


def _values(enum: type[StrEnum]) -> tuple[str, ...]:
    return tuple(str(member.value) for member in enum)


# ------------------------------------------------------------------------------------- events: tags
class Phase(StrEnum):
    """When in an iteration a call is issued."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    SETUP = "setup"


class Parallelism(StrEnum):
    """Which parallelism a call serves (``sp``: the all-gathers / reduce-scatters of sequence parallelism)."""

    TP = "tp"
    SP = "sp"
    CP = "cp"
    PP = "pp"
    DP = "dp"
    EP = "ep"
    OTHER = "other"


class Op(StrEnum):
    """The communication call, in nccl-tests' names."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"
    RECV = "recv"
    BROADCAST = "broadcast"


COLLECTIVES = (Op.ALL_REDUCE.value, Op.ALL_GATHER.value, Op.REDUCE_SCATTER.value, Op.ALL_TO_ALL.value,
               Op.BROADCAST.value)
POINT_TO_POINT = (Op.SEND.value, Op.RECV.value)


class Algorithm(StrEnum):
    """How a collective's bytes become flows between ranks (see :mod:`llmcomm.trace`)."""

    RING = "ring"
    DIRECT = "direct"


# ------------------------------------------------------------------------------------------ groups
class GroupKind(StrEnum):
    """A process group named by its role rather than by its ranks.

    ``tp``, ``cp``, ``dp``, ``pp``, ``ep``: one parallelism's groups; ``edp``: expert data parallel (the ranks
    holding the same experts, ``world/(etp·ep·pp)``); ``dpcp``: data parallel with CP folded in (Megatron's
    gradient group, ``cp·dp``); ``emb``: first and last pipeline stage (Megatron's embedding group, tied
    weights); ``mp``: Megatron's model-parallel group (``tp × pp``); ``tpcp``: ``tp × cp`` (the router's
    aux-loss group); ``etp``: expert tensor parallel; ``tpep``: expert tensor × expert parallel (Megatron's
    ``tp_ep`` group); ``tpeppp``: expert tensor × expert × pipeline parallel (Megatron's ``tp-ep-pp`` expert
    group, the expert optimizer's gradient-statistics group); ``tpdpcp``: ``tp × dp × cp`` (the global aux loss
    and the expert-bias update); ``world``: every rank; ``p2p`` / ``cp_p2p``: the pair ``[rank, peer]`` with the peer in
    the rank's PP / CP group."""

    TP = "tp"
    CP = "cp"
    DP = "dp"
    PP = "pp"
    EP = "ep"
    EDP = "edp"
    DPCP = "dpcp"
    EMB = "emb"
    MP = "mp"
    TPCP = "tpcp"
    ETP = "etp"
    TPEP = "tpep"
    TPEPPP = "tpeppp"
    TPDPCP = "tpdpcp"
    WORLD = "world"
    P2P = "p2p"
    CP_P2P = "cp_p2p"


RANK_DIMS = ("tp", "cp", "dp", "pp")  # the world is their product, ordered by ParallelConfig.order
GROUP_PARALLELISMS = (*RANK_DIMS, "ep")  # parallelisms with a group of their own (Layout.membership)
# what Layout.groups builds
LAYOUT_GROUP_KINDS = (*GROUP_PARALLELISMS, "edp", "dpcp", "emb", "mp", "tpcp", "etp", "tpep", "world", "tpeppp", "tpdpcp")
PAIR_GROUP_KINDS = ("p2p", "cp_p2p")  # [rank, peer] pairs, built per call
# the group kinds a predictor Call names (llmcomm.predict.calls), in the order expand encodes them; "pp" is the
# whole pipeline group (collectives over it, not send/recv)
CALL_GROUP_KINDS = ("tp", "dp", "edp", "ep", "emb", "p2p", "cp_p2p", "dpcp", "mp", "tpcp", "etp", "tpep", "world",
                    "pp", "tpeppp", "tpdpcp", "cp")  # "cp": the CP group's collectives (all_gather, a2a cp_comm_type)


def parse_order(order: str) -> tuple[str, ...]:
    """A rank order string (``ParallelConfig.order``, Megatron-LM ``--order``-style) as its dimensions, fastest
    first: ``"tp-cp-ep-dp-pp"`` -> ``("tp", "cp", "dp", "pp")``; checks it is a permutation of ``RANK_DIMS``
    (``ep`` optional, immediately before ``dp``: it subdivides ``dp`` and adds no dimension)."""
    toks = [t.strip().lower() for t in order.split("-") if t.strip()]
    if "ep" in toks:
        i = toks.index("ep")
        if i + 1 >= len(toks) or toks[i + 1] != "dp":
            raise ConfigError(f"order={order!r}: 'ep' must come immediately before 'dp'")
        toks.pop(i)
    for d in RANK_DIMS:  # dimensions left out of the order string are size-1 and placed slowest
        if d not in toks:
            toks.append(d)
    if sorted(toks) != sorted(RANK_DIMS) or len(toks) != len(RANK_DIMS):
        raise ConfigError(f"order={order!r} must be a permutation of {'-'.join(RANK_DIMS)} (ep optional before dp)")
    return tuple(toks)


class Route(StrEnum):
    """Which way a predicted all-to-all moves tokens; its splits come from routing (``NONE``: not routed)."""

    NONE = ""
    DISPATCH = "dispatch"  # rank -> the ranks of its tokens' experts
    COMBINE = "combine"  # experts' outputs -> back to the rank
    COUNTS = "counts"  # the token-count exchange before a dispatch
    PROBS_DISPATCH = "probs_dispatch"  # the routing probabilities, sent like a dispatch
    PROBS_COMBINE = "probs_combine"  # their gradients, sent back like a combine


# ------------------------------------------------------------------------------------------ dtypes
class Dtype(StrEnum):
    """Training dtypes a :class:`~llmcomm.specs.ParallelConfig` may name."""

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# every short dtype name the events table may hold, with its element size
ELEMENT_BYTES: dict[str, int] = {
    **DTYPE_BYTES, "fp64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "complex64": 8,
}
# torch attribute names -> short names (other torch dtypes keep torch's own name, e.g. "int64")
TORCH_DTYPE_NAMES: dict[str, str] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
# PyTorch's c10 ScalarType names (record_param_comms), C type names (Input type) and short names
_DTYPE_ALIASES: dict[str, str] = {
    "float": "fp32", "double": "fp64", "half": "fp16", "bfloat16": "bf16", "c10::half": "fp16",
    "c10::bfloat16": "bf16", "long": "int64", "long int": "int64", "int64": "int64", "int": "int32",
    "int32": "int32", "short": "int16", "short int": "int16", "byte": "uint8", "unsigned char": "uint8",
    "uint8": "uint8", "char": "int8", "signed char": "int8", "int8": "int8", "bool": "bool",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "complexfloat": "complex64",
    "fp32": "fp32", "fp16": "fp16", "bf16": "bf16",
}
# alias -> (short name, bytes per element), what the trace readers look names up in
DTYPES: dict[str, tuple[str, int]] = {k: (v, ELEMENT_BYTES[v]) for k, v in _DTYPE_ALIASES.items()}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a training dtype name (``bf16`` -> 2); :class:`ConfigError` for any other name."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(f"dtype={dtype!r} is not one of {sorted(DTYPE_BYTES)}") from None


# ---------------------------------------------------------------------------------- configurations
class Recompute(StrEnum):
    """Activation recomputation (Megatron-LM's ``--recompute-granularity``)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class PipelineSchedule(StrEnum):
    """Pipeline schedules the predictor knows."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"
    INTERLEAVED = "interleaved"


class AttentionBackend(StrEnum):
    """Megatron-LM's ``--attention-backend`` (``megatron/core/transformer/enums.py:51`` ``AttnBackend``; default
    ``auto``, ``transformer_config.py:151``). ``flash`` and ``fused`` are TransformerEngine's fused kernels (the
    score matrix never reaches HBM; ``auto`` lets TE choose one of them); ``unfused`` and ``local`` materialize
    the scores (softmax, dropout) in HBM."""

    FLASH = "flash"
    FUSED = "fused"
    UNFUSED = "unfused"
    LOCAL = "local"
    AUTO = "auto"


class Framework(StrEnum):
    """Whose calls a prediction describes: Megatron-LM's, or torch's parallel APIs in ``llmcomm.collect``."""

    MEGATRON = "megatron"
    TORCH = "torch"


class Normalization(StrEnum):
    """A transformer's norm layers (Megatron-LM's ``--normalization``): LayerNorm has 2·h parameters, RMSNorm h."""

    LAYER_NORM = "LayerNorm"
    RMS_NORM = "RMSNorm"


class Activation(StrEnum):
    """The FFN activation (the model's ``activation``; :func:`llmcomm.step.ffn_activation_bytes` counts its
    kernel): the fused bias-GeLU of a two-matrix MLP, the fused SwiGLU of a gated one (``gated_mlp``), or the
    ``torch.compile``'d squared ReLU of Nemotron's two-matrix MLP (NeMo's ``activation: squared-relu``)."""

    GELU = "gelu"
    SWIGLU = "swiglu"
    SQUARED_RELU = "squared_relu"


class MoeTokenDispatcher(StrEnum):
    """Megatron-LM's ``--moe-token-dispatcher-type`` (``core/transformer/transformer_config.py``); ``flex``
    (DeepEP / HybridEP kernels) is named so that it can be refused with a reason rather than as an unknown
    word."""

    ALLGATHER = "allgather"
    ALLTOALL = "alltoall"
    FLEX = "flex"


class PositionEmbedding(StrEnum):
    """Megatron-LM's ``--position-embedding-type``; ``learned_absolute`` adds a P·h table of parameters; ``yarn``
    is RoPE with YaRN's frequency scaling (``YarnRotaryEmbedding``, no parameters), which Megatron runs unfused
    (:mod:`llmcomm.overhead.eager_ops`)."""

    ROPE = "rope"
    LEARNED_ABSOLUTE = "learned_absolute"
    NONE = "none"
    YARN = "yarn"


# ------------------------------------------------------------------------ the same sets as Literal types
PhaseName = Literal["forward", "backward", "optimizer", "setup"]
ParallelismName = Literal["tp", "sp", "cp", "pp", "dp", "ep", "other"]
OpName = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "broadcast"]
AlgorithmName = Literal["ring", "direct"]
DtypeName = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
RecomputeName = Literal["none", "selective", "full"]
ScheduleName = Literal["1f1b", "gpipe", "interleaved"]
FrameworkName = Literal["megatron", "torch"]
NormalizationName = Literal["LayerNorm", "RMSNorm"]
ActivationName = Literal["gelu", "swiglu", "squared_relu"]
DispatcherName = Literal["allgather", "alltoall", "flex"]
PositionEmbeddingName = Literal["rope", "learned_absolute", "none", "yarn"]
RouteName = Literal["", "dispatch", "combine", "counts", "probs_dispatch", "probs_combine"]
# each Literal with the StrEnum it spells out (tests/test_vocab.py checks they hold the same values)
LITERALS: dict[Any, type[StrEnum]] = {
    PhaseName: Phase, ParallelismName: Parallelism, OpName: Op, AlgorithmName: Algorithm, DtypeName: Dtype,
    RecomputeName: Recompute, ScheduleName: PipelineSchedule, FrameworkName: Framework,
    NormalizationName: Normalization, ActivationName: Activation, DispatcherName: MoeTokenDispatcher, PositionEmbeddingName: PositionEmbedding,
    RouteName: Route,
}


# ------------------------------------------------------------------------------------ value tuples
# the values of each vocabulary as plain strings, in declaration order (the codes llmcomm.predict.expand uses)
PHASES = _values(Phase)
PARALLELISM_TAGS = _values(Parallelism)
OPS = _values(Op)
ALGORITHMS = cast("tuple[AlgorithmName, ...]", _values(Algorithm))  # the Literal below spells these
ROUTES = _values(Route)
RECOMPUTE_MODES = _values(Recompute)
# recomputation as an ordered code (none < selective < full): the cost model's arrays and the tuner's pruning
RECOMPUTE_CODE: dict[str, int] = {"none": 0, "selective": 1, "full": 2}
PIPELINE_SCHEDULES = _values(PipelineSchedule)
ATTENTION_BACKENDS = _values(AttentionBackend)
FUSED_ATTENTION_BACKENDS = ("flash", "fused", "auto")  # one kernel: no score traffic, causal FLOPs halved
# Megatron-LM's --recompute-modules the kit reads (megatron/core/transformer/transformer_config.py:560 lists these and
# the GatedDeltaNet/mHC ones, gdn_norm_out, gdp_in_proj, gdp_qkv, mhc, which need model features the kit has not)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
# Megatron-LM's --cp-comm-type (megatron/training/arguments.py:3221, transformer_config.py:1030, passed to
# TransformerEngine's attn_forward_func_with_cp, context_parallel.py:4924): the KV ring, the KV all-gather,
# Ulysses-style all-to-alls of Q, K, V and O, and the two-level a2a inside / p2p across (hierarchical sizes)
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
FRAMEWORKS = _values(Framework)
MOE_TOKEN_DISPATCHERS = _values(MoeTokenDispatcher)
# Megatron-LM's --moe-flex-dispatcher-backend (transformer_config.py:898), the flex dispatcher's kernels
MOE_FLEX_BACKENDS = ("deepep", "hybridep", "ncclep")
NORMALIZATIONS = _values(Normalization)
ACTIVATIONS = _values(Activation)
POSITION_EMBEDDINGS = _values(PositionEmbedding)


# ------------------------------------------------------------------------------------------ schemas
EVENTS_SCHEMA = pa.schema([
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("iteration", pa.int32(), nullable=False),
    pa.field("microbatch", pa.int32(), nullable=False),
    pa.field("layer", pa.int32(), nullable=False),
    pa.field("phase", pa.string(), nullable=False),
    pa.field("parallelism", pa.string(), nullable=False),
    pa.field("op", pa.string(), nullable=False),
    pa.field("group", pa.list_(pa.int32()), nullable=False),
    pa.field("peer", pa.int32(), nullable=False),
    pa.field("bytes", pa.int64(), nullable=False),
    pa.field("dtype", pa.string(), nullable=False),
    pa.field("split_bytes", pa.list_(pa.int64()), nullable=True),
    pa.field("t_start_ns", pa.int64(), nullable=True),
    pa.field("t_end_ns", pa.int64(), nullable=True),
    pa.field("source", pa.string(), nullable=False),
    pa.field("count", pa.int64(), nullable=False),
])
EVENT_COLUMNS: tuple[str, ...] = tuple(EVENTS_SCHEMA.names)
# optional columns and the value a missing one takes
EVENT_DEFAULTS: dict[str, Any] = {
    "iteration": 0, "microbatch": -1, "layer": -1, "peer": -1, "dtype": "", "split_bytes": None,
    "t_start_ns": None, "t_end_ns": None, "count": 1,
}
TIME_COLUMNS = ("t_start_ns", "t_end_ns")

ROUTING_SCHEMA = pa.schema([
    pa.field("iteration", pa.int32()),
    pa.field("microbatch", pa.int32()),
    pa.field("layer", pa.int32()),
    pa.field("src_rank", pa.int32()),
    pa.field("expert", pa.int32()),
    pa.field("tokens", pa.int64()),
])
ROUTING_COLUMNS: tuple[str, ...] = tuple(ROUTING_SCHEMA.names)
ROUTING_KEY: tuple[str, ...] = ROUTING_COLUMNS[:-1]  # a routing row's identity (and sort order)

# the userbuffers layers whose reduce-scatter buffer the ub config may make FP8 (TransformerEngine's initialize_ub
# honours ``fp8_buf`` for the pipeline-method names only; the all-gather buffers are FP8 regardless):
# ParallelConfig.tp_comm_overlap_fp8_buf, read by llmcomm.predict.fp8_wire
FP8_BUF_LAYERS = ("proj_fprop", "fc2_fprop")
