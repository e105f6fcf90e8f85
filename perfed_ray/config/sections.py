"""Components' sections: the settings that registered components declare, each under
the configuration's section named after the component (``fedrep: {head_epochs: 10}``).

The components say what their sections hold (a ``settings`` mapping of
:class:`~perfed_ray.config.settings.Setting` on the class), so nothing here lists a method's
knobs: a user's own method by dotted path gets a section the same way. Loading a
component imports it, so these functions ask the registries only when a
configuration has component keys, or for the reference.
"""

from __future__ import annotations

from typing import Any

from perfed_ray.config.settings import Setting
from perfed_ray.registry import REGISTRIES, SECTIONED, is_dotted


def section_name(value: str, key: str | None = None) -> str:
    """The section of the component a configuration names under `key`: its registry's
    shared section if it has one (``privacy``), else its registered name, or for a
    dotted path ``pkg.mod:Reptile`` the class name in lower case (``reptile``)."""
    if key is not None and REGISTRIES[key].section:
        return REGISTRIES[key].section
    return value.rpartition(":")[2].lower() if is_dotted(value) else value


def declared(registry_key: str, name: str) -> dict[str, Setting]:
    """The settings a component declares (none for most)."""
    return dict(getattr(REGISTRIES[registry_key].load(name), "settings", None) or {})


def registered_sections() -> dict[str, tuple[str, str]]:
    """section -> (registry key, name) for every registered component that has
    settings: where a section or a legacy key given in a file is looked up."""
    out = {}
    for key in SECTIONED:
        for name in REGISTRIES[key].names():
            if declared(key, name):
                out.setdefault(section_name(name, key), (key, name))
    return out


def component_settings(cfg: Any) -> dict[str, Setting]:
    """The settings declared by the components a run configuration names (its algorithm
    and optimisers, a user's own included), by dotted key (``fedrep.body_steps``)."""
    return {
        f"{section_name(getattr(cfg, key), key)}.{name}": s
        for key in SECTIONED
        for name, s in declared(key, getattr(cfg, key)).items()
    }


def registered_settings() -> dict[str, tuple[str, str, Setting]]:
    """Every built-in or installed component's settings: dotted key -> (the registry key
    that picks the component, its name, the Setting)."""
    return {
        f"{section}.{name}": (key, component, s)
        for section, (key, component) in registered_sections().items()
        for name, s in declared(key, component).items()
    }
