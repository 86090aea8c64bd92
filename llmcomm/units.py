"""Byte counts as short human-readable text: the one byte formatter of tables, figure labels and tick labels,
and command-line output (binary units: 1 KiB = 2¹⁰ B, 1 MiB = 2²⁰ B, 1 GiB = 2³⁰ B, 1 TiB = 2⁴⁰ B)."""

from __future__ import annotations

BINARY_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(n: float, *, compact: bool = False, decimals: int = 2, sep: str | None = None) -> str:
    """``n`` bytes in the largest binary unit not above it.

    Default (reports): ``decimals`` decimals and a space, ``"24.50 GiB"``, ``"512 B"``. ``compact`` (labels):
    no needless decimals and no space, ``"32MiB"``, ``"1.5KiB"``, ``"96B"``. ``sep`` replaces the text between
    number and unit (tick labels: ``compact=True, sep=" "`` gives ``"32 MiB"``, ``"1.5 GiB"``, ``"512 B"``)."""
    gap = sep if sep is not None else ("" if compact else " ")
    for unit, size in BINARY_UNITS:
        if n >= size:
            value = n / size
            if not compact:
                return f"{value:.{decimals}f}{gap}{unit}"
            return f"{value:.0f}{gap}{unit}" if value == int(value) else f"{value:.1f}{gap}{unit}"
    return f"{int(n)}{gap}B" if compact else f"{n:.0f}{gap}B"
