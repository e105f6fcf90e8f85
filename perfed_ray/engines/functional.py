"""A model's maths by autodiff, for one user at a time (and under `vmap`): any
`nn.Module` works, called with explicit parameters (`functional_call`).

As in functorch's MAML examples (``examples/maml_omniglot/maml-omniglot-transforms.py``),
the model is a function of explicit parameters, so a local step and its gradient are
each one line and `vmap` runs them for many users at once; the Hessian-vector product
is forward-over-reverse, the `jvp` of `grad`, as torch.func's documentation computes
one.

One user's plain tensors (the sequential engine's) take PyTorch's ordinary autograd, as
a plain training loop does (`torch.autograd.grad` on leaves that require gradients);
under `torch.func`'s transforms (`vmap`, the `jvp` of a Hessian-vector product) and
while `torch.compile` traces, `torch.func.grad`, which composes with them. The two
give the same gradients to rounding; the plain path is the cheaper one step
(experiments/bench/step_overhead.py measures both).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad, grad_and_value, jvp
from torch.utils import _pytree as pytree

from perfed_ray.algorithms.base import Batch
from perfed_ray.algorithms.tree import Params, Scalar, axpy, eager_plain, sub
from perfed_ray.masks import Masks, applying


class Curvature:
    """The Hessian-vector product and the gradients' difference from an ops' own `grad`:
    autodiff serves one user and users stacked alike."""

    def hvp(self, params: Params, batch: Batch, v: Params) -> Params:
        return jvp(lambda p: self.grad(p, batch), (params,), (v,))[1]

    def grad_difference(self, params: Params, v: Params, step: Scalar, batch: Batch) -> Params:
        plus = self.grad(axpy(params, v, step), batch)
        minus = self.grad(axpy(params, v, -step), batch)
        return sub(plus, minus)


def plain(params: Params, batch: Batch) -> bool:
    """Whether ordinary autograd may serve: plain tensors, run eagerly (no `torch.func`
    transform around them, no `torch.compile` tracing)."""
    tensors = [b for b in batch if isinstance(b, torch.Tensor)]
    return eager_plain(pytree.tree_leaves(params) + tensors)


class FunctionalOps(Curvature):
    """:class:`~perfed_ray.algorithms.base.ModelOps` of one user, by autodiff; with
    `autograd` false, by `torch.func` alone (the reference the plain path is tested
    against)."""

    def __init__(self, model: nn.Module, autograd: bool = True) -> None:
        self.model = model
        self.autograd = autograd
        # Whether one tensor is two of the model's parameters: only then need
        # functional_call look for ties on every call (75 us of a 5 ms step on the CNN).
        named = [t for _, t in model.named_parameters(remove_duplicate=False)]
        self.tied = len({id(t) for t in named}) < len(named)

    def logits(self, params: Params, x: torch.Tensor, masks: Masks | None = None) -> torch.Tensor:
        with applying(masks):
            return functional_call(self.model, params, (x,), tie_weights=self.tied)

    def _loss(
        self, params: Params, x: torch.Tensor, y: torch.Tensor, masks: Masks | None = None
    ) -> torch.Tensor:
        return nn.functional.cross_entropy(self.logits(params, x, masks), y)

    def loss(self, params: Params, batch: Batch) -> torch.Tensor:
        return self._loss(params, *batch)

    def grad_and_loss(self, params: Params, batch: Batch) -> tuple[Params, torch.Tensor]:
        if self.autograd and plain(params, batch):
            return self._autograd(params, batch)
        return grad_and_value(self._loss)(params, *batch)

    def grad(self, params: Params, batch: Batch) -> Params:
        if self.autograd and plain(params, batch):
            return self._autograd(params, batch)[0]
        return grad(self._loss)(params, *batch)

    def _autograd(self, params: Params, batch: Batch) -> tuple[Params, torch.Tensor]:
        """(grad, loss) by the ordinary tape: the parameters as fresh leaves that
        require gradients, the input's own history cut off (so that it is the
        gradient with respect to `params` alone, as `torch.func.grad` gives)."""
        leaves, spec = pytree.tree_flatten(params)
        with torch.enable_grad():
            leaves = [leaf.detach().requires_grad_() for leaf in leaves]
            inputs = [b.detach() if isinstance(b, torch.Tensor) else b for b in batch]
            loss = self._loss(pytree.tree_unflatten(leaves, spec), *inputs)
            grads = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
        return pytree.tree_unflatten(list(grads), spec), loss.detach()

    def norm(self, tree: Params) -> torch.Tensor:
        return torch.sqrt(self.inner(tree, tree))

    def inner(self, a: Params, b: Params) -> torch.Tensor:
        pairs = zip(pytree.tree_leaves(a), pytree.tree_leaves(b), strict=True)
        return sum((x * y).sum() for x, y in pairs)
