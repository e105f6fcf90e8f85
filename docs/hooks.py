"""MkDocs hooks (`hooks:` in mkdocs.yml): the parts of the site that the code is the truth
for, and links into the rest of the repository.

- The references the code is the truth for are generated at build time: the block
  between `<!-- NAME:begin -->` and `<!-- NAME:end -->` is replaced by GENERATED[NAME]
  (`keys`: the configuration reference from the settings; `columns`: the results'
  columns from results/schema.py; `cli`: every command and flag from the argparse
  parser), so the site can never be stale. The committed copy of a block stays readable
  on GitHub; a stale one is a warning, which `mkdocs build --strict` (CI) turns into a
  failure, and `python docs/hooks.py` rewrites every page's blocks.
- A page may include a Markdown file from elsewhere in the repository with a line
  `<!-- include PATH -->` (PATH relative to the page), so a README that must also read
  on its own beside its files (cluster/README.md) is in the site's navigation without a
  copy; its relative links are rewritten to start from the including page.
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

from perfed_ray import clidocs
from perfed_ray.config import reference_text
from perfed_ray.results import docs as columns

log = logging.getLogger("mkdocs.hooks.perfed_ray")

REPO = Path(__file__).resolve().parents[1]
GENERATED = {
    "keys": lambda: reference_text(markdown=True),
    "columns": columns.reference_text,
    "cli": clidocs.reference_text,
}
INCLUDE = re.compile(r"^<!-- include (\S+) -->$", re.M)
BLOCK = re.compile(r"(<!-- (\w+):begin -->\n)(.*?)(\n<!-- \2:end -->)", re.S)
LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")
OUTSIDE = "repository:"  # a URL scheme, so MkDocs' own link check leaves these links alone
HREF = re.compile(rf'href="{OUTSIDE}([^"#]*)(#[^"]*)?"')
ROLE = re.compile(r":(?:class|mod|func|meth|attr|data|exc):<code>(~?)([^<]+)</code>")


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Fill the generated blocks and mark the links that leave `docs/`."""
    here = Path(page.file.abs_src_path).parent
    markdown = included(generated_blocks(markdown, page.file.src_uri), here)
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


def included(markdown: str, here: Path) -> str:
    """`markdown` with each include line replaced by the file it names, whose relative
    links are rewritten to lead from `here` to the same targets."""

    def include(match: re.Match) -> str:
        path = (here / match.group(1)).resolve()
        text = path.read_text()

        def moved(link: re.Match) -> str:
            target, _, anchor = link.group(1).partition("#")
            new = os.path.relpath(path.parent / target, here) if target else ""
            return f"]({new}{'#' + anchor if anchor else ''})"

        return LINK.sub(moved, text)

    return INCLUDE.sub(include, markdown)


def generated_blocks(markdown: str, where: str) -> str:
    """`markdown` with every generated block filled afresh; a stale one is a warning."""

    def fill(match: re.Match) -> str:
        name = match.group(2)
        if name not in GENERATED:
            return match.group(0)  # a marked block of a page's own (tests read them)
        text = GENERATED[name]()
        if match.group(3) != text:
            log.warning(
                "%s: the generated %s block is stale; regenerate it with `python docs/hooks.py`",
                where,
                name,
            )
        return match.group(1) + text + match.group(4)

    return BLOCK.sub(fill, markdown)


if __name__ == "__main__":  # python docs/hooks.py: rewrite every page's generated blocks
    log.setLevel(logging.ERROR)  # a stale block is what this rewrites, not news
    for path in sorted((REPO / "docs").rglob("*.md")):
        text = path.read_text()
        fresh = generated_blocks(text, str(path))
        if fresh != text:
            path.write_text(fresh)
            print(f"regenerated {path.relative_to(REPO)}")
