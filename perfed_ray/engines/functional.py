"""A model's maths by `torch.func`, for one user at a time (and under `vmap`): any
`nn.Module` works, called with explicit parameters (`functional_call`)."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad, grad_and_value, jvp
from torch.utils import _pytree as pytree

from perfed_ray.algorithms.base import Batch
from perfed_ray.algorithms.tree import Params, Scalar, axpy, sub
from perfed_ray.dropout import Masks, applying


class Curvature:
    """The Hessian-vector product and the gradients' difference from an ops' own `grad`:
    autodiff serves one user and users stacked alike."""

    def hvp(self, params: Params, batch: Batch, v: Params) -> Params:
        return jvp(lambda p: self.grad(p, batch), (params,), (v,))[1]

    def grad_difference(self, params: Params, v: Params, step: Scalar, batch: Batch) -> Params:
        plus = self.grad(axpy(params, v, step), batch)
        minus = self.grad(axpy(params, v, -step), batch)
        return sub(plus, minus)


class FunctionalOps(Curvature):
    """:class:`~perfed_ray.algorithms.base.ModelOps` of one user, by autodiff."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def logits(self, params: Params, x: torch.Tensor, masks: Masks | None = None) -> torch.Tensor:
        with applying(masks):
            return functional_call(self.model, params, (x,))

    def _loss(
        self, params: Params, x: torch.Tensor, y: torch.Tensor, masks: Masks | None = None
    ) -> torch.Tensor:
        return nn.functional.cross_entropy(self.logits(params, x, masks), y)

    def loss(self, params: Params, batch: Batch) -> torch.Tensor:
        return self._loss(params, *batch)

    def grad_and_loss(self, params: Params, batch: Batch) -> tuple[Params, torch.Tensor]:
        return grad_and_value(self._loss)(params, *batch)

    def grad(self, params: Params, batch: Batch) -> Params:
        return grad(self._loss)(params, *batch)

    def norm(self, tree: Params) -> torch.Tensor:
        return torch.sqrt(self.inner(tree, tree))

    def inner(self, a: Params, b: Params) -> torch.Tensor:
        pairs = zip(pytree.tree_leaves(a), pytree.tree_leaves(b), strict=True)
        return sum((x * y).sum() for x, y in pairs)
