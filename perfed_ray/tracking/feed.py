"""Feeding a run's trackers from the rows its writer has just made durable, so the
trackers see what the Parquet tables hold, in the same order, and the rounds' loop
knows nothing of them.

:class:`TrackerFeed` is the writer's listener (:class:`~perfed_ray.results.writer.RunWriter`
calls it after each write): a write's new `rounds` and `evals` rows go to the
trackers, the final `runs` row brings the summary and the end. The trackers run in a
process of their own (:mod:`perfed_ray.tracking.serve`) at the lowest priority: the
driver only hands it the written rows (immutable Arrow tables, pickled down a pipe),
and their work (a server's round trip, a file's flush, the libraries' Python) neither
holds the driver's interpreter lock, which the next round's dispatch and aggregation
need, nor takes a core from the actors while they compute. The run's end waits for
them. A tracker that raises is reported once in `events` (kind ``tracker-failed``)
and on stderr, and is not used again; the run goes on, and so it does if the
trackers' process itself dies.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from perfed_ray.results.layout import EVALS, EVENTS, ROUNDS, RUNS
from perfed_ray.tracking.base import TrackedRun
from perfed_ray.tracking.serve import EVALUATED, FAILED, Follow, Prepare

if TYPE_CHECKING:
    from perfed_ray.results.writer import RunWriter

LOWEST = 19  # the trackers' process's niceness
# A run's trackers' process, kept when the run ends for the driver's next run (a
# sweep's next trial in the same process, a notebook's next run), by its niceness:
# their libraries stay loaded, as the run's actors stay warm. It ends with the driver.
_spare: dict[int, subprocess.Popen] = {}


def _spare_process(niceness: int) -> subprocess.Popen:
    """The process kept at `niceness` if it is still alive, else a new one."""
    kept = _spare.pop(niceness, None)
    if kept is not None and kept.poll() is None:
        return kept
    return subprocess.Popen(
        [sys.executable, "-m", "perfed_ray.tracking"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )


def _keep_spare(process: subprocess.Popen, niceness: int) -> None:
    """Keep `process` for the next run at `niceness`, letting go of one kept before."""
    older = _spare.pop(niceness, None)
    if older is not None:
        with contextlib.suppress(OSError):
            older.stdin.close()  # it ends at once
    _spare[niceness] = process


class TrackerFeed:
    """The trackers `report_to` names, in their own process, started as the run begins
    so that their libraries load while the driver readies the data, Ray and the actors;
    :meth:`follow` then names the run they follow."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.run: TrackedRun | None = None  # until followed
        self.failed: list[dict[str, Any]] = []  # events not yet handed to the writer
        self.unwritten = False  # events handed to the writer but not yet written
        self.ended = False  # the end was sent
        # The CPU seconds the trackers' process took to start (imports, tracker runs
        # opened), once it has: what a run pays once, apart from what it pays a round.
        self.start_cpu: float | None = None
        # Set once the trackers have started (their runs opened and kept beside the
        # checkpoint) or their process has died: the first rows wait for it, so that a
        # run killed from then on finds its tracker runs to continue.
        self.started = threading.Event()
        self.waited = 0.0  # seconds the first rows waited for it
        self.lock = threading.Lock()
        self.niceness = LOWEST
        self.process = _spare_process(self.niceness)
        # Messages are pickled and written by a thread of the driver's: a large write
        # (a final evaluation of a million users) never waits on the pipe in the rounds'
        # loop, while the trackers' process, at its low priority, catches up.
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=target, name=f"perfed-ray-trackers-{what}", daemon=True)
            for target, what in ((self._post, "post"), (self._listen, "listen"))
        ]
        for thread in self.threads:
            thread.start()
        here = Prepare(names, self.niceness, list(sys.path), dict(os.environ), os.getcwd())
        self.outbox.put(here)

    def follow(
        self, run: TrackedRun, folder: Path, writer: RunWriter, resumed_at: int | None = None
    ) -> TrackerFeed:
        """Follow `run`, whose rows `writer` writes (and whose events table hears of a
        tracker's failure), keeping what the trackers hold in `folder` (the run's
        checkpoint folder). A resumed run's trackers are sent the rounds up to
        `resumed_at` (its checkpoint's round) that they do not hold yet."""
        self.run, self.writer = run, writer
        self.outbox.put(Follow(run, Path(folder), resumed_at))
        return self

    def _post(self) -> None:
        """Write each message down the trackers' process's input, until the run's last
        (None); a process that has died is sent nothing more (the listener reports
        it)."""
        pipe = self.process.stdin
        while (message := self.outbox.get()) is not None:
            try:
                pickle.dump(message, pipe)
                pipe.flush()
            except OSError:  # a broken pipe: the process is gone
                pass

    def _listen(self) -> None:
        """The failures the trackers' process reports, kept for the driver's thread
        to hand to the writer; its death before the end is one more."""
        answers = self.process.stdout
        while True:
            try:
                kind, what = pickle.load(answers)
            except EOFError:
                break
            if kind == "started":
                self.start_cpu = what
                self.started.set()
                continue
            if kind == "ended":  # the process waits for the next run's trackers
                return
            with self.lock:
                self.failed.append(what)
        # Its input or its output gone before the end: the process died.
        self.started.set()
        code = self.process.wait()
        if self.run is not None:
            detail = f"the trackers' process ended with status {code}: every tracker is off"
            print(f"perfed-ray: {detail} for run {self.run.run_id}", file=sys.stderr)
            event = {"round": 0, "kind": FAILED, "actor": None, "users": None}
            with self.lock:
                self.failed.append({**event, "detail": f"{','.join(self.names)}: {detail}"})

    def _report(self) -> bool:
        """Hand the failures' events to the writer (on the driver's thread, which owns
        it); whether there were any."""
        with self.lock:
            failed, self.failed = self.failed, []
        if failed:
            self.writer.add(EVENTS, failed)
        return bool(failed)

    def __call__(self, written: Mapping[str, pa.Table]) -> None:
        """The writer's listener: `written` holds each table's rows just written. The
        final runs row waits for the trackers' summary and end, and writes the events
        of failures there."""
        if EVENTS in written:  # what was handed to the writer before is on disk now
            self.unwritten = False
        self.unwritten |= self._report()
        if RUNS not in written:
            sent = {k: v for k, v in written.items() if k in (ROUNDS, EVALS)}
            if EVALS in sent:  # what the aggregates need, not a million users' every column
                sent[EVALS] = sent[EVALS].select(EVALUATED)
            if not self.started.is_set():
                began = time.perf_counter()
                self.started.wait()
                self.waited = time.perf_counter() - began
            self.outbox.put(("sent", sent))
            return
        status = written[RUNS]["status"][0].as_py()
        if status != "running":
            self._end(status)
            if self._report() or self.unwritten:
                self.writer.flush()

    def _end(self, status: str | None) -> None:
        """Send the end and wait for the trackers to finish it; their process, alive,
        is kept for this driver's next run."""
        self.ended = True
        self.outbox.put(("end", status))
        self.outbox.put(None)
        for thread in self.threads:
            thread.join()
        if self.process.poll() is None:
            _keep_spare(self.process, self.niceness)

    def close(self) -> None:
        """Let go of the trackers of a run that ended before its final row (a full
        disk: their end, as failed), or before it was followed (its data refused:
        nothing to close)."""
        if not self.ended:
            self._end(None)
