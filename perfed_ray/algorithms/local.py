"""Local training alone: every user trains its own model on its own data and nothing it
learns reaches anyone else, the lower bound that personalised federated learning
papers report (e.g. Dinh et al. 2020, Collins et al. 2021, "Local").

A user's model starts from the run's w_0 (the server's model, which never changes) and
takes `tau` SGD steps of size beta on D in every round it is sampled, or in every round
with `trained_users: all`, the baseline as its papers run it (every user training on
its own data throughout); it is the user's per-user state, kept on the actor that
hosts the user. The server ignores what users send. A user's personalisation starts
from its own model; a user that never trained (an unseen one) starts from w_0.
"""

from __future__ import annotations

from perfed_ray.algorithms.base import Algorithm


class Local(Algorithm):
    """Each user alone, with the client optimiser (plain SGD by default; its state lives
    for one round). Its stream draws D, D', D'' per step like Per-FedAvg's and it uses
    D, so that one seed gives every method the same D at every step."""

    batches_per_step = 1
    draws_per_step = 3

    def init_user_state(self, server):
        return server

    def client_init(self, ops, server, own):
        return {"w": own, "opt": self.optimizer.init(own)}

    def client_step(self, ops, state, batches):
        g, loss = ops.grad_and_loss(state["w"], batches[0])
        w, opt = self.optimizer.step(state["w"], g, state["opt"], self.beta)
        return {"w": w, "opt": opt}, loss

    def client_final(self, ops, server, state):
        return state["w"], state["w"]

    def personal_model(self, ops, server, own):
        return own

    def server_update(self, server, aggregate):
        return server
