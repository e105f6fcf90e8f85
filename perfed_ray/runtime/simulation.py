"""One simulation from configuration to Parquet: data, actors, rounds, results.

Everything that can fail because of the user's input (configuration, data
root, partition) is checked in :func:`prepare`, before Ray starts.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow
import ray
import torch
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import perfed_ray
from perfed_ray import faults, timeline
from perfed_ray.algorithms.base import keeps_user_state
from perfed_ray.config import RunConfig
from perfed_ray.data import (
    DataArrays,
    InputScaling,
    PartitionedShards,
    ShardSource,
    SyntheticShards,
    UserIndices,
    input_scaling,
    load_dataset,
    partition,
    resolve_root,
)
from perfed_ray.data.datasets import dataset, paper_a
from perfed_ray.data.synthetic import train_size
from perfed_ray.engines.auto import Workload, choose, known
from perfed_ray.errors import ConfigError
from perfed_ray.lifecycle import RunLife, new_run_id
from perfed_ray.models import FlatParams, initial_model, params_of
from perfed_ray.registry import STRATEGIES
from perfed_ray.results.writer import RunWriter
from perfed_ray.runtime import local_ray
from perfed_ray.runtime.actor import UserActor, peak_memory_bytes
from perfed_ray.runtime.checkpoint import Checkpoint, RunRecord, RunStore
from perfed_ray.runtime.coordinator import Coordinator
from perfed_ray.runtime.environment import adopt, components
from perfed_ray.runtime.placement import (
    Placement,
    bundles,
    group_share,
    plan,
    unfit,
    with_resources,
)
from perfed_ray.runtime.pool import ActorFactory, ActorPool, StateLost
from perfed_ray.runtime.rounds import Progress, Rounds


@dataclass(frozen=True)
class Prepared:
    """A run's validated inputs: the data set (none for generated ones), its users
    and the input scaling every user's pixels get."""

    cfg: RunConfig
    data: DataArrays | None
    users: list[UserIndices] | None
    scaling: InputScaling | None = None

    def source(self, block: list[int]) -> ShardSource:
        """What the actor hosting `block` needs to build its shards: ids and seeds
        or index sets, never samples."""
        cfg = self.cfg
        if self.data is None:
            generate = dataset(cfg.dataset).generate
            return SyntheticShards(generate, cfg.seed, cfg.synthetic_alpha, cfg.synthetic_beta)
        return PartitionedShards(
            cfg.dataset,
            str(cfg.data_root),
            cfg.seed,
            {u: self.users[u] for u in block},
            self.data.input_shape,
            self.data.n_classes,
            self.scaling,
            cfg.data_folder,
        )

    def train_sizes(self) -> np.ndarray:
        """Every user's training-sample count (before any validation hold-out), on the
        driver: what `sampling: samples` draws users in proportion to."""
        if self.users is None:
            seed = self.cfg.seed
            return np.array([train_size(seed, u) for u in range(self.cfg.n_users)])
        return np.array([len(u.train) for u in self.users])


def prepare(cfg: RunConfig) -> Prepared:
    """Load the data set and partition it; raises DataError for unusable input.

    `auto` values that depend on the data are resolved here, so the stored
    configuration says what the run actually used.
    """
    if dataset(cfg.dataset).load is None:
        return Prepared(cfg, None, None)
    cfg = cfg.replace(
        data_root=str(resolve_root(cfg.data_root)), paper_a=cfg.paper_a or paper_a(cfg.dataset)
    )
    data = load_dataset(cfg.dataset, cfg.data_root, cfg.download, cfg.seed, cfg.data_folder)
    return Prepared(cfg, data, partition(cfg, data), input_scaling(data, cfg.input_scale))


def initial_weights(cfg: RunConfig, source: ShardSource) -> np.ndarray:
    """w_0 as the flat vector that travels."""
    params = params_of(initial_model(cfg, source))
    return FlatParams(params).flatten(params)


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
    return cfg.replace(engine=engine, compile=compile_, balance_rounds=balance)


def round_work(prepared: Prepared) -> Callable[[int], float] | None:
    """A user's local steps in a round, as balanced rounds weigh it: the same for every
    user (None) with `tau` steps, its batches per epoch with `local_epochs`."""
    cfg = prepared.cfg
    if not cfg.steps_vary:
        return None
    batches = np.ceil(prepared.train_sizes() / cfg.batch_size)
    return lambda user: float(batches[user])


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


def actor_factory(
    prepared: Prepared,
    placement: Placement,
    checkpoint: Checkpoint | None = None,
    group: PlacementGroup | None = None,
) -> ActorFactory:
    """How to start (or restart) actor i: its block's shards come from the data set,
    put once in the object store and shared, or from the data root the actor reads;
    its users' per-user states from the checkpoint the run continues from; the user's
    own components (dotted paths in the configuration) resolved here. Actors are
    spread over the cluster's nodes, or in a placement group, actor i takes bundle
    i + 1 (bundle 0 is the driver's), so a replacement takes its predecessor's place."""
    cfg = prepared.cfg
    shared = prepared.data is not None and cfg.data_transport == "object_store"
    data_ref = ray.put(prepared.data) if shared else None
    found = components(cfg)
    # Balanced rounds send any user to any actor: every actor gets every user's indices,
    # made and stored once for all of them.
    everyone = ray.put(prepared.source(range(cfg.n_users))) if cfg.balance_rounds else None

    def start(actor: int, incarnation: int) -> ray.actor.ActorHandle:
        block = placement.blocks[actor]
        states = checkpoint.states_of(block) if checkpoint else None
        where = (
            "SPREAD"
            if group is None
            else PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=1 + actor)
        )
        return UserActor.options(
            num_cpus=placement.num_cpus,
            num_gpus=placement.num_gpus,
            scheduling_strategy=where,
            runtime_env=faults.actor_env(),
        ).remote(
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
        )

    return start


def _versions() -> dict[str, str]:
    return {
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "perfed_ray_version": perfed_ray.__version__,
        "ray_version": ray.__version__,
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "pyarrow_version": pyarrow.__version__,
    }


def _driver() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _nodes() -> list[dict[str, float]]:
    return [node["Resources"] for node in ray.nodes() if node["Alive"]]


def _peak_memory(pool: ActorPool) -> dict[str, int]:
    """Peak resident memory of the driver and of all actors together."""
    return {
        "driver_peak_memory_bytes": peak_memory_bytes(),
        "actors_peak_memory_bytes": sum(d["peak_memory_bytes"] for d in pool.describe()),
    }


def check_resources(cfg: RunConfig, blocks: list[range] | None = None) -> None:
    """The actors of a new run (or of one resumed with its `blocks`) fit the connected
    cluster, all alive at once; ConfigError naming what they ask and what there is,
    where Ray would keep them waiting for ever."""
    nodes = _nodes()
    placement = plan(cfg, nodes) if blocks is None else with_resources(cfg, nodes, blocks)
    why = unfit(bundles(placement), nodes)
    if why:
        raise ConfigError(
            f"{why}: lower num_cpus_per_actor or num_gpus_per_actor (auto shares the "
            f"cluster out), or run on a cluster that has them"
        )


class _RollBacks:
    """How a run whose users keep per-user state goes on after an actor died with some
    of those states: from the last checkpoint, its rows restored and the roll-back
    recorded. An actor that dies in the same round more often than `retries` stops the
    run instead (counted per round and actor, as the pool counts replacements)."""

    def __init__(self, retries: int, store: RunStore, writer: RunWriter) -> None:
        self.retries, self.store, self.writer = retries, store, writer
        self.deaths: Counter[tuple[int, int]] = Counter()
        self.events: list[tuple[int, dict]] = []  # (checkpoint round restored, events row)

    def restore(self, lost: StateLost) -> Checkpoint | None:
        """The checkpoint to go on from after `lost` (None: from the start)."""
        self.deaths[lost.round, lost.actor] += 1
        if self.deaths[lost.round, lost.actor] > self.retries:
            raise lost.failed(self.deaths[lost.round, lost.actor]) from None
        checkpoint = self.store.load()
        self.writer.resume(checkpoint.rows if checkpoint else {})
        restored = checkpoint.round if checkpoint else 0
        # Roll-backs to this same checkpoint were recorded after it was saved, so resuming
        # the writer cut their rows: they are written again; rows of roll-backs to an
        # older checkpoint are in it and stay as they are.
        self.events = [(r, e) for r, e in self.events if r == restored]
        self.events.append((restored, lost.event(restored)))
        self.writer.add("events", [event for _, event in self.events])
        return checkpoint


def run(
    prepared: Prepared,
    out: Path,
    on_progress: Callable[[Progress], None] | None = None,
    group: PlacementGroup | None = None,
    command: str | None = None,
    life: RunLife | None = None,
) -> str:
    """Run one simulation on the connected Ray cluster (a local one if none) as a new run
    in `out`, or the run `life` claimed (new, or a stopped one to continue from its last
    checkpoint); returns the run id. With `group` (a sweep trial's placement group), the
    actors are sized by and placed in its bundles after the first. `command` is what
    started the run, for its runs row (default: this process's command line). The runs
    row says `finished` only if every round ran, and otherwise why it did not
    (:class:`~perfed_ray.lifecycle.RunLife`)."""
    if life is None:
        with RunLife.new(out, new_run_id(prepared.cfg.algorithm)) as life:
            return run(prepared, out, on_progress, group, command, life)
    local_ray.start([prepared.cfg])
    cfg = prepared.cfg
    clock = time.perf_counter()
    model = initial_model(cfg, prepared.source([]))
    nodes = _nodes() if group is None else group_share(group.bundle_specs)
    checkpoint = life.checkpoint
    if life.resumed:
        record = dataclasses.replace(life.record, resumes=life.record.resumes + 1, driver=_driver())
        placement = with_resources(cfg, nodes, record.blocks)
    else:
        placement = plan(cfg, nodes)
        cfg = resolve_execution(cfg, model, placement, prepared.source([]), group)
        prepared = dataclasses.replace(prepared, cfg=cfg)
        record = RunRecord(
            life.run_id,
            cfg.to_dict(),
            placement.blocks,
            datetime.now(UTC).isoformat(),
            command or " ".join(sys.argv),
            driver=_driver(),
        )
    if group is not None and len(placement.blocks) >= len(group.bundle_specs):
        raise ConfigError(
            f"the placement group holds {len(group.bundle_specs) - 1} actor bundles after "
            f"the driver's; the run needs {len(placement.blocks)} actors"
        )
    writer = RunWriter(life.out, life.run_id, cfg)
    row = {
        "started_at": datetime.fromisoformat(record.started_at),
        "resumes": record.resumes,
        "command": record.command,
        "n_actors": len(placement.blocks),
        "actor_cpus": placement.num_cpus,
        "actor_gpus": placement.num_gpus,
        "rounds_done": checkpoint.round if checkpoint else 0,
        **_versions(),
    }
    with life.running(writer, row) as row:
        if life.resumed:
            writer.resume(checkpoint.rows if checkpoint else {})
        life.store.save_record(record)
        template = params_of(model)
        policy = STRATEGIES.load(cfg.strategy)  # given sizes only when it needs them: a
        # user's own Strategy written before sizes existed takes cfg alone
        strategy = policy(cfg, prepared.train_sizes()) if cfg.sampling == "samples" else policy(cfg)
        initial = strategy.init(template)
        stateful = keeps_user_state(strategy.algorithm, template)
        rollbacks = _RollBacks(cfg.actor_retries, life.store, writer)
        work = round_work(prepared) if cfg.balance_rounds else None
        incarnations = None
        pool = rounds = None
        try:
            while True:
                pool = ActorPool(
                    placement.blocks,
                    actor_factory(prepared, placement, checkpoint, group),
                    cfg.actor_retries,
                    writer.add,
                    replaceable=not stateful,
                    incarnations=incarnations,
                )
                rounds = Rounds(
                    cfg,
                    Coordinator(pool, bool(cfg.balance_rounds), work, stateful),
                    strategy,
                    initial,
                    writer,
                    life.store,
                    on_progress,
                    checkpoint,
                    clock,
                )
                try:
                    timeline.mark("actors")
                    pool.start(from_round=checkpoint.round + 1 if checkpoint else 0)
                    row.setdefault("startup_seconds", time.perf_counter() - clock)
                    timeline.mark("rounds")
                    rounds.run()
                    timeline.mark("finish")
                    break
                except StateLost as lost:
                    checkpoint = rollbacks.restore(lost)
                    pool.stop()
                    incarnations = [i + 1 for i in pool.incarnations]  # all restarted
            row.update(_peak_memory(pool))
        finally:
            if rounds is not None:
                row.update(wall_seconds=rounds.wall_seconds(), rounds_done=rounds.rounds_done)
            if pool is not None:
                pool.stop()
    return life.run_id
