"""The model catalogue as a table: computed against published parameter counts."""

from __future__ import annotations

import math

import pandas as pd

from .specs import list_models, load_model


def family(name: str) -> str:
    """``"llama3-70b"`` -> ``"llama3"``; ``"megatron-gpt-1t"`` -> ``"megatron-gpt"``."""
    return name.rsplit("-", 1)[0] if "-" in name else name


def significant_digits(x: float) -> int:
    """Digits a published figure was printed with: ``1.7e9`` -> 2, ``6738415616`` -> 9."""
    mant = f"{x:.12e}".split("e")[0].replace(".", "").rstrip("0")
    return max(len(mant), 1)


def matches_published(computed: float, published: float, tolerance: float = 0.02) -> bool:
    """``|computed − published| ≤ tolerance·published``, or equal once ``computed`` is rounded to the digits
    the source printed (Megatron's table prints 1.7B for a model its own formula puts at 1.65B)."""
    if abs(computed - published) <= tolerance * published:
        return True
    d = significant_digits(published)
    return round(computed, -int(math.floor(math.log10(abs(published)))) + d - 1) == published


NOMINAL_TOLERANCE = 0.10  # a model whose only published size is its name ("8B"): within 10 % of it


def published_ok(computed: float, published: float, nominal: bool = False, tolerance: float = 0.02) -> bool:
    """:func:`matches_published`, or for a size published only as the model's name (``nominal``) within
    :data:`NOMINAL_TOLERANCE` of it."""
    if nominal:
        return abs(computed - published) <= NOMINAL_TOLERANCE * published
    return matches_published(computed, published, tolerance)


def catalogue_table(names: list[str] | None = None) -> pd.DataFrame:
    """One row per model: architecture, ``computed`` and ``published`` totals and their relative error
    ``(computed − published) / published``; for MoE also the active counts."""
    rows = []
    for n in names or list_models():
        m = load_model(n)
        pub = m.published_parameters or float("nan")
        rows.append({
            "name": n, "family": family(n), "kind": "MoE" if m.is_moe else "dense",
            "layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_attention_heads,
            "kv_heads": m.query_groups, "experts": m.num_experts, "top_k": m.moe_router_topk,
            "computed": m.num_parameters(), "published": pub,
            "rel_error": (m.num_parameters() - pub) / pub,
            "published_is_nominal": m.published_is_nominal,
            "matches_published": published_ok(m.num_parameters(), pub, m.published_is_nominal),
            "active_computed": m.num_active_parameters(),
            "active_published": m.published_active_parameters or float("nan"),
            "source": m.source,
        })
    return pd.DataFrame(rows)
