"""How uint8 pixels become model inputs (`input_scale`): unit, standardize,
standardize-pixel, imagenet or raw.

The paper does not say how it scaled its inputs (PROTOCOL.md fixes [0, 1]);
the scale changes the size of every gradient and so how far a fixed step
(beta, alpha, HF's delta) moves the model. The constants are computed once,
on the driver, from the whole training set, and shipped to every actor, so
all users see the same affine map however their shards are made.

Float features (a data set split by user, whose generator scaled them) are
already inputs: `unit` leaves them as they are, and nothing else applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from perfed_ray.data.datasets import DataArrays, DataError


@dataclass(frozen=True)
class InputScaling:
    """x -> (x - offset[g]) / divisor[g] for the features of part g, the features cut
    into len(offset) equal consecutive parts: channels (CHW-flat layout), or single
    pixels; a division, so `unit` gives exactly the float32 x / 255 of the paper's
    protocol, which the committed results were computed with."""

    offset: np.ndarray  # float64 [channels] or [features]
    divisor: np.ndarray  # float64, the same length

    def apply(self, x: np.ndarray, device: torch.device) -> torch.Tensor:
        """uint8 (or float) [N, C*H*W] -> float32 inputs on `device`."""
        parts = len(self.offset)
        per_part = x.reshape(len(x), parts, -1).astype(np.float32)
        scaled = (per_part - self.offset[:, None].astype(np.float32)) / self.divisor[
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


PIXEL_CHUNK = 4096  # training images summed at a time: bounds the int64 copy to ~100 MB


def pixel_moments(data: DataArrays) -> tuple[np.ndarray, np.ndarray]:
    """Exact mean and (population) standard deviation of every feature (pixel) over the
    training set, from integer sums of the values and of their squares, taken a chunk
    of images at a time: no float copy of the data set, the same numbers everywhere."""
    n = len(data.x_train)
    total = np.zeros(data.x_train.shape[1], dtype=np.int64)
    squares = np.zeros_like(total)
    for start in range(0, n, PIXEL_CHUNK):
        chunk = data.x_train[start : start + PIXEL_CHUNK].astype(np.int64)
        total += chunk.sum(axis=0)
        squares += (chunk * chunk).sum(axis=0)
    variance = (n * squares - total * total) / float(n) ** 2  # exact numerator
    return total / n, np.sqrt(variance)


# torchvision's ImageNet statistics of [0, 1] RGB pixels, which FedRep's and LG-FedAvg's
# code normalise CIFAR-10 with: Normalize(mean, std) after ToTensor.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def input_scaling(data: DataArrays, how: str) -> InputScaling:
    """The map for `input_scale` = unit ([0, 1]), standardize (zero mean, unit
    standard deviation per channel over the training set), standardize-pixel (the same
    for each pixel on its own, as pFedMe's and FedProx's MNIST generators do), imagenet
    (ImageNet's fixed RGB statistics, as FedRep's CIFAR code) or raw (0-255). Float
    features are left as they are (`unit` only)."""
    channels = data.input_shape[0]
    if data.x_train.dtype != np.uint8:
        if how != "unit":
            raise DataError(
                f"input_scale = {how!r} applies to image pixels; {data.name} has "
                f"real-valued features: use input_scale: unit"
            )
        return InputScaling(np.zeros(1), np.ones(1))
    if how == "unit":
        return InputScaling(np.zeros(channels), np.full(channels, 255.0))
    if how == "raw":
        return InputScaling(np.zeros(channels), np.ones(channels))
    if how == "imagenet":
        if channels != 3:
            raise DataError(
                f"input_scale = imagenet standardises RGB images; {data.name} has "
                f"{channels} channel(s): use standardize"
            )
        return InputScaling(255.0 * IMAGENET_MEAN, 255.0 * IMAGENET_STD)
    means, stds = pixel_moments(data) if how == "standardize-pixel" else channel_moments(data)
    return InputScaling(means, np.where(stds > 0, stds, 1.0))  # a constant part -> 0
