"""Markdown tables: the one helper every report, summary and analysis table goes through,
so that escaping and layout are decided in one place."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def cell(value: object) -> str:
    """A value as table text: floats to three significant digits, `|` escaped so that a
    value never splits its row."""
    text = f"{value:.3g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table, without a trailing newline."""
    head = [cell(h) for h in header]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for row in rows:
        texts = [cell(v) for v in row]
        if len(texts) != len(head):
            raise ValueError(f"a row of {len(texts)} cells under a header of {len(head)}")
        lines.append("| " + " | ".join(texts) + " |")
    return "\n".join(lines)
