"""Run configuration: the schema of a run's choices (:mod:`.schema`, with each core
key's meaning in :mod:`.meanings`), the settings components declare in their own
sections (:mod:`.sections`, each setting typed in :mod:`.settings`, old flat names in
:mod:`.legacy`), reading files and `--set` pairs and revising a configuration
(:mod:`.load`), rules across keys (:mod:`.rules`), the reference that
`perfed-ray keys` and the docs print (:mod:`.docs`), and the record of its own
settings each component is made from (:mod:`.owners`).

The names below are the package's public face, so ``from perfed_ray.config import
from_mapping`` reads as it always has; the modules say where each one lives.
"""

from perfed_ray.config.docs import reference, reference_text
from perfed_ray.config.legacy import legacy_keys
from perfed_ray.config.load import flatten, from_mapping, load, parse_overrides, revise
from perfed_ray.config.schema import CORE, FIELDS, RunConfig, base_type, spec
from perfed_ray.config.sections import (
    component_settings,
    declared,
    registered_settings,
    section_name,
)
from perfed_ray.errors import ConfigError
from perfed_ray.registry import SECTIONED

__all__ = [
    "CORE",
    "FIELDS",
    "SECTIONED",
    "ConfigError",
    "RunConfig",
    "base_type",
    "component_settings",
    "declared",
    "flatten",
    "from_mapping",
    "legacy_keys",
    "load",
    "parse_overrides",
    "reference",
    "reference_text",
    "registered_settings",
    "revise",
    "section_name",
    "spec",
]
