"""What a configuration value may be, declared once and used for validation, the docs
(`perfed-ray keys`, docs/reference/configuration.md) and the Parquet column types.

The core keys of :class:`perfed_ray.config.RunConfig` are declared with a
:class:`Setting` each, and so is every setting of a component (an algorithm, a server
or client optimiser, a user's own), in the component's ``settings`` mapping:

    class FedRep(Algorithm):
        settings = {"head_epochs": Setting(10, "local epochs on the head", low=0)}

A component's settings live in its own section of the configuration, named after
it (``fedrep: {head_epochs: 10}``, ``--set fedrep.head_epochs=10``, a runs-table
column ``fedrep.head_epochs``), so a plug-in declares, validates and sweeps its own
knobs exactly as the built-in methods do. Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfed_ray.errors import ConfigError

KINDS = {"str": str, "int": int, "float": float, "bool": bool}
INT64_MAX = 2**63 - 1  # integer values are stored in int64 Parquet columns


@dataclass(frozen=True)
class Setting:
    """One configuration value: its default, a one-line meaning, and what it allows.

    `kind` is the type (inferred from the default when it is not None); `auto` values
    also accept the word `word` (stored as None: chosen at run time); `registry` values
    name a component of the registry under the same key, `many` of them for a list
    (stored as one comma-separated string, a column like any other); `legacy` is the
    flat key an older perfed-ray used for it, still read from old files."""

    default: Any
    help: str
    kind: type | None = None
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    auto: bool = False
    word: str = "auto"
    registry: bool = False
    many: bool = False
    legacy: str | None = None

    @property
    def type(self) -> type:
        if self.kind is not None:
            return self.kind
        if self.default is None:
            raise TypeError("a Setting whose default is None needs kind=")
        return type(self.default)

    def coerce(self, key: str, value: Any) -> Any:
        """`value` checked for type, range and choices, in its canonical form; a
        ConfigError naming `key` and what it allows otherwise."""
        if self.auto and (value is None or value == self.word):
            return None
        kind = self.type
        if self.many:
            return self._names(key, value)
        if self.registry and isinstance(value, str):
            from perfed_ray.registry import REGISTRIES

            REGISTRIES[key].check(value)
            return value
        bad = ConfigError(f"{key} = {value!r} is not allowed: {self.describe(key)}")
        if kind is bool:
            if not isinstance(value, bool):
                raise bad
            return value
        if kind is str:
            if not isinstance(value, str) or (self.choices and value not in self.choices):
                raise bad
            return value
        if isinstance(value, bool):
            raise bad
        given = value
        if isinstance(value, str):  # YAML 1.1 reads `1e-3` and `1e9` as strings
            try:
                value = float(value)
            except ValueError:
                raise bad from None
        if kind is int:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if not isinstance(value, int):
                raise bad
        else:
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad
            value = float(value)
        too_low = self.low is not None and (
            value <= self.low if self.low_open else value < self.low
        )
        shown = given if isinstance(given, (str, float)) else value  # 1e30 as written
        if too_low or (self.high is not None and value > self.high):
            raise ConfigError(f"{key} = {shown!r} is out of range: {self.describe(key)}")
        if kind is int and abs(value) > INT64_MAX:
            raise ConfigError(
                f"{key} = {shown!r} is out of range: {self.describe(key)} below 2**63 "
                f"(it is stored in a 64-bit Parquet column)"
            )
        return value

    def _names(self, key: str, value: Any) -> str:
        """A list of registered names (or one, or a comma-separated string: what `--set
        key=a,b` gives) as its canonical comma-separated string; "" for none."""
        from perfed_ray.registry import REGISTRIES

        names = value.split(",") if isinstance(value, str) else value
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{key} = {value!r} is not allowed: {self.describe(key)}")
        names = [n.strip() for n in names if n.strip()]
        for name in names:
            REGISTRIES[key].check(name)
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"{key} names {twice[0]!r} twice: name each once")
        return ",".join(names)

    def describe(self, key: str) -> str:
        """What the value accepts, in words, for error messages and the docs."""
        kind = self.type
        if self.registry:
            from perfed_ray.registry import REGISTRIES

            text = REGISTRIES[key].describe()
            if self.many:
                text = f"a list, each {text} ([] for none)"
        elif self.choices:
            text = "one of " + ", ".join(self.choices)
        elif kind is bool:
            text = "true or false"
        elif kind is str:
            text = "a string"
        else:
            noun = "an integer" if kind is int else "a number"
            low, high = (  # an integer bound in full (100000000), not as 1e+08
                None if x is None else str(int(x)) if kind is int else f"{x:g}"
                for x in (self.low, self.high)
            )
            if low is not None and high is not None:
                text = f"{noun} in {'(' if self.low_open else '['}{low}, {high}]"
            elif low is not None:
                text = f"{noun} {'>' if self.low_open else '>='} {low}"
            else:
                text = noun
        return text + (f" or {self.word}" if self.auto else "")

    def shown_default(self) -> str:
        if self.many:
            return f"[{self.default}]"
        return self.word if self.auto and self.default is None else repr(self.default)
