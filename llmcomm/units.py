"""Byte counts as short human-readable text, for table labels and command-line output (binary units)."""

from __future__ import annotations

BINARY_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(n: float, *, compact: bool = False) -> str:
    """``n`` bytes in the largest binary unit not above it.

    Default (reports): two decimals and a space, ``"24.50 GiB"``, ``"512 B"``. ``compact`` (labels):
    no space and no needless decimals, ``"32MiB"``, ``"1.5KiB"``, ``"96B"``."""
    for unit, size in BINARY_UNITS:
        if n >= size:
            value = n / size
            if not compact:
                return f"{value:.2f} {unit}"
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{int(n)}B" if compact else f"{n:.0f} B"
