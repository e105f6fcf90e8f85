"""Derived random streams, so a result never depends on where or when work ran.

Every random draw of a run comes from a stream keyed by what it is for
(`seed`, purpose, and the user, round and draw it belongs to), never from
a shared generator whose state depends on the order in which actors answer.
That is what makes a run identical whatever the placement of users on actors.

The built-in purposes are the closed :class:`Stream` enum; a plug-in (a strategy, a
method, a data set of your own) keys its own draws with a :class:`PluginStream` named
after it, which can never hand out a built-in purpose's stream.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
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
    DROPOUT = 12
    CENTRAL_NOISE = 13
    LOCAL_NOISE = 14
    DEVICES = 15
    AVAILABILITY = 16
    TASK_SAMPLING = 17  # an asynchronous server's draws of users after a version's first


# The purpose word of every plug-in stream: above any built-in purpose (they count up
# from 0), so a plug-in's key and a built-in one differ in the word after the seed.
_PLUGIN = 0xFFFFFFFF


@dataclass(frozen=True)
class PluginStream:
    """A plug-in's own purpose, named by the plug-in (``"dp_mean.noise"``).

    Why not a new :class:`Stream` member: the enum is the package's, and two plug-ins
    picking the next free number would share a stream. The name is hashed (SHA-256,
    the same on every machine and Python, unlike ``hash``) into four 32-bit words that
    follow a purpose word no built-in stream uses, so plug-ins' streams differ from the
    built-in ones by construction and from each other unless their names are equal.
    """

    name: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a plug-in stream needs a name, e.g. 'my_module.noise'")

    @property
    def words(self) -> tuple[int, ...]:
        digest = hashlib.sha256(self.name.encode()).digest()
        return (_PLUGIN, *(int.from_bytes(digest[i : i + 4], "little") for i in (0, 4, 8, 12)))


Purpose = Stream | PluginStream


def _purpose(stream: Purpose) -> list[int]:
    """The 32-bit words a purpose puts into a stream's key after the seed."""
    return list(stream.words) if isinstance(stream, PluginStream) else [int(stream)]


def stream_seed(seed: int, stream: Purpose, *keys: int) -> int:
    """The 32-bit seed of the stream keyed (seed, stream, *keys)."""
    words = [seed, *_purpose(stream), *keys]
    return int(np.random.SeedSequence(words).generate_state(1)[0])


# NumPy's SeedSequence, whose first 32-bit word of state stream_seed takes: the
# constants of its hash (O'Neill's seed_seq_fe), its pool of four words.
_MASK, _INIT_A, _MULT_A = 0xFFFFFFFF, 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B, _MIX_L, _MIX_R, _POOL = 0x8B51F9DD, 0x58F38DED, 0xCA01F9DD, 0x4973F715, 4


def stream_seeds(seed: int, stream: Purpose, keys: np.ndarray) -> np.ndarray:
    """stream_seed(seed, stream, *row) for every row of `keys` ([n, m], entries below
    2^32) at once: SeedSequence's hash vectorised over the rows, the same words in the
    same order (the seed's and stream's 32-bit words, then the row's), so a round's
    users get their batch streams' seeds in microseconds, not 15 each
    (tests/test_permutations.py checks it against stream_seed)."""
    keys = np.asarray(keys, dtype=np.uint64)
    if keys.size and int(keys.max()) > _MASK:
        raise ValueError("stream_seeds: keys must be below 2^32")
    common = [w for x in (seed, *_purpose(stream)) for w in _words(x)]
    words = [np.full(len(keys), w, np.uint64) for w in common] + list(keys.T)
    mult = _INIT_A

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal mult
        value = (value ^ np.uint64(mult)) & np.uint64(_MASK)
        mult = (mult * _MULT_A) & _MASK
        value = (value * np.uint64(mult)) & np.uint64(_MASK)
        return value ^ (value >> np.uint64(16))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        mixed = (np.uint64(_MIX_L) * x - np.uint64(_MIX_R) * y) & np.uint64(_MASK)
        return mixed ^ (mixed >> np.uint64(16))

    zero = np.zeros(len(keys), np.uint64)
    pool = [hashmix(words[i] if i < len(words) else zero) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL, len(words)):
        for dst in range(_POOL):
            pool[dst] = mix(pool[dst], hashmix(words[src]))
    first = ((pool[0] ^ np.uint64(_INIT_B)) * np.uint64(_INIT_B * _MULT_B & _MASK)) & np.uint64(
        _MASK
    )
    return first ^ (first >> np.uint64(16))


def _words(x: int) -> list[int]:
    """An int's 32-bit words, least significant first, at least one (SeedSequence's)."""
    words = [x & _MASK]
    while x > _MASK:
        x >>= 32
        words.append(x & _MASK)
    return words


def numpy_rng(seed: int, stream: Purpose, *keys: int) -> np.random.Generator:
    """A NumPy generator for driver-side draws (partition, user sampling, data, a
    plug-in's noise)."""
    return np.random.default_rng(stream_seed(seed, stream, *keys))


def torch_generator(seed: int, stream: Purpose, *keys: int) -> torch.Generator:
    """A CPU torch generator for a user's draws (batches) in one round or evaluation.
    torch is imported here, not with the module: the population's keyed draws
    (perfed_ray.population) and the configuration's checks need NumPy alone."""
    import torch

    return torch.Generator().manual_seed(stream_seed(seed, stream, *keys))
