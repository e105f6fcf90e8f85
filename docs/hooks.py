"""MkDocs hooks (`hooks:` in mkdocs.yml): the parts of the site that the code is the truth
for, and links into the rest of the repository.

- The configuration reference is generated from the settings at build time: the block
  between `<!-- keys:begin -->` and `<!-- keys:end -->` is replaced by
  `perfed_ray.config.reference_text(markdown=True)`, so the site can never be stale. The
  committed copy of the block stays readable on GitHub; a stale one is a warning, which
  `mkdocs build --strict` (CI) turns into a failure.
- A page may link to any file of the repository by its relative path (so the Markdown
  reads on GitHub too). MkDocs only knows `docs/`, so such a link is checked to exist
  and then pointed at the file on `repo_url` when one is set, or else at the file in
  the checkout the site was built in (the site folder sits inside it).
- The docstrings cross-reference in Sphinx's roles (:class:`~perfed_ray.strategy.Strategy`),
  which mkdocstrings leaves as text: they are shown as the code name alone.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from perfed_ray.config import reference_text

log = logging.getLogger("mkdocs.hooks.perfed_ray")

REPO = Path(__file__).resolve().parents[1]
KEYS = re.compile(r"(<!-- keys:begin -->\n)(.*?)(\n<!-- keys:end -->)", re.S)
LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")
OUTSIDE = "repository:"  # a URL scheme, so MkDocs' own link check leaves these links alone
HREF = re.compile(rf'href="{OUTSIDE}([^"#]*)(#[^"]*)?"')
ROLE = re.compile(r":(?:class|mod|func|meth|attr|data|exc):<code>(~?)([^<]+)</code>")


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Fill the generated blocks and mark the links that leave `docs/`."""
    markdown = _keys_block(markdown, page.file.src_uri)
    here = Path(page.file.abs_src_path).parent
    docs = Path(config.docs_dir).resolve()

    def mark(match: re.Match) -> str:
        target, _, anchor = match.group(1).partition("#")
        path = (here / target).resolve()
        if path.is_relative_to(docs):
            return match.group(0)
        if not path.exists():
            log.warning("%s links to %s, which does not exist", page.file.src_uri, target)
            return match.group(0)
        rel = path.relative_to(REPO).as_posix() + ("/" if path.is_dir() else "")
        return f"]({OUTSIDE}{rel}{'#' + anchor if anchor else ''})"

    return LINK.sub(mark, markdown)


def on_page_content(html: str, page, config, files) -> str:
    """Point the marked links at the repository's files; show Sphinx roles as code."""

    def point(match: re.Match) -> str:
        rel, anchor = match.group(1), match.group(2) or ""
        if config.repo_url:
            kind = "tree" if rel.endswith("/") else "blob"
            return f'href="{config.repo_url.rstrip("/")}/{kind}/main/{rel}{anchor}"'
        page_dir = Path(config.site_dir) / Path(page.file.dest_uri).parent
        return f'href="{os.path.relpath(REPO / rel, page_dir)}{anchor}"'

    def name(match: re.Match) -> str:
        short, dotted = match.groups()
        return f"<code>{dotted.rsplit('.', 1)[-1] if short else dotted}</code>"

    return ROLE.sub(name, HREF.sub(point, html))


def _keys_block(markdown: str, where: str) -> str:
    match = KEYS.search(markdown)
    if match is None:
        return markdown
    table = reference_text(markdown=True)
    if match.group(2) != table:
        log.warning(
            "%s: the configuration keys block is stale; regenerate it with "
            "`perfed-ray keys --markdown`",
            where,
        )
    return markdown[: match.start(2)] + table + markdown[match.end(2) :]
