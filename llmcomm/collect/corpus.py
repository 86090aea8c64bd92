"""The training text: byte-level tokens of the Python standard library's own source files.

Offline, deterministic and the same on every machine with the same Python: the ``*.py`` files under
``sysconfig.get_paths()["stdlib"]`` (site-packages excluded), sorted by relative path, concatenated until
``max_bytes``. A token is a byte (vocabulary 256).
"""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

import numpy as np

from ..errors import DataError

VOCAB_SIZE = 256


@functools.lru_cache(maxsize=4)
def load_corpus(max_bytes: int = 1 << 22) -> np.ndarray:
    """The first ``max_bytes`` bytes of the sorted standard-library sources, as ``uint8``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total = 0
    for p in sorted(root.rglob("*.py"), key=lambda q: q.relative_to(root).as_posix()):
        rel = p.relative_to(root).as_posix()
        if "site-packages" in rel or "/test" in "/" + rel:
            continue
        try:
            data = p.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    arr = np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8).copy()
    if len(arr) < 1024:
        raise DataError(f"standard library sources under {root} give only {len(arr)} bytes")
    return arr


def batch(corpus: np.ndarray, iteration: int, global_batch: int, seq_len: int,
          seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``global_batch`` windows of ``seq_len + 1`` bytes at positions drawn from ``seed + iteration``:
    inputs ``x[:, :-1]`` and next-byte targets ``x[:, 1:]`` (int64, shape ``(global_batch, seq_len)``)."""
    rng = np.random.default_rng([seed, iteration])
    starts = rng.integers(0, len(corpus) - seq_len - 1, size=global_batch)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    w = corpus[idx].astype(np.int64)
    return w[:, :-1], w[:, 1:]
