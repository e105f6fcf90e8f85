"""All of an actor's users in one `torch.func.vmap` pass: any model, any algorithm.

Users are to it what tasks are to functorch's MAML example
(``examples/maml_omniglot/maml-omniglot-transforms.py``), which maps one task's inner
loop over a batch of tasks with `vmap`: here one user's update over the users."""

from __future__ import annotations

from torch.func import vmap

from perfed_ray.algorithms.base import client_update
from perfed_ray.engines.base import Engine, Result, active_steps, steps_of
from perfed_ray.engines.functional import FunctionalOps


class Vmap(Engine):
    def run(self, server, x, y, states, steps=None, masks=None) -> Result:
        ops = FunctionalOps(self.model)
        active = None if steps is None else active_steps(steps, x.shape[1])

        def one(xu, yu, state, on, mu):
            batches = steps_of(xu, yu, masks=mu)
            return client_update(self.algorithm, ops, server, batches, state, active=on)

        def axis(value):  # None stays None: stateless methods, equal steps, no dropout
            return None if value is None else 0

        in_dims = (0, 0, axis(states), axis(active), axis(masks))
        return vmap(one, in_dims=in_dims, out_dims=(0, 0, axis(states)))(
            x, y, states, active, masks
        )
