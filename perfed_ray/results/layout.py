"""A results folder's layout: the one place that names what lies under ``--out``.

Everything perfed-ray writes into a results folder sits in a folder named here, so
that a folder is recognised as perfed-ray's own (runs are added side by side, never
mixed into someone else's files) and every reader and writer agrees on the paths::

    runs/ rounds/ evals/ events/ actors/ tasks/
                                           the Parquet tables, run_id=<id>/part-0.parquet
    checkpoints/run_id=<id>/               a run's record and checkpoint (--resume)
    sweeps/<name>/                         Ray Tune's state of each sweep
    logs/<run_id>.txt                      tracebacks of failed runs
    tensorboard/<run_id>/                  report_to: tensorboard's event files
    report/                                `perfed-ray report` and `compare`
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from perfed_ray.errors import ConfigError

RUNS = "runs"  # one row per run, rewritten as its status changes
ROUNDS = "rounds"  # one row per round
EVALS = "evals"  # one row per user, evaluation and draw
EVENTS = "events"  # failures, replacements, drop-outs, stragglers
ACTORS = "actors"  # which node, process and GPU hosted which users
TASKS = "tasks"  # one row per user's task on the simulated clock
TABLES = (RUNS, ROUNDS, EVALS, EVENTS, ACTORS, TASKS)
APPENDED = tuple(t for t in TABLES if t != RUNS)  # tables that grow as a run goes

CHECKPOINTS = "checkpoints"
SAFE_ID = re.compile(r"[A-Za-z0-9_-]+")  # a run id names folders: no separators, no dots
SWEEPS = "sweeps"
LOGS = "logs"
REPORT = "report"
TENSORBOARD = "tensorboard"
# Notes beside the tables (a README) do not make a folder someone else's.
OURS = frozenset({*TABLES, CHECKPOINTS, SWEEPS, LOGS, REPORT, TENSORBOARD, "README.md"})

FILE = "part-0.parquet"  # each table's one file per run


def run_folder(out: str | Path, table: str, run_id: str) -> Path:
    """Where one run's file of `table` lies (hive-partitioned by run)."""
    return Path(out) / table / f"run_id={run_id}"


def traceback_log(out: str | Path, run_id: str) -> Path:
    return Path(out) / LOGS / f"{run_id}.txt"


def _not_creatable(out: Path) -> int | None:
    """The errno that making folder `out` would meet, None if it exists or can be made."""
    nearest = next(p for p in (out, *out.parents) if p.exists())
    if nearest == out:
        return None if out.is_dir() else errno.EEXIST
    if not nearest.is_dir():
        return errno.ENOTDIR
    return None if os.access(nearest, os.W_OK | os.X_OK) else errno.EACCES


def check_out(out: Path) -> None:
    """A results folder must be creatable, writable, and empty or perfed-ray's own:
    runs are added to it side by side, but never mixed into someone else's files. It is
    only checked here, not made: the run makes it when it writes, so input found bad
    later (the data) leaves no empty folder behind."""
    problem = _not_creatable(out)
    if problem is not None:
        raise ConfigError(
            f"--out {str(out)!r} cannot be created ({os.strerror(problem)}): choose a "
            f"writable folder"
        )
    if not out.exists():
        return
    if not os.access(out, os.W_OK):
        raise ConfigError(f"--out {str(out)!r} is not writable: choose a writable folder")
    foreign = sorted(
        p.name for p in out.iterdir() if p.name not in OURS and not p.name.startswith(".")
    )
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise ConfigError(
            f"--out {str(out)!r} is not empty and not a perfed-ray results "
            f"folder (it holds {shown}): choose an empty or new folder, or an "
            f"existing results folder"
        )
