"""Data sets, partitioners and user shards."""

from perfed_ray.data.datasets import DataArrays, DataError, load_dataset, resolve_root
from perfed_ray.data.partition import UserIndices, partition
from perfed_ray.data.shards import Shard, materialise

__all__ = ["DataArrays", "DataError", "Shard", "UserIndices", "load_dataset", "materialise",
           "partition", "resolve_root"]
