"""The server's maths on the flat vectors that travel: the users' aggregate becomes the
next global model through the algorithm's `server_update` (Algorithm 1: the aggregate
itself; pFedMe mixes it with the old model, for instance)."""

from __future__ import annotations

import numpy as np

from perfed_ray.algorithms.tree import Params
from perfed_ray.config import RunConfig
from perfed_ray.models import FlatParams
from perfed_ray.registry import ALGORITHMS


class Server:
    def __init__(self, cfg: RunConfig, template: Params) -> None:
        self.algorithm = ALGORITHMS.load(cfg.algorithm)(cfg)
        self.layout = FlatParams(template)
        # Whether users keep per-user state: checkpoints then fetch it, and a dead actor
        # means a roll-back rather than a replacement.
        self.stateful = self.algorithm.init_user_state(template) is not None

    def next_model(self, weights: np.ndarray, total: np.ndarray, weight_sum: float) -> np.ndarray:
        """w_{k+1} from w_k and the weighted sum of the reporting users' models."""
        aggregate = (total / weight_sum).astype(np.float32)
        new = self.algorithm.server_update(
            self.layout.unflatten(weights), self.layout.unflatten(aggregate)
        )
        return self.layout.flatten(new)
