"""Ditto: Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, Algorithm 1.

Each sampled user does both of its parts on the same batch D at every local step:
its personal model v_k, kept on its actor between rounds, takes a step on
f_k(v_k) + lambda/2 ||v_k - w^t||^2 (eq. 2's personal objective, w^t the global model
the round started from); then its copy of the global model takes a plain SGD step, as
FedAvg's would. The server averages the global copies (Algorithm 1's global update).
Users are scored on v_k; a user that never trained starts from w^t.

`ditto.lambda` defaults to 1, the value of the authors' run scripts; the personal and
global steps share the step size beta and the client optimiser (plain SGD in their
code; its state lives for one round).

Where the authors' code (litian96/ditto) differs, and what to set: it draws users in
proportion to their sample counts (`sampling: samples`); it starts every personal model
from the initial global model w_0, where here a user's v starts from the global model
of the first round the user trains or is scored in (not selectable yet: it needs w_0
on the actors); its local work is epochs over the user's data (`local_epochs`).
"""

from __future__ import annotations

from typing import ClassVar

from perfed_ray.algorithms.base import Algorithm
from perfed_ray.algorithms.tree import tree_map
from perfed_ray.settings import Setting


class Ditto(Algorithm):
    """The stream draws D, D', D'' per step like Per-FedAvg's; Ditto uses D."""

    batches_per_step = 1
    draws_per_step = 3
    settings: ClassVar[dict[str, Setting]] = {
        "lambda": Setting(
            1.0, "pull of each personal model towards the global one", low=0, legacy="ditto_lambda"
        ),
    }

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.lam = self.settings["lambda"]

    def init_user_state(self, server):
        return server

    def client_init(self, ops, server, personal):
        opt = self.optimizer.init(server)
        return {"w": server, "v": personal, "anchor": server, "opt_w": opt, "opt_v": opt}

    def client_step(self, ops, state, batches):
        batch = batches[0]
        g_v = ops.grad(state["v"], batch)
        pull = tree_map(lambda g, v, w: g + self.lam * (v - w), g_v, state["v"], state["anchor"])
        g_w, loss = ops.grad_and_loss(state["w"], batch)
        w, opt_w = self.optimizer.step(state["w"], g_w, state["opt_w"], self.beta)
        v, opt_v = self.optimizer.step(state["v"], pull, state["opt_v"], self.beta)
        return {"w": w, "v": v, "anchor": state["anchor"], "opt_w": opt_w, "opt_v": opt_v}, loss

    def client_final(self, ops, server, state):
        return state["w"], state["v"]

    def personal_model(self, ops, server, personal):
        return personal
