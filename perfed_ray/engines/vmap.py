"""All of an actor's users in one `torch.func.vmap` pass: any model, any algorithm."""

from __future__ import annotations

from torch.func import vmap

from perfed_ray.algorithms.base import client_update
from perfed_ray.engines.base import Engine, Result, steps_of
from perfed_ray.engines.functional import FunctionalOps


class Vmap(Engine):
    def run(self, server, x, y, states) -> Result:
        ops = FunctionalOps(self.model)

        def one(xu, yu, state):
            return client_update(self.algorithm, ops, server, steps_of(xu, yu), state)

        state_dim = None if states is None else 0  # stateless methods keep None
        return vmap(one, in_dims=(0, 0, state_dim), out_dims=(0, 0, state_dim))(x, y, states)
