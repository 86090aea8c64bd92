"""Limits on work whose size depends on the input, checked before the work starts.

A prediction's layout and events grow with the number of GPUs (measured by ``benchmarks/bench_predict.py``
and on GPT-3 175B tp8·pp16: 131,072 GPUs give 1.22 M aggregated rows in 1.5 s and about 0.4 GB; roughly 9 rows
and 2 KB per GPU), so a world size far beyond any real machine is refused with the number instead of dying
with a ``MemoryError`` minutes later. The tuner's space is built from the divisors of the GPU count
(``O(√gpus)`` work per split), so its GPU count is bounded too.
"""

from __future__ import annotations

from .errors import ConfigError

MAX_PREDICT_GPUS = 2**21  # 2,097,152: 16x the largest prediction benchmarked (131,072 GPUs)
BYTES_PER_GPU = 2_000  # measured memory of a prediction per GPU (module docstring)
MAX_TUNE_GPUS = 2**24  # 16,777,216: divisors() of a number this size is ~4,000 steps
MAX_TUNE_CANDIDATES = 5_000_000  # rows of the candidate table (about 1 GB of columns)
# flows a matrix expands (each computed once, block by block): GPT-3 175B on 16,384 GPUs, direct, with the rerun
# check's world all-reduce expands ~270 M flows in ~35 s and 3.6 GiB (benchmarks/bench_predict.py); 500 M keeps a
# build under ~7 GiB and about a minute on 2 cores
MAX_MATRIX_FLOWS = 500_000_000


def check_predict_size(world_size: int, *, what: str = "tp*pp*dp*cp") -> None:
    """Refuse a prediction over more than :data:`MAX_PREDICT_GPUS` GPUs, with the memory it would need."""
    if world_size > MAX_PREDICT_GPUS:
        need = world_size * BYTES_PER_GPU
        raise ConfigError(
            f"{what}={world_size:,} GPUs is above the {MAX_PREDICT_GPUS:,} a prediction handles: its events grow "
            f"with the GPU count (about {BYTES_PER_GPU:,} bytes per GPU, so about {need / 2**30:,.0f} GiB here)")


def check_tune_gpus(gpus: int) -> None:
    """Refuse a tuning run over more than :data:`MAX_TUNE_GPUS` GPUs."""
    if gpus > MAX_TUNE_GPUS:
        raise ConfigError(f"gpus={gpus:,} is above the {MAX_TUNE_GPUS:,} GPUs the tuner enumerates (its space is "
                          "built from the divisors of the GPU count)")


def check_tune_candidates(n: int) -> None:
    """Refuse ranking more than :data:`MAX_TUNE_CANDIDATES` candidate configurations."""
    if n > MAX_TUNE_CANDIDATES:
        raise ConfigError(f"{n:,} candidate configurations are above the {MAX_TUNE_CANDIDATES:,} the tuner ranks "
                          "in one run; narrow the space (--tp, --pp, --ep, --micro-batch, --vpp)")


def check_matrix_flows(flows: int, *, algorithm: str, world_size: int) -> None:
    """Refuse a matrix that would expand more than :data:`MAX_MATRIX_FLOWS` flows (an upper bound counted from the
    events before any is expanded): a group spanning the world makes the direct matrix world² (Megatron's rerun
    check, the distributed optimizer's gradient norm)."""
    if flows > MAX_MATRIX_FLOWS:
        raise ConfigError(
            f"the {algorithm} matrix of {world_size:,} ranks would expand up to {flows:,} flows, above the "
            f"{MAX_MATRIX_FLOWS:,} a matrix build handles (a group spanning the world makes the direct matrix "
            "world²): use algorithm='ring' (--algorithm ring), drop the world-spanning calls (e.g. "
            "trace.select(parallelism=...) or rerun_mode='disabled'), or fewer ranks")
