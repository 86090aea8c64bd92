"""``--constraints cp=1,fp8=off,max_tp=8``: narrow a :class:`~llmcomm.tune.space.SearchSpace` from text.

Each comma-separated item is ``NAME=VALUE``: ``NAME`` a dimension of the space (``tp``, ``cp``, ``pp``, ``ep``,
``etp``, ``micro_batch`` or ``mb``, ``vpp``, ``sp``, ``recompute``, ``distributed_optimizer`` or ``dist_opt``,
``fsdp``, ``attention_backend``, ``uneven``, ``fp8``, ``fp8_param_gather``, ``tp_comm_overlap``,
``overlap_grad_reduce``, ``overlap_param_gather``, ``overlap_p2p_comm`` / ``p2p``, ``moe_a2a_overlap`` / ``a2a`` (off
in the default space: ``p2p=off/on`` opens it), ``cp_comm_type``, ``recompute_modules`` / ``modules``) with one
value or several joined by ``/`` (``tp=4/8``), or ``max_NAME`` / ``min_NAME`` for an integer dimension (``max_tp=8``). Booleans read ``on/off``,
``true/false``, ``yes/no``, ``1/0``. ``fp8`` takes ``on`` (Megatron-LM's ``hybrid`` format), ``off`` (BF16),
``hybrid`` or ``e4m3``. ``recompute_modules`` takes module sets, each its ``--recompute-modules`` names joined by ``+``
(``recompute_modules=core_attn+moe_act/layernorm+moe_act``; ``default``: Megatron-LM's, ``core_attn``): the sets of
the selective rows (:func:`~llmcomm.tune.space.module_set`).
Every error is a :class:`~llmcomm.errors.UsageError` naming the item and the rule it breaks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import UsageError
from ..vocab import ATTENTION_BACKENDS, CP_COMM_TYPES, RECOMPUTE_MODES
from .space import SearchSpace, divisors

INT_DIMS = ("tp", "cp", "pp", "ep", "etp", "micro_batch", "vpp")
BOOL_DIMS = ("sp", "distributed_optimizer", "fsdp", "uneven", "fp8_param_gather", "tp_comm_overlap",
             "overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm", "moe_a2a_overlap")
STR_DIMS = {"recompute": RECOMPUTE_MODES, "attention_backend": ATTENTION_BACKENDS, "cp_comm_type": CP_COMM_TYPES}
FP8 = {"on": "hybrid", "hybrid": "hybrid", "e4m3": "e4m3", **{f: None for f in ("off", "false", "no", "0", "bf16")}}
ALIASES = {"mb": "micro_batch", "dist_opt": "distributed_optimizer", "dopt": "distributed_optimizer",
           "attention": "attention_backend", "tpo": "tp_comm_overlap", "ogr": "overlap_grad_reduce",
           "opg": "overlap_param_gather", "p2p": "overlap_p2p_comm", "a2a": "moe_a2a_overlap",
           "modules": "recompute_modules"}
TRUE, FALSE = ("on", "true", "yes", "1"), ("off", "false", "no", "0")
KNOWN = (*INT_DIMS, *BOOL_DIMS, *STR_DIMS, *ALIASES, "fp8", "recompute_modules", *(f"max_{d}" for d in INT_DIMS),
         *(f"min_{d}" for d in INT_DIMS))


def _bool(item: str, text: str) -> bool:
    t = text.strip().lower()
    if t in TRUE:
        return True
    if t in FALSE:
        return False
    raise UsageError(f"--constraints {item!r}: {text!r} is not on/off (accepted: {', '.join(TRUE + FALSE)})")


def _int(item: str, text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise UsageError(f"--constraints {item!r}: {text!r} is not an integer") from None
    if v < 1:
        raise UsageError(f"--constraints {item!r}: {v} must be a positive integer")
    return v


def _module_set(item: str, text: str) -> tuple[str, ...] | None:
    from ..errors import ConfigError
    from .space import module_set

    t = text.strip()
    if t.lower() == "default":
        return None
    names = [x.strip() for x in t.split("+")]
    if not t or not all(names):
        raise UsageError(f"--constraints {item!r}: {text!r} is not a module set (names joined by '+', e.g. "
                         "core_attn+moe_act, or default)")
    try:
        return module_set(names)
    except ConfigError as e:
        raise UsageError(f"--constraints {item!r}: {e}") from None


def parse(text: str, gpus: int, space: SearchSpace | None = None) -> SearchSpace:
    """``space`` (default: the whole space) narrowed by the constraints ``text`` (see the module docstring);
    ``gpus`` bounds the values a ``max_``/``min_`` constraint expands to."""
    space = space or SearchSpace()
    chosen: dict[str, Any] = {}
    bounds: dict[str, list[int]] = {}
    for raw in (x.strip() for x in text.split(",")):
        if not raw:
            continue
        if raw.count("=") != 1:
            raise UsageError(f"--constraints {raw!r}: expected NAME=VALUE (e.g. cp=1, fp8=off, max_tp=8)")
        name, value = (x.strip() for x in raw.split("="))
        key = ALIASES.get(name.lower(), name.lower())
        if key not in KNOWN:
            raise UsageError(f"--constraints {raw!r}: unknown constraint {name!r}; known: {', '.join(KNOWN)}")
        if key in chosen or (key.startswith(("max_", "min_")) and key in bounds):
            raise UsageError(f"--constraints {raw!r}: {name} is constrained twice")
        if key == "fp8":
            bad = [v for v in value.split("/") if v.strip().lower() not in FP8]
            if bad:
                raise UsageError(f"--constraints {raw!r}: fp8 takes on, off, hybrid or e4m3; got {bad}")
            chosen[key] = tuple(dict.fromkeys(FP8[v.strip().lower()] for v in value.split("/")))
            continue
        if key.startswith(("max_", "min_")):
            bounds[key] = [_int(raw, value)]
            continue
        if key == "recompute_modules":
            chosen[key] = tuple(dict.fromkeys(_module_set(raw, v) for v in value.split("/")))
            continue
        parts = [v for v in value.split("/") if v.strip()] or [""]
        if key in INT_DIMS:
            chosen[key] = tuple(sorted({_int(raw, v) for v in parts}))
        elif key in BOOL_DIMS:
            chosen[key] = tuple(sorted({_bool(raw, v) for v in parts}))
        else:
            bad = [v for v in parts if v not in STR_DIMS[key]]
            if bad:
                raise UsageError(f"--constraints {raw!r}: {key} takes {', '.join(STR_DIMS[key])}; got {bad}")
            chosen[key] = tuple(dict.fromkeys(parts))
    for key, (bound,) in bounds.items():
        dim = key[4:]
        base = chosen.get(dim) or getattr(space, dim) or tuple(divisors(gpus))
        keep = tuple(v for v in base if (v <= bound if key.startswith("max_") else v >= bound))
        if not keep:
            raise UsageError(f"--constraints {key}={bound}: leaves no value of {dim} (values before it: "
                             f"{', '.join(map(str, base[:16]))})")
        chosen[dim] = keep
    return dataclasses.replace(space, **chosen)
