"""Time stamps of a run's phases from the command to its exit, for the benchmark that
splits a run's fixed cost (experiments/bench/breakdown.py).

With ``PERFED_TIMELINE=FILE`` in the environment, :func:`mark` appends one line, the
phase's name and the wall-clock time it began (seconds since the epoch, comparable
across processes), to FILE; without it, as always outside the benchmarks, it does
nothing. The phases, in order: ``cli`` (Python and the command's imports done),
``data`` (the configuration validated: reading and partitioning the data set),
``ray`` (starting or joining Ray), ``set-up`` (the driver's model, engine and
results files), ``actors`` (the actors started and holding their shards), ``rounds``
(the rounds, evaluations and checkpoints), ``finish`` (the runs row and the summary),
``stop`` (the local Ray stopped) and ``exit`` (the process's last step).
"""

from __future__ import annotations

import os
import time

ENV = "PERFED_TIMELINE"
PHASES = ("cli", "data", "ray", "set-up", "actors", "rounds", "finish", "stop", "exit")


def mark(phase: str) -> None:
    """Note that `phase` begins now, where PERFED_TIMELINE says (else nothing)."""
    path = os.environ.get(ENV)
    if path:
        with open(path, "a") as timeline:
            timeline.write(f"{phase} {time.time():.6f}\n")


def read(path: str | os.PathLike) -> dict[str, float]:
    """A timeline file as {phase: when it first began}."""
    began: dict[str, float] = {}
    with open(path) as timeline:
        for line in timeline:
            phase, at = line.split()
            began.setdefault(phase, float(at))
    return began
