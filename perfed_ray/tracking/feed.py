"""Feeding a run's trackers from the rows its writer has just made durable, so the
trackers see what the Parquet tables hold, in the same order, and the rounds' loop
knows nothing of them.

:class:`TrackerFeed` is the writer's listener (:class:`~perfed_ray.results.writer.RunWriter`
calls it after each write): a flush's new `rounds` and `evals` rows become one
:meth:`~perfed_ray.tracking.base.Tracker.log` per round, the final `runs` row the
summary and the end. What each tracker has logged (the last step, and the ids its
``start`` returned) is kept in ``trackers.json`` beside the run's checkpoint, written
after the tracker flushed: a resumed run reopens the same tracker runs and skips the
steps they already hold, so no step is logged twice (a round replayed after a crash
keeps, in the tracker, its first sitting's timings). A tracker that raises is
reported once in `events` (kind ``tracker-failed``) and on stderr, and is not used
again; the run goes on.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from perfed_ray.analysis import evaluation_accuracy, summary
from perfed_ray.errors import first_line
from perfed_ray.registry import TRACKERS
from perfed_ray.results.layout import EVALS, EVENTS, ROUNDS, RUNS
from perfed_ray.results.writer import write_atomically
from perfed_ray.tracking.base import TrackedRun, Tracker

if TYPE_CHECKING:
    from perfed_ray.results.writer import RunWriter

KEPT = "trackers.json"  # beside the run's checkpoint
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
    whose events table hears of a tracker's failure); what they logged is kept in
    `folder` (the run's checkpoint folder)."""

    def __init__(self, run: TrackedRun, names: list[str], folder: Path, writer: RunWriter) -> None:
        self.run, self.writer = run, writer
        self.path = Path(folder) / KEPT
        kept = json.loads(self.path.read_text()) if run.resumed and self.path.exists() else {}
        self.kept: dict[str, dict[str, Any]] = {n: kept.get(n, {}) for n in names}
        self.step = -1  # the last round logged, for a failure's event
        self.failures = 0
        self.trackers: dict[str, Tracker] = {}
        for name in names:
            tracker = TRACKERS.load(name)()
            ids = {k: v for k, v in self.kept[name].items() if k != "step"}
            started = self._call(name, tracker.start, replace(run, kept=ids))
            if started is not None:
                self.trackers[name] = tracker
                self.kept[name] = {**self.kept[name], **started}

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
        self.failures += 1
        detail = f"{name}: {first_line(err)}"
        event = {"round": max(self.step, 0), "kind": FAILED, "actor": None, "users": None}
        self.writer.add(EVENTS, [{**event, "detail": detail}])
        print(
            f"perfed-ray: tracker {detail}; it is off for the rest of run {self.run.run_id}",
            file=sys.stderr,
        )

    def __call__(self, written: Mapping[str, pa.Table]) -> None:
        """The writer's listener: `written` holds each table's rows just written. Even
        a defect here only turns the trackers off: the run goes on."""
        try:
            self._take(written)
        except Exception as err:
            for name in list(self.trackers):
                self._fail(name, err)

    def _take(self, written: Mapping[str, pa.Table]) -> None:
        if RUNS in written:
            row = written[RUNS].to_pylist()[0]
            if row["status"] != "running":
                self.end(row["status"])
            return
        steps: dict[int, dict[str, float]] = {}
        if ROUNDS in written:
            steps = round_metrics(written[ROUNDS])
        if EVALS in written:
            for step, figures in evaluation_metrics(written[EVALS]).items():
                steps[step] = {**steps.get(step, {}), **figures}
        if steps:
            self.log(steps)

    def log(self, steps: dict[int, dict[str, float]]) -> None:
        """Each tracker gets the rounds it does not hold yet, in order, then flushes;
        only then is its last step kept."""
        for name, tracker in list(self.trackers.items()):
            done = self.kept[name].get("step", -1)
            for step in sorted(s for s in steps if s > done):
                self.step = step
                metrics = steps[step]
                if self._call(name, tracker.log, step, metrics, metrics.get("sim_time")) is None:
                    break
            else:
                if self._call(name, tracker.flush) is not None:
                    self.kept[name]["step"] = max(done, *steps)
        self._keep()

    def _keep(self) -> None:
        text = json.dumps(self.kept)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, lambda tmp: tmp.write_text(text))

    def end(self, status: str) -> None:
        """The run's summary (`perfed-ray summary`'s row), then each tracker's end."""
        if not self.trackers:
            return
        rows = summary(self.run.out, self.run.run_id).to_dict("records")
        values = _finite({k: _plain(v) for k, v in rows[0].items()}) if rows else {}
        failures = self.failures
        for name, tracker in list(self.trackers.items()):
            if self._call(name, tracker.summary, values) is not None:
                self._call(name, tracker.close, status)
        if self.failures > failures:  # the events of failures at the end
            self.writer.flush()
        self.trackers.clear()

    def close(self) -> None:
        """Let go of trackers still open (a run that ended before its final row)."""
        for name, tracker in list(self.trackers.items()):
            self._call(name, tracker.close, "failed")
        self.trackers.clear()


def _plain(value: Any) -> Any:
    """A pandas or numpy scalar as the Python value trackers serialise."""
    return value.item() if hasattr(value, "item") else value
