"""Users' own trackers, for the tracking tests: one that fails as a tracker whose
server went away does, and one whose library is not installed."""

from __future__ import annotations

from typing import ClassVar

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
    """Keeps the steps it is sent, in this process, for the tests of what a resumed
    run sends again."""

    sent: ClassVar[list[int]] = []

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        Recording.sent.append(step)


class RecordingNoResend(Recording):
    """The same, for a tracker that cannot tell what it holds (as W&B offline)."""

    sent: ClassVar[list[int]] = []
    resends = False

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        RecordingNoResend.sent.append(step)
