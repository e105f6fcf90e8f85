"""Federated algorithms as values (pure PyTorch, no Ray): the interface and the
built-in methods, each in its own module and written exactly as a user's plug-in
would be. Names are registered in :data:`perfed_ray.registry.ALGORITHMS`."""

from perfed_ray.algorithms.base import (
    Algorithm,
    Batch,
    ModelOps,
    client_update,
    keeps_user_state,
    make_algorithm,
)
from perfed_ray.algorithms.tree import Params, axpy, sgd, tree_map

__all__ = [
    "Algorithm",
    "Batch",
    "ModelOps",
    "Params",
    "axpy",
    "client_update",
    "keeps_user_state",
    "make_algorithm",
    "sgd",
    "tree_map",
]
