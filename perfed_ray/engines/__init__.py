"""Engines: how the users an actor runs in a round are executed (sequential, vmap,
fused), the only place that knows how users' work is batched or compiled. Names are
registered in :data:`perfed_ray.registry.ENGINES`."""

from __future__ import annotations

import sys

from torch import nn

from perfed_ray.algorithms.base import Algorithm
from perfed_ray.engines.base import Engine
from perfed_ray.engines.stacked import chain_of
from perfed_ray.registry import ENGINES


def default_engine(model: nn.Module) -> str:
    """`engine: auto`: fused where the model allows it, else vmap."""
    return "fused" if chain_of(model) is not None else "vmap"


def make_engine(name: str | None, algorithm: Algorithm, model: nn.Module, compile: bool) -> Engine:
    """The engine a configuration names (None: auto). A model that `fused` cannot run
    falls back to `vmap`, with a one-line notice."""
    name = name or default_engine(model)
    if name == "fused" and chain_of(model) is None:
        print(
            f"perfed-ray: model {type(model).__name__} is not a chain of Linear and ELU "
            f"layers (it declares no fused_layers()); engine fused falls back to vmap",
            file=sys.stderr,
        )
        name = "vmap"
    return ENGINES.load(name)(algorithm, model, compile)


__all__ = ["Engine", "default_engine", "make_engine"]
