"""One benchmark case in its own process: the harness that ``bench_predict.py`` and ``bench_network.py`` share.

Each case runs as ``python SCRIPT --one CASE`` so that its peak RSS is its own; the child prints one JSON line
last. :func:`run_case` returns that line's dict, or ``None`` and a short reason (timed out, killed, the child's
last error line) for the table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def run_case(script: str, case: str, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """``(result, "")`` from the child's last stdout line, or ``(None, why)`` when it did not finish."""
    try:
        p = subprocess.run([sys.executable, script, "--one", case], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:g} s"
    if p.returncode != 0:
        lines = p.stderr.strip().splitlines()
        return None, "killed (out of memory?)" if p.returncode < 0 else (lines[-1][:80] if lines else "failed")
    return json.loads(p.stdout.strip().splitlines()[-1]), ""
