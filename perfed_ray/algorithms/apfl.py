"""APFL: Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", 2020,
Algorithm 1.

Each user keeps a local model v_i and a mixing weight alpha_i (its per-user state,
on the actor that hosts it); its personalised model is the mixture
vbar_i = alpha_i v_i + (1 - alpha_i) w (eq. 4), w the global model. At every local step
on a batch D, from the values before the step: its copy of the global model takes a
plain SGD step, w <- w - beta grad f(w; D); its local model takes a step on the
mixture's loss, v <- v - beta alpha grad f(vbar; D) (the gradient of f(vbar) in v);
and, with `apfl.adaptive`, alpha takes a step on the same loss,
alpha <- clip(alpha - eta (<v - w, grad f(vbar; D)> + decay alpha), 0, 1) (Section 3.2,
"adaptive alpha"; `ops.inner` is the per-user inner product). The server averages the
w's. Users are scored on vbar with the current global model; a newcomer's v is the
global model, so its vbar is the global model.

From the authors' code (MLOPTPSU/FedTorch: comms/trainings/federated/centered/apfl.py,
comms/utils/flow_utils.py `alpha_update`, parameters.py): alpha starts at 0.5 and is
fixed unless `--fed_adaptive_alpha`; its step size is the local learning rate; its
gradient carries a 0.02 alpha term (`alpha.decay` here, 0.02). Where we differ, and
why: their code mixes the two models' *outputs* (alpha v(x) + (1 - alpha) w(x)) where
the paper mixes parameters; we follow the paper (the two agree for a linear model such
as `logreg`), since a mixture of parameters is one model every engine runs. Their
code updates alpha once per round, at the first local step; the paper and we, at every
step. Their local optimiser is SGD with the step size schedule of their runs; here
plain SGD of size beta.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from perfed_ray.algorithms.base import Algorithm
from perfed_ray.algorithms.tree import lerp, sgd, sub
from perfed_ray.settings import Setting


class APFL(Algorithm):
    """The stream draws D, D', D'' per step like Per-FedAvg's; APFL uses D for all three
    updates."""

    batches_per_step = 1
    draws_per_step = 3
    settings: ClassVar[dict[str, Setting]] = {
        "alpha": Setting(0.5, "a user's initial mixing weight alpha", low=0, high=1),
        "adaptive": Setting(True, "learn each user's alpha by gradient descent"),
        "alpha_lr": Setting(
            None,
            "step size of alpha's updates; beta: the local step size (the authors' code)",
            kind=float,
            low=0,
            auto=True,
            word="beta",
        ),
        "decay": Setting(0.02, "weight of the alpha term in alpha's gradient", low=0),
    }

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        rate = self.settings["alpha_lr"]
        self.alpha_lr = self.beta if rate is None else rate

    def init_user_state(self, server):
        return {"v": server, "alpha": torch.tensor(self.settings["alpha"])}

    def client_init(self, ops, server, state):
        return {"w": server, "v": state["v"], "alpha": state["alpha"]}

    def client_step(self, ops, state, batches):
        w, v, alpha = state["w"], state["v"], state["alpha"]
        batch = batches[0]
        g_w, loss = ops.grad_and_loss(w, batch)
        g_mix = ops.grad(lerp(w, v, alpha), batch)
        new_v = sgd(v, g_mix, self.beta * alpha)
        if self.settings["adaptive"]:
            grad_alpha = ops.inner(sub(v, w), g_mix) + self.settings["decay"] * alpha
            alpha = torch.clamp(alpha - self.alpha_lr * grad_alpha, 0.0, 1.0)
        return {"w": sgd(w, g_w, self.beta), "v": new_v, "alpha": alpha}, loss

    def client_final(self, ops, server, state):
        return state["w"], {"v": state["v"], "alpha": state["alpha"]}

    def personal_model(self, ops, server, state):
        return lerp(server, state["v"], state["alpha"])
