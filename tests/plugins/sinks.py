"""Users' own trackers, for the tracking tests: one that fails as a tracker whose
server went away does, and one whose library is not installed."""

from __future__ import annotations

from perfed_ray.tracking import Tracker


class Failing(Tracker):
    """Takes rounds 0 and 1, then raises on round 2 (its server gone)."""

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        if step >= 2:
            raise ConnectionError("the tracking server at http://tracker.invalid went away")


class Uninstalled(Tracker):
    library = "perfed_ray_tests_no_such_library"
    extra = "nowhere"
