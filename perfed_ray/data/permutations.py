"""The permutations `torch.randperm` draws, for many generators at once.

A user's batches are the heads of permutations drawn by `torch.randperm` from the
user's own generator (:mod:`perfed_ray.data.batches`). One call per batch costs about
6 microseconds of dispatch for a few dozen swaps: thirty calls a user (HF's tau = 10
steps of three batches) make a GPU wait 300 ms for 1000 users' indices, against 50 ms
of their arithmetic. Here the same permutations come in bulk: every generator's
words from NumPy, every shuffle at once in a few hundred array operations. That fixed
cost pays from a few hundred batches a round on a CPU (below, :mod:`batches` calls
torch.randperm itself) and always on a GPU.

torch's CPU generator is the 32-bit Mersenne Twister seeded as NumPy's legacy
`RandomState` seeds it, and for n below 2^32 / 20 `randperm` is a forward
Fisher-Yates shuffle: for i = 0 .. n - 2 it swaps positions i and i + (w mod (n - i)),
w the generator's next 32-bit word. So a generator's words come from NumPy's
`MT19937`, and the shuffles of every permutation run side by side, one vectorised swap
per position, stopping where the heads asked for are final (a forward shuffle fixes
position i at step i) though each permutation still consumes its n - 1 words. The
shuffles run where the batches are gathered, on the actor's device.
`tests/test_permutations.py` checks the result against `torch.randperm` itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

TORCH_SHUFFLE_MAX = 2**32 // 20  # randperm's 32-bit Fisher-Yates below this n
CHUNK = 2**24  # entries of the permutations shuffled at once (int32: 64 MB)
WORDS = 2**20  # Mersenne Twister words drawn at once, at most (about: one permutation's)


def used_words(bits: np.random.MT19937, seed: int, n: int, count: int, used: int) -> np.ndarray:
    """The words the first `used` swaps of each of `count` successive torch.randperm(n)
    of torch.Generator().manual_seed(seed) (seed below 2^32) take: [count, used] int64.
    Every permutation consumes n - 1 words; they are drawn WORDS at a time at most, so
    a user of millions of samples costs megabytes, not a copy of its every permutation.
    `bits` is reseeded, made once: making one costs more than a small user's words."""
    bits._legacy_seeding(seed)  # private: RandomState's seeding, which torch's matches
    at_once = max(1, WORDS // (n - 1))
    parts = [
        bits.random_raw(min(at_once, count - done) * (n - 1)).reshape(-1, n - 1)[:, :used]
        for done in range(0, count, at_once)
    ]
    return np.concatenate(parts).astype(np.int64)


def randperm_batches(
    seeds: Sequence[int],
    sizes: Sequence[int],
    batches: int,
    batch_size: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """For each generator j, seeded seeds[j] (below 2^32, as
    :func:`perfed_ray.seeding.stream_seed` makes them): `batches` successive batches of
    :func:`perfed_ray.data.batches.draw` from range(sizes[j]), [G, batches, batch_size]
    int64 on `device`. A batch is the head of one torch.randperm, or, where n is below
    the batch size, of ceil(B / n) of them end to end. The words come from the CPU; the
    shuffles and the gathering of heads run on `device`, in chunks of about CHUNK
    entries (on a GPU: a few hundred small kernels a chunk, whatever its users)."""
    for n in sizes:
        if not 1 <= n < TORCH_SHUFFLE_MAX:
            raise ValueError(f"randperm_batches: n = {n} outside [1, {TORCH_SHUFFLE_MAX})")
    laps = [-(-batch_size // n) for n in sizes]  # permutations a batch: 1 unless n < B
    parts, start = [], 0
    while start < len(seeds):
        stop, width, rows = start, 0, 0
        while stop < len(seeds):
            wider, more = max(width, sizes[stop]), rows + batches * laps[stop]
            if stop > start and wider * more > CHUNK:
                break
            width, rows, stop = wider, more, stop + 1
        chunk = slice(start, stop)
        perms = _shuffle(
            seeds[chunk], sizes[chunk], laps[chunk], batches, batch_size, width, device
        )
        parts.append(_heads(perms, sizes[chunk], laps[chunk], batches, batch_size))
        start = stop
    return torch.cat(parts)


def _shuffle(seeds, sizes, laps, batches: int, batch_size: int, width: int, device):
    """Every permutation of a chunk's generators (batches x laps each), as far as its
    batches' heads go, one row each: [rows, width] int32 on `device`."""
    counts = [batches * k for k in laps]
    steps = [min(batch_size, n - 1) for n in sizes]  # heads longer than n: all of it
    rows, most = sum(counts), max(steps)
    words = np.zeros((most, rows), np.int64)  # step-major: a step's words are contiguous
    bits, row = np.random.MT19937(0), 0
    for seed, n, k, s in zip(seeds, sizes, counts, steps, strict=True):
        if s:
            words[:s, row : row + k] = used_words(bits, seed, n, k, s).T
        row += k
    # Rows past their own steps draw words of 0: they swap position i with itself.
    by_step = torch.from_numpy(words).to(device)
    n_rows = torch.from_numpy(np.repeat(np.asarray(sizes, np.int64), counts)).to(device)
    flat = torch.arange(width, dtype=torch.int32, device=device).repeat(rows)
    first = torch.arange(rows, device=device) * width
    for i in range(most):
        here = first + i
        other = here + by_step[i] % (n_rows - i).clamp_min(1)
        moved = flat[here]
        flat[here] = flat[other]
        flat[other] = moved
    return flat.view(rows, width)


def _heads(perms: torch.Tensor, sizes, laps, batches: int, batch_size: int) -> torch.Tensor:
    """The chunk's batches, [G, batches, B], gathered from its permutations in one
    indexing: entry j of a batch is entry j mod n of the batch's (j div n)-th lap."""
    device, width = perms.device, perms.shape[1]

    def column(values) -> torch.Tensor:  # one value a generator, broadcast over [b, j]
        return torch.tensor(list(values), device=device)[:, None, None]

    first_row = column(np.cumsum([0, *(batches * k for k in laps[:-1])]))
    n, k = column(sizes), column(laps)
    b = torch.arange(batches, device=device)[None, :, None]
    j = torch.arange(batch_size, device=device)[None, None, :]
    at = (first_row + b * k + j // n) * width + j % n
    return perms.view(-1)[at].long()
