"""The bulk permutations equal torch.randperm's, so every committed run's batches stay."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perfed_ray.data import permutations
from perfed_ray.data.batches import draw, round_indices
from perfed_ray.data.permutations import randperm_heads
from perfed_ray.seeding import Stream, torch_generator


def _torch_heads(seed: int, n: int, count: int, length: int) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n, generator=gen)[:length] for _ in range(count)]).numpy()


@pytest.mark.parametrize("chunk", [permutations.CHUNK, 7])  # one chunk; a chunk per generator
def test_heads_equal_torch_randperm(monkeypatch, chunk):
    monkeypatch.setattr(permutations, "CHUNK", chunk)
    seeds = [0, 1, 2**32 - 1, 123_456_789, 42, 7]
    sizes = [1, 2, 60, 1000, 40, 3]
    counts = [3, 5, 30, 4, 2, 9]
    length = [1, 2, 40, 40, 40, 3]
    heads = randperm_heads(seeds, sizes, counts, length)
    for h, s, n, k, m in zip(heads, seeds, sizes, counts, length, strict=True):
        np.testing.assert_array_equal(h, _torch_heads(s, n, k, m))


def test_round_indices_are_each_users_draws():
    users, sizes = [3, 0, 11, 5], [60, 7, 1200, 40]  # one user smaller than a batch
    tau, per_step, drawn, batch = 3, 2, 3, 10
    got = round_indices(5, users, 4, sizes, tau, per_step, batch, drawn)
    assert got.shape == (4, tau, per_step, batch)
    for i, (user, n) in enumerate(zip(users, sizes, strict=True)):
        gen = torch_generator(5, Stream.LOCAL_TRAINING, user, 4)
        want = torch.stack([draw(n, batch, gen) for _ in range(tau * drawn)])
        assert torch.equal(got[i], want.view(tau, drawn, batch)[:, :per_step])


def test_sizes_outside_torchs_shuffle_are_refused():
    with pytest.raises(ValueError, match="outside"):
        randperm_heads([0], [0], [1], [1])
