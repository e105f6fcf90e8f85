"""How a user's own components reach every actor.

A configuration may name a user's own algorithm, model, data set, partitioner or
strategy by dotted path (``algorithm: mypkg.methods:Reptile``) or by an entry point.
When perfed-ray starts Ray or joins a cluster, the top-level package (or single
file) of each dotted path goes into the job's runtime_env (`py_modules`), so every
worker can import it, on nodes that never saw it; packages installed in
site-packages are expected on the nodes too and are not shipped. Ray accepts local
folders in `py_modules` only for a whole job, so for a Ray session the user started
(a notebook, a test) the components travel by value instead: the driver resolves
each one, registers its module with cloudpickle to be pickled by value, and hands
the objects to the actors, which take them into their registries
(:func:`adopt`). Either way an actor never looks a user's name up on its own.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from ray import cloudpickle

from perfed_ray.config.schema import CORE, RunConfig
from perfed_ray.registry import REGISTRIES, is_dotted

Components = dict[str, Any]  # configuration key -> the component it names


def _foreign(cfg: RunConfig) -> dict[str, str]:
    """Registry keys whose value is not a built-in name: key -> name. Lists of names
    (`report_to`'s trackers) are the driver's alone: nothing of them travels."""
    return {
        key: getattr(cfg, key)
        for key, s in CORE.items()
        if s.registry
        and not s.many
        and isinstance(getattr(cfg, key), str)
        and getattr(cfg, key) not in REGISTRIES[key].builtins
    }


def _shippable(module: str) -> str | None:
    """The local path of a top-level module that is not an installed package."""
    spec = importlib.util.find_spec(module)
    if spec is None or module == "perfed_ray":
        return None
    path = spec.submodule_search_locations[0] if spec.submodule_search_locations else spec.origin
    installed = any(p in Path(path or "").parts for p in ("site-packages", "dist-packages"))
    return None if installed or not path else str(path)


def plugin_modules(cfg: RunConfig) -> list[str]:
    """Local paths of the top-level packages or modules that dotted paths in `cfg` name:
    what the job's runtime_env ships."""
    tops = {
        name.partition(":")[0].split(".")[0] for name in _foreign(cfg).values() if is_dotted(name)
    }
    return sorted(p for p in map(_shippable, tops) if p)


def components(cfg: RunConfig) -> Components:
    """The user's components resolved on the driver, their modules marked to travel by
    value (a module the job shipped imports on the workers all the same)."""
    found = {}
    for key, name in _foreign(cfg).items():
        obj = REGISTRIES[key].load(name)
        top = getattr(obj, "__module__", "").split(".")[0]
        if top and _shippable(top):
            cloudpickle.register_pickle_by_value(importlib.import_module(top))
        found[key] = obj
    return found


def adopt(cfg: RunConfig, found: Components) -> None:
    """In an actor: the driver's components answer the configuration's names."""
    for key, obj in found.items():
        REGISTRIES[key].provide(getattr(cfg, key), obj)
