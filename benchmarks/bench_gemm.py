"""Speed of the GEMM model (llmcomm.overhead.gemm): one layer's GEMMs, 10^5 configurations sharing few shapes,
and 10^5 distinct shapes.

    .venv/bin/python benchmarks/bench_gemm.py

The iteration-time formulation asks for a handful of shapes per configuration (one ``iteration_time`` must stay
under 1 ms) and for many configurations that share few shapes (``iteration_times`` at >= 10^5 per second).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llmcomm.overhead.gemm import load_gemm_model  # noqa: E402


def best(fn, repeat: int = 5) -> float:  # noqa: ANN001
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> int:
    g = load_gemm_model("H100")
    m, n, k = np.array([8192] * 4), np.array([1280, 8192, 7168, 8192]), np.array([8192, 1024, 8192, 3584])
    g.time(m, n, k)
    one = best(lambda: g.time(m, n, k))
    print(f"one layer's 4 GEMMs (Llama-3 70B, TP 8): {one * 1e6:.0f} us per call (memoized scalar path)")
    rng = np.random.default_rng(0)
    mm = rng.choice([4096, 8192, 16384], 100_000)
    nn = rng.choice([1024, 1280, 3584, 7168], 100_000)
    kk = rng.choice([1024, 3584, 8192], 100_000)
    t = best(lambda: g.time(mm, nn, kk), 3)
    print(f"10^5 configurations over 36 shapes: {t * 1e3:.1f} ms ({1e5 / t:,.0f} GEMMs/s)")
    mm, nn, kk = (rng.integers(256, 65536, 100_000) for _ in range(3))
    t = best(lambda: g.time(mm, nn, kk), 3)
    print(f"10^5 distinct shapes: {t * 1e3:.0f} ms ({1e5 / t:,.0f} GEMMs/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
