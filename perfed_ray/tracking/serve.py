"""The trackers' own process: it runs one run's trackers on the rows the driver hands
it (:class:`~perfed_ray.tracking.feed.TrackerFeed` starts it), so that their work
never holds the driver's interpreter lock and takes only what the run leaves idle.

It is ``python -m perfed_ray.tracking``, told what to do on its standard input
(pickled messages: the trackers to load, the run to follow, each write's rows, the
end; then the same for the driver's next run, which keeps this process) and
answering on its standard output (the CPU time its start took, and each tracker's
failure, as an event for the run's `events` table); what the trackers' libraries
print goes to the driver's stderr.
It lowers itself to the lowest priority first, and the threads and processes its
trackers start (TensorBoard's writer, W&B's service) inherit that: on a machine whose
cores the actors fill, it takes the moments they leave idle (between rounds, while
the driver aggregates); where it must share a core with a process of the run's at
niceness 0, it gets 15/1039 of it.

What each tracker holds (the last step it flushed, and the ids its ``start``
returned) is kept in ``trackers.json`` beside the run's checkpoint, written after the
tracker flushed; the last step it is being sent is written there before, so that a
resumed run knows which steps a kill left in doubt (see
:class:`~perfed_ray.tracking.base.TrackedRun`). A resumed run reopens the same
tracker runs; the rounds up to its checkpoint that a tracker does not hold yet
(queued when the run stopped) are sent again from the Parquet tables, and the rounds
after it, which the run replays, only where the tracker does not hold them: no step
is logged twice (a replayed round keeps, in the tracker, its first sitting's
timings), and none is lost but the steps in doubt of a tracker that cannot tell
whether it holds them (``resends = False``). A tracker that raises is reported once
and not used again. The driver gone (its end of the input closed without an end
message: killed), the process ends at once, as the driver's own thread would have,
leaving the trackers as a kill leaves them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfed_ray.analysis import evaluation_accuracy, summary
from perfed_ray.errors import first_line
from perfed_ray.registry import TRACKERS
from perfed_ray.results.layout import EVALS, FILE, ROUNDS, run_folder
from perfed_ray.results.schema import SCHEMAS
from perfed_ray.results.writer import write_atomically
from perfed_ray.tracking.base import TrackedRun, Tracker

KEPT = "trackers.json"  # beside the run's checkpoint
STEPS = ("step", "sent")  # what trackers.json holds of each tracker beside its ids
FAILED = "tracker-failed"  # the events table's kind
EVALUATED = ["round", "draw", "acc_after", "acc_before", "unseen"]  # what the aggregates need


@dataclass(frozen=True)
class Prepare:
    """The first message, as the run begins: the trackers by name, whose libraries
    load at once, the niceness to run at, and the driver's import path, environment
    and working folder as they are now (a user's tracker module found where the
    driver finds it, ``MLFLOW_TRACKING_URI`` and the like as the driver has them for
    this run, a tracker writing into the current folder writing into the driver's)."""

    names: list[str]
    niceness: int
    path: list[str]
    environ: dict[str, str]
    cwd: str


@dataclass(frozen=True)
class Follow:
    """The second: the run to follow, the folder that keeps what its trackers hold,
    and the round a resumed run continues after (None: a new run)."""

    run: TrackedRun
    folder: Path
    resumed_at: int | None


def _finite(values: Mapping[str, Any]) -> dict[str, Any]:
    """Values a tracker can take: no nulls, and no NaN or infinity (a round no user
    reported, the epsilon of a run without privacy), which JSON-speaking servers
    refuse."""
    return {
        k: v
        for k, v in values.items()
        if v is not None and not (isinstance(v, float) and not math.isfinite(v))
    }


def round_metrics(rounds: pa.Table) -> dict[int, dict[str, float]]:
    """Each round's numeric columns (the table's own: `train_loss`, `wall_seconds`,
    `bytes_sent`, `epsilon`, `sim_time` where the run has a clock ...), by round."""
    names = [
        f.name
        for f in rounds.schema
        if f.name != "round" and (pa.types.is_integer(f.type) or pa.types.is_floating(f.type))
    ]
    columns = rounds.select(["round", *names]).to_pylist()
    return {row.pop("round"): _finite(row) for row in columns}


def evaluation_metrics(evals: pa.Table) -> dict[int, dict[str, float]]:
    """Each evaluation's aggregates (:func:`perfed_ray.analysis.evaluation_accuracy`),
    by round."""
    columns = {name: evals[name].to_numpy() for name in EVALUATED}
    rounds = columns["round"]
    return {
        int(r): _finite(evaluation_accuracy({k: v[rounds == r] for k, v in columns.items()}))
        for r in np.unique(rounds)
    }


class Trackers:
    """One run's trackers, what they hold, and the failures to report through `tell`."""

    def __init__(
        self, names: list[str], follow: Follow, tell: Callable[[dict[str, Any]], None]
    ) -> None:
        self.run, self.tell = follow.run, tell
        self.path = Path(follow.folder) / KEPT
        resumed = self.run.resumed and self.path.exists()
        kept = json.loads(self.path.read_text()) if resumed else {}
        self.kept: dict[str, dict[str, Any]] = {n: kept.get(n, {}) for n in names}
        self.step = -1  # the last round logged, for a failure's event
        # Of the rounds without an evaluation, every this many are sent (a run made by
        # hand, as a tracker's own test makes one, may not say: every round).
        self.every = int(self.run.config.get("report_every", 1))
        self.trackers: dict[str, Tracker] = {}
        for name in names:
            self._start(name)
        self._keep()  # their runs' ids, before any step: a kill from now on continues them
        if follow.resumed_at is not None:
            self.take(self._recorded(follow.resumed_at))

    def _start(self, name: str) -> None:
        """Tracker `name`'s start (its library imported, its run opened or reopened)."""
        try:
            tracker = TRACKERS.load(name)()
        except Exception as err:  # its module gone since the configuration was checked
            self.fail(name, err)
            return
        ids = {k: v for k, v in self.kept[name].items() if k not in STEPS}
        logged = int(self.kept[name].get("step", -1))
        sent = max(logged, int(self.kept[name].get("sent", -1)))
        tracked = replace(self.run, kept=ids, logged=logged, sent=sent)
        started = self._call(name, tracker.start, tracked)
        if started is not None:
            self.trackers[name] = tracker
            done = logged if tracker.resends else sent
            self.kept[name] = {**self.kept[name], **started, "step": done, "sent": done}

    def _recorded(self, through: int) -> dict[str, pa.Table]:
        """The run's rounds and evaluations up to round `through`, as written."""
        tables = {}
        for name in (ROUNDS, EVALS):
            path = run_folder(self.run.out, name, self.run.run_id) / FILE
            if path.exists():
                table = pq.read_table(path, columns=SCHEMAS[name].names)
                tables[name] = table.filter(pc.field("round") <= through)
        return tables

    def _call(self, name: str, method: Callable[..., Any], *args: Any) -> Any:
        """`method(*args)` of tracker `name`; if it raises, the tracker is reported
        and dropped (None is returned)."""
        try:
            result = method(*args)
        except Exception as err:
            self.fail(name, err)
            return None
        return {} if result is None else result

    def fail(self, name: str, err: Exception) -> None:
        self.trackers.pop(name, None)
        detail = f"{name}: {first_line(err)}"
        print(
            f"perfed-ray: tracker {detail}; it is off for the rest of run {self.run.run_id}",
            file=sys.stderr,
            flush=True,
        )
        event = {"round": max(self.step, 0), "kind": FAILED, "actor": None, "users": None}
        self.tell({**event, "detail": detail})

    def take(self, written: Mapping[str, pa.Table]) -> None:
        """A write's new rows: each round's metrics, with its evaluation's where it has
        one; of the rounds without one, every `report_every`-th."""
        evaluated = evaluation_metrics(written[EVALS]) if EVALS in written else {}
        steps: dict[int, dict[str, float]] = {}
        if ROUNDS in written:
            rounds = round_metrics(written[ROUNDS])
            steps = {s: m for s, m in rounds.items() if s % self.every == 0 or s in evaluated}
        for step, figures in evaluated.items():
            steps[step] = {**steps.get(step, {}), **figures}
        if steps:
            self._log(steps)

    def _log(self, steps: dict[int, dict[str, float]]) -> None:
        """Each tracker gets the rounds it does not hold yet, in order, then flushes;
        only then is its last step kept. The last step it is about to be sent is kept
        first, so that a resumed run knows which steps are in doubt."""
        todo = {
            name: sorted(s for s in steps if s > self.kept[name]["step"]) for name in self.trackers
        }
        if not any(todo.values()):  # replayed rounds every tracker holds: nothing to keep
            return
        for name, todo_steps in todo.items():
            self.kept[name]["sent"] = max([self.kept[name]["step"], *todo_steps])
        self._keep()
        for name, tracker in list(self.trackers.items()):
            for step in todo[name]:
                self.step = step
                metrics = steps[step]
                if self._call(name, tracker.log, step, metrics, metrics.get("sim_time")) is None:
                    break
            else:
                if self._call(name, tracker.flush) is not None:
                    self.kept[name]["step"] = self.kept[name]["sent"]
        self._keep()

    def _keep(self) -> None:
        text = json.dumps(self.kept)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, lambda tmp: tmp.write_text(text))

    def end(self, status: str | None) -> None:
        """The run's summary (`perfed-ray summary`'s row), then each tracker's end
        (`status` None: the run ended before its final row, as failed)."""
        if self.trackers and status is not None:
            rows = summary(self.run.out, self.run.run_id).to_dict("records")
            values = _finite({k: _plain(v) for k, v in rows[0].items()}) if rows else {}
            for name, tracker in list(self.trackers.items()):
                self._call(name, tracker.summary, values)
        for name, tracker in list(self.trackers.items()):
            self._call(name, tracker.close, status or "failed")
        self.trackers.clear()


def _plain(value: Any) -> Any:
    """A pandas or numpy scalar as the Python value trackers serialise."""
    return value.item() if hasattr(value, "item") else value


def _preload(name: str) -> None:
    """Import tracker `name`'s class and the modules its start needs, while the driver
    readies the run. What fails here fails again in its start, which reports it."""
    with contextlib.suppress(Exception):
        for module in TRACKERS.load(name).imports:
            importlib.import_module(module)


def serve(commands: IO[bytes], answers: IO[bytes]) -> None:
    """Run after run, until the driver is gone (its end of the input closed): load the
    trackers a run's first command names, follow the run its second names until its
    end, then wait for the next run's (the driver keeps this process for it: the
    libraries stay loaded). Even a defect here only turns the trackers off: the run
    goes on."""

    def tell(kind: str, what: Any) -> None:
        try:
            pickle.dump((kind, what), answers)
            answers.flush()
        except BrokenPipeError:  # the driver is gone: end with it, as its thread would
            os._exit(0)

    try:
        while True:
            _one_run(pickle.load(commands), commands, tell)
    except EOFError:  # the driver is gone (or let this process go): as its thread, end
        return


def _one_run(prepare: Prepare, commands: IO[bytes], tell: Callable[[str, Any], None]) -> None:
    """One run: `prepare` names its trackers, the next command the run (or its end,
    where it ended before it began)."""
    began = time.process_time()
    sys.path[:] = prepare.path
    os.environ.clear()
    os.environ.update(prepare.environ)
    os.chdir(prepare.cwd)
    if hasattr(os, "setpriority"):
        os.setpriority(os.PRIO_PROCESS, 0, prepare.niceness)
    for name in prepare.names:
        _preload(name)
    followed = pickle.load(commands)
    if not isinstance(followed, Follow):  # ended before it began: nothing to close
        tell("ended", None)
        return
    trackers = Trackers(prepare.names, followed, lambda event: tell("failed", event))
    tell("started", time.process_time() - began)
    while True:
        kind, what = pickle.load(commands)
        try:
            if kind == "sent":
                trackers.take(what)
            else:
                trackers.end(what)
        except Exception as err:
            for name in list(trackers.trackers):
                trackers.fail(name, err)
        if kind == "end":
            tell("ended", None)
            return


def main() -> None:
    """Answers go to the standard output as the driver opened it; the standard output
    the trackers' libraries print to is the driver's stderr from here on. Ctrl-C and a
    scheduler's SIGTERM reach the driver's whole process group: the driver decides what
    they mean (an interrupted run, its trackers closed as such), and this process ends
    when it says so, or when it is gone."""
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, answers)
