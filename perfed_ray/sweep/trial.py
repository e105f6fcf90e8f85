"""One trial of a sweep: one simulation as a Ray Tune trainable, and how it learns why
it is being stopped.

The simulation runs in a thread of the trial's actor and hands Tune a result after
every round (`round`, and `accuracy`: the personalised accuracy of the latest
evaluation), then waits for Tune's next call: `step` lets it run one more round,
`cleanup` ends it there. Waiting keeps the run from running ahead of Tune's
decisions, and a stopped trial ends within one round, well inside the seconds Tune
allows an actor to clean up before it kills it.

`cleanup` alone cannot tell a trial that Tune's scheduler stopped (early stopping:
status `stopped`) from one whose sweep was interrupted (Ctrl-C, SIGTERM: status
`interrupted`, continued by `--resume`): Tune stops both the same way. The driver
can: a scheduler's stop arrives as the trial's result marked done without the trial
having finished. :class:`RecordStops`, a Tune callback in the driver, writes those
down in a small named actor (:class:`Stops`) before Tune stops the trial, and the
trial asks it. A trial that cannot reach it (its driver is gone) was interrupted.

A trial whose run ended before (finished, diverged or stopped: a sweep killed before
Tune saved that the trial was done) reports that and ends; one that was interrupted
continues from its run's last checkpoint, so its numbers are those of a trial never
stopped.
"""

from __future__ import annotations

import math
import queue
import signal
import threading
from pathlib import Path
from typing import Any

import ray
from ray import tune

from perfed_ray.lifecycle import status_of
from perfed_ray.runtime import hosts
from perfed_ray.runtime.rounds import Progress, Stopped
from perfed_ray.sweep import ENDED

STOPS = "perfed-ray-sweep-stops-"  # + the sweep's name: the actor, in its driver's namespace
CONTINUE, STOP, INTERRUPT = "continue", "stop", "interrupt"


@ray.remote(num_cpus=0)
class Stops:
    """The trials Tune stopped on its scheduler's decision (kept by the sweep's driver)."""

    def __init__(self) -> None:
        self.trials: set[str] = set()

    def add(self, trial_id: str) -> None:
        self.trials.add(trial_id)

    def has(self, trial_id: str) -> bool:
        return trial_id in self.trials


class RecordStops(tune.Callback):
    """Notes, in :class:`Stops`, each trial whose result Tune marked done although the
    trial still runs: a scheduler's (or stopper's) decision, taken before Tune stops it.
    Looks the actor up by name, so that the callback pickles with the Tuner's state."""

    def __init__(self, stops: str) -> None:
        self.stops = stops

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info):
        if result.get("done") and result.get("status") == "running":
            ray.get(ray.get_actor(self.stops).add.remote(trial.trial_id))


class Trial(tune.Trainable):
    """One simulation: `config["trial"]` holds the run's id, whole configuration and
    placement group bundles; `config` also the results folder, the sweep's name and command
    (see :func:`perfed_ray.sweep.runner.param_space`)."""

    def setup(self, config: dict[str, Any]) -> None:
        # Ray ends a trial's process (its work done, or its sweep gone) with SIGTERM when
        # it is slow to exit; its own handler then prints a SystemExit traceback from
        # wherever the process was. Nothing here needs cleaning up by then: die quietly.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        hosts.keep_in_groups()
        self._begin(config)

    def _begin(self, config: dict[str, Any]) -> None:
        self.run_id: str = config["trial"]["run_id"]
        self.tune_id: str = self.trial_id  # Tune's id of the trial this run is
        self.out = Path(config["out"])
        self.results: queue.Queue = queue.Queue(maxsize=1)
        self.verdicts: queue.Queue = queue.Queue(maxsize=1)
        self.thread: threading.Thread | None = None

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Host the sweep's next trial in this process and placement group (Tune reuses
        a trial's actor for a trial of the same shape, `reuse_actors`): the last
        trial's run is ended as :meth:`cleanup` would (Tune does not call it for an
        actor it keeps), and the next run finds its actors idle here
        (:mod:`perfed_ray.runtime.hosts`), sparing a process start for each."""
        self.cleanup()
        self._begin(new_config)
        return True

    def step(self) -> dict[str, Any]:
        if self.thread is None:
            ended = self._ended()
            if ended is not None:
                return ended
            self.thread = threading.Thread(target=self._simulate, name=self.run_id, daemon=True)
            self.thread.start()
        else:
            self.verdicts.put(CONTINUE)
        result = self.results.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def cleanup(self) -> None:
        """End a run Tune stops before it finished, with the status that says why."""
        if self.thread is not None and self.thread.is_alive():
            self.verdicts.put(STOP if self._stopped() else INTERRUPT)
            self.thread.join()

    def _stopped(self) -> bool:
        try:
            stops = ray.get_actor(self.config["stops"])
            return ray.get(stops.has.remote(self.tune_id), timeout=30)
        except (ValueError, ray.exceptions.RayError):  # no driver, so no decision: interrupted
            return False

    def _simulate(self) -> None:
        from perfed_ray.api import simulate
        from perfed_ray.runtime.checkpoint import RunStore

        store = RunStore(self.out, self.run_id)
        resume = store.folder if store.started else None
        try:
            simulate(
                None if resume else self.config["trial"]["run"],
                self.out,
                resume=resume,
                run_id=None if resume else self.run_id,
                progress=self._progress,
                placement_group=ray.util.get_current_placement_group(),
                command=self.config["command"],
                sweep=self.config.get("sweep"),  # a sweep started before trackers: none
            )
        except BaseException as err:
            status = status_of(err)
            if status in ("stopped", "interrupted"):
                return  # Tune asked for it in `cleanup`; nobody waits for a result
            if status != "diverged":  # a diverged run ended, as its runs row says
                self.results.put(err)
                return
        self.results.put(self._ended())

    def _progress(self, progress: Progress) -> None:
        """Hand Tune this round's result and wait for its decision; after the last round
        there is nothing to decide, and the run's end makes the final result."""
        if progress.round == progress.rounds:
            return
        self.results.put(self._result(progress.round, progress.accuracy, "running"))
        verdict = self.verdicts.get()
        if verdict == STOP:
            raise Stopped(f"stopped by the sweep's scheduler after round {progress.round}")
        if verdict == INTERRUPT:
            raise KeyboardInterrupt

    def _result(self, round_: int, accuracy: float | None, status: str) -> dict[str, Any]:
        return {
            "round": round_,
            "accuracy": math.nan if accuracy is None else accuracy,
            "status": status,
            "run_id": self.run_id,
        }

    def _ended(self) -> dict[str, Any] | None:
        """The final result of this trial's run if it ended (finished, diverged, stopped),
        from its runs row and its last checkpoint's evaluation; else None."""
        from perfed_ray.results.reader import read_runs
        from perfed_ray.runtime.checkpoint import RunStore

        runs = read_runs(self.out, self.run_id)
        if runs.empty or runs["status"].iloc[0] not in ENDED:
            return None
        checkpoint = RunStore(self.out, self.run_id).load()
        accuracy = checkpoint.accuracy[1] if checkpoint and checkpoint.accuracy else None
        status = runs["status"].iloc[0]
        return {**self._result(int(runs["rounds_done"].iloc[0]), accuracy, status), "done": True}
