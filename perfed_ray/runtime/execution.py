"""How a run executes its users' work, decided once before any actor starts: the
engine (measured on the actors' device where it is `auto`), compilation and balanced
rounds, so that the stored configuration says how the run was executed."""

from __future__ import annotations

import dataclasses
import math

import ray
import torch
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from perfed_ray.config import RunConfig, revise
from perfed_ray.data import ShardSource
from perfed_ray.engines.auto import Workload, choose, known
from perfed_ray.runtime import hosts
from perfed_ray.runtime.environment import adopt, components
from perfed_ray.runtime.placement import Placement

COMPILE_FROM = 200_000  # user-steps per actor from which compiling (10-20 s) pays on CPU


def resolve_execution(
    cfg: RunConfig,
    model: torch.nn.Module,
    placement: Placement,
    source: ShardSource,
    group: PlacementGroup | None = None,
) -> RunConfig:
    """`engine`, `compile` and `balance_rounds` made concrete, once, before any actor
    starts, so the stored configuration says how the run was executed and a resumed
    run and every actor (a replacement one too) use the same engine: engines differ in
    their order of summation, and exact resumption needs the same one. The engine is
    fused for the MLP, else the fastest measured for this workload on the actors'
    device (:mod:`perfed_ray.engines.auto`); compiled when each actor has enough work
    for compilation to pay for itself; rounds balanced over two or more actors (users'
    per-user states travel with their work)."""
    engine = cfg.engine or known(model) or _auto_engine(cfg, model, placement, source, group)
    n_actors = len(placement.blocks)
    compile_ = cfg.compile
    if compile_ is None:
        work = cfg.rounds * cfg.users_per_round * cfg.tau / n_actors
        compile_ = engine == "fused" and work >= COMPILE_FROM
    balance = n_actors > 1 if cfg.balance_rounds is None else cfg.balance_rounds
    return revise(cfg, engine=engine, compile=compile_, balance_rounds=balance)


def _auto_engine(
    cfg: RunConfig,
    model: torch.nn.Module,
    placement: Placement,
    source: ShardSource,
    group: PlacementGroup | None,
) -> str:
    """The engine `auto` stands for, measured where the actors will run: CPU actors on
    the driver (same CPUs, the actors' thread count), GPU actors in a Ray task that
    asks for one actor's resources (in the trial's group, where a sweep reserved them),
    since the driver may have no GPU and the choice is the device's. The task runs
    before the actors start, so their resources are free."""
    trained = cfg.n_users if cfg.trained_users == "all" else cfg.users_per_round
    work = Workload(
        tuple(source.input_shape),
        source.n_classes,
        users=math.ceil(trained / len(placement.blocks)),
        threads=max(1, int(placement.num_cpus)),
        device="cpu",
    )
    if not placement.num_gpus:
        return choose(cfg, model, work)
    hosts.release()  # an earlier run's idle hosts may hold the GPU the task needs
    where = (
        "DEFAULT"
        if group is None
        else PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=1)
    )
    task = ray.remote(_choose_on_gpu).options(
        num_cpus=placement.num_cpus, num_gpus=placement.num_gpus, scheduling_strategy=where
    )
    return ray.get(task.remote(cfg, model, work, components(cfg)))


def _choose_on_gpu(cfg: RunConfig, model: torch.nn.Module, work: Workload, found) -> str:
    """In a task holding an actor's GPU share: the choice on its device."""
    adopt(cfg, found)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return choose(cfg, model, dataclasses.replace(work, device=device))
