"""Users' parameters stacked along a leading axis and every layer computed for all of
them at once (:mod:`perfed_ray.engines.stacked`), in blocks (:func:`block_size`),
optionally with each local step under `torch.compile`.

On a CPU, blocks of 10 to 20 users are enough: past that the stacked weights fall out
of cache and the time per user grows. On a GPU a block's cost is its kernel launches,
a few hundred a round whatever its size, so a block holds as many users as fit in
`GPU_BLOCK_BYTES` of stacked weights: blocks of 16 launch kernels for 63 blocks to run
1000 users, and hold a GPU to 6,600 user-steps a second of HF.

Compiled, the step (not the whole round: one step compiles in seconds where tau
unrolled steps take minutes) becomes one graph for every block size once the user axis
turns dynamic at the first size change, and the compiled kernels are kept in one cache
folder that every actor of the machine reuses (:func:`compile_cache`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from perfed_ray.algorithms.base import client_update
from perfed_ray.engines.base import Engine, Result, active_steps, per_user_copies, steps_of
from perfed_ray.engines.stacked import StackedOps, chain_of
from perfed_ray.masks import index

BLOCK = 16  # users a block on a CPU
GPU_BLOCK_BYTES = 2**30  # a block's stacked copy of the model, at most, on a GPU
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def block_size(params: list[torch.Tensor]) -> int:
    """Users a block for a model of these parameters: BLOCK on a CPU; on a GPU as many
    as GPU_BLOCK_BYTES of stacked weights hold (a block holds a few such copies:
    weights, gradients, perturbed weights), BLOCK at least."""
    if params[0].device.type == "cpu":
        return BLOCK
    per_user = sum(p.numel() * p.element_size() for p in params)
    return max(BLOCK, GPU_BLOCK_BYTES // per_user)


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
        self.block_users = block_size(list(model.parameters()))  # the model's device's
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

    def block(self, server, x, y, states, steps, masks=None) -> Result:
        """One block; with `steps`, only as many of the T steps as its busiest user takes
        (users sorted by their steps make blocks of like users), the rest masked."""
        n = len(x)
        stacked = per_user_copies(server, n)
        active = None
        if steps is not None:
            longest = int(steps.max())
            x, y, active = x[:, :longest], y[:, :longest], active_steps(steps, longest).T
            masks = index(masks, (slice(None), slice(longest)))
        batches = steps_of(x, y, axis=1, masks=masks)
        return client_update(self.algorithm, self.ops, stacked, batches, states, self.step, active)

    def run(self, server, x, y, states, steps=None, masks=None) -> Result:
        parts, size = [], self.block_users
        for start in range(0, len(x), size):
            cut = slice(start, start + size)
            block_states = (
                None
                if states is None
                else torch.utils._pytree.tree_map(lambda s, c=cut: s[c], states)
            )
            block_steps = None if steps is None else steps[cut]
            parts.append(
                self.block(server, x[cut], y[cut], block_states, block_steps, index(masks, cut))
            )
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
