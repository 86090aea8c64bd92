"""The report of a :class:`~llmcomm.compare.comparison.Comparison`, built once as a list of sections
(:func:`sections`) and rendered as Markdown (:func:`to_markdown`) or HTML (:func:`to_html`), so both carry
the same header, verdicts, per-kind table, one-sided calls and largest per-pair differences."""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from .comparison import Comparison

PAIRS_SHOWN = 15  # largest per-pair differences in a report


@dataclass(frozen=True)
class Section:
    """One section: a title and either a bullet list (``items``, ``None`` for none) or a table."""

    title: str
    items: list[tuple[str, str]] | None = None  # (bold lead, text): the lead may be empty
    table: pd.DataFrame | None = None
    empty: str = "none"


def title(c: Comparison) -> str:
    return f"{c.meta.get('trace', 'trace')} against its prediction"


def header(c: Comparison, code: Callable[[str], str] = lambda v: f"`{v}`",
           text: Callable[[str], str] = str) -> str:
    """The sentence under the title: model, configuration, framework, iteration, ranks and how many of them
    issue the same calls in the same order; ``code`` marks names, ``text`` escapes the rest."""
    m = c.meta
    return (f"model {code(str(m.get('model')))}, {text(str(m.get('parallel')))}, framework "
            f"{code(str(m.get('framework')))}; iteration {c.iteration}, ranks compared: "
            f"{text(ranks_text(c.ranks))}; {c.ordered_ranks} of {len(c.ranks)} ranks issue the same calls in the "
            "same order.")


def sections(c: Comparison) -> list[Section]:
    """The report's sections, in order."""
    pairs = c.pairs.reindex(c.pairs["diff"].abs().sort_values(ascending=False).index).head(PAIRS_SHOWN)
    return [
        Section("Verdict per parallelism", items=[(r.parallelism, r.verdict) for r in c.verdicts.itertuples()]),
        Section("Calls and bytes per parallelism, phase and op", table=c.by_kind),
        Section("Calls on one side only",
                items=[("", s) for s in c.one_sided["what"]] if not c.one_sided.empty else None),
        Section("Largest per-pair differences (direct matrix, bytes)", table=pairs),
    ]


def to_markdown(c: Comparison) -> str:
    lines = [f"# {title(c)}", "", header(c), ""]
    for s in sections(c):
        lines += [f"## {s.title}", ""]
        if s.table is not None:
            lines.append(_table_markdown(s.table, s.empty))
        elif s.items:
            lines += [f"- **{lead}**: {text}" if lead else f"- {text}" for lead, text in s.items]
        else:
            lines.append(s.empty)
        lines.append("")
    return "\n".join(lines[:-1]) + "\n"


def to_html(c: Comparison) -> str:
    t = html.escape(title(c))
    parts = ["<!doctype html><meta charset='utf-8'>", f"<title>{t}</title>", f"<h1>{t}</h1>",
             f"<p>{header(c, code=lambda v: f'<code>{html.escape(v)}</code>', text=html.escape)}</p>"]
    for s in sections(c):
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        if s.table is not None:
            table = s.table.drop(columns=["ranks"], errors="ignore")
            parts.append(table.to_html(index=False) if not table.empty else f"<p>{s.empty}</p>")
        elif s.items:
            parts.append("<ul>" + "".join(
                f"<li><b>{html.escape(lead)}</b>: {html.escape(text)}</li>" if lead else f"<li>{html.escape(text)}</li>"
                for lead, text in s.items) + "</ul>")
        else:
            parts.append(f"<p>{s.empty}</p>")
    return "\n".join(parts) + "\n"


def ranks_text(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 6:
        return f"{len(ranks)} ranks ({ranks[0]}..{ranks[-1]})"
    return ", ".join(map(str, ranks))


def _table_markdown(df: pd.DataFrame, empty: str = "none") -> str:
    if df.empty:
        return empty
    cols = list(df.columns)
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        rows.append("| " + " | ".join(_cell(v) for v in r) + " |")
    return "\n".join(rows)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


