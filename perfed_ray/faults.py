"""Deliberate crashes at named points, so that recovery is tested with real processes
and real signals rather than with mocks.

``PERFED_FAULT=<point>@<n>`` makes the process that reaches ``point`` for key ``n``
kill itself with SIGKILL: no clean-up, no flush, exactly what a pre-empted node or
the kernel's OOM killer does; several, separated by commas, arm each of them. Unset
(normal use) it costs a dictionary lookup.

=====================  =======================================================
point                  where, and what ``n`` counts
=====================  =======================================================
``driver-round``       driver, round ``n``'s training calls in flight
``driver-eval``        driver, the evaluation after round ``n`` in flight
``driver-write``       driver, its ``n``-th results file written under its
                       temporary name and not yet renamed into place
``driver-checkpoint``  driver, the checkpoint after round ``n`` written under
                       its temporary name and not yet renamed into place
``actor``              actor 0, first incarnation, training in round ``n``
``actor-replacement``  actor 0, second incarnation (its first replacement),
                       training in round ``n``
``actor-always``       actor 0, every incarnation, training in round ``n``
                       (work that fails however often it is retried)
``actor-states``       actor 0, first incarnation, taking back its users'
                       states trained elsewhere in round ``n`` (balanced rounds)
=====================  =======================================================
"""

from __future__ import annotations

import functools
import os
import signal

ENV = "PERFED_FAULT"

# The driver's points while an actor method's calls are in flight (the pool's gather).
IN_FLIGHT = {"work": "driver-round", "evaluate": "driver-eval"}


@functools.lru_cache(maxsize=8)
def _armed(spec: str) -> frozenset[tuple[str, int]]:
    armed = set()
    for one in spec.split(","):
        point, sep, n = one.partition("@")
        if sep and n.isdigit():
            armed.add((point, int(n)))
    return frozenset(armed)


def crash_at(point: str, n: int) -> None:
    """SIGKILL this process if ``PERFED_FAULT`` names this point and key."""
    spec = os.environ.get(ENV)
    if spec and (point, n) in _armed(spec):
        os.kill(os.getpid(), signal.SIGKILL)


def in_flight(method: str, n: int) -> None:
    """The driver's point for calls of an actor `method` sent in round `n` (if it has one)."""
    point = IN_FLIGHT.get(method)
    if point is not None:
        crash_at(point, n)


def armed() -> str | None:
    """What this process has armed: the spec a driver hands its actors (:func:`arm`)."""
    return os.environ.get(ENV)


def arm(spec: str | None) -> None:
    """Arm in this process the faults `spec` names (None: none). An actor takes its
    driver's so, as an argument, wherever it runs (a worker on a running cluster did not
    inherit the driver's environment) and whichever run it hosted before."""
    if spec:
        os.environ[ENV] = spec
    else:
        os.environ.pop(ENV, None)
