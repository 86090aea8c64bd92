"""The parallel configuration an ingest run tags groups with: given whole, given in part, or read from the file.

``parallel`` may be a :class:`~llmcomm.specs.ParallelConfig` (every dimension fixed), a mapping of some
dimensions (``{"tp": 2}``, what ``llmcomm ingest --tp 2`` passes) or ``None``. A partial mapping is completed
per file from what the file states, following Megatron-LM's rule ``dp = world / (tp · pp · cp)``:

* an AICB workload states its group sizes in its rows: dimensions not given are taken from there (with a
  warning naming them, e.g. ``dp=64`` for LLaMA-7B at tp 2 on 128 ranks);
* a Kineto trace states its world size (``distributedInfo.world_size``): ``dp`` not given is
  ``world / (tp · pp · cp)``; a ``tp · pp · cp`` that does not divide the world size is refused;
* a file that states no world size gets ``1`` for the dimensions not given.

Whatever the source, a configuration whose ``tp · pp · dp · cp`` differs from a file's stated world size is
refused, naming the rule (``--tp 3`` on a 2-rank trace).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any, cast

from ..errors import ConfigError
from ..specs import ParallelConfig
from .sources import Source

DIMS = ("tp", "pp", "dp", "ep", "cp")
_WORLD = re.compile(rb'"world_size"\s*:\s*(\d+)')


def normalize(parallel: ParallelConfig | Mapping[str, Any] | None) -> ParallelConfig | dict[str, int] | None:
    """A ParallelConfig as it is; a mapping checked (known dimensions, positive integers) into a dict of the
    dimensions it sets; anything else refused."""
    if parallel is None or isinstance(parallel, ParallelConfig):
        return parallel
    if not isinstance(parallel, Mapping):
        raise ConfigError(f"parallel={parallel!r}: expected a ParallelConfig, a mapping such as "
                          "{'tp': 2, 'pp': 4} or None")
    unknown = sorted(set(parallel) - set(DIMS))
    if unknown:
        raise ConfigError(f"parallel: unknown dimension(s) {unknown}; known: {', '.join(DIMS)}")
    out: dict[str, int] = {}
    for k, v in parallel.items():
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"parallel: {k}={v!r} must be a positive integer")
        out[k] = v
    return out or None


def stated_world(src: Source, fmt: str) -> int | None:
    """The world size a trace file states, read cheaply: Kineto's ``distributedInfo.world_size``."""
    if fmt != "kineto":
        return None
    m = _WORLD.search(src.data[:1 << 20])
    return int(m.group(1)) if m else None


def _product(dims: Mapping[str, int], names: tuple[str, ...]) -> int:
    out = 1
    for n in names:
        out *= dims.get(n, 1)
    return out


def resolve(parallel: ParallelConfig | dict[str, int] | None, src: Source, fmt: str) -> ParallelConfig | None:
    """The configuration to read ``src`` with (module docstring), or ``None`` (none given: the readers
    tag groups from their names, AICB infers the configuration from its rows)."""
    if parallel is None:
        return None
    world = stated_world(src, fmt)
    if isinstance(parallel, ParallelConfig):
        cfg = parallel
    else:
        dims = dict(parallel)
        if fmt == "aicb":
            from .aicb import _rows, infer_parallel

            header, _ = infer_parallel(_rows(src), src.name)
            taken = {d: getattr(header, d) for d in DIMS if d not in dims and getattr(header, d) > 1}
            if taken:
                warnings.warn(f"{src.name}: {', '.join(f'{k}={v}' for k, v in taken.items())} not given; taken "
                              f"from the AICB rows' group sizes (world size {header.world_size})", stacklevel=3)
            dims = {**taken, **dims}
        elif "dp" not in dims and world is not None:
            rest = _product(dims, ("tp", "pp", "cp"))
            if world % rest:
                raise ConfigError(f"{src.name}: tp*pp*cp={rest} does not divide the trace's world size {world} "
                                  "(distributedInfo.world_size)")
            dims["dp"] = world // rest
        try:
            cfg = ParallelConfig(**cast(dict[str, Any], dims))  # the dimensions, each an int field
        except ConfigError as e:
            raise ConfigError(f"{src.name}: {e}") from None
    if world is not None and cfg.world_size != world:
        raise ConfigError(f"{src.name}: tp*pp*dp*cp={cfg.world_size} (tp={cfg.tp}, pp={cfg.pp}, dp={cfg.dp}, "
                          f"cp={cfg.cp}) but the trace's world size is {world} (distributedInfo.world_size)")
    return cfg
