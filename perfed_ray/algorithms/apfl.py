"""APFL: Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", 2020,
Algorithm 1 (local descent APFL) with its adaptive mixing weight.

Each user keeps a local model v_i and a mixing weight alpha_i in [0, 1] (its per-user
state, on the actor that hosts it); its personalised model is the mixture of
parameters vbar_i = alpha_i v_i + (1 - alpha_i) w_i, w_i its copy of the global model.
At every local step, on one batch D and from the values before the step (Algorithm 1
updates all three from iterate t - 1):

    w     <- w - beta grad f(w; D)                           (FedAvg's local step)
    v     <- v - beta alpha grad f(vbar; D)                  (grad_v f(vbar) = alpha grad f(vbar))
    alpha <- clip(alpha - eta <v - w, grad f(vbar; D)>, 0, 1)   (d f(vbar) / d alpha)

the last with `apfl.adaptive` (`ops.inner` is the per-user inner product). The server
averages the w's. Users are scored on vbar = alpha v + (1 - alpha) w with the current
global model w, personalised by the default one SGD step; a user that never trained
has v = w, so its vbar is the global model.

Defaults follow the authors' code (MLOPTPSU/FedTorch): alpha starts at 0.5
(`--fed_personal_alpha`), and its step size eta is the local step size (the `lr` they
pass to `alpha_update`), here `apfl.alpha_lr: beta`. Their code also learns alpha only
with `--fed_adaptive_alpha` (off by default); APFL's adaptive alpha is the method's
point, so it is on here (FL-bench's default too).

Where their code (fedtorch/comms/trainings/federated/apfl.py, comms/utils/flow_utils.py
`alpha_update`, comms/utils/eval.py `inference_personal`) differs from the paper, we
follow the paper:

- It mixes the two models' outputs, alpha v(x) + (1 - alpha) w(x), not their
  parameters (the two agree for a linear model such as `logreg`); a mixture of
  parameters is one model that every engine runs.
- It steps w first and then takes v's gradient at the mixture with the new w; the
  paper updates both from the old iterates.
- It updates alpha once a round (at the first local step), after v's and w's steps,
  with the gradient alpha grad_v + (1 - alpha) grad_w of its output mixture's loss
  plus a regulariser 0.02 alpha; the paper's, and ours, is <v - w, grad f(vbar)> at
  every step, with no regulariser.
- Their v and w start each round on their own SGD optimisers with the schedule of their
  runs; here plain SGD of size beta, and v of a user's first round is that round's w.

Under differential privacy (`privacy: central | local`) a user shares its copy w of the
global model (its update, clipped and noised); its local model v and its mixing weight
alpha stay on its actor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from perfed_ray.algorithms.base import Algorithm, AlgorithmHParams
from perfed_ray.algorithms.tree import lerp, sgd, sub
from perfed_ray.config.settings import Setting

if TYPE_CHECKING:
    from perfed_ray.config.schema import RunConfig


class APFL(Algorithm):
    """The stream draws D, D', D'' per step like Per-FedAvg's; APFL uses D for all three
    updates, through two passes a step (the gradient at w and the one at the mixture,
    which alpha's update reuses), so its task is twice FedAvg's samples on the clock
    (:meth:`task_samples`)."""

    batches_per_step = 1
    draws_per_step = 3
    settings: ClassVar[dict[str, Setting]] = {
        "alpha": Setting(0.5, "a user's initial mixing weight alpha", low=0, high=1),
        "adaptive": Setting(True, "learn each user's alpha by gradient descent"),
        "alpha_lr": Setting(
            None,
            "step size eta of alpha's updates (beta: the local step size, the authors' code)",
            kind=float,
            low=0,
            auto=True,
            word="beta",
        ),
    }

    def __init__(self, hparams: AlgorithmHParams | RunConfig) -> None:
        super().__init__(hparams)
        rate = self.settings["alpha_lr"]
        self.alpha_lr = self.beta if rate is None else rate

    def task_samples(self, n_train: int) -> int:
        return 2 * super().task_samples(n_train)

    def init_user_state(self, server):
        like = next(iter(server.values()))  # alpha on the model's device, in its dtype
        alpha = torch.full((), self.settings["alpha"], dtype=like.dtype, device=like.device)
        return {"v": server, "alpha": alpha}

    def client_init(self, ops, server, state):
        return {"w": server, "v": state["v"], "alpha": state["alpha"]}

    def client_step(self, ops, state, batches):
        w, v, alpha = state["w"], state["v"], state["alpha"]
        batch = batches[0]
        g_w, loss = ops.grad_and_loss(w, batch)
        g_mix = ops.grad(lerp(w, v, alpha), batch)
        new_v = sgd(v, g_mix, self.beta * alpha)
        if self.settings["adaptive"]:
            grad_alpha = ops.inner(sub(v, w), g_mix)
            alpha = torch.clamp(alpha - self.alpha_lr * grad_alpha, 0.0, 1.0)
        return {"w": sgd(w, g_w, self.beta), "v": new_v, "alpha": alpha}, loss

    def client_final(self, ops, server, state):
        return state["w"], {"v": state["v"], "alpha": state["alpha"]}

    def personal_model(self, ops, server, state):
        return lerp(server, state["v"], state["alpha"])
