"""Server optimisers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021): the
server treats ``Delta = target - w``, the move from its model w to the users' aggregate
(after the method's own server rule, e.g. pFedMe's mixing), as a negative gradient and
takes a step of its own optimiser along it. `mean` takes the whole move: Algorithm 1.

They work on the flat float vectors the coordinator holds (numpy, float64 state), on
the driver; their state is saved with every checkpoint, so a resumed run continues
with exactly the moments it stopped with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from perfed_ray.settings import Setting

if TYPE_CHECKING:
    from perfed_ray.config import RunConfig

State = dict[str, np.ndarray]


class ServerOptimizer:
    """``(w, target, state) -> (w', state')``. Subclass it and name the class in the
    configuration (`server_optimizer: mypkg.opt:Mine`) to use your own; its `settings`
    become the section of that name."""

    settings: ClassVar[dict[str, Setting]] = {}

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.options: dict[str, Any] = cfg.settings_of("server_optimizer")

    def init(self, weights: np.ndarray) -> State:
        """The state before the first round ({} for a stateless rule)."""
        return {}

    def step(
        self, weights: np.ndarray, target: np.ndarray, state: State
    ) -> tuple[np.ndarray, State]:
        raise NotImplementedError


class Mean(ServerOptimizer):
    """Algorithm 1: the next model is the target itself."""

    def step(self, weights, target, state):
        return target, state
