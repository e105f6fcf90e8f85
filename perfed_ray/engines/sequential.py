"""One user after another: the readable reference every other engine is tested against."""

from __future__ import annotations

import torch

from perfed_ray.algorithms.base import client_update
from perfed_ray.engines.base import Engine, Result, stack, steps_of, unstack
from perfed_ray.engines.functional import FunctionalOps


class Sequential(Engine):
    def run(self, server, x, y, states) -> Result:
        ops = FunctionalOps(self.model)
        results = [
            client_update(self.algorithm, ops, server, steps_of(x[u], y[u]), state)
            for u, state in enumerate(unstack(states, len(x)))
        ]
        models, losses, new_states = zip(*results, strict=True)
        return stack(models), torch.stack(losses), stack(new_states)
