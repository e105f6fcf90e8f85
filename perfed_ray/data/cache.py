"""Users' shards made when they are needed, kept within a byte budget.

An actor hosting many users keeps only their descriptions (index sets into the one
shared copy of the data set, or the seed of a generated user) and makes a user's
float tensors when the user is sampled or evaluated. The most recently used shards
stay, up to `shard_cache_mb`; so an actor's memory follows the users of a round,
not the users it hosts. A shard is a pure function of its description, so results
do not depend on the budget: a shard evicted and made again is the same shard.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

import torch

from perfed_ray.data.datasets import DataArrays
from perfed_ray.data.shards import Shard
from perfed_ray.data.sources import ShardSource


def shard_bytes(shard: Shard) -> int:
    return sum(t.nbytes for t in (shard.x_train, shard.y_train, shard.x_test, shard.y_test))


class ShardCache:
    """`cache[user]` is the user's shard, made on first use and kept while the shards
    used since fit in `budget_bytes` (None: kept for the whole run). The shard just
    asked for is always kept, even alone over the budget, since its caller is about to
    use it."""

    def __init__(
        self,
        source: ShardSource,
        users: Iterable[int],
        device: torch.device,
        data: DataArrays | None,
        budget_bytes: int | None = None,
        prepare: Callable[[Shard], Shard] | None = None,
    ) -> None:
        self.source = source
        self.hosted = users if isinstance(users, range) else frozenset(users)
        self.device = device
        self.data = source.data_for(data)
        self.budget = budget_bytes
        self.prepare = prepare  # e.g. holding out a validation split, as each shard is made
        self.kept: OrderedDict[int, Shard] = OrderedDict()
        self.bytes = 0
        self.made = 0  # shards made so far, for tests and benchmarks

    def __getitem__(self, user: int) -> Shard:
        shard = self.kept.get(user)
        if shard is not None:
            self.kept.move_to_end(user)
            return shard
        if user not in self.hosted:
            raise KeyError(user)
        shard = self.source.shards([user], self.device, self.data)[user]
        if self.prepare is not None:
            shard = self.prepare(shard)
        self.made += 1
        self.kept[user] = shard
        self.bytes += shard_bytes(shard)
        while self.budget is not None and self.bytes > self.budget and len(self.kept) > 1:
            _, old = self.kept.popitem(last=False)
            self.bytes -= shard_bytes(old)
        return shard
