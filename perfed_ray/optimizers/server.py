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


class FedAvgM(ServerOptimizer):
    """Server momentum (Hsu, Qi, Brown 2019): v <- mu v + Delta, w <- w + eta v; with
    mu = 0 and eta = 1 it is `mean`."""

    settings: ClassVar[dict[str, Setting]] = {
        "lr": Setting(1.0, "the server's step size eta", low=0, low_open=True),
        "momentum": Setting(0.9, "the server's momentum mu", low=0, high=1),
    }

    def init(self, weights):
        return {"velocity": np.zeros(weights.shape, np.float64)}

    def step(self, weights, target, state):
        velocity = self.options["momentum"] * state["velocity"] + (target - weights)
        return weights + self.options["lr"] * velocity, {"velocity": velocity}


class Adaptive(ServerOptimizer):
    """Reddi et al. 2021, Algorithm 2: m <- beta1 m + (1 - beta1) Delta, v by the rule
    of each variant, w <- w + eta m / (sqrt(v) + tau); m starts at 0 and v at tau^2 (the
    paper's v_{-1} >= tau^2). No bias correction, as in the paper."""

    settings: ClassVar[dict[str, Setting]] = {
        "lr": Setting(0.01, "the server's step size eta", low=0, low_open=True),
        "beta1": Setting(0.9, "the first moment's decay beta1", low=0, high=1),
        "beta2": Setting(0.99, "the second moment's decay beta2", low=0, high=1),
        "tau": Setting(0.001, "the adaptivity tau (the paper's default)", low=0, low_open=True),
    }

    def second_moment(self, v: np.ndarray, square: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def init(self, weights):
        tau = self.options["tau"]
        return {
            "m": np.zeros(weights.shape, np.float64),
            "v": np.full(weights.shape, tau * tau, np.float64),
        }

    def step(self, weights, target, state):
        o = self.options
        delta = target.astype(np.float64) - weights
        m = o["beta1"] * state["m"] + (1 - o["beta1"]) * delta
        v = self.second_moment(state["v"], delta * delta)
        return weights + o["lr"] * m / (np.sqrt(v) + o["tau"]), {"m": m, "v": v}


class FedAdagrad(Adaptive):
    """v <- v + Delta^2."""

    def second_moment(self, v, square):
        return v + square


class FedYogi(Adaptive):
    """v <- v - (1 - beta2) Delta^2 sign(v - Delta^2)."""

    def second_moment(self, v, square):
        return v - (1 - self.options["beta2"]) * square * np.sign(v - square)


class FedAdam(Adaptive):
    """v <- beta2 v + (1 - beta2) Delta^2."""

    def second_moment(self, v, square):
        beta2 = self.options["beta2"]
        return beta2 * v + (1 - beta2) * square
