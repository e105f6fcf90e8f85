"""The flat keys older versions of perfed-ray used for components' settings
(``fedrep_body_steps``), so that their configuration files and result tables still
read: each is declared by the Setting it became (``Setting(..., legacy=...)``), beside
the component that owns it, and mapped to its dotted key here.
"""

from __future__ import annotations

from collections.abc import Mapping

from perfed_ray.config.sections import declared, registered_sections


def legacy_of(sections: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """Old flat key -> dotted key, for the components of `sections`
    (section -> (registry key, name))."""
    return {
        s.legacy: f"{section}.{name}"
        for section, (key, component) in sections.items()
        for name, s in declared(key, component).items()
        if s.legacy
    }


def legacy_keys() -> dict[str, str]:
    """The flat keys older versions used for components' settings -> their dotted keys."""
    return legacy_of(registered_sections())
