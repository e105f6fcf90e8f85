"""Per-FedAvg: Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with
Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020.

A local step is ``w <- w - beta * direction`` (eq. (7)) with three independent batches
D, D', D''. Exact Per-FedAvg's direction is the stochastic gradient of the
meta-function ``F_i(w) = f_i(w - alpha grad f_i(w))``, eq. (8):
``(I - alpha H(w; D'')) grad f(w~; D')``, ``w~ = w - alpha grad f(w; D)``. The FO and HF
variants replace its Hessian-vector product as in Section 5 and Appendix H.

Under differential privacy (`privacy: central | local`) a user shares the whole
meta-model w after its tau steps: its update from the server's, clipped to
`privacy.clip` and noised; the inner steps ``w - alpha grad f(w)`` of training and the
personalisation of its evaluation use its data but never leave it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from perfed_ray.algorithms.base import Algorithm, AlgorithmHParams
from perfed_ray.algorithms.tree import sgd, tree_map

if TYPE_CHECKING:
    from perfed_ray.config.schema import RunConfig


class PerFedAvgFO(Algorithm):
    """Per-FedAvg (FO), Section 5 (i): the Hessian term dropped, direction g. Its
    stream draws D, D', D'' a step like the other variants'; a step's work is two
    batches (a gradient on D, then one on D'), so its task is 2 tau batch_size samples
    on the clock (:meth:`task_samples`)."""

    batches_per_step = 3
    epochs = False  # tau steps of three fresh batches each, as the paper runs them
    passes = 2  # batches the model passes over in a step: D, D'

    def task_samples(self, n_train: int) -> int:
        return self.passes * super().task_samples(n_train)

    def outer_gradient(self, ops, w, batches):
        """g = grad f(w~; D') with w~ = w - alpha grad f(w; D); also f(w; D)."""
        inner, loss = ops.grad_and_loss(w, batches[0])
        return ops.grad(sgd(w, inner, self.alpha, into=inner), batches[1]), loss

    def direction(self, ops, w, batches):
        return self.outer_gradient(ops, w, batches)

    def client_step(self, ops, w, batches):
        direction, loss = self.direction(ops, w, batches)
        return sgd(w, direction, self.beta, into=direction), loss


class PerFedAvg(PerFedAvgFO):
    """Per-FedAvg, Algorithm 1 and eq. (8): (I - alpha H(w; D'')) g, the Hessian at w,
    its product with g exact by autodiff. Three batches a step (D, D', D''): its task
    is 3 tau batch_size samples on the clock (the Hessian-vector product counts as one
    pass over D'', though it costs about two gradients)."""

    passes = 3

    def direction(self, ops, w, batches):
        g, loss = self.outer_gradient(ops, w, batches)
        hv = ops.hvp(w, batches[2], g)
        return tree_map(lambda a, b: a - self.alpha * b, g, hv), loss


class PerFedAvgHF(PerFedAvgFO):
    """Per-FedAvg (HF), Section 5 (ii) and Appendix H: g - alpha d with the central
    difference d = (grad f(w + delta g; D'') - grad f(w - delta g; D'')) / (2 delta),
    delta as :meth:`difference_step` chooses it. Three batches a step (D, D', D''): its
    task is 3 tau batch_size samples on the clock (the difference of two gradients on
    D'' counts as one pass)."""

    passes = 3

    @dataclass(frozen=True, kw_only=True)
    class HParams(AlgorithmHParams):
        """Also the difference step: its size and whether it scales with ||g||."""

        delta: float
        hf_delta: str

    def __init__(self, hparams: PerFedAvgHF.HParams | RunConfig) -> None:
        super().__init__(hparams)
        self.delta = self.hparams.delta
        self.normalized = self.hparams.hf_delta == "normalized"

    def difference_step(self, ops, g):
        """HF's delta: fixed (the paper's text), or delta / ||g||, so w moves by a fixed
        length delta whatever the gradient's size (HF-MAML analyses scale it so; a fixed
        delta times a large g is a large, inaccurate perturbation). ||g|| = 0 is guarded
        by the smallest positive float: g = 0 then makes the difference 0, not NaN."""
        if not self.normalized:
            return self.delta
        norm = ops.norm(g)
        return self.delta / torch.clamp(norm, min=torch.finfo(norm.dtype).tiny)

    def direction(self, ops, w, batches):
        g, loss = self.outer_gradient(ops, w, batches)
        step = self.difference_step(ops, g)
        difference = ops.grad_difference(w, g, step, batches[2])
        scale = self.alpha / (2 * step)
        return sgd(g, difference, scale, into=difference), loss
