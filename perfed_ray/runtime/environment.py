"""What every actor's process needs besides the node's Python: the user's own
components and an armed fault.

A configuration may name a user's own algorithm, model, data set, partitioner or
strategy by dotted path (``algorithm: mypkg.methods:Reptile``). The module's top-level
package (or single file) is shipped to every actor through Ray's `runtime_env`
(`py_modules`), so it runs on a cluster whose nodes never saw it; packages installed
in site-packages are expected to be installed on the nodes too, and are not shipped.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ray

from perfed_ray import faults
from perfed_ray.config import FIELDS, RunConfig
from perfed_ray.registry import is_dotted


def plugin_modules(cfg: RunConfig) -> list[str]:
    """Local paths of the top-level packages or modules that dotted paths in `cfg` name."""
    paths = []
    for name, f in FIELDS.items():
        value = getattr(cfg, name)
        if not (f.metadata["registry"] and isinstance(value, str) and is_dotted(value)):
            continue
        top = value.partition(":")[0].split(".")[0]
        spec = importlib.util.find_spec(top)
        if spec is None or top == "perfed_ray":
            continue
        path = (spec.submodule_search_locations[0] if spec.submodule_search_locations
                else spec.origin)
        if path and not any(p in Path(path).parts for p in ("site-packages", "dist-packages")):
            paths.append(str(path))
    return sorted(set(paths))


def actor_env(cfg: RunConfig) -> dict[str, object]:
    """The actors' runtime_env: the job's modules (this package, on a cluster) plus the
    user's own, which an actor-level `py_modules` would otherwise replace; and an
    armed fault (:mod:`perfed_ray.faults`)."""
    env: dict[str, object] = dict(faults.actor_env())
    plugins = plugin_modules(cfg)
    if plugins:
        job = ray.get_runtime_context().runtime_env.get("py_modules") or []
        env["py_modules"] = [*job, *plugins]
    return env
