"""The bulk permutations equal torch.randperm's, so every committed run's batches stay."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perfed_ray.data import batches, permutations
from perfed_ray.data.batches import draw, round_indices
from perfed_ray.data.permutations import randperm_batches
from perfed_ray.seeding import Stream, stream_seed, stream_seeds, torch_generator


@pytest.mark.parametrize("chunk", [permutations.CHUNK, 7])  # one chunk; a chunk per generator
def test_batches_equal_torch_randperms(monkeypatch, chunk):
    """Heads of torch.randperm, and for n below the batch size several end to end; the
    words drawn in pieces (WORDS small) or whole."""
    monkeypatch.setattr(permutations, "CHUNK", chunk)
    monkeypatch.setattr(permutations, "WORDS", 2**20 if chunk > 7 else 100)
    seeds = [0, 1, 2**32 - 1, 123_456_789, 42, 7]
    sizes = [1, 2, 60, 1000, 40, 3]
    got = randperm_batches(seeds, sizes, batches=4, batch_size=40)
    assert got.shape == (len(seeds), 4, 40) and got.dtype == torch.int64
    for drawn, seed, n in zip(got, seeds, sizes, strict=True):
        gen = torch.Generator().manual_seed(seed)
        want = torch.stack([draw(n, 40, gen) for _ in range(4)])
        assert torch.equal(drawn, want)
    gen = torch.Generator().manual_seed(1000)  # and draw() is torch.randperm's head
    assert torch.equal(
        draw(60, 40, gen), torch.randperm(60, generator=torch.Generator().manual_seed(1000))[:40]
    )


@pytest.mark.parametrize("bulk", [True, False])
def test_round_indices_are_each_users_draws(monkeypatch, bulk):
    """Both ways to a round's indices: the bulk shuffle, or on a CPU for few batches
    torch.randperm itself."""
    monkeypatch.setattr(batches, "BULK_BATCHES", 0 if bulk else 10**9)
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
        randperm_batches([0], [0], 1, 1)


def test_stream_seeds_are_stream_seed_for_every_row():
    """The vectorised hash equals NumPy's SeedSequence, seeds of one word or several."""
    keys = np.array([[u, r] for u in range(0, 3000, 37) for r in (0, 1, 999, 2**32 - 1)])
    for seed in (0, 7, 2**32 - 1, 2**40 + 5):
        got = stream_seeds(seed, Stream.LOCAL_TRAINING, keys)
        want = [stream_seed(seed, Stream.LOCAL_TRAINING, int(u), int(r)) for u, r in keys]
        assert got.tolist() == want
    with pytest.raises(ValueError, match="below 2"):
        stream_seeds(0, Stream.LOCAL_TRAINING, np.array([[2**32, 0]]))
