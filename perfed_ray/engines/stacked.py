"""A chain of linear layers and ELUs (the paper's MLP, logistic regression) for a block of
users at once: every user's parameters stacked along a leading axis, each layer one
batched matrix product (`baddbmm`/`bmm`) for all of them, and the backward pass
written out by hand, since local training needs gradients, not a tape.

Per round the time of a per-user loop goes to per-operation overhead (some 200 ATen
operations per user and step), not arithmetic; here a step costs a handful of
operations for the whole block. A model declares that it is such a chain with
``fused_layers()`` (see :class:`perfed_ray.models.MLP`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import jvp
from torch.utils import _pytree as pytree

from perfed_ray.algorithms.base import Batch
from perfed_ray.algorithms.tree import Params, Scalar, axpy, eager_plain, per_user, sub


@dataclass(frozen=True)
class Layer:
    weight: str  # parameter names, [U, out, in] and [U, out] when stacked
    bias: str
    elu: bool  # an ELU (alpha = 1) follows


def chain_of(model: nn.Module) -> list[Layer] | None:
    """The model's layers if it declares itself a chain of Linear and ELU(1) modules,
    else None (the engine then falls back to `vmap`)."""
    declared = getattr(model, "fused_layers", None)
    if declared is None:
        return None
    prefix, sequence = declared()
    layers: list[Layer] = []
    for i, module in enumerate(sequence):
        if isinstance(module, nn.Linear) and module.bias is not None:
            layers.append(Layer(f"{prefix}.{i}.weight", f"{prefix}.{i}.bias", False))
        elif isinstance(module, nn.ELU) and module.alpha == 1.0 and layers:
            layers[-1] = Layer(layers[-1].weight, layers[-1].bias, True)
        else:
            return None
    return layers or None


def elu(z: torch.Tensor) -> torch.Tensor:
    """ELU(1): on a GPU `F.elu`, one kernel; elsewhere as max(z, exp(min(z, 0)) - 1), equal
    to it to rounding and about ten times faster on a CPU, where `F.elu` goes through
    `expm1`."""
    if z.is_cuda:
        return nn.functional.elu(z)
    return torch.maximum(z, torch.exp(torch.clamp(z, max=0.0)) - 1.0)


def _linear(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h [U, B, in] -> h W^T + b, [U, B, out]."""
    return torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))


class PerUser:
    """Whole-tree reductions of users stacked along axis 0: one number per user."""

    def norm(self, tree: Params) -> torch.Tensor:
        return torch.sqrt(self.inner(tree, tree))

    def inner(self, a: Params, b: Params) -> torch.Tensor:
        pairs = zip(pytree.tree_leaves(a), pytree.tree_leaves(b), strict=True)
        return sum((x * y).flatten(1).sum(1) for x, y in pairs)


class StackedOps(PerUser):
    """:class:`~perfed_ray.algorithms.base.ModelOps` for users stacked along axis 0."""

    def __init__(self, layers: list[Layer]) -> None:
        self.layers = layers

    def _forward(
        self, params: Params, x: torch.Tensor, first: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """[input, activation 1, ..., logits]; `first` replaces layer 1's output."""
        outputs = [x]
        for i, layer in enumerate(self.layers):
            z = (
                first
                if i == 0 and first is not None
                else _linear(outputs[-1], params[layer.weight], params[layer.bias])
            )
            outputs.append(elu(z) if layer.elu else z)
        return outputs

    def logits(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        return self._forward(params, x)[-1]

    def loss(self, params: Params, batch: Batch) -> torch.Tensor:
        logits, y = self.logits(params, batch[0]), batch[1]
        picked = torch.log_softmax(logits, -1).gather(-1, y.unsqueeze(-1))
        return -picked.mean((1, 2))

    def _output_grad(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """d(mean cross-entropy)/d logits, per user: (softmax - one-hot) / B, the one-hot
        subtracted in place where that may be done (the same numbers, two operations
        fewer; not under exact Per-FedAvg's forward-mode autodiff, which has no rule for
        it)."""
        p = torch.softmax(logits, -1)
        if eager_plain([p]):
            p.scatter_(-1, y.unsqueeze(-1), -1.0, reduce="add")
            return p.div_(logits.shape[1])
        onehot = torch.zeros_like(p).scatter_(-1, y.unsqueeze(-1), 1.0)
        return (p - onehot) / logits.shape[1]

    def _backward(
        self, params: Params, outputs: list[torch.Tensor], dz: torch.Tensor, grads: Params
    ) -> torch.Tensor:
        """Fill `grads` for layers 2.. from the logits' gradient `dz`; return the gradient
        of layer 1's output (layer 1's own gradients need its input)."""
        for i in range(len(self.layers) - 1, 0, -1):
            layer = self.layers[i]
            grads[layer.weight] = torch.bmm(dz.transpose(1, 2), outputs[i])
            grads[layer.bias] = dz.sum(1)
            dz = torch.bmm(dz, params[layer.weight])
            if self.layers[i - 1].elu:  # ELU'(z) = 1 + min(ELU(z), 0), as dz + dz min(.)
                dz = torch.addcmul(dz, dz, torch.clamp(outputs[i], max=0.0))
        return dz

    def _first_layer(self, grads: Params, dz: torch.Tensor, x: torch.Tensor) -> None:
        layer = self.layers[0]
        grads[layer.weight] = torch.bmm(dz.transpose(1, 2), x)
        grads[layer.bias] = dz.sum(1)

    def grad_and_loss(self, params: Params, batch: Batch) -> tuple[Params, torch.Tensor]:
        x, y = batch
        outputs = self._forward(params, x)
        logits = outputs[-1]
        picked = torch.log_softmax(logits, -1).gather(-1, y.unsqueeze(-1))
        grads: Params = {}
        dz = self._backward(params, outputs, self._output_grad(logits, y), grads)
        self._first_layer(grads, dz, x)
        return {k: grads[k] for k in params}, -picked.mean((1, 2))

    def grad(self, params: Params, batch: Batch) -> Params:
        x, y = batch
        outputs = self._forward(params, x)
        grads: Params = {}
        dz = self._backward(params, outputs, self._output_grad(outputs[-1], y), grads)
        self._first_layer(grads, dz, x)
        return {k: grads[k] for k in params}

    def hvp(self, params: Params, batch: Batch, v: Params) -> Params:
        return jvp(lambda p: self.grad(p, batch), (params,), (v,))[1]

    def grad_difference(self, params: Params, v: Params, step: Scalar, batch: Batch) -> Params:
        """The two gradients share layer 1's input: x (W1 +- s V1) = x W1 +- s x V1, and
        layer 1's weight gradient is linear in its output's gradient, so the difference
        of the two is one product, (dz+ - dz-)^T x. Two large products fewer a step."""
        x, y = batch
        first = self.layers[0]
        base = _linear(x, params[first.weight], params[first.bias])
        along = _linear(x, v[first.weight], v[first.bias])
        shift = per_user(step, along) * along
        rest = [k for k in params if k not in (first.weight, first.bias)]
        others, towards = {k: params[k] for k in rest}, {k: v[k] for k in rest}
        grads, dzs = [], []
        for sign, z1 in ((1.0, base + shift), (-1.0, base - shift)):
            w = axpy(others, towards, sign * step)
            outputs = self._forward(w, x, first=z1)
            part: Params = {}
            dzs.append(self._backward(w, outputs, self._output_grad(outputs[-1], y), part))
            grads.append(part)
        diff = sub(grads[0], grads[1])
        self._first_layer(diff, dzs[0] - dzs[1], x)
        return {k: diff[k] for k in params}
