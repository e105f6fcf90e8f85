"""FedProx: Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020, Algorithm 2.

A sampled user k approximately minimises the proximal local objective of eq. (2),
h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2, from the server's model w^t, by `tau` steps
of the run's client optimiser on D along grad f(w; D) + mu (w - w^t); with plain SGD
(the default) that is w <- w - beta (grad f(w; D) + mu (w - w^t)), the update of the
authors' optimiser (litian96/FedProx, flearn/optimizer/pgd.py,
PerturbedGradientDescent). The server's model is the users' aggregate; users are
scored, like FedAvg's, on the global model after the default one-step
personalisation. With mu = 0 it is FedAvg step for step.

`fedprox.mu` defaults to 1, the paper's best value on MNIST (and on its synthetic data
and FEMNIST; 0.001 on Shakespeare, 0.01 on Sent140), tuned among {0.001, 0.01, 0.1,
0.5, 1} as the authors' README advises; 0.01 is only their optimiser's constructor
default (their command line's is 0).

Where this differs from the paper or the authors' code:

- Sampling and aggregation. The paper (Algorithm 2) draws users with probability p_k
  (their share of the samples) and averages their models plainly; the authors' code
  draws uniformly without replacement (`p=pk` is commented out in
  flearn/trainers/fedbase.py) and averages in proportion to the users' samples. Both
  are run settings here: `sampling: samples` with the plain mean is the paper's,
  `aggregation: samples` with uniform sampling the code's; the default, uniform and
  plain, is the Per-FedAvg protocol's.
- Local work. The authors run E epochs of batches of 10 (run_fedprox.sh: 20 epochs,
  step 0.01); here `tau` steps of `batch_size`, or `local_epochs` passes.
- Stragglers. FedProx lets a straggler send a partial solution (the authors' code gives
  it a random number of epochs below E); here `stragglers` drops a late user's update,
  as the paper's FedAvg baseline does.

Under differential privacy (`privacy: central | local`) a user shares its whole model
after its proximal steps, as FedAvg's do (its update from w^t, clipped and noised);
nothing else is kept.
"""

from __future__ import annotations

from typing import ClassVar

from perfed_ray.algorithms.base import Algorithm
from perfed_ray.algorithms.tree import tree_map
from perfed_ray.config.settings import Setting


class FedProx(Algorithm):
    """Local SGD on the proximal objective. The stream draws D, D', D'' per step like
    Per-FedAvg's, and FedProx uses D, so one seed gives it FedAvg's batches (with mu = 0
    it is FedAvg, step for step). Its task on the simulated clock is FedAvg's: one batch
    a step, the proximal term costing no pass over data."""

    batches_per_step = 1
    draws_per_step = 3
    settings: ClassVar[dict[str, Setting]] = {
        "mu": Setting(1.0, "weight mu of the proximal term mu/2 ‖w - w^t‖^2", low=0),
    }

    def client_init(self, ops, server, user_state):
        return {"w": server, "anchor": server, "opt": self.optimizer.init(server)}

    def client_step(self, ops, state, batches):
        w, anchor = state["w"], state["anchor"]
        g, loss = ops.grad_and_loss(w, batches[0])
        mu = self.settings["mu"]
        proximal = tree_map(lambda g, w, a: g + mu * (w - a), g, w, anchor)
        w, opt = self.optimizer.consuming_step(w, proximal, state["opt"], self.beta)
        return {"w": w, "anchor": anchor, "opt": opt}, loss

    def client_final(self, ops, server, state):
        return state["w"], None
