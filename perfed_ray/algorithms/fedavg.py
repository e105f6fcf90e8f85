"""FedAvg (McMahan et al., AISTATS 2017) as Per-FedAvg's paper runs it (Section 5):
`tau` local SGD steps ``w <- w - beta grad f(w; D)`` from the server's model (or the
client optimiser's steps: `client_optimizer`, e.g. SGD with momentum), the
server's model the plain mean of the users' (Algorithm 1 with the rule of eq. (7)
replaced by SGD), scored after one step of personalisation like every method.

Under differential privacy (`privacy: central | local`) a user shares its whole model:
its update from the server's, clipped to `privacy.clip` (and noised, by the server on the
sum or by the user itself); the personalisation step of its evaluation stays with it.
"""

from __future__ import annotations

from perfed_ray.algorithms.base import Algorithm


class FedAvg(Algorithm):
    """Local steps of the client optimiser (plain SGD by default) on D. Its stream
    draws D, D' and D'' for each step like Per-FedAvg's and it uses D alone, so that
    one seed gives FedAvg and Per-FedAvg the same D at every step (and the committed
    FedAvg results, drawn so, keep their numbers). The optimiser's state lives for one
    round, as in the code of McMahan et al.'s successors (`optimizer = SGD(...)` in each
    client's `train()`). Its task on the simulated clock is one batch a step
    (:meth:`~perfed_ray.algorithms.base.Algorithm.task_samples`): tau batch_size samples,
    or its epochs' full batches."""

    batches_per_step = 1
    draws_per_step = 3

    def client_init(self, ops, server, user_state):
        return {"w": server, "opt": self.optimizer.init(server)}

    def client_step(self, ops, state, batches):
        g, loss = ops.grad_and_loss(state["w"], batches[0])
        w, opt = self.optimizer.consuming_step(state["w"], g, state["opt"], self.beta)
        return {"w": w, "opt": opt}, loss

    def client_final(self, ops, server, state):
        return state["w"], None
