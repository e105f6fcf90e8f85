"""Server optimisers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021): the
server treats ``Delta = target - w``, the move from its model w to the users' aggregate
(after the method's own server rule, e.g. pFedMe's mixing), as a negative gradient and
takes a step of its own optimiser along it. `mean` takes the whole move: Algorithm 1.

They work on the flat float vectors the coordinator holds (numpy, float64 state), on
the driver; their state is saved with every checkpoint, so a resumed run continues
with exactly the moments it stopped with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from perfed_ray.config.owners import HParams
from perfed_ray.config.schema import RunConfig
from perfed_ray.config.settings import Setting

State = dict[str, np.ndarray]


@dataclass(frozen=True, kw_only=True)
class ServerOptimizerHParams(HParams):
    """What a server optimiser reads of a run: its own section alone; the move it steps
    along is given at every round."""

    key: ClassVar[str] = "server_optimizer"


class ServerOptimizer:
    """``(w, target, state) -> (w', state')``. Subclass it and name the class in the
    configuration (`server_optimizer: mypkg.opt:Mine`) to use your own; its `settings`
    become the section of that name, which it reads as `self.options`."""

    settings: ClassVar[dict[str, Setting]] = {}
    HParams: ClassVar[type[ServerOptimizerHParams]] = ServerOptimizerHParams

    def __init__(self, hparams: ServerOptimizerHParams | RunConfig) -> None:
        self.hparams = self.HParams.given(hparams)
        self.options: dict[str, Any] = self.hparams.section

    def init(self, weights: np.ndarray) -> State:
        """The state before the first round ({} for a stateless rule)."""
        return {}

    def step(
        self, weights: np.ndarray, target: np.ndarray, state: State
    ) -> tuple[np.ndarray, State]:
        raise NotImplementedError


def pseudo_gradient(weights: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Delta = target - w in float64: Algorithm 2's Delta_t, the users' mean move."""
    return target.astype(np.float64) - weights.astype(np.float64)


class Mean(ServerOptimizer):
    """Algorithm 1: the next model is the target itself."""

    def step(self, weights, target, state):
        return target, state


class FedAvgM(ServerOptimizer):
    """Server momentum (Hsu, Qi, Brown, "Measuring the Effects of Non-Identical Data
    Distribution for Federated Visual Classification", 2019, Section 3):
    the velocity ``v <- mu v + Delta``, ``w <- w + lr v`` with v = 0 before the first
    round, so that v_1 = Delta_1. Hsu et al.'s ``v <- beta v + Delta w; w <- w - v`` is
    this with lr = 1 (their Delta w is -Delta). Momentum 0.9 is Reddi et al.'s FedAvgM
    (`--server_sgd_momentum=0.9` in their code's README); lr = 1 and momentum 0 is
    `mean`."""

    settings: ClassVar[dict[str, Setting]] = {
        "lr": Setting(1.0, "server learning rate (1: Hsu et al.'s)", low=0, low_open=True),
        "momentum": Setting(0.9, "server momentum mu", low=0, high=1),
    }

    def init(self, weights):
        return {"velocity": np.zeros(weights.shape, np.float64)}

    def step(self, weights, target, state):
        velocity = self.options["momentum"] * state["velocity"] + pseudo_gradient(weights, target)
        return weights + self.options["lr"] * velocity, {"velocity": velocity}


def _adaptive_settings(lr: float, beta2: bool) -> dict[str, Setting]:
    """Algorithm 2's hyper-parameters (eta, beta_1, beta_2, tau) with their defaults."""
    settings = {
        "lr": Setting(lr, "server learning rate eta", low=0, low_open=True),
        "beta1": Setting(0.9, "first-moment decay beta_1 (0: no momentum)", low=0, high=1),
    }
    if beta2:
        settings["beta2"] = Setting(0.99, "second-moment decay beta_2", low=0, high=1)
    settings["tau"] = Setting(
        1e-3, "adaptivity tau (epsilon): smaller adapts more", low=0, low_open=True
    )
    return settings


class Adaptive(ServerOptimizer):
    """Reddi et al.'s Algorithm 2, one server round: with Delta_t the pseudo-gradient,

        m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t
        v_t = (the subclass's rule, :meth:`second_moment`)
        w_{t+1} = w_t + eta m_t / (sqrt(v_t) + tau)

    from m_{-1} = 0 and v_{-1} = tau^2, the smallest value Algorithm 2 allows
    (v_{-1} >= tau^2). As in Algorithm 2 (and Flower's and FL-bench's FedOpt), there is
    no bias correction; the authors' TensorFlow experiments ran Keras' Adam (with bias
    correction, beta_2 = 0.999) and started Adagrad's and Yogi's accumulators at 0.
    Defaults: beta_1 = 0.9 and beta_2 = 0.99 (Flower's), tau = 1e-3 (the authors'
    recommended epsilon)."""

    def init(self, weights):
        tau = self.options["tau"]
        return {"m": np.zeros(weights.shape, np.float64), "v": np.full(weights.shape, tau**2)}

    def second_moment(self, v: np.ndarray, square: np.ndarray) -> np.ndarray:
        """v_t from v_{t-1} and Delta_t^2."""
        raise NotImplementedError

    def step(self, weights, target, state):
        delta = pseudo_gradient(weights, target)
        beta1 = self.options["beta1"]
        m = beta1 * state["m"] + (1 - beta1) * delta
        v = self.second_moment(state["v"], delta * delta)
        move = self.options["lr"] * m / (np.sqrt(v) + self.options["tau"])
        return weights + move, {"m": m, "v": v}


class FedAdagrad(Adaptive):
    """FedAdagrad: v_t = v_{t-1} + Delta_t^2 (no beta_2). Algorithm 2 keeps beta_1's
    momentum for it too; the authors' Keras Adagrad had none (beta1: 0 here). eta = 0.1,
    the authors' best server rate for it on most of their tasks (README of their code)."""

    settings: ClassVar[dict[str, Setting]] = _adaptive_settings(0.1, beta2=False)

    def second_moment(self, v, square):
        return v + square


class FedAdam(Adaptive):
    """FedAdam: v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2; eta = 0.01, the authors'
    best server rate for it on most of their tasks (10^-2.5 to 1 over all of them)."""

    settings: ClassVar[dict[str, Setting]] = _adaptive_settings(0.01, beta2=True)

    def second_moment(self, v, square):
        beta2 = self.options["beta2"]
        return beta2 * v + (1 - beta2) * square


class FedYogi(Adaptive):
    """FedYogi: v_t = v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2), which
    moves v towards Delta_t^2 by at most (1 - beta_2) Delta_t^2 per round; eta = 0.01
    as FedAdam's."""

    settings: ClassVar[dict[str, Setting]] = _adaptive_settings(0.01, beta2=True)

    def second_moment(self, v, square):
        return v - (1 - self.options["beta2"]) * square * np.sign(v - square)
