"""The results' column reference: every table's own columns, their Arrow types and
meanings, from the schemas the writer writes with, so docs/reference/results.md can
never miss a column a run writes (the docs site regenerates it at build time)."""

from __future__ import annotations

from perfed_ray.markdown import table
from perfed_ray.results.schema import MEANINGS, SCHEMAS


def reference_text() -> str:
    """One Markdown section and table per results table, in the order they are written."""
    sections = []
    for name, schema in SCHEMAS.items():
        meanings = MEANINGS.get(name, {})
        rows = [(f"`{f.name}`", f"`{f.type}`", meanings.get(f.name, "")) for f in schema]
        sections.append(f"### `{name}`\n\n" + table(("column", "type", "meaning"), rows))
    return "\n\n".join(sections)
