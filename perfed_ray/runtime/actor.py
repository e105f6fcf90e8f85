"""The Ray actor that hosts users: their shards stay here for the whole run.

Only weights (in) and weights, losses and scores (out) cross the actor's
boundary; the maths is the :class:`~perfed_ray.learner.LocalLearner`'s.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import ray
import torch

from perfed_ray.config import RunConfig
from perfed_ray.data import DataArrays, UserIndices, load_dataset, materialise
from perfed_ray.learner import LocalLearner
from perfed_ray.models import FlatParams, build_model, params_of


@ray.remote
class UserActor:
    """Hosts the shards of a block of users and runs their local work on its device."""

    def __init__(self, cfg: RunConfig, users: list[UserIndices], data: DataArrays | None,
                 num_cpus: float, num_gpus: float) -> None:
        torch.set_num_threads(max(1, int(num_cpus)))
        use_gpu = num_gpus > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_gpu else "cpu")
        if data is None:  # data_transport: data_root, the actor reads the files itself
            data = load_dataset(cfg.dataset, cfg.data_root, cfg.download, cfg.seed)
        self.shards = {idx.user: materialise(data, idx, self.device) for idx in users}
        model = build_model(cfg.model, data.input_shape, data.n_classes).to(self.device)
        self.flat = FlatParams(params_of(model))
        self.learner = LocalLearner(cfg, model)

    def describe(self) -> dict[str, object]:
        """Where this actor runs and what it holds (also tells the driver it is ready)."""
        return {"device": str(self.device), "users": sorted(self.shards),
                "node": ray.get_runtime_context().get_node_id()}

    def train(self, weights: np.ndarray, users: list[int],
              round_: int) -> list[tuple[int, np.ndarray, float]]:
        """Local updates of the given users from the global weights: (user, weights, loss)."""
        start = self.flat.unflatten(weights, self.device)  # rules never modify it in place
        out = []
        for user in users:
            params, loss = self.learner.train(start, self.shards[user], round_)
            out.append((user, self.flat.flatten(params), loss))
        return out

    def evaluate(self, weights: np.ndarray, round_: int, draws: int) -> list[dict]:
        """Every hosted user's personalised scores for the global weights."""
        params = self.flat.unflatten(weights, self.device)
        return [dataclasses.asdict(row) for user in sorted(self.shards)
                for row in self.learner.evaluate(params, self.shards[user], round_, draws)]
