"""pFedMe: Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes",
NeurIPS 2020, Algorithm 1.

A user's personalised model solves the Moreau-envelope problem
theta(w) = argmin_theta f_i(theta) + lambda/2 ||theta - w||^2 around its local copy w of
the global model. At every local step, on one batch D, theta takes K gradient steps of
size `pfedme_lr` on that objective (plus the authors' weight decay mu = 0.001), from where
it stood; then w <- w - beta lambda (w - theta). Theta starts each round from the global
model, as in the authors' code. The server mixes: w <- (1 - beta_s) w + beta_s mean(w_i)
(`pfedme.beta`). Users are scored on their last theta; a user that never trained starts
from the global model.

Defaults are the authors' for MNIST with the MLP (README of CharlieDinh/pFedMe):
lambda = 15, K = 5, personal step 0.09, beta_s = 1; their local step 0.005 is this
configuration's `beta`.

Who trains: in the paper's Algorithm 1 and in the authors' code every user runs its R
local steps each round and the server aggregates a sampled subset S of them, so every
user's theta is fresh each round: that is `trained_users: all`. The default,
`trained_users: sampled`, is the Per-FedAvg protocol's (only sampled users train),
under which a user's theta dates from the last round it was sampled in. The authors'
"local_epochs" (20 for MNIST) are local steps, each on one batch: this configuration's
`tau`. Their reported figure is the personalised models' accuracy counted over all
users' test samples together (correct answers / test samples), at the best round,
averaged over runs; this project's headline is the unweighted mean over users of a
personalised model's accuracy at the final round (`perfed_ray.analysis` computes both).

Under differential privacy (`privacy: central | local`) a user shares its local model w
(the local models' contribution to the server: its update from the global model, clipped
and noised), and the server's mix by beta_s acts on the private aggregate; theta, the
personalised model, stays on the user's actor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from perfed_ray.algorithms.base import Algorithm, AlgorithmHParams
from perfed_ray.algorithms.tree import lerp, sgd, tree_map
from perfed_ray.config.settings import Setting

if TYPE_CHECKING:
    from perfed_ray.config.schema import RunConfig


class PFedMe(Algorithm):
    """The stream draws D, D', D'' per step like Per-FedAvg's; pFedMe uses D, K =
    `pfedme.steps` times a step (theta's K gradient steps on it), so its task is K tau
    batch_size samples on the clock (:meth:`task_samples`)."""

    batches_per_step = 1
    draws_per_step = 3
    mu = 0.001  # the authors' optimizer's weight decay on theta
    settings: ClassVar[dict[str, Setting]] = {
        "lambda": Setting(
            15.0,
            "Moreau-envelope regularisation lambda",
            low=0,
            low_open=True,
            legacy="pfedme_lambda",
        ),
        "steps": Setting(
            5, "steps K on the personalised model per local step", low=1, legacy="pfedme_steps"
        ),
        "personal_lr": Setting(
            0.09,
            "step size of those K steps (personal learning rate)",
            low=0,
            low_open=True,
            legacy="pfedme_lr",
        ),
        "beta": Setting(
            1.0,
            "the server's mixing beta, w <- (1 - beta) w + beta mean",
            low=0,
            high=2,
            legacy="pfedme_beta",
        ),
    }

    def __init__(self, hparams: AlgorithmHParams | RunConfig) -> None:
        super().__init__(hparams)
        self.lam = self.settings["lambda"]
        self.inner_steps = self.settings["steps"]
        self.inner_lr = self.settings["personal_lr"]
        self.mix = self.settings["beta"]

    def task_samples(self, n_train: int) -> int:
        return self.inner_steps * super().task_samples(n_train)

    def init_user_state(self, server):
        return server

    def client_init(self, ops, server, theta):
        return {"w": server, "theta": server}

    def client_step(self, ops, state, batches):
        w, theta = state["w"], state["theta"]
        loss = None
        for _ in range(self.inner_steps):
            g, value = ops.grad_and_loss(theta, batches[0])
            loss = value if loss is None else loss
            step = tree_map(lambda g, t, a: g + self.lam * (t - a) + self.mu * t, g, theta, w)
            theta = sgd(theta, step, self.inner_lr)
        w = tree_map(lambda a, t: a - self.beta * self.lam * (a - t), w, theta)
        return {"w": w, "theta": theta}, loss

    def client_final(self, ops, server, state):
        return state["w"], state["theta"]

    def personal_model(self, ops, server, theta):
        return theta

    def server_update(self, server, aggregate):
        return lerp(server, aggregate, self.mix)
