"""Where an actor's shards come from: a partitioned data set, or a generator.

A source is what the driver hands an actor so it can build its users'
shards itself; it carries indices or seeds, never samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from perfed_ray.data.datasets import DataArrays, load_dataset
from perfed_ray.data.partition import UserIndices
from perfed_ray.data.scaling import InputScaling
from perfed_ray.data.shards import Shard, materialise
from perfed_ray.data.synthetic import CLASSES, FEATURES, UserData


class ShardSource(Protocol):
    """Builds the shards of the given users inside the actor that hosts them."""

    input_shape: tuple[int, int, int]
    n_classes: int
    scaling: InputScaling | None  # how pixels became inputs; None: features as generated

    def data_for(self, data: DataArrays | None) -> DataArrays | None:
        """What :meth:`shards` draws from in this actor: the shared data set, or the
        one the actor loads itself (once), or nothing for generated users."""

    def shards(
        self, users: list[int], device: torch.device, data: DataArrays | None
    ) -> dict[int, Shard]: ...


@dataclass(frozen=True)
class PartitionedShards:
    """Users' index sets into a data set that is either shared through the object
    store (`data` given) or read from the data root by the actor itself, and the
    input scaling computed once on the driver."""

    dataset: str
    data_root: str
    seed: int
    indices: dict[int, UserIndices]
    input_shape: tuple[int, int, int]
    n_classes: int
    scaling: InputScaling
    data_folder: str = ""

    def data_for(self, data: DataArrays | None) -> DataArrays:
        if data is None:
            data = load_dataset(self.dataset, self.data_root, False, self.seed, self.data_folder)
        return data

    def shards(
        self, users: list[int], device: torch.device, data: DataArrays | None
    ) -> dict[int, Shard]:
        data = self.data_for(data)
        return {u: materialise(data, self.indices[u], device, self.scaling) for u in users}


@dataclass(frozen=True)
class SyntheticShards:
    """Generated users (:mod:`perfed_ray.data.synthetic`), made from the seed and their
    ids by `generate`."""

    generate: Callable[[int, float, float, int], UserData]
    seed: int
    alpha: float
    beta: float
    input_shape: tuple[int, int, int] = (1, 1, FEATURES)
    n_classes: int = CLASSES
    scaling: None = None

    def data_for(self, data: DataArrays | None) -> None:
        return None

    def shards(
        self, users: list[int], device: torch.device, data: DataArrays | None
    ) -> dict[int, Shard]:
        out = {}
        for u in users:
            x_train, y_train, x_test, y_test = self.generate(self.seed, self.alpha, self.beta, u)
            out[u] = Shard(
                u,
                "all",
                *(torch.from_numpy(a).to(device) for a in (x_train, y_train, x_test, y_test)),
            )
        return out
