"""How uint8 pixels become model inputs (`input_scale`): unit, standardize or raw.

The paper does not say how it scaled its inputs (PROTOCOL.md fixes [0, 1]);
the scale changes the size of every gradient and so how far a fixed step
(beta, alpha, HF's delta) moves the model. The constants are computed once,
on the driver, from the whole training set, and shipped to every actor, so
all users see the same affine map however their shards are made.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from perfed_ray.data.datasets import DataArrays


@dataclass(frozen=True)
class InputScaling:
    """x -> (x - offset[c]) / divisor[c] for the pixels of channel c (CHW-flat layout);
    a division, so `unit` gives exactly the float32 x / 255 that results before
    `input_scale` existed were computed with."""

    offset: np.ndarray  # float64 [channels]
    divisor: np.ndarray  # float64 [channels]

    def apply(self, x: np.ndarray, device: torch.device) -> torch.Tensor:
        """uint8 [N, C*H*W] -> float32 inputs on `device`."""
        channels = len(self.offset)
        per_channel = x.reshape(len(x), channels, -1).astype(np.float32)
        scaled = (per_channel - self.offset[:, None].astype(np.float32)) / self.divisor[
            :, None
        ].astype(np.float32)
        return torch.from_numpy(scaled.reshape(len(x), -1)).to(device)


def channel_moments(data: DataArrays) -> tuple[np.ndarray, np.ndarray]:
    """Exact per-channel mean and (population) standard deviation of the training
    pixels, from each channel's histogram of the 256 values: no float copy of the
    data set, and the same numbers on every machine."""
    channels = data.input_shape[0]
    pixels = data.x_train.reshape(len(data.x_train), channels, -1)
    values = np.arange(256, dtype=np.float64)
    means, stds = np.empty(channels), np.empty(channels)
    for c in range(channels):
        counts = np.bincount(pixels[:, c].ravel(), minlength=256).astype(np.float64)
        total = counts.sum()
        means[c] = counts @ values / total
        stds[c] = np.sqrt(max(counts @ (values - means[c]) ** 2 / total, 0.0))
    return means, stds


def input_scaling(data: DataArrays, how: str) -> InputScaling:
    """The map for `input_scale` = unit ([0, 1]), standardize (zero mean, unit
    standard deviation per channel over the training set) or raw (0-255)."""
    channels = data.input_shape[0]
    if how == "unit":
        return InputScaling(np.zeros(channels), np.full(channels, 255.0))
    if how == "raw":
        return InputScaling(np.zeros(channels), np.ones(channels))
    means, stds = channel_moments(data)
    return InputScaling(means, np.where(stds > 0, stds, 1.0))  # a constant channel -> 0
