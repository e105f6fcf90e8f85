"""perfed-ray: a Ray simulator for personalised federated learning (Per-FedAvg, FedAvg,
and methods of your own). `simulate` runs one simulation from Python.

The API (and pandas with it) is imported when first asked for, not with the package:
every actor imports this package, and its start-up should not pay for the driver's
tables (about 0.3 s a process)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# First, so that its exit hook is registered before any other and runs after them all.
from perfed_ray import exiting  # noqa: F401
from perfed_ray.version import __version__

__all__ = ["RunResult", "__version__", "simulate"]

if TYPE_CHECKING:
    from perfed_ray.api import RunResult, simulate


def __getattr__(name: str) -> Any:
    if name in ("RunResult", "simulate"):
        from perfed_ray import api

        return getattr(api, name)
    raise AttributeError(f"module 'perfed_ray' has no attribute {name!r}")
