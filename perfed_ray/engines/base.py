"""The one seam that decides how users' local work is executed (FedJAX's
`for_each_client`): given an algorithm, the server's model and the batches of the
users an actor runs in a round, an engine returns every user's model, mean training
loss and next state, stacked along a leading user axis.

Engines run on the device they are given (CPU or a GPU share), so the same code is
the GPU path; they know nothing about Ray, and algorithms know nothing about them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils import _pytree as pytree

from perfed_ray.algorithms.base import Algorithm, Batch, ModelOps
from perfed_ray.algorithms.tree import Params
from perfed_ray.masks import Masks, index, keyed

Result = tuple[Params, torch.Tensor, Params | None]  # models [U, ...], losses [U], states


def steps_of(
    x: torch.Tensor, y: torch.Tensor, axis: int = 0, masks: Masks | None = None
) -> list[list[Batch]]:
    """Per local step, its batches: x is [..., tau, batches_per_step, B, ...] with tau at
    `axis` (0 for one user, 1 for users stacked in front); a batch carries its dropout
    masks, laid out as x, where the model has dropout sites."""
    pick = (slice(None),) * axis

    def batch(t: int, j: int) -> Batch:
        where = (*pick, t, j)
        return (x[where], y[where]) if masks is None else (x[where], y[where], index(masks, where))

    return [[batch(t, j) for j in range(x.shape[axis + 1])] for t in range(x.shape[axis])]


def one_by_one(fn: Callable, in_dims: tuple[int | None, ...]) -> Callable:
    """``torch.func.vmap(fn, in_dims)``'s contract (arguments mapped along axis 0 where
    their dim is 0, results stacked), met one user after another: for an engine whose
    users' work runs so, evaluation takes the path its training takes, ordinary autograd
    and its model's own layout, where vmap's wrappers would keep `torch.func`'s."""

    def mapped(*args):
        n = next(
            len(pytree.tree_leaves(a)[0]) for a, d in zip(args, in_dims, strict=True) if d == 0
        )
        results = [
            fn(
                *(
                    a if d is None else pytree.tree_map(lambda t, i=i: t[i], a)
                    for a, d in zip(args, in_dims, strict=True)
                )
            )
            for i in range(n)
        ]
        return pytree.tree_map(lambda *parts: torch.stack(parts), *results)

    return mapped


def per_user_copies(server: Params, n: int) -> Params:
    """The server's model once for each of a block's n users, stacked along a new axis 0
    (copied, not broadcast: a step writes each user's own)."""
    return {k: v.expand(n, *v.shape).contiguous() for k, v in server.items()}


def stack(trees: Sequence[Params | None]) -> Params | None:
    """Per-user trees stacked along a new leading axis (None for stateless users)."""
    if trees[0] is None:
        return None
    return pytree.tree_map(lambda *leaves: torch.stack(leaves), *trees)


def unstack(tree: Params | None, n: int) -> list[Params | None]:
    """The inverse of :func:`stack`."""
    if tree is None:
        return [None] * n
    return [pytree.tree_map(lambda leaf, i=i: leaf[i], tree) for i in range(n)]


class Engine:
    """Runs one round of local work for the users an actor was sent.

    `ops` is the engine's own :class:`~perfed_ray.algorithms.base.ModelOps` for users
    stacked along axis 0, where it has one (fused, grouped): evaluation then personalises
    and scores a block of users with the same maths as training. None: the model's maths
    by autodiff, one user at a time under ``vmap``."""

    ops: ModelOps | None = None
    # Whether its users' work runs one after another: evaluation then does the same
    # (:func:`one_by_one`) instead of mapping them under ``vmap``.
    one_at_a_time: bool = False

    def __init__(self, algorithm: Algorithm, model: nn.Module, compile: bool = False) -> None:
        self.algorithm = algorithm
        self.model = model
        keyed(model)  # its dropout, if any, from keyed masks only

    def run(
        self,
        server: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        states: Params | None,
        steps: torch.Tensor | None = None,
        masks: Masks | None = None,
    ) -> Result:
        """x [U, T, batches_per_step, B, ...], y likewise; `states` stacked [U, ...];
        `steps` [U], the local steps each user takes (the first of the T; all T when
        None): users of different sizes under `local_epochs`; `masks` the dropout masks
        of every sample, laid out as x (:mod:`perfed_ray.masks`)."""
        raise NotImplementedError


def active_steps(steps: torch.Tensor, total: int) -> torch.Tensor:
    """[U, total] bool: step t is one of user u's own."""
    return torch.arange(total, device=steps.device)[None, :] < steps[:, None]
