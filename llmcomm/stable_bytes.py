"""Bytes of a figure or a results file that depend on the numbers, not on the machine that computed them.

Two runs on one machine write identical files; on another machine the same code gives numbers that differ in
their last bits (BLAS and LAPACK kernels chosen by CPU, SIMD summation order: relative differences of about
1e-13 in fitted coefficients and everything computed from them). Written at full precision, such a difference
shows as a changed results JSON, and in a PDF as a changed coordinate wherever it crosses the last written
decimal. One rule each, applied by :class:`llmcomm.reproduce.Outputs` to everything it writes:

* **Numbers** (:func:`rounded`): a float that is not a whole number keeps :data:`SIGNIFICANT_DIGITS` significant
  digits. No number measured or fitted here carries more than four significant digits of information (the
  measurements are timings with percent-level noise), so six keep every digit the prose quotes and drop the
  machine-dependent tail; whole numbers (byte counts, call counts) are kept exactly.
* **PDF coordinates** (:func:`figure_bytes`): matplotlib writes positions with 10 decimals (``pdfRepr``) and path
  vertices with 6 (``_path.convert_to_string``); while a figure is saved both are limited to
  :data:`PDF_DECIMALS` decimals of a PostScript point (1/72 inch): 0.35 µm, a hundredth of a 600-dpi printer dot.
  The PDF carries no creation date and no producer version, the PNG no software tag.

A value sitting within 1e-13 of a rounding boundary can still flip (about one in 10⁷ numbers); nothing else does.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGNIFICANT_DIGITS = 6
PDF_DECIMALS = 3
PDF_METADATA = {"CreationDate": None, "Producer": None}
PNG_METADATA = {"Software": None}


def rounded(value: float) -> float:
    """``value`` with :data:`SIGNIFICANT_DIGITS` significant digits; whole numbers, inf and NaN unchanged."""
    if not math.isfinite(value) or value == int(value):
        return value
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def jsonable(v: Any) -> Any:
    """``v`` as JSON-ready Python values (numpy scalars and arrays unwrapped, mapping keys as strings), every
    float :func:`rounded`."""
    import numpy as np

    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [jsonable(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float):
        return rounded(v)
    return v


def json_bytes(doc: Any) -> bytes:
    """``doc`` as indented JSON with sorted keys and :func:`rounded` floats, newline-terminated (UTF-8)."""
    return (json.dumps(jsonable(doc), indent=2, sort_keys=True) + "\n").encode()


class _CoarsePaths:
    """matplotlib's ``_path`` module, with path vertices written to at most ``decimals`` decimals."""

    def __init__(self, module: Any, decimals: int) -> None:
        self._module, self._decimals = module, decimals

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def convert_to_string(self, path, trans, clip, simplify, sketch, precision, codes, postfix):  # noqa: ANN001, ANN201
        return self._module.convert_to_string(path, trans, clip, simplify, sketch, min(precision, self._decimals),
                                              codes, postfix)


@contextmanager
def pdf_decimals(decimals: int = PDF_DECIMALS) -> Iterator[None]:
    """While active, matplotlib's PDF backend writes every number with at most ``decimals`` decimals.

    It replaces the backend's float formatting (``backend_pdf.pdfRepr``) and its path writer's precision (through
    ``backend_pdf._path``) and restores both on exit. A matplotlib without these names raises RuntimeError
    rather than silently writing machine-dependent PDFs."""
    import numpy as np
    from matplotlib.backends import backend_pdf as bp

    if not (callable(getattr(bp, "pdfRepr", None)) and hasattr(getattr(bp, "_path", None), "convert_to_string")):
        raise RuntimeError("matplotlib's PDF backend has no pdfRepr / _path.convert_to_string: "
                           "llmcomm.stable_bytes.pdf_decimals needs updating for this matplotlib version")
    original_repr, original_path = bp.pdfRepr, bp._path
    fmt = b"%%.%df" % decimals

    def pdf_repr(obj: Any) -> bytes:
        if isinstance(obj, (float, np.floating)) and np.isfinite(obj):
            text = (fmt % obj).rstrip(b"0").rstrip(b".")
            return b"0" if text in (b"", b"-", b"-0") else text
        return original_repr(obj)

    bp.pdfRepr, bp._path = pdf_repr, _CoarsePaths(original_path, decimals)  # type: ignore[assignment]  # a stand-in for the module
    try:
        yield
    finally:
        bp.pdfRepr, bp._path = original_repr, original_path


def figure_bytes(fig: Any, fmt: str) -> bytes:
    """A matplotlib Figure saved as ``fmt`` (``png``, ``pdf``, ``svg``) without dates or version tags; PDFs with
    :func:`pdf_decimals`."""
    buf = io.BytesIO()
    if fmt == "pdf":
        with pdf_decimals():
            fig.savefig(buf, format="pdf", metadata=PDF_METADATA)
    else:
        fig.savefig(buf, format=fmt, metadata=PNG_METADATA if fmt == "png" else None)
    return buf.getvalue()
