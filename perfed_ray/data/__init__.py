"""Data sets, partitioners, user shards and where actors get them from."""

from perfed_ray.data.datasets import DataArrays, DataError, load_dataset, resolve_root
from perfed_ray.data.partition import UserIndices, partition
from perfed_ray.data.scaling import InputScaling, input_scaling
from perfed_ray.data.shards import Shard, materialise
from perfed_ray.data.sources import PartitionedShards, ShardSource, SyntheticShards

__all__ = [
    "DataArrays",
    "DataError",
    "InputScaling",
    "PartitionedShards",
    "Shard",
    "ShardSource",
    "SyntheticShards",
    "UserIndices",
    "input_scaling",
    "load_dataset",
    "materialise",
    "partition",
    "resolve_root",
]
