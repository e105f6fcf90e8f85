"""FedProx: Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020, Algorithm 2.

A sampled user approximately minimises its local objective with a proximal term,
h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2 (eq. 2), by `tau` SGD steps on D from the
server's model w^t: w <- w - beta (grad f(w; D) + mu (w - w^t)), the update of the
authors' code (litian96/FedProx, flearn/optimizer/pgd.py, PerturbedGradientDescent).
The server's model is the aggregate; users are scored, as FedAvg's, on the global
model after the default one-step personalisation.

Where we differ: the paper samples users with probability p_k (their share of samples)
and averages the models plainly; the authors' code (flearn/trainers/fedbase.py) draws
users uniformly and averages in proportion to their samples. Here either is a setting
of the run: `sampling: samples` (the paper) or `aggregation: samples` (the code); the
default is the Per-FedAvg protocol's (uniform, plain mean). The authors tune mu per
data set in {0.001, 0.01, 0.1, 1} (1 for their synthetic data, for instance); its
default here is 0.01. Their "local epochs" are passes over the user's data: use
`local_epochs` to run them so; `tau` steps otherwise. Stragglers, which FedProx lets
do less work, are a separate matter here (`stragglers` drops late users' updates).
"""

from __future__ import annotations

from typing import ClassVar

from perfed_ray.algorithms.base import Algorithm
from perfed_ray.algorithms.tree import tree_map
from perfed_ray.settings import Setting


class FedProx(Algorithm):
    """Local SGD on the proximal objective. The stream draws D, D', D'' per step like
    Per-FedAvg's, and FedProx uses D, so one seed gives it FedAvg's batches (with mu = 0
    it is FedAvg, step for step)."""

    batches_per_step = 1
    draws_per_step = 3
    settings: ClassVar[dict[str, Setting]] = {
        "mu": Setting(0.01, "weight mu of the proximal term mu/2 ||w - w^t||^2", low=0),
    }

    def client_init(self, ops, server, user_state):
        return {"w": server, "anchor": server, "opt": self.optimizer.init(server)}

    def client_step(self, ops, state, batches):
        w, anchor = state["w"], state["anchor"]
        g, loss = ops.grad_and_loss(w, batches[0])
        mu = self.settings["mu"]
        proximal = tree_map(lambda g, w, a: g + mu * (w - a), g, w, anchor)
        w, opt = self.optimizer.step(w, proximal, state["opt"], self.beta)
        return {"w": w, "anchor": anchor, "opt": opt}, loss

    def client_final(self, ops, server, state):
        return state["w"], None
