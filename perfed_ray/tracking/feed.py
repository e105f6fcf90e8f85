"""Feeding a run's trackers from the rows its writer has just made durable, so the
trackers see what the Parquet tables hold, in the same order, and the rounds' loop
knows nothing of them.

:class:`TrackerFeed` is the writer's listener (:class:`~perfed_ray.results.writer.RunWriter`
calls it after each write): a write's new `rounds` and `evals` rows become one
:meth:`~perfed_ray.tracking.base.Tracker.log` per round, the final `runs` row the
summary and the end. The trackers run in a thread of their own, handed the written
rows (immutable Arrow tables): the driver only queues them, and their work (a
server's round trip, a file's flush) overlaps the next rounds, which mostly wait on
the actors; the run's end waits for them.

What each tracker holds (the last step it flushed, and the ids its ``start``
returned) is kept in ``trackers.json`` beside the run's checkpoint, written after
the tracker flushed; the last step it is being sent is written there before, so
that a resumed run knows which steps a kill left in doubt (see
:class:`~perfed_ray.tracking.base.TrackedRun`). A resumed run reopens the same
tracker runs; the rounds up to its checkpoint that a tracker does not hold yet
(queued when the run stopped) are sent again from the Parquet tables, and the rounds
after it, which the run replays, only where the tracker does not hold them: no step
is logged twice (a replayed round keeps, in the tracker, its first sitting's
timings), and none is lost but the steps in doubt of a tracker that cannot tell
whether it holds them (``resends = False``). A tracker that
raises is reported once in `events` (kind ``tracker-failed``) and on stderr, and is
not used again; the run goes on.
"""

from __future__ import annotations

import json
import math
import queue
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from perfed_ray.analysis import evaluation_accuracy, summary
from perfed_ray.errors import first_line
from perfed_ray.registry import TRACKERS
from perfed_ray.results.layout import EVALS, EVENTS, FILE, ROUNDS, RUNS, run_folder
from perfed_ray.results.schema import SCHEMAS
from perfed_ray.results.writer import write_atomically
from perfed_ray.tracking.base import TrackedRun, Tracker

if TYPE_CHECKING:
    from perfed_ray.results.writer import RunWriter

KEPT = "trackers.json"  # beside the run's checkpoint
STEPS = ("step", "sent")  # what trackers.json holds of each tracker beside its ids
FAILED = "tracker-failed"  # the events table's kind


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
    frame = evals.select(["round", "draw", "acc_after", "acc_before", "unseen"]).to_pandas()
    return {int(r): _finite(evaluation_accuracy(rows)) for r, rows in frame.groupby("round")}


class TrackerFeed:
    """The trackers `report_to` names, for one run whose rows `writer` writes (and
    whose events table hears of a tracker's failure); what they hold is kept in
    `folder` (the run's checkpoint folder). A resumed run's trackers are sent the
    rounds up to `resumed_at` (its checkpoint's round) that they do not hold yet."""

    def __init__(
        self,
        run: TrackedRun,
        names: list[str],
        folder: Path,
        writer: RunWriter,
        resumed_at: int | None = None,
    ) -> None:
        self.run, self.writer = run, writer
        self.path = Path(folder) / KEPT
        kept = json.loads(self.path.read_text()) if run.resumed and self.path.exists() else {}
        self.kept: dict[str, dict[str, Any]] = {n: kept.get(n, {}) for n in names}
        self.step = -1  # the last round logged, for a failure's event
        self.failed: list[dict[str, Any]] = []  # events not yet handed to the writer
        self.unwritten = False  # events handed to the writer but not yet written
        self.lock = threading.Lock()
        self.trackers: dict[str, Tracker] = {}
        for name in names:
            tracker = TRACKERS.load(name)()
            ids = {k: v for k, v in self.kept[name].items() if k not in STEPS}
            logged = int(self.kept[name].get("step", -1))
            sent = max(logged, int(self.kept[name].get("sent", -1)))
            tracked = replace(run, kept=ids, logged=logged, sent=sent)
            started = self._call(name, tracker.start, tracked)
            if started is not None:
                self.trackers[name] = tracker
                done = logged if tracker.resends else sent
                self.kept[name] = {**self.kept[name], **started, "step": done, "sent": done}
        self.queue: queue.Queue = queue.Queue()
        if resumed_at is not None:
            self.queue.put(("sent", self._recorded(resumed_at)))
        self.worker = threading.Thread(target=self._work, name="perfed-ray-trackers", daemon=True)
        self.worker.start()

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
            self._fail(name, err)
            return None
        return {} if result is None else result

    def _fail(self, name: str, err: Exception) -> None:
        self.trackers.pop(name, None)
        detail = f"{name}: {first_line(err)}"
        event = {"round": max(self.step, 0), "kind": FAILED, "actor": None, "users": None}
        with self.lock:
            self.failed.append({**event, "detail": detail})
        print(
            f"perfed-ray: tracker {detail}; it is off for the rest of run {self.run.run_id}",
            file=sys.stderr,
        )

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
            self.queue.put(("sent", dict(written)))
            return
        status = written[RUNS]["status"][0].as_py()
        if status != "running":
            self.queue.put(("end", status))
            self.worker.join()
            if self._report() or self.unwritten:
                self.writer.flush()

    def _work(self) -> None:
        """The trackers' thread: each write's rows in turn, until the run's end. Even a
        defect here only turns the trackers off: the run goes on."""
        while True:
            kind, what = self.queue.get()
            try:
                if kind == "sent":
                    self._take(what)
                else:
                    self._end(what)
                    return
            except Exception as err:
                for name in list(self.trackers):
                    self._fail(name, err)

    def _take(self, written: Mapping[str, pa.Table]) -> None:
        steps: dict[int, dict[str, float]] = {}
        if ROUNDS in written:
            steps = round_metrics(written[ROUNDS])
        if EVALS in written:
            for step, figures in evaluation_metrics(written[EVALS]).items():
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

    def _end(self, status: str) -> None:
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

    def close(self) -> None:
        """Let go of the trackers of a run that ended before its final row (a full
        disk): their end, as failed."""
        if self.worker.is_alive():
            self.queue.put(("end", None))
            self.worker.join()


def _plain(value: Any) -> Any:
    """A pandas or numpy scalar as the Python value trackers serialise."""
    return value.item() if hasattr(value, "item") else value
