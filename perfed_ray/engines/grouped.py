"""A chain of convolutions, pooling, activations and linear layers (the CNNs) for a block
of users at once: the users' channels side by side in one image, every user's filters
one group of a grouped convolution, every linear layer one batched matrix product.
Gradients come from autodiff of the sum of the users' losses: users are independent,
so its gradient with respect to their stacked parameters is each user's own.

Where this pays is a measurement, not a rule (`engine: auto` makes it): on a GPU one
grouped convolution a layer replaces a kernel launch per user; on CPU, where a
convolution is compute-bound and a grouped one runs no faster than its groups one by
one, the per-user loop tends to win. A model declares such a chain with
``grouped_layers()`` (see :class:`perfed_ray.models.CNN`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import grad, grad_and_value

from perfed_ray.algorithms.base import Batch
from perfed_ray.algorithms.tree import Params
from perfed_ray.engines.functional import Curvature
from perfed_ray.engines.fused import Fused
from perfed_ray.engines.stacked import PerUser
from perfed_ray.masks import Masks, apply

Chain = list[tuple[str, nn.Module]]  # parameter-name prefix, module, in the order applied

PER_CHANNEL = (nn.ReLU, nn.ELU, nn.Tanh, nn.Sigmoid, nn.MaxPool2d, nn.AvgPool2d)


def grouped_chain(model: nn.Module) -> tuple[tuple[int, ...], Chain] | None:
    """(input shape, chain) if the model declares one this engine runs: convolutions and
    modules that act on each channel alone, one Flatten of the whole image, then linear
    layers and activations; else None."""
    declared = getattr(model, "grouped_layers", None)
    if declared is None:
        return None
    shape, chain = declared()
    image = True
    for _, module in chain:
        if isinstance(module, nn.Conv2d):
            fits = image and module.padding_mode == "zeros"
        elif isinstance(module, nn.Flatten):
            fits, image = image and module.start_dim == 1 and module.end_dim == -1, False
        elif isinstance(module, nn.Linear):
            fits = not image
        elif type(module) is nn.Dropout:
            fits = True
        else:
            fits = isinstance(module, PER_CHANNEL) and (image or not hasattr(module, "kernel_size"))
        if not fits:
            return None
    return (tuple(shape), chain) if not image else None


class GroupedOps(PerUser, Curvature):
    """:class:`~perfed_ray.algorithms.base.ModelOps` for users stacked along axis 0."""

    def __init__(self, input_shape: tuple[int, ...], chain: Chain) -> None:
        self.input_shape = input_shape
        self.chain = chain

    def logits(self, params: Params, x: torch.Tensor, masks: Masks | None = None) -> torch.Tensor:
        """x [U, B, features] -> [U, B, classes]; `masks` [U, B, ...] at each dropout site
        (none: dropout is the identity)."""
        users, batch = x.shape[:2]
        channels, *side = self.input_shape
        h = x.reshape(users, batch, *self.input_shape).transpose(0, 1)
        h = h.reshape(batch, users * channels, *side)  # user u's channels: a block of them
        for name, module in self.chain:
            bias = params.get(f"{name}.bias")
            if isinstance(module, nn.Conv2d):
                h = nn.functional.conv2d(
                    h,
                    params[f"{name}.weight"].flatten(0, 1),
                    None if bias is None else bias.flatten(),
                    module.stride,
                    module.padding,
                    module.dilation,
                    users * module.groups,
                )
            elif isinstance(module, nn.Flatten):
                h = h.reshape(batch, users, -1).transpose(0, 1)  # each user's (C, H, W)
            elif isinstance(module, nn.Linear):
                w = params[f"{name}.weight"].transpose(1, 2)
                h = torch.bmm(h, w) if bias is None else torch.baddbmm(bias.unsqueeze(1), h, w)
            elif isinstance(module, nn.Dropout):
                if masks is not None and name in masks:
                    mask = masks[name]
                    if h.ndim > 3:  # the image layout: user u's channels a block of them
                        mask = mask.transpose(0, 1).reshape(h.shape)
                    h = apply(h, mask, module.p)
            else:
                h = module(h)
        return h

    def _losses(
        self, params: Params, x: torch.Tensor, y: torch.Tensor, masks: Masks | None = None
    ) -> torch.Tensor:
        """Each user's mean cross-entropy, [U]."""
        logits = self.logits(params, x, masks)
        each = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
        return each.view(y.shape).mean(1)

    def _total(self, params: Params, x: torch.Tensor, y: torch.Tensor, masks=None):
        losses = self._losses(params, x, y, masks)
        return losses.sum(), losses

    def loss(self, params: Params, batch: Batch) -> torch.Tensor:
        return self._losses(params, *batch)

    def grad_and_loss(self, params: Params, batch: Batch) -> tuple[Params, torch.Tensor]:
        grads, (_, losses) = grad_and_value(self._total, has_aux=True)(params, *batch)
        return grads, losses

    def grad(self, params: Params, batch: Batch) -> Params:
        return grad(self._total, has_aux=True)(params, *batch)[0]


class Grouped(Fused):
    """The fused engine's blocks of users, each block's maths by :class:`GroupedOps`."""

    @staticmethod
    def stacked_ops(model: nn.Module) -> GroupedOps:
        found = grouped_chain(model)
        if found is None:
            raise ValueError(f"{type(model).__name__} declares no grouped_layers()")
        return GroupedOps(*found)
