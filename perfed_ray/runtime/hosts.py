"""Warm hosts: the actor processes of a finished run, kept to host the next run of the
same driver process instead of starting new ones.

Starting an actor's process costs seconds of CPU (importing torch and Ray is most of
it), against milliseconds for the rounds of a small run: a process that runs
many short runs (a study's grid, a notebook, the test suite) pays that for every actor
of every run. A finished run's live actors are emptied (their users' shards and states
dropped) and kept; the next run that asks Ray for the same share (CPUs and
GPUs) with no placement group of its own rehosts them with its users, as a new
actor would be built. Rows do not change: an actor is made from its arguments alone
(every random stream is keyed), and its peak memory is counted from the rehosting.

Idle hosts hold their CPUs in Ray: anything else that asks this Ray for resources
waits on them. So they are kept only where this driver owns its Ray (it started the
local Ray itself, :mod:`perfed_ray.runtime.local_ray`) or where asked with
``PERFED_RAY_WARM_HOSTS=1`` (the test suite; a notebook that runs nothing else on its
Ray); a run that wants another share lets every idle host go first, and
:func:`release` lets them go for other work (a sweep's trials).

A sweep's trial places its actors in bundles of its own placement group, which Tune
hands, with the trial's process, to the sweep's next trial of the same shape
(:mod:`perfed_ray.sweep.trial`): hosts idle there hold nothing anyone else could
have, so a trial's process keeps them (:func:`keep_in_groups`), keyed by group and
bundle, and the next trial there skips both processes' start.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import ray
from ray.util.placement_group import PlacementGroup

ENV = "PERFED_RAY_WARM_HOSTS"

Key = tuple[float, float, str]  # CPUs, GPUs, where: Ray session, or group and bundle
_idle: dict[Key, list[ray.actor.ActorHandle]] = {}
_lent: dict[bytes, Key] = {}  # actor id -> the share it holds, for actors a run holds
_in_groups = False  # this process keeps hosts idle in its placement group's bundles


def _wanted() -> bool:
    from perfed_ray.runtime import local_ray

    return os.environ.get(ENV) == "1" or local_ray.owns_ray()


def keep_in_groups() -> None:
    """This process runs one run after another in a placement group that is its own
    (a sweep's trial actor): keep their hosts idle in its bundles."""
    global _in_groups
    _in_groups = True


def key(
    num_cpus: float, num_gpus: float, group: PlacementGroup | None = None, bundle: int = 0
) -> Key | None:
    """What a host must hold to be lent again (its share, and where: bundle `bundle` of
    `group`, or anywhere in this Ray session): None where hosts are not kept."""
    if group is not None:
        return (num_cpus, num_gpus, f"{group.id.hex()}:{bundle}") if _in_groups else None
    if not _wanted():
        return None
    return (num_cpus, num_gpus, ray.get_runtime_context().get_job_id())


def lend(
    share: Key | None,
    create: Callable[[], ray.actor.ActorHandle],
    rehost: Callable[[ray.actor.ActorHandle], None],
) -> ray.actor.ActorHandle:
    """An idle host holding `share`, rehosted, or else a new actor from `create` (every
    idle host of another share let go first, so that its resources are free)."""
    idle = _idle.get(share) if share is not None else None
    if idle:
        actor = idle.pop()
        rehost(actor)
    else:
        release()
        actor = create()
    if share is not None:
        _lent[actor._actor_id.binary()] = share
    return actor


def give_back(actors: list[ray.actor.ActorHandle], keep: bool) -> None:
    """A run's actors, done: kept idle (emptied) where `keep` and they were lent with a
    share, else ended."""
    for actor in actors:
        share = _lent.pop(actor._actor_id.binary(), None)
        if keep and share is not None:
            actor.vacate.remote()
            _idle.setdefault(share, []).append(actor)
        else:
            ray.kill(actor)


def release() -> None:
    """End every idle host, freeing what it holds in Ray (those of a Ray since shut
    down are gone already)."""
    for actors in _idle.values():
        for actor in actors:
            try:
                ray.kill(actor)
            except Exception:  # a handle of an earlier Ray session
                continue
    _idle.clear()
