"""Engines: how the users an actor runs in a round are executed (sequential, vmap,
fused, grouped), the only place that knows how users' work is batched or compiled. Names are
registered in :data:`perfed_ray.registry.ENGINES`."""

from __future__ import annotations

import sys

from torch import nn

from perfed_ray.algorithms.base import Algorithm
from perfed_ray.engines.base import Engine
from perfed_ray.engines.grouped import grouped_chain
from perfed_ray.engines.stacked import chain_of
from perfed_ray.registry import ENGINES


def default_engine(model: nn.Module) -> str:
    """An engine left unresolved (a Learner built by hand, with no run to measure it in):
    fused where the model allows it, else vmap. A run resolves `auto` by measurement
    instead (:mod:`perfed_ray.engines.auto`)."""
    return "fused" if chain_of(model) is not None else "vmap"


# Engines that run only the models declaring a structure: name -> (its test, the declaration).
STRUCTURED = {"fused": (chain_of, "fused_layers"), "grouped": (grouped_chain, "grouped_layers")}


def make_engine(name: str | None, algorithm: Algorithm, model: nn.Module, compile: bool) -> Engine:
    """The engine a configuration names (None: auto). A model that `fused` or `grouped`
    cannot run falls back to `vmap`, with a one-line notice."""
    name = name or default_engine(model)
    if name in STRUCTURED and STRUCTURED[name][0](model) is None:
        print(
            f"perfed-ray: model {type(model).__name__} declares no usable "
            f"{STRUCTURED[name][1]}(); engine {name} falls back to vmap",
            file=sys.stderr,
        )
        name = "vmap"
    return ENGINES.load(name)(algorithm, model, compile)


__all__ = ["Engine", "default_engine", "make_engine"]
