"""A user's own server optimiser, written outside the package as any plug-in would be:
the global model moves a share of the way to the users' aggregate, and the optimiser
counts its rounds in its state (saved with every checkpoint like FedAdam's moments)."""

from typing import ClassVar

import numpy as np

from perfed_ray.config.settings import Setting
from perfed_ray.optimizers.server import ServerOptimizer


class Halfway(ServerOptimizer):
    settings: ClassVar[dict[str, Setting]] = {
        "share": Setting(0.5, "share of the way to the aggregate moved each round", low=0, high=1)
    }

    def init(self, weights):
        return {"rounds": np.zeros(1)}

    def step(self, weights, target, state):
        moved = weights + self.options["share"] * (target - weights)
        return moved, {"rounds": state["rounds"] + 1}
