"""A validation split carved out of each user's training samples (`validation`).

Choosing step sizes by their test accuracy and then reporting that accuracy
overstates it; a search (`perfed-ray sweep` with `search:`) scores each user's
held-out training samples instead, so the test shards are looked at once, by the
runs that use the chosen values. The held-out samples take the test shard's place
in the user's shard, so training, personalisation and scoring need no other change:
they never train the model, and evaluation scores them.
"""

from __future__ import annotations

import dataclasses

import torch

from perfed_ray.data.shards import Shard
from perfed_ray.seeding import Stream, numpy_rng


def hold_out(shard: Shard, fraction: float, seed: int) -> Shard:
    """The shard with `fraction` of its training samples (at least one, at most all but
    one), drawn from the user's own stream, moved into its test set, which they replace.
    The same user, seed and fraction hold out the same samples wherever the user is
    hosted."""
    n = len(shard.y_train)
    held = min(max(1, round(fraction * n)), n - 1)
    order = numpy_rng(seed, Stream.VALIDATION, shard.user).permutation(n)
    device = shard.x_train.device
    test = torch.from_numpy(order[:held].copy()).sort().values.to(device)
    train = torch.from_numpy(order[held:].copy()).sort().values.to(device)
    return dataclasses.replace(
        shard,
        x_train=shard.x_train[train],
        y_train=shard.y_train[train],
        x_test=shard.x_train[test],
        y_test=shard.y_train[test],
    )
