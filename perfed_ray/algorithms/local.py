"""Local training alone: every user trains its own model on its own data and nothing it
learns reaches anyone else, the lower bound that personalised federated learning
papers report (e.g. Dinh et al. 2020, Collins et al. 2021, "Local").

A user's model starts from the run's w_0 (the server's model, which never changes) and
takes `tau` SGD steps of size beta on D in every round it is sampled, or in every round
with `trained_users: all`, the baseline as its papers run it (every user training on
its own data throughout); it is the user's per-user state, kept on the actor that
hosts the user. The server ignores what users send. A user's personalisation starts
from its own model; a user that never trained (an unseen one) starts from w_0.

It shares nothing: the server's model never moves (`fixed_server`), so `privacy:
central | local` is refused with one line (there is nothing to privatise) and its runs
take `privacy: none`.
"""

from __future__ import annotations

from perfed_ray.algorithms.fedavg import FedAvg


class Local(FedAvg):
    """Each user alone: FedAvg's local steps (the client optimiser, its state for one
    round, on the same D for one seed) from the user's own model instead of the
    server's. Its task on the simulated clock is FedAvg's: one batch a step."""

    fixed_server = True

    def init_user_state(self, server):
        return server

    def client_init(self, ops, server, own):
        return super().client_init(ops, own, None)

    def client_final(self, ops, server, state):
        return state["w"], state["w"]

    def personal_model(self, ops, server, own):
        return own

    def server_update(self, server, aggregate):
        return server
