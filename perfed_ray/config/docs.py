"""The configuration reference: every key with its default, what it allows and what it
means, from the same Settings that validation reads, so the docs and `perfed-ray keys`
cannot disagree with what a run accepts.
"""

from __future__ import annotations

from perfed_ray.config.schema import CORE
from perfed_ray.config.sections import declared, registered_sections
from perfed_ray.markdown import table
from perfed_ray.registry import REGISTRIES


def reference() -> list[tuple[str, str, str, str]]:
    """(key, default, allowed, meaning) for every key: the core keys, then every
    registered component's own settings under its section (``fedrep.head_epochs``): the
    docs' configuration reference (docs/reference/configuration.md) and `keys`."""
    rows = [(k, s.shown_default(), s.describe(k), s.help) for k, s in CORE.items()]
    for section, (key, name) in registered_sections().items():
        # a section a whole registry shares (privacy) is every component's, not one's
        owner = key if REGISTRIES[key].section else f"{key} {name}"
        for setting, s in declared(key, name).items():
            dotted = f"{section}.{setting}"
            rows.append((dotted, s.shown_default(), s.describe(dotted), f"{owner}: {s.help}"))
    return rows


def reference_text(markdown: bool = False) -> str:
    """The configuration reference as a Markdown table (the docs page's) or plain text."""
    if markdown:
        rows = [(f"`{k}`", f"`{d}`", a, m) for k, d, a, m in reference()]
        return table(("key", "default", "allowed", "meaning"), rows)
    return "\n".join(f"{k:20} default {d:14} {a}\n{'':20} {m}" for k, d, a, m in reference())
