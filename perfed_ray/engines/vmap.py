"""All of an actor's users in one `torch.func.vmap` pass: any model, any algorithm."""

from __future__ import annotations

from torch.func import vmap

from perfed_ray.algorithms.base import client_update
from perfed_ray.engines.base import Engine, Result, active_steps, steps_of
from perfed_ray.engines.functional import FunctionalOps


class Vmap(Engine):
    def run(self, server, x, y, states, steps=None) -> Result:
        ops = FunctionalOps(self.model)
        active = None if steps is None else active_steps(steps, x.shape[1])

        def one(xu, yu, state, on):
            return client_update(self.algorithm, ops, server, steps_of(xu, yu), state, active=on)

        state_dim = None if states is None else 0  # stateless methods keep None
        active_dim = None if active is None else 0
        return vmap(one, in_dims=(0, 0, state_dim, active_dim), out_dims=(0, 0, state_dim))(
            x, y, states, active
        )
