"""The command-line options every subcommand shares, and the :class:`~llmcomm.specs.ParallelConfig` they build.

One home for the model, parallel-configuration and cluster flags of ``predict``, ``time``, ``collect``,
``compare``, ``tune`` and ``ingest``: the same name, help and default everywhere. Defaults are
:class:`ParallelConfig`'s own field defaults (``micro_batch`` 1, ``schedule`` 1f1b, ...), read from the
dataclass, so that a flag left out means what the Python API means by leaving the argument out. A subcommand
that needs another default says why where it passes it (``collect``: several micro-batches per iteration, so
that a pipeline schedule has something to interleave; ``compare``: every option defaults to the trace's
metadata).

Numbers are checked by their argparse type, so ``--tp 0`` is a usage error naming the flag (exit status 2)
before any file is read.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ConfigError
from .specs import ParallelConfig
from .vocab import (
    ATTENTION_BACKENDS,
    CP_COMM_TYPES,
    MOE_FLEX_BACKENDS,
    PIPELINE_SCHEDULES,
    RECOMPUTE_MODES,
    RECOMPUTE_MODULES,
)

DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ParallelConfig)}
DIM_NAMES = {"tp": "tensor", "pp": "pipeline", "dp": "data", "ep": "expert", "cp": "context"}
DIM_NOTES = {"ep": "MoE models; subdivides the cp x dp ranks of the expert layers, so it does not multiply the "
                   "GPU count"}
FROM_METADATA = "the trace's metadata"
# options whose argparse destination is the ParallelConfig field of the same name
PARALLEL_FIELDS: tuple[str, ...] = ("tp", "pp", "dp", "ep", "cp", "vpp", "sp", "micro_batch", "global_batch", "seq_len",
                   "recompute", "distributed_optimizer", "fsdp", "schedule", "pipe_partitioned",
                   "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "attention_backend", "fp8",
                   "fp8_recipe")
PARALLEL_FIELDS += ("fsdp_reshard_after_forward", "recompute_modules")  # with "fsdp" and "recompute" (issue 20)
PARALLEL_FIELDS += ("overlap_p2p_comm", "moe_a2a_overlap", "moe_flex_dispatcher_backend", "align_grad_reduce")  # issue 20: overlap
PARALLEL_FIELDS += ("cp_comm_type",)  # issue 20: context parallelism
PARALLEL_FIELDS += ("etp",)  # moe-fold: expert tensor parallelism (MoE parallel folding)
PARALLEL_FIELDS += ("recompute_method", "recompute_num_layers")  # with "recompute": which layers full recomputes
PARALLEL_FIELDS += ("tp_comm_overlap_fp8_buf",)  # acc-fp8wire: userbuffers' FP8 reduce-scatter buffers (fp8_wire)


# ------------------------------------------------------------------------------------------ value types
def _int_at_least(text: str, low: int, rule: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"{v} must be {rule}")
    return v


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``--tp 0`` and ``--tp two`` are usage errors naming the flag)."""
    return _int_at_least(text, 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, ">= 0")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    v = _float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{v:g} must be > 0")
    return v


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    v = _float(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v:g} must be >= 0")
    return v


def fraction(text: str) -> float:
    """argparse type: a share in (0, 1]."""
    v = _float(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{v:g} must lie in (0, 1] (a share of GPU memory)")
    return v


def _float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return v


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated positive integers (``8`` or ``1,2,4``)."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    bad = [v for v in values if v < 1]
    if bad:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad} are not positive integers")
    return values


# ------------------------------------------------------------------------------------------ the options
def add_quiet(p: argparse.ArgumentParser, text: str = "no progress bars or per-step lines") -> None:
    """``-q/--quiet`` for a command that prints progress or a summary."""
    p.add_argument("-q", "--quiet", action="store_true", help=text)


def add_model(p: argparse.ArgumentParser, *, flag: bool = False, required: bool = True,
              default_text: str | None = None) -> None:
    """The model: a positional ``model`` argument, or ``--model`` (``flag``)."""
    text = "catalogue name (see llmcomm models) or YAML path"
    if flag:
        p.add_argument("--model", required=required, default=None,
                       help=text + (f" (default: {default_text})" if default_text else ""))
    else:
        p.add_argument("model", help=text)


def add_cluster(p: argparse.ArgumentParser, *, required: bool, default_text: str | None = None) -> None:
    """``--cluster``: a catalogue name or a YAML path."""
    text = "cluster name (see llmcomm clusters) or YAML path"
    p.add_argument("--cluster", required=required, default=None,
                   help=text + (f" (default: {default_text})" if default_text and not required else ""))


def add_dims(p: argparse.ArgumentParser, dims: Iterable[str] = ("tp", "pp", "dp", "ep", "cp"), *,
             default_text: Mapping[str, str] | str | None = None) -> None:
    """``--tp``, ``--pp``, ... parallel degrees. ``default_text`` (all dims or per dim): the default is
    ``None`` and the help says where the value then comes from; otherwise :class:`ParallelConfig`'s default."""
    for dim in dims:
        what = f"{DIM_NAMES[dim]}-parallel degree"
        if dim in DIM_NOTES:
            what += f" ({DIM_NOTES[dim]})"
        text = default_text.get(dim) if isinstance(default_text, Mapping) else default_text
        if text is not None:
            p.add_argument(f"--{dim}", type=positive_int, default=None, help=f"{what} (default: {text})")
        else:
            p.add_argument(f"--{dim}", type=positive_int, default=DEFAULTS[dim], help=what)


def add_parallel(p: argparse.ArgumentParser, *, dims: Iterable[str] = ("tp", "pp", "dp", "ep", "cp"),
                 extras: Iterable[str] = ("vpp", "sp", "micro_batch", "global_batch", "seq_len", "recompute",
                                          "distributed_optimizer", "schedule"),
                 from_metadata: bool = False, schedules: Iterable[str] = PIPELINE_SCHEDULES,
                 global_batch_text: str = "micro-batch x dp, one micro-batch per data-parallel rank") -> None:
    """The parallel-configuration flags: ``dims`` and the ``extras`` named by their ParallelConfig fields
    (``vpp``, ``sp``, ``micro_batch``, ``global_batch``, ``seq_len``, ``recompute``, ``distributed_optimizer``,
    ``fsdp``, ``schedule``, ``pipe_partitioned``, ``overlap_grad_reduce``). ``from_metadata``: every default is
    ``None``, meaning the trace's recorded value."""
    meta = FROM_METADATA if from_metadata else None
    add_dims(p, dims, default_text=meta)
    extras = tuple(extras)
    unknown = set(extras) - set(PARALLEL_FIELDS)
    if unknown:
        raise ValueError(f"add_parallel: unknown extras {sorted(unknown)}")

    def default(name: str) -> Any:
        return None if from_metadata else DEFAULTS[name]

    def flag(name: str, text: str) -> None:  # a store_true flag; with from_metadata None means "as recorded"
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, action="store_true",
                       default=None if from_metadata else False,
                       help=text + (f" (default: {meta})" if meta else " (default: off)"))

    if "vpp" in extras:
        p.add_argument("--vpp", type=positive_int, default=default("vpp"),
                       help="virtual pipeline stages (model chunks) per rank; > 1 selects the interleaved 1F1B "
                            "schedule" + (f" (default: {meta})" if meta else ""))
    if "sp" in extras:
        flag("sp", "sequence parallelism (needs --tp > 1)")
    if "micro_batch" in extras:
        p.add_argument("--micro-batch", type=positive_int, default=default("micro_batch"),
                       help="sequences per micro-batch" + (f" (default: {meta})" if meta else ""))
    if "global_batch" in extras:
        p.add_argument("--global-batch", type=positive_int, default=None,
                       help=f"sequences per iteration (default: {meta or global_batch_text})")
    if "seq_len" in extras:
        p.add_argument("--seq-len", type=positive_int, default=None,
                       help=f"sequence length (default: {meta + ', else the model' if meta else 'the model'}'s)")
    if "recompute" in extras:
        p.add_argument("--recompute", nargs="?", const="full", default=default("recompute"),
                       choices=RECOMPUTE_MODES,
                       help="activation recomputation; --recompute alone means full"
                            + (f" (default: {meta})" if meta else ""))
        p.add_argument("--recompute-modules", nargs="+", default=None, choices=RECOMPUTE_MODULES, metavar="MODULE",
                       help="Megatron-LM's --recompute-modules with --recompute selective (" + ", ".join(
                           RECOMPUTE_MODULES) + f"; default: {meta or 'core_attn'})")
        p.add_argument("--recompute-method", default=None, choices=("uniform", "block"),
                       help="Megatron-LM's --recompute-method with --recompute full and --recompute-num-layers: "
                            "uniform (every layer, in checkpointed groups of N) or block (only the first N layers "
                            "of each model chunk; default: " + (meta or "every layer on its own") + ")")
        p.add_argument("--recompute-num-layers", type=positive_int, default=None, metavar="N",
                       help="Megatron-LM's --recompute-num-layers (with --recompute-method; default: " + (meta or "none") + ")")
    if "distributed_optimizer" in extras:
        flag("distributed_optimizer", "Megatron-LM's distributed optimizer (gradient reduce-scatter + parameter "
                                      "all-gather over DP)")
    if "fsdp" in extras:
        flag("fsdp", "fully sharded data parallelism (ZeRO-3) per transformer layer: torch FSDP2; with "
                     "--distributed-optimizer --overlap-grad-reduce Megatron-FSDP (--use-megatron-fsdp)")
        p.add_argument("--fsdp-no-reshard-after-forward", "--torch-fsdp2-no-reshard-after-forward",
                       dest="fsdp_reshard_after_forward", action="store_false", default=None if from_metadata else True,
                       help="keep each FSDP unit's gathered parameters from the forward to the backward (torch "
                            "FSDP2's reshard_after_forward=False, as Llama 3: no all-gather in the backward)"
                            + (f" (default: {meta})" if meta else " (default: reshard)"))
    if "schedule" in extras:
        p.add_argument("--schedule", default=default("schedule"), choices=tuple(schedules),
                       help="pipeline schedule" + ("; --vpp > 1 implies interleaved" if "vpp" in extras else "")
                            + (f" (default: {meta})" if meta else ""))
    if "pipe_partitioned" in extras:
        flag("pipe_partitioned", "Megatron-DeepSpeed: DeepSpeed's pipeline engine sends pipeline tensors split "
                                 "over TP and all-gathers them on arrival (not with --sp)")
    if "overlap_grad_reduce" in extras:
        flag("overlap_grad_reduce", "Megatron-LM's bucketed overlap of the DP gradient reduction with the "
                                    "backward pass")
    if "overlap_param_gather" in extras:
        flag("overlap_param_gather", "Megatron-LM's --overlap-param-gather: the distributed optimizer's parameter "
                                     "all-gathers hidden in the next forward")
    if "tp_comm_overlap" in extras:
        flag("tp_comm_overlap", "Megatron-LM's --tp-comm-overlap (TransformerEngine userbuffers: SP all-gathers and "
                                "reduce-scatters overlapped with their GEMMs)")
    if "attention_backend" in extras:
        p.add_argument("--attention-backend", default=default("attention_backend"), choices=ATTENTION_BACKENDS,
                       help="Megatron-LM's --attention-backend: flash/fused/auto one fused kernel (no score "
                            "traffic), unfused the 2022 path" + (f" (default: {meta})" if meta else ""))
    if "fp8" in extras:
        p.add_argument("--fp8", default=None, choices=("hybrid", "e4m3"),
                       help="Megatron-LM's --fp8-format (TransformerEngine FP8 GEMMs; default: BF16)")
    if "fp8_recipe" in extras:
        p.add_argument("--fp8-recipe", default=default("fp8_recipe"), choices=("delayed", "tensorwise"),
                       help="Megatron-LM's --fp8-recipe (the two the formulation times)"
                            + (f" (default: {meta})" if meta else ""))
    # pipeline and MoE communication overlap (issue 20; llmcomm.overhead.overlap)
    if "overlap_p2p_comm" in extras:
        p.add_argument("--overlap-p2p-comm", "--overlap-p2p-communication", dest="overlap_p2p_comm",
                       action="store_true", default=None if from_metadata else False,
                       help="Megatron-LM's --overlap-p2p-communication: the interleaved schedule's pipeline "
                            "send/recv behind the next compute step (no effect without --vpp > 1, as in Megatron)"
                            + (f" (default: {meta})" if meta else " (default: off)"))
    if "moe_a2a_overlap" in extras:
        p.add_argument("--moe-a2a-overlap", "--overlap-moe-expert-parallel-comm", dest="moe_a2a_overlap",
                       action="store_true", default=None if from_metadata else False,
                       help="Megatron-LM's overlap_moe_expert_parallel_comm (NVIDIA's recipes: moe_a2a_overlap): "
                            "one micro-batch's expert all-to-alls behind another's compute (needs --ep > 1)"
                            + (f" (default: {meta})" if meta else " (default: off)"))
    if "align_grad_reduce" in extras:
        p.add_argument("--no-align-grad-reduce", dest="align_grad_reduce", action="store_false",
                       default=None if from_metadata else True,
                       help="Megatron-LM's --no-align-grad-reduce: with --overlap-grad-reduce each pipeline stage "
                            "launches its chunks' gradient reductions on its own (default: aligned to stage 0)")
    if "moe_flex_dispatcher_backend" in extras:
        p.add_argument("--moe-flex-dispatcher-backend", default=None, choices=MOE_FLEX_BACKENDS,
                       help="Megatron-LM's --moe-flex-dispatcher-backend (the flex dispatcher's DeepEP/HybridEP "
                            "kernels; the formulation refuses it and says why; default: not set)")

    if "etp" in extras:  # MoE parallel folding (moe-fold; llmcomm.overhead.moe_fold)
        p.add_argument("--etp", "--expert-tensor-parallel-size", dest="etp", type=positive_int, default=None,
                       help="Megatron-LM's --expert-tensor-parallel-size: the experts' TP size, on the expert grid "
                            "etp x ep x edp x pp (EP may then span the attention TP, CP and DP ranks; world must be "
                            "divisible by etp*ep*pp)" + (f" (default: {meta})" if meta else " (default: tp)"))
    if "cp_comm_type" in extras:
        p.add_argument("--cp-comm-type", dest="cp_comm_type", default=default("cp_comm_type"),
                       choices=CP_COMM_TYPES,
                       help="Megatron-LM's --cp-comm-type with --cp > 1: p2p (KV ring, overlapped with attention), "
                            "all_gather (KV all-gather, exposed), a2a (Ulysses all-to-alls of Q, K, V, O); a2a+p2p "
                            "is refused (needs hierarchical CP sizes)" + (f" (default: {meta})" if meta else
                                                                          " (default: p2p)"))
    # FP8 on the wire (acc-fp8wire; llmcomm.predict.fp8_wire)
    if "tp_comm_overlap_fp8_buf" in extras:
        from .vocab import FP8_BUF_LAYERS

        p.add_argument("--tp-comm-overlap-fp8-buf", dest="tp_comm_overlap_fp8_buf", nargs="*", default=None,
                       choices=FP8_BUF_LAYERS, metavar="LAYER",
                       help="with --fp8 and --tp-comm-overlap: the userbuffers layers whose config sets fp8_buf "
                            f"({', '.join(FP8_BUF_LAYERS)}), whose forward reduce-scatter then moves FP8 "
                            "(default: none; the SP all-gathers move FP8 under --fp8 regardless)")


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The ParallelConfig fields the namespace carries (``None``: not given, where the default is ``None``)."""
    return {name: getattr(args, name) for name in PARALLEL_FIELDS
            if hasattr(args, name) and getattr(args, name) is not None}


def _schedule(kw: dict[str, Any]) -> None:
    """``--vpp > 1`` selects the interleaved schedule; another explicit schedule with it is refused."""
    vpp = kw.get("vpp", 1)
    sched = kw.get("schedule")
    if vpp > 1:
        if sched not in (None, "1f1b", "interleaved"):
            raise ConfigError(f"--schedule {sched} --vpp {vpp}: virtual pipeline stages need the interleaved 1F1B "
                              "schedule; drop --vpp or use --schedule interleaved")
        kw["schedule"] = "interleaved"


def parallel_from_args(args: argparse.Namespace, **fixed: Any) -> ParallelConfig:
    """The :class:`ParallelConfig` the options describe (``fixed``: fields a subcommand sets itself, e.g.
    ``collect``'s fp32 dtypes). A broken rule is a :class:`ConfigError` naming it."""
    kw = {**_given(args), **fixed}
    _schedule(kw)
    return ParallelConfig.from_dict(kw, origin="the command line")


def parallel_with_overrides(base: Mapping[str, Any] | None, args: argparse.Namespace) -> ParallelConfig | None:
    """``base`` (a trace's recorded configuration) with the options given on the command line applied; ``None``
    when no option was given (the caller then uses ``base`` as recorded). Changing tp/pp/dp or the micro-batch
    without ``--global-batch`` drops the recorded global batch (it would no longer divide)."""
    over = _given(args)
    if not over:
        return None
    kw = dict(base or {})
    kw.update(over)
    if over.keys() & {"tp", "pp", "dp", "micro_batch"} and "global_batch" not in over:
        kw.pop("global_batch", None)
    if "vpp" in over and over["vpp"] == 1 and kw.get("schedule") == "interleaved":
        kw["schedule"] = "1f1b"
    _schedule(kw)
    return ParallelConfig.from_dict(kw, origin="the command line and the trace's metadata")
