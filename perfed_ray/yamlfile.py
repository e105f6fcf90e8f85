"""Reading the YAML files a user writes (configurations, sweep files), strictly.

PyYAML on its own takes the last of two equal keys without a word, decodes text in
whatever way the platform prefers and reports a syntax error as a multi-line dump.
Here a file must be UTF-8, a key may appear once per mapping, and every problem is
one line naming the file, the line and the column, so the command line can exit 2
with it before anything starts. Nothing here imports torch or Ray.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from perfed_ray.errors import ConfigError


class _DuplicateKey(yaml.MarkedYAMLError):
    """A key given twice in one mapping (PyYAML would keep the second silently)."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):  # PyYAML's own error says so
                continue
            if key in first:
                raise _DuplicateKey(
                    problem=f"key {key!r} is given twice (first on line {first[key].line + 1})",
                    problem_mark=key_node.start_mark,
                )
            first[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def _where(text: bytes, offset: int) -> str:
    """`line L, column C` (both from 1) of byte `offset` of `text`."""
    line = text.count(b"\n", 0, offset) + 1
    column = offset - (text.rfind(b"\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


def read(path: Path, what: str) -> Any:
    """The contents of YAML file `path`; a missing, non-UTF-8 or malformed `what` (e.g.
    "configuration file") is a ConfigError of one line naming it, the line and column."""
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{what} {str(path)!r} is not UTF-8 text: byte {raw[err.start]:#04x} at "
            f"{_where(raw, err.start)}; save it as UTF-8"
        ) from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as err:
        raise ConfigError(f"{what} {str(path)!r}: {describe(err)}") from None


def describe(err: yaml.YAMLError) -> str:
    """A YAML error in one line: where, and what is wrong there."""
    if not isinstance(err, yaml.MarkedYAMLError):
        return f"not valid YAML ({' '.join(str(err).split())})"
    mark = err.problem_mark or err.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = err.problem or "not valid YAML"
    context = f" ({err.context})" if err.context and not isinstance(err, _DuplicateKey) else ""
    return f"{where}{problem}{context}"
