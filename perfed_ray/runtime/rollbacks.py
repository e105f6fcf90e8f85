"""Going on after an actor died holding users' per-user state: from the last checkpoint."""

from __future__ import annotations

from collections import Counter

from perfed_ray.results.writer import RunWriter
from perfed_ray.runtime.checkpoint import Checkpoint, RunStore
from perfed_ray.runtime.pool import StateLost


class RollBacks:
    """How a run whose users keep per-user state goes on after an actor died with some
    of those states: from the last checkpoint, its rows restored and the roll-back
    recorded. An actor that dies in the same round more often than `retries` stops the
    run instead (counted per round and actor, as the pool counts replacements)."""

    def __init__(self, retries: int, store: RunStore, writer: RunWriter) -> None:
        self.retries, self.store, self.writer = retries, store, writer
        self.deaths: Counter[tuple[int, int]] = Counter()
        self.events: list[tuple[int, dict]] = []  # (checkpoint round restored, events row)

    def restore(self, lost: StateLost) -> Checkpoint | None:
        """The checkpoint to go on from after `lost` (None: from the start)."""
        self.deaths[lost.round, lost.actor] += 1
        if self.deaths[lost.round, lost.actor] > self.retries:
            raise lost.failed(self.deaths[lost.round, lost.actor]) from None
        checkpoint = self.store.load()
        self.writer.resume(checkpoint.rows if checkpoint else {})
        restored = checkpoint.round if checkpoint else 0
        # Roll-backs to this same checkpoint were recorded after it was saved, so resuming
        # the writer cut their rows: they are written again; rows of roll-backs to an
        # older checkpoint are in it and stay as they are.
        self.events = [(r, e) for r, e in self.events if r == restored]
        self.events += [(restored, event) for event in lost.events(restored)]
        self.writer.add("events", [event for _, event in self.events])
        return checkpoint
