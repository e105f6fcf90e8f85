"""The Ray actor that hosts users: their shards stay here for the whole run.

Only weights (in) and a sum of weights, losses and scores (out) cross the
actor's boundary; the maths is the :class:`~perfed_ray.learner.LocalLearner`'s.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np
import ray
import torch

from perfed_ray import faults
from perfed_ray.config import RunConfig
from perfed_ray.data import DataArrays, ShardSource
from perfed_ray.learner import LocalLearner
from perfed_ray.models import FlatParams, build_model, params_of


@dataclass(frozen=True)
class UpdateSum:
    """An actor's part of a round: the sum of its users' new weights (float64, so the
    server's total does not depend on the order in which actors answer) and how many
    users it holds; per-user weights only when asked for."""

    total: np.ndarray
    count: int
    loss_sum: float
    per_user: dict[int, np.ndarray] | None = None


def peak_memory_bytes() -> int:
    """This process's peak resident memory (Linux VmHWM), 0 where unknown."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@ray.remote
class UserActor:
    """Hosts the shards of a block of users and runs their local work on its device.

    `actor` and `incarnation` name it in the run's records (a replacement for a dead
    actor is the next incarnation of the same actor)."""

    def __init__(self, cfg: RunConfig, users: list[int], source: ShardSource,
                 data: DataArrays | None, num_cpus: float, num_gpus: float,
                 actor: int = 0, incarnation: int = 0) -> None:
        self.actor, self.incarnation = actor, incarnation
        torch.set_num_threads(max(1, int(num_cpus)))
        use_gpu = num_gpus > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_gpu else "cpu")
        self.shards = source.shards(users, self.device, data)
        model = build_model(cfg.model, source.input_shape, source.n_classes).to(self.device)
        self.flat = FlatParams(params_of(model))
        self.learner = LocalLearner(cfg, model)
        self.batch_users = cfg.batch_users

    def describe(self) -> dict[str, object]:
        """Where this actor runs and its peak memory (also: it is ready)."""
        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "device": str(self.device),
                "gpu_ids": [str(g) for g in context.get_accelerator_ids().get("GPU", [])],
                "peak_memory_bytes": peak_memory_bytes()}

    def train(self, weights: np.ndarray, users: list[int], round_: int,
              per_user: bool = False) -> UpdateSum:
        """Local updates of the given users from the global weights, summed."""
        if self.actor == 0:
            faults.crash_at("actor-always", round_)
            if self.incarnation == 0:
                faults.crash_at("actor", round_)
        start = self.flat.unflatten(weights, self.device)  # rules never modify it in place
        shards = [self.shards[u] for u in users]
        if self.batch_users and len(users) > 1:
            stacked, losses = self.learner.train_many(start, shards, round_)
            updated = [{k: v[i] for k, v in stacked.items()} for i in range(len(users))]
            loss_sum = float(losses.sum())
        else:
            results = [self.learner.train(start, shard, round_) for shard in shards]
            updated = [params for params, _ in results]
            loss_sum = sum(loss for _, loss in results)
        # The sum is taken in float64 in user order, one leaf at a time, before flattening.
        total = self.flat.flatten({k: torch.stack([p[k].double() for p in updated]).sum(0)
                                   for k in start})
        per = ({u: self.flat.flatten(p) for u, p in zip(users, updated, strict=True)}
               if per_user else None)
        return UpdateSum(total, len(users), loss_sum, per)

    def evaluate(self, weights: np.ndarray, round_: int, draws: int) -> list[dict]:
        """Every hosted user's personalised scores for the global weights."""
        params = self.flat.unflatten(weights, self.device)
        return [dataclasses.asdict(row) for user in sorted(self.shards)
                for row in self.learner.evaluate(params, self.shards[user], round_, draws)]
