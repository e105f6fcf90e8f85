"""Starting the actors that host a run's users, where its placement puts them.

The data set goes into Ray's object store once (`ray.put`) and every actor is given
the reference, as Ray's design patterns advise for a large read-only argument of
many calls, instead of a copy pickled into each actor's creation.
"""

from __future__ import annotations

from typing import Protocol

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from perfed_ray import faults
from perfed_ray.config import RunConfig
from perfed_ray.data import DataArrays, ShardSource
from perfed_ray.runtime import hosts
from perfed_ray.runtime.actor import UserActor
from perfed_ray.runtime.checkpoint import Checkpoint
from perfed_ray.runtime.environment import components
from perfed_ray.runtime.placement import Placement
from perfed_ray.runtime.pool import ActorFactory, Request


class Inputs(Protocol):
    """What starting the actors reads of a run's prepared inputs (the simulation's
    `Prepared`, which uses this module: typed here so that it is not imported back)."""

    @property
    def cfg(self) -> RunConfig: ...

    @property
    def data(self) -> DataArrays | None: ...

    def source(self, block: list[int]) -> ShardSource: ...


def actor_factory(
    prepared: Inputs,
    placement: Placement,
    checkpoint: Checkpoint | None = None,
    group: PlacementGroup | None = None,
) -> ActorFactory:
    """How to start (or restart) actor i: its block's shards come from the data set,
    put once in the object store and shared, or from the data root the actor reads;
    its users' per-user states from the checkpoint the run continues from; the user's
    own components (dotted paths in the configuration) resolved here. Actors are
    spread over the cluster's nodes, or in a placement group, actor i takes bundle
    i + 1 (bundle 0 is the driver's), so a replacement takes its predecessor's place.
    A `share` asked of Ray instead of the placement's request (a cluster that lost
    nodes) changes where the actor fits, not how it computes: its threads stay the
    placement's."""
    cfg = prepared.cfg
    shared = prepared.data is not None and cfg.data_transport == "object_store"
    data_ref = ray.put(prepared.data) if shared else None
    found = components(cfg)
    # Balanced rounds send any user to any actor: every actor gets every user's indices,
    # made and stored once for all of them.
    everyone = ray.put(prepared.source(range(cfg.n_users))) if cfg.balance_rounds else None

    def start(actor: int, incarnation: int, share: Request | None = None) -> ray.actor.ActorHandle:
        block = placement.blocks[actor]
        states = checkpoint.states_of(block) if checkpoint else None
        where = (
            "SPREAD"
            if group is None
            else PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=1 + actor)
        )
        asked = share or {}
        num_cpus = asked.get("CPU", placement.num_cpus)
        num_gpus = asked.get("GPU", placement.num_gpus)
        hosted = (
            cfg,
            block,
            prepared.source(block) if everyone is None else everyone,
            data_ref,
            placement.num_cpus,
            placement.num_gpus,
            actor,
            incarnation,
            states,
            found,
            faults.armed(),
        )
        return hosts.lend(
            hosts.key(num_cpus, num_gpus, group, 1 + actor),
            lambda: UserActor.options(
                num_cpus=num_cpus, num_gpus=num_gpus, scheduling_strategy=where
            ).remote(*hosted),
            lambda host: host.host.remote(*hosted),
        )

    return start
