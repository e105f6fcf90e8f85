"""Trackers: TensorBoard, MLflow, Weights & Biases or a user's own sink, fed a run's
configuration, rounds, evaluations and summary as its rows are written
(``report_to``; docs/guide/tracking.md). :mod:`.base` says what a tracker is,
:mod:`.feed` when it is told what; one module per library beside them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from perfed_ray.tracking.base import TrackedRun, Tracker
from perfed_ray.tracking.feed import TrackerFeed

if TYPE_CHECKING:
    from perfed_ray.config import RunConfig
    from perfed_ray.results.writer import RunWriter

__all__ = ["TrackedRun", "Tracker", "TrackerFeed", "follow", "start"]


def start(cfg: RunConfig) -> TrackerFeed | None:
    """The trackers `cfg.report_to` names, their process started now (as the run
    begins: their libraries load while the driver readies it); None where it names
    none."""
    return TrackerFeed(cfg.trackers) if cfg.trackers else None


def follow(
    feed: TrackerFeed,
    writer: RunWriter,
    cfg: RunConfig,
    folder: Path,
    resumed_at: int | None,
    sweep: str | None = None,
) -> None:
    """Have `feed` follow the run `writer` writes (`cfg`: as placed), listening to its
    writes. `folder` (the run's checkpoint folder) keeps what they logged;
    `resumed_at` is the round a resumed run continues after (-1: before its first
    checkpoint; None: a new run); `sweep` names the sweep the run is a trial of."""
    resumed = resumed_at is not None
    run = TrackedRun(writer.run_id, cfg.to_dict(), writer.out, resumed, sweep, {})
    writer.listeners.append(feed.follow(run, folder, writer, resumed_at))
