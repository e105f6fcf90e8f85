"""The server's maths on the flat vectors that travel: the users' aggregate becomes a
target through the algorithm's `server_update` (Algorithm 1: the aggregate itself;
pFedMe mixes it with the old model, for instance), and the server optimiser moves the
global model towards it (`mean`: all the way; FedAdam and the others: a step of their
own along the move, with state)."""

from __future__ import annotations

import numpy as np

from perfed_ray.algorithms.base import Algorithm
from perfed_ray.algorithms.tree import Params
from perfed_ray.config import RunConfig
from perfed_ray.models import FlatParams
from perfed_ray.optimizers.server import State
from perfed_ray.registry import ALGORITHMS, SERVER_OPTIMIZERS


def keeps_user_state(algorithm: Algorithm, template: Params) -> bool:
    """Whether the method's users keep per-user state on their actor: checkpoints then
    fetch it, a dead actor means a roll-back rather than a replacement, and a user
    trained on another actor (balanced rounds) takes its state there and back."""
    return algorithm.init_user_state(template) is not None


class Server:
    def __init__(self, cfg: RunConfig, template: Params) -> None:
        self.algorithm = ALGORITHMS.load(cfg.algorithm)(cfg)
        self.optimizer = SERVER_OPTIMIZERS.load(cfg.server_optimizer)(cfg)
        self.layout = FlatParams(template)
        self.state: State = self.optimizer.init(self.layout.flatten(template))
        self.stateful = keeps_user_state(self.algorithm, template)
        self.keeps_aggregate = type(self.algorithm).server_update is Algorithm.server_update
        self.fixed = self.algorithm.fixed_server  # w_0 for good: rounds may go in spans

    def next_model(self, weights: np.ndarray, total: np.ndarray, weight_sum: float) -> np.ndarray:
        """w_{k+1} from w_k and the weighted sum of the reporting users' models."""
        aggregate = (total / weight_sum).astype(np.float32)
        if self.keeps_aggregate:  # Algorithm 1's: no trip through the parameter tree
            target = aggregate
        else:
            target = self.layout.flatten(
                self.algorithm.server_update(
                    self.layout.unflatten(weights), self.layout.unflatten(aggregate)
                )
            )
        new, self.state = self.optimizer.step(weights, target, self.state)
        return np.asarray(new, dtype=np.float32)
