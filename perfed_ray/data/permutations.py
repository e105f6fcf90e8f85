"""The permutations `torch.randperm` draws, for many generators at once.

A user's batches are the heads of permutations drawn by `torch.randperm` from the
user's own generator (:mod:`perfed_ray.data.batches`). One call per batch costs about
6 microseconds of dispatch for a few dozen swaps: thirty calls a user (HF's tau = 10
steps of three batches) made a GPU wait 300 ms for 1000 users' indices while their
arithmetic took 50 ms. Here the same permutations come out of NumPy in bulk.

torch's CPU generator is the 32-bit Mersenne Twister seeded as NumPy's legacy
`RandomState` seeds it, and for n below 2^32 / 20 `randperm` is a forward
Fisher-Yates shuffle: for i = 0 .. n - 2 it swaps positions i and i + (w mod (n - i)),
w the generator's next 32-bit word. So a generator's words come from NumPy's
`MT19937`, and the shuffles of every permutation run side by side, one vectorised swap
per position, stopping where the heads asked for are final (a forward shuffle fixes
position i at step i) though each permutation still consumes its n - 1 words.
`tests/test_permutations.py` checks the result against `torch.randperm` itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TORCH_SHUFFLE_MAX = 2**32 // 20  # randperm's 32-bit Fisher-Yates below this n
CHUNK = 2**24  # entries of the permutations shuffled at once (int32: 64 MB)


def mt19937_words(bits: np.random.MT19937, seed: int, count: int) -> np.ndarray:
    """The first `count` 32-bit words of torch.Generator().manual_seed(seed)'s stream,
    seed below 2^32, as int64, from `bits` reseeded (made once: making one costs more
    than the words)."""
    bits._legacy_seeding(seed)  # private: RandomState's seeding, which torch's matches
    return bits.random_raw(count).astype(np.int64)


def randperm_heads(
    seeds: Sequence[int], sizes: Sequence[int], counts: Sequence[int], length: Sequence[int]
) -> list[np.ndarray]:
    """For each generator j, seeded seeds[j]: the first length[j] entries of each of
    counts[j] successive torch.randperm(sizes[j]) drawn from it, [counts[j], length[j]]
    int64. Generators are shuffled in chunks of about CHUNK entries."""
    for n in sizes:
        if not 1 <= n < TORCH_SHUFFLE_MAX:
            raise ValueError(f"randperm_heads: n = {n} outside [1, {TORCH_SHUFFLE_MAX})")
    heads: list[np.ndarray] = []
    start = 0
    while start < len(seeds):
        stop, width, rows = start, 0, 0
        while stop < len(seeds):
            wider, more = max(width, sizes[stop]), rows + counts[stop]
            if stop > start and wider * more > CHUNK:
                break
            width, rows, stop = wider, more, stop + 1
        heads += _shuffle(
            seeds[start:stop], sizes[start:stop], counts[start:stop], length[start:stop], width
        )
        start = stop
    return heads


def _shuffle(seeds, sizes, counts, length, width: int) -> list[np.ndarray]:
    """randperm_heads for generators whose permutations fit one [rows, width] array."""
    steps = [min(h, n - 1) for h, n in zip(length, sizes, strict=True)]
    rows, most = sum(counts), max(steps)
    words = np.zeros((rows, most), np.int64)
    bits, row = np.random.MT19937(0), 0
    for seed, n, k, s in zip(seeds, sizes, counts, steps, strict=True):
        if s:
            drawn = mt19937_words(bits, seed, k * (n - 1)).reshape(k, n - 1)
            words[row : row + k, :s] = drawn[:, :s]
        row += k
    # Rows past their own steps draw words of 0: they swap position i with itself.
    n_rows = np.repeat(np.asarray(sizes, np.int64), counts)
    perm = np.broadcast_to(np.arange(width, dtype=np.int32), (rows, width)).copy()
    flat, by_step = perm.reshape(-1), np.ascontiguousarray(words.T)
    first = np.arange(rows, dtype=np.int64) * width
    for i in range(most):
        here = first + i
        other = here + by_step[i] % np.maximum(n_rows - i, 1)
        moved = flat[here]
        flat[here] = flat[other]
        flat[other] = moved
    heads, row = [], 0
    for n, k, h in zip(sizes, counts, length, strict=True):
        heads.append(perm[row : row + k, : min(h, n)].astype(np.int64))
        row += k
    return heads
