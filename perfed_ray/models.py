"""Models: the paper's MLP (Section 5), multinomial logistic regression and the CNNs
of the methods' and tools' benchmarks, used as pure functions.

Every model takes flattened inputs (the protocol's layout, scaled by `input_scale`), so the
data pipeline is the same whichever model a run picks; the CNN restores the
image shape itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from perfed_ray.algorithms.tree import Params, eager_plain
from perfed_ray.seeding import Stream, numpy_rng

if TYPE_CHECKING:
    from perfed_ray.config.schema import RunConfig
    from perfed_ray.data import ShardSource


class MLP(nn.Module):
    """d -> 80 -> ELU -> 60 -> ELU -> classes, PyTorch's default initialisation."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(int(np.prod(input_shape)), 80),
            nn.ELU(),
            nn.Linear(80, 60),
            nn.ELU(),
            nn.Linear(60, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def fused_layers(self) -> tuple[str, nn.Sequential]:
        """Declares the model a chain of Linear and ELU layers, so the `fused` engine
        can run it: (the parameters' name prefix, the chain)."""
        return "net", self.net


class LogReg(nn.Module):
    """Multinomial logistic regression, d -> classes: the convex model of FedProx's
    Synthetic benchmark (Li et al. 2020) and pFedMe's MNIST "MLR" (Dinh et al. 2020)."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(int(np.prod(input_shape)), n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def fused_layers(self) -> tuple[str, nn.Sequential]:
        """One Linear layer: a chain the `fused` engine runs."""
        return "net", self.net


def _chain(model: nn.Module, *names: str) -> list[tuple[str, nn.Module]]:
    """The modules of the model's Sequentials `names`, in order, with their parameters'
    name prefixes."""
    return [(f"{name}.{i}", m) for name in names for i, m in enumerate(getattr(model, name))]


def as_images(x: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """Flattened inputs x [N, C*H*W] as the model's images [N, C, H, W]: on a CPU, run
    eagerly (not under `torch.func`'s transforms, nor while `torch.compile` traces),
    laid out as the model's `cpu_layout` says (channels-last: oneDNN's convolutions and
    their gradients run faster so, experiments/bench/step_overhead.py); the same
    numbers to rounding, in the same logical order."""
    shaped = x.view(-1, *model.input_shape)
    layout = getattr(model, "cpu_layout", torch.contiguous_format)
    if layout is torch.contiguous_format or shaped.device.type != "cpu":
        return shaped
    return shaped.contiguous(memory_format=layout) if eager_plain([shaped]) else shaped


class ImageChain(nn.Module):
    """A CNN over images whose flattened inputs it restores to `input_shape`, laid out on
    a CPU as `as_images` says, run through its Sequentials `parts` in order: a chain the
    `grouped` engine runs."""

    images = True  # needs inputs of a (channels, height, width) shape
    cpu_layout = torch.channels_last  # the images' layout on a CPU: see `as_images`
    parts: tuple[str, ...] = ("features", "classifier")

    def __init__(self, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = as_images(x, self)
        for part in self.parts:
            h = getattr(self, part)(h)
        return h

    def grouped_layers(self) -> tuple[tuple[int, ...], list[tuple[str, nn.Module]]]:
        """Declares the model a chain the `grouped` engine runs: (input shape, layers)."""
        return self.input_shape, _chain(self, *self.parts)


class CNN(ImageChain):
    """Two 5x5 convolutions with max-pooling and one hidden layer: a second choice for images."""

    parts = ("features", "head")

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        super().__init__(input_shape)
        channels, height, width = self.input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, 5, padding=2),
            nn.ELU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2),
            nn.ELU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Linear(32 * (height // 4) * (width // 4), 64),
            nn.ELU(),
            nn.Linear(64, n_classes),
        )


class LeNet(ImageChain):
    """LeNet-5 with 64 channels: two 5x5 convolutions without padding, each ReLU and 2x2
    max-pooling, then 120 -> ReLU -> 64 -> ReLU -> classes: the CIFAR CNN of
    LG-FedAvg's and FedRep's authors (lgcollins/FedRep, models/Nets.py `CNNCifar`),
    whose last layer is FedRep's head. Theirs ends in log-softmax before a cross-entropy
    loss; log-softmax is idempotent, so logits give the same loss and predictions."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        super().__init__(input_shape)
        channels, height, width = self.input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 64, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        side = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
        self.classifier = nn.Sequential(
            nn.Linear(64 * side[0] * side[1], 120),
            nn.ReLU(),
            nn.Linear(120, 64),
            nn.ReLU(),
            nn.Linear(64, n_classes),
        )


class SimpleCNN(ImageChain):
    """pfl-research's `simple_cnn` (apple/pfl-research, benchmarks/model/pytorch/cnn.py),
    the model of their CIFAR-10 benchmark: 3x3 convolutions to 32 and 64 channels without
    padding, each followed by ReLU, 2x2 max-pooling, dropout 0.25, a dense layer of 128
    with ReLU, dropout 0.5, and the output layer; Xavier-uniform weights (theirs, to match
    their TensorFlow model), PyTorch's default biases.

    Their model takes images channels-last and transposes them; ours are channels-first
    already. Dropout is applied in training steps (local and personalisation) with masks
    from the run's keyed streams (:mod:`perfed_ray.masks`), never in scoring."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        super().__init__(input_shape)
        channels, height, width = self.input_shape
        side = (height - 4) // 2, (width - 4) // 2
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(64 * side[0] * side[1], 128),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(128, n_classes),
        )
        for module in self.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                nn.init.xavier_uniform_(module.weight)


def build_model(
    name: str, input_shape: tuple[int, ...], n_classes: int, seed: int | None = None
) -> nn.Module:
    """A fresh model of a registered (or dotted-path) class, called with the input
    shape and the number of classes; with `seed`, its initial weights are a function
    of the seed alone."""
    from perfed_ray.registry import MODELS

    cls = MODELS.load(name)
    if seed is None:
        return cls(input_shape, n_classes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(input_shape, n_classes)


def initial_model(cfg: RunConfig, source: ShardSource) -> nn.Module:
    """The model with w_0: PyTorch's default initialisation, drawn from the run's seed,
    so the driver and every actor (a replacement one too) make the same w_0."""
    init_seed = int(numpy_rng(cfg.seed, Stream.MODEL_INIT).integers(2**31))
    return build_model(cfg.model, source.input_shape, source.n_classes, seed=init_seed)


def activation_bytes(model: nn.Module, sample_shape: tuple[int, ...]) -> int:
    """Bytes of the outputs of the model's layers (its modules without children) for one
    sample: one forward pass of a zero sample measures them."""
    total = 0

    def count(module: nn.Module, args: tuple, output) -> None:
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel() * output.element_size()

    leaves = [m for m in model.modules() if not any(m.children())]
    hooks = [m.register_forward_hook(count) for m in leaves]
    like = next(model.parameters())
    try:
        with torch.no_grad():
            model(torch.zeros(1, *sample_shape, dtype=like.dtype, device=like.device))
    finally:
        for hook in hooks:
            hook.remove()
    return max(total, 1)


def params_of(model: nn.Module) -> Params:
    """The model's parameters as a plain dict of detached tensors."""
    return {k: v.detach().clone() for k, v in model.named_parameters()}


class FlatParams:
    """Converts between parameter trees (dicts of tensors, possibly nested: a model, or
    a method's per-user state) and one flat vector, in the parameters' own dtype
    (float32; float64 where tests compare engines without float32's rounding).

    Weights travel between driver and actors as one NumPy vector: Ray moves it
    through the object store without copying, the server's mean is one line,
    and its size in bytes is exact.
    """

    def __init__(self, params: Params) -> None:
        leaves, self.spec = pytree.tree_flatten(params)
        self.shapes = [tuple(leaf.shape) for leaf in leaves]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.dtype = leaves[0].dtype

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def flatten(self, params: Params) -> np.ndarray:
        leaves = pytree.tree_leaves(params)
        return torch.cat([leaf.detach().reshape(-1).cpu() for leaf in leaves]).numpy()

    def unflatten(self, vector: np.ndarray, device: torch.device | str = "cpu") -> Params:
        # A copy: vectors from the object store are read-only.
        flat = torch.tensor(vector, dtype=self.dtype, device=device)
        parts = torch.split(flat, self.sizes)
        leaves = [p.reshape(s) for p, s in zip(parts, self.shapes, strict=True)]
        return pytree.tree_unflatten(leaves, self.spec)
