"""A user's shard: its samples as float tensors, made where the user is hosted."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from perfed_ray.data.datasets import DataArrays
from perfed_ray.data.partition import UserIndices
from perfed_ray.data.scaling import InputScaling


@dataclass(frozen=True)
class Shard:
    """One user's training and test samples, pixels scaled by `input_scale`, on its device."""

    user: int
    group: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def materialise(
    data: DataArrays, idx: UserIndices, device: torch.device, scaling: InputScaling
) -> Shard:
    """Copy the user's samples out of the (possibly shared, read-only) data set."""
    return Shard(
        idx.user,
        idx.group,
        scaling.apply(data.x_train[idx.train], device),
        torch.from_numpy(data.y_train[idx.train]).to(device),
        scaling.apply(data.x_test[idx.test], device),
        torch.from_numpy(data.y_test[idx.test]).to(device),
    )
