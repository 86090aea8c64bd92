"""Kernel measurements on one NVIDIA H200 (or any CUDA GPU): GEMM throughput over LLM shapes in BF16 and FP8, and
fused attention (torch SDPA, flash backend) forward and backward, written as one CSV with its provenance.

    .venv/bin/python benchmarks/bench_h200_kernels.py [--out data/calibration/h200_kernels.csv] [--budget-s 420]

Nothing in the kit depends on this file's output: it exists so that an H200 entry can be calibrated from
measurement when one is at hand (issue 20, item 11). Without CUDA it exits with status 2 and says so; it never
falls back to the CPU. The whole run is bounded by ``--budget-s`` (default 420 s, under 8 minutes): shapes are
measured in a fixed order and the run stops, writing what it has, when the budget is spent.

What is measured
* GEMM ``C = A·B`` for every (m, n, k) of :data:`GEMM_SHAPES`: the weight GEMMs of Llama-3 8B / 70B / 405B and
  GPT-3 175B layers at TP 1, 2, 4, 8 and the token counts of a micro-batch (m = tokens), plus XLA's square
  shapes 1024–4096 to compare with its H100 table. BF16 through ``torch.matmul``; FP8 (E4M3 operands, BF16 output,
  per-tensor scales of 1) through ``torch._scaled_mm`` where the GPU has FP8 tensor cores (sm_89+). Times are CUDA
  event times of ``--iters`` back-to-back calls after ``--warmup`` calls, median of ``--repeats``;
  ``tflops = 2·m·n·k / t``.
* Attention ``torch.nn.functional.scaled_dot_product_attention`` with only the flash backend enabled
  (``torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)``), causal, BF16, over (batch, heads, kv heads,
  sequence, head dim) of :data:`ATTN_SHAPES`; forward alone and forward+backward. ``flops`` counts the causal
  half: forward ``2·2·b·h·s²·d / 2``, backward 2.5× forward (FlashAttention-2's count).

Iterations adapt to the kernel: one repeat lasts about 20 ms (at most ``--iters`` calls), warm-up stops after
~50 ms, so the ~190 GEMM shapes x 2 dtypes and 16 attention runs fit the budget on an H100/H200-class GPU.

Columns: ``kind, dtype, b, m, n, k, heads, kv_heads, seq, head_dim, causal, pass, time_s, tflops, iters,
repeats`` and, on every row, the provenance ``gpu, gpu_sm, driver, cuda, torch, date_utc, host``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
DEFAULT_OUT = ROOT / "data" / "calibration" / "h200_kernels.csv"

# (m, n, k): m = tokens of a micro-batch (b·s = 4096, 8192, 16384), n x k the weight of one TP rank
_LAYERS = {  # hidden, ffn, q heads x head dim, kv heads x head dim  (Llama-3 8B / 70B / 405B, GPT-3 175B)
    "llama3-8b": (4096, 14336, 4096, 1024), "llama3-70b": (8192, 28672, 8192, 1024),
    "llama3-405b": (16384, 53248, 16384, 1024), "gpt3-175b": (12288, 49152, 12288, 12288),
}
GEMM_SHAPES: list[tuple[int, int, int]] = sorted({
    shape
    for h, f, q, kv in _LAYERS.values() for tp in (1, 2, 4, 8) for m in (4096, 8192, 16384)
    for shape in ((m, (q + 2 * kv) // tp, h), (m, h, q // tp), (m, 2 * f // tp, h), (m, h, f // tp))
} | {(s, s, s) for s in (1024, 2048, 4096)})
ATTN_SHAPES: list[tuple[int, int, int, int, int]] = [  # batch, q heads, kv heads, sequence, head dim (per TP rank)
    (1, 32, 8, 8192, 128), (1, 16, 4, 8192, 128), (1, 8, 1, 8192, 128), (1, 64, 8, 4096, 128),
    (2, 16, 2, 4096, 128), (1, 16, 2, 16384, 128), (1, 96, 96, 2048, 128), (1, 12, 12, 2048, 128),
]
COLUMNS = ["kind", "dtype", "b", "m", "n", "k", "heads", "kv_heads", "seq", "head_dim", "causal", "pass", "time_s",
           "tflops", "iters", "repeats", "gpu", "gpu_sm", "driver", "cuda", "torch", "date_utc", "host"]


def _fail(msg: str) -> int:
    print(f"bench_h200_kernels: {msg}", file=sys.stderr)
    return 2


def provenance(torch) -> dict[str, str]:  # noqa: ANN001 - torch is imported lazily
    p = torch.cuda.get_device_properties(0)
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        drv = "unknown"
    return {"gpu": p.name, "gpu_sm": f"{p.major}{p.minor}", "driver": drv, "cuda": str(torch.version.cuda),
            "torch": torch.__version__, "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": platform.node()}


def _time(torch, fn, warmup: int, iters: int, repeats: int, target_s: float = 0.02) -> float:  # noqa: ANN001
    """Median over ``repeats`` of the mean time of back-to-back calls; ``iters`` is lowered so that one repeat
    takes about ``target_s`` (a 50 ms GEMM is not run 20 times 3 times), and warm-up stops after ~50 ms."""
    t_start = time.monotonic()
    fn()
    torch.cuda.synchronize()
    one = time.monotonic() - t_start
    for _ in range(warmup - 1):
        if time.monotonic() - t_start > 0.05:
            break
        fn()
    torch.cuda.synchronize()
    iters = max(1, min(iters, int(target_s / max(one, 1e-6))))
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / 1e3 / iters)
    return statistics.median(out)


def bench_gemm(torch, dtype: str, m: int, n: int, k: int, a: argparse.Namespace) -> float:  # noqa: ANN001
    dev = "cuda"
    if dtype == "bf16":
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        return _time(torch, lambda: torch.matmul(x, w), a.warmup, a.iters, a.repeats)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()  # column-major B
    one = torch.ones((), device=dev, dtype=torch.float32)
    return _time(torch, lambda: torch._scaled_mm(x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                 a.warmup, a.iters, a.repeats)


def bench_attention(torch, b: int, h: int, hkv: int, s: int, d: int, backward: bool,  # noqa: ANN001
                    a: argparse.Namespace) -> float:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    kk = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    g = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    gqa = h != hkv

    def fwd():  # noqa: ANN202
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(q, kk, v, is_causal=True, enable_gqa=gqa)

    def fwd_bwd() -> None:
        out = fwd()
        out.backward(g)

    return _time(torch, fwd_bwd if backward else fwd, a.warmup, max(1, a.iters // 4), a.repeats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop measuring after this many seconds")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    if a.budget_s <= 0 or a.budget_s > 470 or min(a.warmup, a.iters, a.repeats) < 1:
        return _fail("--budget-s must be in (0, 470] (the run must end within 8 minutes) and warmup, iters, "
                     "repeats >= 1")
    try:
        import torch
    except ImportError:
        return _fail("needs torch (pip install -e .[collect]); nothing measured")
    if not torch.cuda.is_available():
        return _fail("no CUDA device: this benchmark measures GPU kernels and never runs on the CPU; nothing "
                     "measured, nothing written")
    t0 = time.monotonic()
    prov = provenance(torch)
    sm = int(prov["gpu_sm"])
    if "H200" not in prov["gpu"]:
        print(f"bench_h200_kernels: note: the GPU is {prov['gpu']!r}, not an H200; rows say so", file=sys.stderr)
    rows: list[dict[str, object]] = []
    stopped = ""

    def left() -> float:
        return a.budget_s - (time.monotonic() - t0)

    dtypes = ["bf16"] + (["fp8"] if sm >= 89 and hasattr(torch, "_scaled_mm") else [])
    for m, n, k in GEMM_SHAPES:
        for dtype in dtypes:
            if left() < 0.4 * a.budget_s and not stopped:  # keep 40 % of the budget for attention
                stopped = f"GEMM sweep stopped at ({m}, {n}, {k}) to leave time for attention"
            if stopped:
                break
            try:
                t = bench_gemm(torch, dtype, m, n, k, a)
            except (RuntimeError, TypeError) as e:  # e.g. an FP8 layout the backend rejects: record, go on
                print(f"skip gemm {dtype} {m}x{n}x{k}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            rows.append({"kind": "gemm", "dtype": dtype, "b": 1, "m": m, "n": n, "k": k, "pass": "forward",
                         "time_s": t, "tflops": 2 * m * n * k / t / 1e12, "iters": a.iters, "repeats": a.repeats,
                         **prov})
        torch.cuda.empty_cache()
    for b, h, hkv, s, d in ATTN_SHAPES:
        for backward in (False, True):
            if left() < 5:
                stopped = stopped or f"attention stopped at {(b, h, hkv, s, d)}: budget spent"
                break
            try:
                t = bench_attention(torch, b, h, hkv, s, d, backward, a)
            except RuntimeError as e:
                print(f"skip attention {(b, h, hkv, s, d)}: {e}", file=sys.stderr)
                continue
            fwd_flops = 2 * 2 * b * h * s * s * d / 2
            flops = fwd_flops * (3.5 if backward else 1.0)
            rows.append({"kind": "attention", "dtype": "bf16", "b": b, "heads": h, "kv_heads": hkv, "seq": s,
                         "head_dim": d, "causal": True, "pass": "forward+backward" if backward else "forward",
                         "time_s": t, "tflops": flops / t / 1e12, "iters": max(1, a.iters // 4),
                         "repeats": a.repeats, **prov})
        torch.cuda.empty_cache()
    if not rows:
        return _fail("no kernel could be measured; nothing written")
    from llmcomm.atomic import atomic_path

    a.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(a.out) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, restval="")
        w.writeheader()
        w.writerows(rows)
    best = max((r["tflops"] for r in rows if r["kind"] == "gemm" and r["dtype"] == "bf16"), default=float("nan"))
    print(f"{len(rows)} rows in {time.monotonic() - t0:.0f} s on {prov['gpu']} (driver {prov['driver']}, torch "
          f"{prov['torch']}); best bf16 GEMM {best:.1f} TFLOP/s; written {a.out}" + (f"; {stopped}" if stopped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
