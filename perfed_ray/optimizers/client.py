"""Client optimisers: the update rule of a method's local steps, as pure tree arithmetic.

An optimiser's state is a tree carried in the round's local state, so the same rule
runs for one user, under `vmap` and for users stacked along a leading axis (the fused
engine), where a per-user step size is a [U] tensor (:func:`perfed_ray.algorithms.tree.per_user`).
Whether the state lives for one round (PyTorch's `optimizer = SGD(...)` inside a
client's `train()`, as FedRep's and Ditto's authors write it) or is kept per user
across rounds is the method's choice: it keeps the state in its per-user state, or not.

Plain SGD with no momentum and no weight decay keeps no state and is exactly
``w - lr g``, so the fused engine's fastest path is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from perfed_ray.algorithms.tree import Params, Scalar, per_user, sgd, tree_map
from perfed_ray.config.owners import HParams
from perfed_ray.config.schema import RunConfig
from perfed_ray.config.settings import Setting


@dataclass(frozen=True, kw_only=True)
class ClientOptimizerHParams(HParams):
    """What a client optimiser reads of a run: its own section alone; the step size is
    the method's, given at every step."""

    key: ClassVar[str] = "client_optimizer"


class ClientOptimizer:
    """The update ``(w, g, state) -> (w', state')`` with step size `lr`. Subclass it and
    name the class in the configuration (`client_optimizer: mypkg.opt:Lion`) to use
    your own; its `settings` become the section of that name."""

    settings: ClassVar[dict[str, Setting]] = {}
    HParams: ClassVar[type[ClientOptimizerHParams]] = ClientOptimizerHParams

    def __init__(self, hparams: ClientOptimizerHParams | RunConfig) -> None:
        self.hparams = self.HParams.given(hparams)
        self.options: dict[str, Any] = self.hparams.section

    def init(self, params: Params) -> Params:
        """The state before the first step ({} for a stateless rule)."""
        return {}

    def step(
        self, params: Params, grad: Params, state: Params, lr: Scalar
    ) -> tuple[Params, Params]:
        raise NotImplementedError

    def consuming_step(
        self, params: Params, grad: Params, state: Params, lr: Scalar
    ) -> tuple[Params, Params]:
        """`step`, where `grad` is handed over: a temporary the caller reads no more,
        which the rule may write its result into instead of new memory (the built-in
        methods call this with their fresh gradients). By default `step`."""
        return self.step(params, grad, state, lr)


class SGD(ClientOptimizer):
    """PyTorch's `torch.optim.SGD` (dampening 0): g <- g + wd w; with momentum mu,
    b <- mu b + g (b = g at the first step) and the step takes b, or g + mu b with
    Nesterov; w <- w - lr g."""

    settings: ClassVar[dict[str, Setting]] = {
        "momentum": Setting(0.0, "heavy-ball momentum mu (0: none)", low=0, high=1),
        "weight_decay": Setting(0.0, "L2 weight decay added to the gradient", low=0),
        "nesterov": Setting(False, "Nesterov momentum (needs momentum > 0)"),
        "decay_biases": Setting(
            True,
            "weight decay on biases too (PyTorch's default); false: on weights only, as "
            "FedRep's code groups its parameters",
        ),
    }

    def __init__(self, hparams: ClientOptimizerHParams | RunConfig) -> None:
        super().__init__(hparams)
        self.momentum = self.options["momentum"]
        self.weight_decay = self.options["weight_decay"]
        self.nesterov = self.options["nesterov"]
        self.decay_biases = self.options["decay_biases"]

    def _decays(self, name: str) -> bool:
        """Whether weight decay applies to the parameter of that name."""
        return self.decay_biases or not name.endswith("bias")

    def init(self, params: Params) -> Params:
        if not self.momentum:
            return {}
        return {"buffer": tree_map(torch.zeros_like, params)}

    def step(self, params, grad, state, lr):
        return self._step(params, grad, state, lr, into=None)

    def consuming_step(self, params, grad, state, lr):
        return self._step(params, grad, state, lr, into=grad)

    def _step(self, params, grad, state, lr, into):
        if self.weight_decay:
            grad = {
                k: g + self.weight_decay * params[k] if self._decays(k) else g
                for k, g in grad.items()
            }
            if into is not None or all(map(self._decays, grad)):
                into = grad  # a new tree, or one whose undecayed leaves are handed over
        if not self.momentum:
            return sgd(params, grad, lr, into=into), state
        # b_t = mu b_{t-1} + g_t from b_0 = 0: PyTorch's b_1 = g_1.
        buffer = tree_map(lambda b, g: self.momentum * b + g, state["buffer"], grad)
        direction = (
            tree_map(lambda g, b: g + self.momentum * b, grad, buffer) if self.nesterov else buffer
        )
        return sgd(params, direction, lr), {"buffer": buffer}


class Adam(ClientOptimizer):
    """PyTorch's `torch.optim.Adam` (L2 weight decay added to the gradient, bias-corrected
    moments): m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2,
    w <- w - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)."""

    settings: ClassVar[dict[str, Setting]] = {
        "beta1": Setting(0.9, "first moment's decay", low=0, high=1),
        "beta2": Setting(0.999, "second moment's decay", low=0, high=1),
        "eps": Setting(1e-8, "added to the second moment's root", low=0, low_open=True),
        "weight_decay": Setting(0.0, "L2 weight decay added to the gradient", low=0),
    }

    def init(self, params: Params) -> Params:
        zeros = tree_map(torch.zeros_like, params)
        dtype = next(iter(zeros.values())).dtype  # bias corrections in the model's precision
        return {"m": zeros, "v": zeros, "t": torch.zeros((), dtype=dtype)}

    def step(self, params, grad, state, lr):
        o = self.options
        b1, b2 = o["beta1"], o["beta2"]
        if o["weight_decay"]:
            grad = tree_map(lambda g, w: g + o["weight_decay"] * w, grad, params)
        t = state["t"] + 1
        m = tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grad)
        v = tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grad)
        first, second = 1 - b1**t, 1 - b2**t

        def direction(m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return (m / per_user(first, m)) / (torch.sqrt(v / per_user(second, v)) + o["eps"])

        return sgd(params, tree_map(direction, m, v), lr), {"m": m, "v": v, "t": t}
