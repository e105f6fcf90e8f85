"""Models: the paper's MLP (Section 5) and a small CNN, used as pure functions.

Every model takes flattened inputs (the protocol's layout, scaled by `input_scale`), so the
data pipeline is the same whichever model a run picks; the CNN restores the
image shape itself.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from perfed_ray.algorithms import LossFn, Params


class MLP(nn.Module):
    """d -> 80 -> ELU -> 60 -> ELU -> classes, PyTorch's default initialisation."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(int(np.prod(input_shape)), 80), nn.ELU(),
            nn.Linear(80, 60), nn.ELU(),
            nn.Linear(60, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """Two 5x5 convolutions with max-pooling and one hidden layer: a second choice for images."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)
        channels, height, width = self.input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, 5, padding=2), nn.ELU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.ELU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Linear(32 * (height // 4) * (width // 4), 64), nn.ELU(),
            nn.Linear(64, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.view(-1, *self.input_shape)))


MODELS: dict[str, type[nn.Module]] = {"mlp": MLP, "cnn": CNN}


def build_model(name: str, input_shape: tuple[int, ...], n_classes: int,
                seed: int | None = None) -> nn.Module:
    """A fresh model; with `seed`, its initial weights are a function of the seed alone."""
    if seed is None:
        return MODELS[name](input_shape, n_classes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name](input_shape, n_classes)


def params_of(model: nn.Module) -> Params:
    """The model's parameters as a plain dict of detached tensors."""
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def cross_entropy_loss(model: nn.Module) -> LossFn:
    """The loss f(w; x, y) of Section 5 as a function of explicit parameters."""

    def loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(functional_call(model, params, (x,)), y)

    return loss


def predict(model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
    """Logits of the model with the given parameters."""
    return functional_call(model, params, (x,))


class FlatParams:
    """Converts between parameter dicts and one flat float32 vector.

    Weights travel between driver and actors as one NumPy vector: Ray moves it
    through the object store without copying, the server's mean is one line,
    and its size in bytes is exact.
    """

    def __init__(self, params: Params) -> None:
        self.names = list(params)
        self.shapes = [tuple(params[k].shape) for k in self.names]
        self.sizes = [int(np.prod(s)) for s in self.shapes]

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def flatten(self, params: Params) -> np.ndarray:
        return torch.cat([params[k].detach().reshape(-1).cpu() for k in self.names]).numpy()

    def unflatten(self, vector: np.ndarray, device: torch.device | str = "cpu") -> Params:
        # A copy: vectors from the object store are read-only.
        flat = torch.tensor(vector, dtype=torch.float32, device=device)
        parts = torch.split(flat, self.sizes)
        return {k: p.reshape(s) for k, p, s in zip(self.names, parts, self.shapes, strict=True)}
