"""FedAvg (McMahan et al., AISTATS 2017) as Per-FedAvg's paper runs it (Section 5):
`tau` local SGD steps ``w <- w - beta grad f(w; D)`` from the server's model, the
server's model the plain mean of the users' (Algorithm 1 with the rule of eq. (7)
replaced by SGD), scored after one step of personalisation like every method.
"""

from __future__ import annotations

from perfed_ray.algorithms.base import Algorithm
from perfed_ray.algorithms.tree import sgd


class FedAvg(Algorithm):
    """Local SGD on D. Its stream draws D, D' and D'' for each step like Per-FedAvg's
    and it uses D alone, so that one seed gives FedAvg and Per-FedAvg the same D at
    every step (and the numbers of runs made before algorithms were values)."""

    batches_per_step = 1
    draws_per_step = 3

    def client_step(self, ops, w, batches):
        g, loss = ops.grad_and_loss(w, batches[0])
        return sgd(w, g, self.beta), loss
