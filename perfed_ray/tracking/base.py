"""What a tracker is: somewhere a run's numbers are also sent as it goes (TensorBoard,
MLflow, Weights & Biases, or a user's own class named by dotted path in
``report_to``), beside the Parquet tables, which stay the record.

A tracker is told five things, in this order, in the trackers' own process at the
lowest priority (:mod:`perfed_ray.tracking.serve`; :mod:`perfed_ray.tracking.feed`
decides when): :meth:`Tracker.start` with the run's whole configuration,
:meth:`Tracker.log` once per round sent (every `report_every`-th, and each evaluated
one) with that round's row and, at an evaluated round, the evaluation's aggregates,
:meth:`Tracker.flush` once the rows of a write are logged, :meth:`Tracker.summary`
with the run's summary row, and :meth:`Tracker.close` with its status. It may raise
anything: the failure is reported once in the run's `events`, the tracker is not used
again, and the run goes on.

Its library is imported in :meth:`Tracker.start`, never when the module loads, so
that checking a configuration costs no import of it: :meth:`Tracker.check_installed`
asks only whether it could be imported.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from perfed_ray.errors import ConfigError
from perfed_ray.results.schema import EXIT_CODES


@dataclass(frozen=True)
class TrackedRun:
    """The run a tracker follows. `kept` is what this tracker's :meth:`Tracker.start`
    returned in the run's earlier sitting (empty for a new run): the ids it needs to
    continue the same tracker run. `logged`: the last step the earlier sittings made
    durable in it (-1: none); `sent`: the last step they had begun to send (the steps
    after `logged` up to it are in doubt: a kill may have come between their sending
    and their being counted). This sitting logs the steps after `logged`, so a tracker
    whose store may hold some of them drops what it holds (TensorBoard's purge,
    MLflow's own history), unless it says it cannot tell (:attr:`Tracker.resends`)."""

    run_id: str
    config: dict[str, Any]  # every configuration key, as the runs table has it
    out: Path  # the results folder
    resumed: bool
    group: str | None  # the sweep the run is a trial of
    kept: dict[str, str]
    logged: int = -1
    sent: int = -1


class Tracker:
    """A sink of one run's metrics; subclass it for your own (``report_to:
    [mypkg.sinks:Mine]``). `library` is the module it needs and `extra` the
    perfed-ray extra that installs it, named by the error when it is missing.
    `resends`: whether a resumed run sends it the steps in doubt again (it holds each
    step at most once itself); False for one that cannot tell what it holds, which is
    not sent them and may lose them, but never holds a step twice. `imports`: the
    modules its :meth:`start` imports, loaded as the run begins, while the driver
    readies the data, Ray and the actors, so that the run's first rows do not wait
    for them."""

    library: ClassVar[str | None] = None
    extra: ClassVar[str | None] = None
    resends: ClassVar[bool] = True
    imports: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check_installed(cls, name: str) -> None:
        """ConfigError (exit 2 before Ray starts) if the tracker's library is missing."""
        if cls.library and importlib.util.find_spec(cls.library) is None:
            how = f"pip install 'perfed-ray[{cls.extra}]'" if cls.extra else "install it"
            raise ConfigError(
                f"report_to names {name}, whose library {cls.library} is not installed: {how}"
            )

    def start(self, run: TrackedRun) -> dict[str, str]:
        """Open (or, with `run.kept`, reopen) the tracker's run and record the
        configuration as its hyperparameters; return what a later sitting needs to
        continue the same tracker run (kept beside the run's checkpoint)."""
        return {}

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        """Round `step`'s metrics, named as the Parquet columns they come from; the
        simulated clock's time of the round where the run has one."""
        raise NotImplementedError

    def flush(self) -> None:
        """Make what was logged durable: the feed then counts those steps as logged,
        and a resumed run does not send them again."""

    def summary(self, values: dict[str, Any]) -> None:
        """The run's row of `perfed-ray summary` (final accuracy, its interval, status,
        wall time ...), once, as it ends."""

    def close(self, status: str) -> None:
        """End the tracker's run; `status` is the runs table's (finished, failed ...):
        a success where it is one of :data:`SUCCEEDED`."""


# The runs table's statuses of a run that ended as it should (those the command exits
# 0 for). Each tracker shows the others as its library's failure.
SUCCEEDED = tuple(status for status, code in EXIT_CODES.items() if code == 0)


def numbers(values: dict[str, Any]) -> dict[str, float]:
    """The values of a summary that are numbers (not flags), as floats."""
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
