"""One user after another: the readable reference every other engine is tested against."""

from __future__ import annotations

import torch

from perfed_ray.algorithms.base import client_update
from perfed_ray.engines.base import Engine, Result, stack, steps_of, unstack
from perfed_ray.engines.functional import FunctionalOps
from perfed_ray.masks import index


class Sequential(Engine):
    """Each user's own steps alone: the reference that the batched engines, which mask
    the steps a user does not take, are tested against. Its users' plain tensors take
    ordinary autograd (:class:`FunctionalOps`), as a plain training loop does."""

    one_at_a_time = True

    def __init__(self, algorithm, model, compile: bool = False) -> None:
        super().__init__(algorithm, model, compile)
        self.functional = FunctionalOps(model)

    def run(self, server, x, y, states, steps=None, masks=None) -> Result:
        ops = self.functional
        results = []
        for u, state in enumerate(unstack(states, len(x))):
            mine = x.shape[1] if steps is None else int(steps[u])
            counts = None if steps is None else torch.tensor(mine)
            batches = steps_of(x[u, :mine], y[u, :mine], masks=index(masks, (u, slice(mine))))
            results.append(
                client_update(self.algorithm, ops, server, batches, state, counts=counts)
            )
        models, losses, new_states = zip(*results, strict=True)
        return stack(models), torch.stack(losses), stack(new_states)
