"""Reading a configuration: YAML files, `--set` pairs and mappings, into one validated
:class:`~perfed_ray.config.schema.RunConfig`.

Validation happens here, before anything expensive starts (data loading, Ray), and
each problem is reported as a :class:`~perfed_ray.errors.ConfigError` naming the key
and what is allowed, so the CLI can exit with status 2 and one clear line.
Components' settings may come as nested sections or dotted keys; both are read as
dotted keys, checked by the component that declares them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from perfed_ray import yamlfile
from perfed_ray.config.legacy import legacy_of
from perfed_ray.config.rules import check
from perfed_ray.config.schema import CORE, RunConfig
from perfed_ray.config.sections import (
    component_settings,
    declared,
    registered_sections,
    section_name,
)
from perfed_ray.errors import ConfigError, did_you_mean
from perfed_ray.registry import SECTIONED


def flatten(values: Mapping[str, Any]) -> dict[str, Any]:
    """Sections given as nested mappings (``fedrep: {head_epochs: 10}``) as dotted keys;
    a core key's value is never a mapping."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        key = str(key)
        if isinstance(value, Mapping) and key not in CORE:
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def _unknown(key: str, known: Iterable[str]) -> ConfigError:
    return ConfigError(
        f"unknown configuration key {key!r}{did_you_mean(key, known)}; see `perfed-ray keys` "
        f"for the allowed keys"
    )


def from_mapping(values: Mapping[str, Any]) -> RunConfig:
    """Build a validated config from a mapping (a YAML file, overrides): core keys, and
    components' settings as sections or dotted keys. The settings of the components the
    run uses are kept, with their defaults filled in; a section of another registered
    component is checked and dropped (a sweep's base file may serve several methods)."""
    flat = flatten(values)
    core = {k: v for k, v in flat.items() if k in CORE}
    cfg = RunConfig(**{k: CORE[k].coerce(k, v) for k, v in core.items()})
    rest = {k: v for k, v in flat.items() if k not in CORE}
    sections = registered_sections() if rest else {}
    chosen = {section_name(getattr(cfg, key), key): (key, getattr(cfg, key)) for key in SECTIONED}
    sections |= chosen
    legacy = legacy_of(sections)
    given: dict[str, Any] = {}
    for key, value in rest.items():
        key = legacy.get(key, key)
        section, dot, name = key.partition(".")
        if not dot or section not in sections:
            dotted = [f"{s}.{n}" for s, (k, c) in sections.items() for n in declared(k, c)]
            raise _unknown(key, [*CORE, *dotted])
        owner = declared(*sections[section])
        if name not in owner:
            raise _unknown(key, [f"{section}.{n}" for n in owner])
        given[key] = owner[name].coerce(key, value)
    settings = {k: given.get(k, s.default) for k, s in component_settings(cfg).items()}
    cfg = dataclasses.replace(cfg, settings=tuple(sorted(settings.items())))
    check(cfg)
    return cfg


def revise(cfg: RunConfig, **changes: Any) -> RunConfig:
    """`cfg` with `changes`, validated again as a whole: here, not a method of the
    schema's, because validation stands above the schema (its rules read it)."""
    return from_mapping({**cfg.to_dict(), **changes})


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """Parse `--set key=value` pairs; values are read as YAML scalars."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r} is not of the form key=value")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def load(path: str | Path | None, overrides: Iterable[str] = ()) -> RunConfig:
    """Read a YAML file (or nothing: all defaults) and apply `--set` overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        loaded = yamlfile.read(path, "configuration file")
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"configuration file {str(path)!r} must be a mapping of key: value lines "
                f"(a component's settings in a section: fedrep: {{head_epochs: 10}})"
            )
        values.update(loaded)
    values.update(parse_overrides(overrides))
    return from_mapping(values)
