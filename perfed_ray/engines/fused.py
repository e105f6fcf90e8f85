"""Users' parameters stacked along a leading axis and every layer computed for all of
them at once (:mod:`perfed_ray.engines.stacked`), in blocks of at most `BLOCK` users,
optionally with each local step under `torch.compile`.

Blocks of 10 to 20 users are enough: past that the stacked weights fall out of cache
and the time per user grows. Compiled, the step (not the whole round: one step
compiles in seconds where tau unrolled steps take minutes) becomes one graph for every
block size once the user axis turns dynamic at the first size change, and the
compiled kernels are kept in one cache folder that every actor of the machine reuses
(:func:`compile_cache`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from perfed_ray.algorithms.base import client_update
from perfed_ray.engines.base import Engine, Result, active_steps, per_user_copies, steps_of
from perfed_ray.engines.stacked import StackedOps, chain_of

BLOCK = 16
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def compile_cache() -> Path:
    """Where compiled kernels are kept: $TORCHINDUCTOR_CACHE_DIR, else a folder under
    the user's cache that outlives /tmp clean-ups, shared by every actor on the node."""
    folder = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache/perfed-ray/inductor")
    os.environ[CACHE_ENV] = str(folder)
    return folder


class Fused(Engine):
    def __init__(self, algorithm, model, compile: bool = False) -> None:
        super().__init__(algorithm, model, compile)
        self.ops = self.stacked_ops(model)
        self.step = None
        if compile:
            compile_cache()
            self.step = torch.compile(algorithm.client_step)

    @staticmethod
    def stacked_ops(model):
        """The model's maths for users stacked along axis 0."""
        layers = chain_of(model)
        if layers is None:
            raise ValueError(f"{type(model).__name__} declares no fused_layers()")
        return StackedOps(layers)

    def block(self, server, x, y, states, steps) -> Result:
        """One block; with `steps`, only as many of the T steps as its busiest user takes
        (users sorted by their steps make blocks of like users), the rest masked."""
        n = len(x)
        stacked = per_user_copies(server, n)
        active = None
        if steps is not None:
            longest = int(steps.max())
            x, y, active = x[:, :longest], y[:, :longest], active_steps(steps, longest).T
        return client_update(
            self.algorithm, self.ops, stacked, steps_of(x, y, axis=1), states, self.step, active
        )

    def run(self, server, x, y, states, steps=None) -> Result:
        parts = []
        for start in range(0, len(x), BLOCK):
            cut = slice(start, start + BLOCK)
            block_states = (
                None
                if states is None
                else torch.utils._pytree.tree_map(lambda s, c=cut: s[c], states)
            )
            block_steps = None if steps is None else steps[cut]
            parts.append(self.block(server, x[cut], y[cut], block_states, block_steps))
        if len(parts) == 1:
            return parts[0]
        models, losses, new_states = zip(*parts, strict=True)
        return (
            torch.utils._pytree.tree_map(lambda *p: torch.cat(p), *models),
            torch.cat(losses),
            None
            if new_states[0] is None
            else torch.utils._pytree.tree_map(lambda *p: torch.cat(p), *new_states),
        )
