"""Users' own trackers, for the tracking tests: one that fails as a tracker whose
server went away does, and one whose library is not installed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from perfed_ray.tracking import Tracker


class Failing(Tracker):
    """Takes rounds 0 and 1, then raises on round 2 (its server gone)."""

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        if step >= 2:
            raise ConnectionError("the tracking server at http://tracker.invalid went away")


class Uninstalled(Tracker):
    library = "perfed_ray_tests_no_such_library"
    extra = "nowhere"


class Recording(Tracker):
    """Records the steps it is sent in `<out>/<its class>.steps`, for the tests of what
    a resumed run sends again (the trackers run in a process of their own)."""

    def start(self, run) -> dict[str, str]:
        self.steps = Path(run.out) / f"{type(self).__name__}.steps"
        return {}

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        with self.steps.open("a") as steps:
            steps.write(f"{step}\n")

    @classmethod
    def sent(cls, out: Path) -> list[int]:
        path = Path(out) / f"{cls.__name__}.steps"
        return [int(line) for line in path.read_text().split()] if path.exists() else []


class RecordingNoResend(Recording):
    """The same, for a tracker that cannot tell what it holds (as W&B offline)."""

    resends = False


class Niceness(Tracker):
    """Records, in `<out>/niceness.json`, the niceness of the process that runs its
    calls and of a process that one starts."""

    def start(self, run) -> dict[str, str]:
        self.seen = {"start": os.getpriority(os.PRIO_PROCESS, 0), "pid": os.getpid()}
        # What a library's helper process (W&B's service) gets: `nice` prints its own.
        self.seen["child"] = int(subprocess.run(["nice"], capture_output=True).stdout)
        self.path = Path(run.out) / "niceness.json"
        return {}

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        self.seen["log"] = os.getpriority(os.PRIO_PROCESS, 0)
        self.path.write_text(json.dumps(self.seen))


class Dying(Tracker):
    """Takes round 0, then its whole process dies in round 1 (as a library's crash
    would end it: no exception to catch)."""

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        if step >= 1:
            os._exit(3)
