"""Derived random streams, so a result never depends on where or when work ran.

Every random draw of a run comes from a stream keyed by what it is for
(`seed`, purpose, and the user, round and draw it belongs to), never from
a shared generator whose state depends on the order in which actors answer.
That is what makes a run identical whatever the placement of users on actors.
"""

from __future__ import annotations

import enum

import numpy as np
import torch


class Stream(enum.IntEnum):
    """What a random stream is used for; part of its key."""

    MODEL_INIT = 0
    PARTITION = 1
    USER_SAMPLING = 2
    LOCAL_TRAINING = 3
    EVALUATION = 4
    DATA = 5
    PARTICIPATION = 6
    EVALUATED_USERS = 7
    UNSEEN_USERS = 8
    SHARED_DATA = 9
    VALIDATION = 10
    AUGMENTATION = 11


def stream_seed(seed: int, stream: Stream, *keys: int) -> int:
    """The 32-bit seed of the stream keyed (seed, stream, *keys)."""
    return int(np.random.SeedSequence([seed, int(stream), *keys]).generate_state(1)[0])


def numpy_rng(seed: int, stream: Stream, *keys: int) -> np.random.Generator:
    """A NumPy generator for driver-side draws (partition, user sampling, data)."""
    return np.random.default_rng(stream_seed(seed, stream, *keys))


def torch_generator(seed: int, stream: Stream, *keys: int) -> torch.Generator:
    """A CPU torch generator for a user's draws (batches) in one round or evaluation."""
    return torch.Generator().manual_seed(stream_seed(seed, stream, *keys))
