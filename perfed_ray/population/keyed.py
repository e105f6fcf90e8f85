"""Per-user draws from keyed streams, for a whole population at once.

A device's speed or a user's online window is drawn once per user, keyed by (seed,
purpose, user, draw), so it is the same whichever process asks and in whatever order.
A NumPy generator per user would cost some 15 microseconds each (15 s for 10^6 users);
instead each user's 32-bit stream seed, which :func:`perfed_ray.seeding.stream_seeds`
computes for many users at once, is itself the uniform variate.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from perfed_ray.seeding import Stream, stream_seeds

_WORDS = 2.0**32


def uniforms(seed: int, stream: Stream, users: np.ndarray, draw: int) -> np.ndarray:
    """One uniform variate in (0, 1) per user: the user's keyed 32-bit word, centred in
    its cell of width 2^-32 (so never 0 or 1)."""
    users = np.asarray(users, dtype=np.int64)
    keys = np.column_stack([users, np.full(len(users), draw, np.int64)])
    return (stream_seeds(seed, stream, keys).astype(np.float64) + 0.5) / _WORDS


def normals(seed: int, stream: Stream, users: np.ndarray, draw: int) -> np.ndarray:
    """One standard normal variate per user, by the inverse of the normal CDF of its
    uniform (exact to the uniform's 2^-32 grid: |z| < 6.3)."""
    return ndtri(uniforms(seed, stream, users, draw))
