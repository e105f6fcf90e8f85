"""One driver per run: an exclusive lock on a file in the run's checkpoint folder, held
from the run's start (or resume) to its end.

Two drivers of one run would write over each other's rows and checkpoints. The kernel
releases the lock when its holder dies, SIGKILL included, so a run stopped in any way
can always be resumed, and never twice at once; unlike a pid written in a file, a
lock cannot be mistaken for the process that happens to reuse the pid.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class Busy(Exception):
    """The lock is held by another process: `pid` and what it does (`doing`)."""

    def __init__(self, pid: str, doing: str) -> None:
        super().__init__(f"held by process {pid} ({doing})")
        self.pid, self.doing = pid, doing


class RunLock:
    """`acquire` or raise :class:`Busy`; `release` when the run ends."""

    FILE = "lock"

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / self.FILE
        self.fd: int | None = None

    def acquire(self, doing: str) -> None:
        """Take the lock and write this process's id and what it does (`run`,
        `resumed`) into the file, for the message of whoever is refused."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode(errors="replace").split()
                os.close(fd)
                pid, doing = [*holder, "?", "run"][:2]
                raise Busy(pid, doing) from None
            # Its last holder may have removed the file between our open and our lock:
            # then we hold a lock nobody else can see, and must take the new file's.
            try:
                current = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {doing}".encode())
        self.fd = fd

    def release(self, remove: bool = False) -> None:
        """Let the next driver in; `remove` the file too (removed while still held, so
        that nobody locks a file on its way out)."""
        if self.fd is None:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None
