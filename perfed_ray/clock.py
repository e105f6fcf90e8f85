"""The simulated clock, in seconds, beside the wall clock: how long each user's task
takes on its device, whether the user stays online for it, and the queue of tasks in
flight that the server's steps are ordered by.

A task is one user's download of the model, local work and upload of the update. Its
length comes from the user's device and the method's samples
(:mod:`perfed_ray.population`: ``task_seconds``); whether the user is online is a pure
function of (user, time) there, so no answer depends on the order of the questions.
Everything a task will do is known when it is dispatched: when it ends, and whether it
arrives, is cut by the `deadline` (`late`) or is lost because its user went offline
first (`offline`). So the maths need not wait for the clock: a task that will arrive is
trained as soon as it is dispatched, from the model it was given, and the clock only
decides when its update counts (:mod:`perfed_ray.runtime.rounds`).

The queue is a heap of (end, task id): ids are given in dispatch order, so tasks that
end at the same instant are taken in the order they were dispatched, never in an order
the heap happens to keep (FedScale's issue #174; FederatedScope's #543). The whole
:class:`Schedule` goes into the checkpoint, so a resumed run takes the same tasks.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from perfed_ray.algorithms.base import make_algorithm
from perfed_ray.config import RunConfig
from perfed_ray.registry import REGISTRIES

# What became of a task: its update aggregated by a server step, cut by a deadline, an
# over-commitment or its staleness (late), lost with its user going offline, dropped
# out (the `dropout` draw), or still in flight when the run ended (pending).
OUTCOMES = ("aggregated", "late", "offline", "dropped", "pending")


@dataclass
class Task:
    """One user's task: dispatched at `start` from the model after `version` server
    steps, ending at `end` (its arrival, or when it is known lost). `outcome` is
    `pending` while the task may still be aggregated; `trained`, whether its update has
    been computed (on an actor, which holds it until it is summed or discarded)."""

    id: int
    user: int
    version: int
    start: float
    end: float
    outcome: str = "pending"
    trained: bool = False
    round: int | None = None

    @property
    def key(self) -> int:
        """The round its local work draws its batches for (its streams' key): the step
        its model leads to, as a synchronous round's users draw theirs for round k."""
        return self.version + 1

    @property
    def arrives(self) -> bool:
        """Whether its update reaches the server (and so is worth computing)."""
        return self.outcome == "pending"

    def row(self) -> dict[str, Any]:
        """Its row of the tasks table."""
        staleness = None if self.round is None else self.round - 1 - self.version
        return {
            "task": self.id,
            "user": self.user,
            "version": self.version,
            "start": self.start,
            "end": self.end,
            "round": self.round,
            "staleness": staleness,
            "outcome": self.outcome,
        }


class Timing:
    """How long a user's task takes and when the user is online, from the run's device
    and availability models (`devices`, `availability`) and the method's samples per
    task (`Algorithm.task_samples`). `size` gives a user's training-sample count (asked
    only of users given a task); `model_bytes` is what a task downloads and uploads
    (the flat float32 model)."""

    def __init__(self, cfg: RunConfig, size: Callable[[int], int], model_bytes: int) -> None:
        from perfed_ray.population.devices import task_seconds

        self._seconds = task_seconds
        self.devices = REGISTRIES["devices"].load(cfg.devices)(cfg)
        self.availability = REGISTRIES["availability"].load(cfg.availability)(cfg)
        self.algorithm = make_algorithm(cfg)
        self.size = size
        self.model_bytes = model_bytes
        self.deadline = cfg.deadline

    def duration(self, user: int) -> float:
        """Seconds of the user's task: download, local work, upload."""
        samples = self.algorithm.task_samples(self.size(user))
        device = self.devices.device(user)
        return float(self._seconds(device, self.model_bytes, self.model_bytes, samples))

    def online(self, users: np.ndarray, t: float) -> np.ndarray:
        """Whether each of `users` is online at `t`, in one vectorised question."""
        return self.availability.online_array(users, t)

    def next_online(self, user: int, t: float) -> float:
        return float(self.availability.next_online(user, t))

    def task(self, id_: int, user: int, version: int, now: float) -> Task:
        """A task the user starts now: it arrives at its end unless the deadline cuts it
        first (`late`, known at start + deadline) or its user goes offline first
        (`offline`, known when the user leaves)."""
        end = now + self.duration(user)
        gone = float(self.availability.online_until(user, now))
        if gone < end and (self.deadline is None or gone < now + self.deadline):
            return Task(id_, user, version, now, gone, "offline")
        if self.deadline is not None and end - now > self.deadline:
            return Task(id_, user, version, now, now + self.deadline, "late")
        return Task(id_, user, version, now, end)


@dataclass
class Schedule:
    """The clock and the queue between server steps: the simulated time `now`, the
    server steps done (`version`), the tasks in flight (a heap by end, then id), the
    arrived tasks waiting in the server's buffer, and what the next draw of users needs
    (the next task id; how many draws the current version has made, and of whom).
    Its size grows with the tasks in flight, never with the population."""

    now: float = 0.0
    version: int = 0
    next_id: int = 0
    draws: int = 0
    drawn: set[int] = field(default_factory=set)
    flight: dict[int, Task] = field(default_factory=dict)
    buffer: list[Task] = field(default_factory=list)
    _heap: list[tuple[float, int]] = field(default_factory=list, repr=False)

    def busy(self) -> set[int]:
        """Users with a task in flight (one whose update waits in the buffer is free)."""
        return {t.user for t in self.flight.values()}

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def push(self, task: Task) -> None:
        self.flight[task.id] = task
        heapq.heappush(self._heap, (task.end, task.id))

    def next_end(self) -> float:
        """When the next task in flight ends (infinity: none in flight)."""
        return self._heap[0][0] if self._heap else math.inf

    def pop(self) -> Task:
        """The task that ends first, ties in dispatch order; the clock moves to its end."""
        end, id_ = heapq.heappop(self._heap)
        self.now = max(self.now, end)
        return self.flight.pop(id_)

    def advance(self) -> None:
        """The server's step is done: a new version, whose draws start afresh."""
        self.version += 1
        self.draws = 0
        self.drawn = set()

    def untrained(self) -> list[Task]:
        """Tasks whose update is still to be computed (dispatched since the last step,
        from the current version), in dispatch order."""
        waiting = [*self.flight.values(), *self.buffer]
        return sorted((t for t in waiting if t.arrives and not t.trained), key=lambda t: t.id)

    def held(self) -> list[Task]:
        """Trained tasks whose updates the actors hold until they are summed."""
        return [t for t in (*self.flight.values(), *self.buffer) if t.trained]

    def pending(self) -> list[Task]:
        """Every task not yet resolved, in dispatch order (the run's last rows)."""
        return sorted([*self.flight.values(), *self.buffer], key=lambda t: t.id)

    def to_json(self) -> dict[str, Any]:
        """Everything as JSON values (floats as Python writes them: exactly)."""
        return {
            "now": self.now,
            "version": self.version,
            "next_id": self.next_id,
            "draws": self.draws,
            "drawn": sorted(self.drawn),
            "flight": [asdict(t) for t in sorted(self.flight.values(), key=lambda t: t.id)],
            "buffer": [asdict(t) for t in self.buffer],
        }

    @classmethod
    def from_json(cls, saved: dict[str, Any]) -> Schedule:
        schedule = cls(
            saved["now"], saved["version"], saved["next_id"], saved["draws"], set(saved["drawn"])
        )
        for task in saved["flight"]:
            schedule.push(Task(**task))
        schedule.buffer = [Task(**t) for t in saved["buffer"]]
        return schedule
