"""Per-user states of the users an actor hosts, kept on the actor's local disk.

A method's per-user state (pFedMe's theta, Ditto's v, FedRep's head, a user's own
method's buffers) exists for every user that ever trained; at a million users it
outgrows memory. Here each hosted user has one row of a float32 array memory-mapped
from a file in the actor's temporary folder ($TMPDIR): the operating system keeps
recently used rows in memory and the rest on disk. A state is read when its user
trains or is evaluated and written back after training; states are float32 tensors,
so a row holds one exactly and results equal those of states kept as tensors.

The file has no name in the folder (it is unlinked at once, or made nameless by
O_TMPFILE): Ray ends actors with SIGKILL, which runs no clean-up, and a named file
would outlive every actor and run. A nameless one goes when its process does,
whatever ends it; checkpoints hold the states that must outlive it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence

import numpy as np


class StateStore:
    """`get(user)` / `put(user, vector)` for the users of one actor; the file is made
    at the first `put`, when the state's size is known, and goes with its process."""

    def __init__(self, users: range | Sequence[int]) -> None:
        self.users = users
        self.rows = None if isinstance(users, range) else {u: i for i, u in enumerate(users)}
        self.has = np.zeros(len(users), dtype=bool)
        self.array: np.ndarray | None = None
        self.file = None

    def _row(self, user: int) -> int:
        return user - self.users.start if self.rows is None else self.rows[user]

    def get(self, user: int) -> np.ndarray | None:
        row = self._row(user)
        return np.array(self.array[row]) if self.has[row] else None

    def put(self, user: int, vector: np.ndarray) -> None:
        if self.array is None:
            self.file = tempfile.TemporaryFile(prefix="perfed-ray-states-")  # noqa: SIM115
            self.array = np.memmap(
                self.file, dtype=np.float32, mode="w+", shape=(len(self.users), len(vector))
            )
        row = self._row(user)
        self.array[row] = vector
        self.has[row] = True

    def __contains__(self, user: int) -> bool:
        """Whether this store keeps the user's state (its actor hosts the user)."""
        return user in (self.users if self.rows is None else self.rows)

    def items(self) -> Iterator[tuple[int, np.ndarray]]:
        """Every stored state, in user order."""
        for row in np.flatnonzero(self.has):
            yield self.users[row], np.array(self.array[row])

    def __len__(self) -> int:
        return int(self.has.sum())
