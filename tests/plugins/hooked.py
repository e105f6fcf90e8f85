"""A user's own strategy, written outside the package as any plug-in would be: each
reporting user's update is clipped to a norm bound on its actor, a known vector is
added to the aggregate on the driver, and the strategy counts its rounds in its own
part of the server state (saved with every checkpoint)."""

import dataclasses

import numpy as np
import torch

from perfed_ray.postprocess import UserPostprocessor
from perfed_ray.strategy import Strategy

BOUND = 0.05  # the largest norm a user's update keeps
SHIFT = 0.01  # the aggregate moves by SHIFT * shift(n)


def shift(n: int) -> np.ndarray:
    """The known vector added to the aggregate."""
    return SHIFT * np.linspace(-1.0, 1.0, n, dtype=np.float32)


class Clip(UserPostprocessor):
    """Each user's update scaled down to norm `bound` where it is longer."""

    def __init__(self, bound: float) -> None:
        self.bound = bound

    def __call__(self, server, models, users):
        updates = {k: v - server[k] for k, v in models.items()}
        norms = sum(u.flatten(1).pow(2).sum(1) for u in updates.values()).sqrt()
        scale = torch.clamp(self.bound / norms.clamp_min(1e-12), max=1.0)
        return {k: server[k] + u * scale.view(-1, *[1] * (u.dim() - 1)) for k, u in updates.items()}


class Hooked(Strategy):
    def init(self, template):
        return dataclasses.replace(super().init(template), extra={"rounds": np.zeros(1)})

    def aggregate(self, round_, state, total, weight, stats=None):
        new = super().aggregate(round_, state, total, weight, stats)
        return dataclasses.replace(new, extra={"rounds": state.extra["rounds"] + 1})

    def user_steps(self, round_, state):
        return [Clip(BOUND)]

    def postprocess_aggregate(self, round_, state, aggregate):
        return aggregate + shift(aggregate.size)
