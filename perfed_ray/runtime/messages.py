"""The two messages that cross a user actor's boundary: a server step's work, sent by
the coordinator (:class:`Batch`), and an actor's sum of its users' results, sent back
(:class:`UpdateSum`). In a module of their own, below both ends, so that neither the
coordinator nor the actor imports the other to name what they exchange; only weights,
ids and sums are in them (users' data never leaves its actor)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # what an actor applies to its users' models; it loads torch
    from perfed_ray.postprocess import UserPostprocessor


@dataclass(frozen=True)
class Batch:
    """One server step's work, as the actors see it: the `users` train from the call's
    model (for round k's streams); with `tasks` None (a synchronous round) the
    `reporting` ones among them (None: all) are summed at once, each model through
    `postprocess` first; else their updates are held under their task ids, and the
    held tasks `summed` (id, factor) are summed, as models or, with `rebase`, those
    started from an older model as updates; `discard`, held ones thrown away."""

    round: int
    users: list[int]
    tasks: list[int] | None = None
    reporting: list[int] | None = None
    summed: list[tuple[int, float]] = field(default_factory=list)
    discard: list[int] = field(default_factory=list)
    rebase: bool = False
    postprocess: UserPostprocessor | None = None

    def on(self, users: list[int], held: set[int]) -> Batch:
        """The part of it for an actor that trains `users` and holds the tasks `held`."""
        ids = None
        if self.tasks is not None:  # in the order of `users`, which the actor trains
            task_of = dict(zip(self.users, self.tasks, strict=True))
            ids = [task_of[u] for u in users]
        reporting = self.reporting
        if reporting is not None and reporting != self.users:
            summed = set(reporting)
            reporting = [u for u in users if u in summed]
        elif reporting is not None:
            reporting = None  # the same users: all of them
        return Batch(
            self.round,
            users,
            ids,
            reporting,
            [(t, f) for t, f in self.summed if t in held],
            [t for t in self.discard if t in held],
            self.rebase,
            self.postprocess,
        )


@dataclass(frozen=True)
class UpdateSum:
    """An actor's part of a round: the weighted sum of its users' new weights (float64,
    so the server's total does not depend on the order in which actors answer), the
    sum of the weights and of the losses."""

    total: np.ndarray
    weight: float
    loss_sum: float
    seconds: float = 0.0  # the actor's own time on the call, to tell work from transport
    guests: dict[int, np.ndarray] | None = None  # new states of users hosted elsewhere
    stats: dict[str, float] = field(default_factory=dict)  # the postprocessor's statistics
    rebased: float = 0.0  # the weights of held updates summed as updates (rebase)
