"""One simulation from configuration to Parquet, in the order it happens:

1. :func:`prepare`: the data set loaded and partitioned, so that everything that can
   fail because of the user's input (configuration, data root, partition) fails
   before Ray starts;
2. :func:`place`: the users placed on actors over the cluster, and how the run
   executes (engine, compilation, balancing) settled;
3. :func:`run`: the actors started (:mod:`.actors`) and the rounds run
   (:class:`~perfed_ray.runtime.rounds.Rounds`), back to the last checkpoint when an
   actor dies holding users' state (:mod:`.rollbacks`).

The run's claim, its runs row and how it ended are the caller's
(:class:`~perfed_ray.lifecycle.RunLife`, through :func:`perfed_ray.simulate`).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow
import ray
import torch
from ray.util.placement_group import PlacementGroup

from perfed_ray import timeline
from perfed_ray.algorithms.base import keeps_user_state
from perfed_ray.clock import Timing
from perfed_ray.config import RunConfig, revise
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
from perfed_ray.errors import ConfigError
from perfed_ray.models import FlatParams, initial_model, params_of
from perfed_ray.privacy.mechanisms import resolve as resolve_privacy
from perfed_ray.registry import STRATEGIES
from perfed_ray.results.writer import RunWriter
from perfed_ray.runtime.actor import peak_memory_bytes
from perfed_ray.runtime.checkpoint import Checkpoint, RunRecord, RunStore
from perfed_ray.runtime.coordinator import Coordinator
from perfed_ray.runtime.execution import resolve_execution
from perfed_ray.runtime.launch import actor_factory
from perfed_ray.runtime.messages import Batch
from perfed_ray.runtime.placement import (
    Placement,
    bundles,
    group_share,
    packed,
    plan,
    unfit,
    with_resources,
)
from perfed_ray.runtime.pool import (
    PLACE_TIMEOUT_S,
    ActorPool,
    NoRoom,
    Request,
    StateLost,
)
from perfed_ray.runtime.rollbacks import RollBacks
from perfed_ray.runtime.rounds import Progress, Rounds, Stopped
from perfed_ray.version import __version__


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

    def train_size(self, user: int) -> int:
        """A user's training-sample count (before any validation hold-out), on the
        driver: what a task's local work is counted in (:class:`~perfed_ray.clock.Timing`)."""
        if self.users is None:
            return train_size(self.cfg.seed, user)
        return len(self.users[user].train)

    def train_sizes(self) -> np.ndarray:
        """Every user's training-sample count: what `sampling: samples` draws users in
        proportion to."""
        return np.array([self.train_size(u) for u in range(self.cfg.n_users)])


def prepare(cfg: RunConfig) -> Prepared:
    """Load the data set and partition it; raises DataError for unusable input.

    `auto` values that depend on the data are resolved here, so the stored
    configuration says what the run actually used.
    """
    if dataset(cfg.dataset).load is None:
        return Prepared(cfg, None, None)
    cfg = revise(
        cfg, data_root=str(resolve_root(cfg.data_root)), paper_a=cfg.paper_a or paper_a(cfg.dataset)
    )
    data = load_dataset(cfg.dataset, cfg.data_root, cfg.download, cfg.seed, cfg.data_folder)
    return Prepared(cfg, data, partition(cfg, data), input_scaling(data, cfg.input_scale))


def initial_weights(cfg: RunConfig, source: ShardSource) -> np.ndarray:
    """w_0 as the flat vector that travels."""
    params = params_of(initial_model(cfg, source))
    return FlatParams(params).flatten(params)


def round_work(prepared: Prepared) -> Callable[[int], float] | None:
    """A user's local steps in a round, as balanced rounds weigh it: the same for every
    user (None) with `tau` steps, its batches per epoch with `local_epochs`."""
    cfg = prepared.cfg
    if not cfg.steps_vary:
        return None
    batches = np.ceil(prepared.train_sizes() / cfg.batch_size)
    return lambda user: float(batches[user])


def _versions() -> dict[str, str]:
    return {
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "perfed_ray_version": __version__,
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
        "actors_peak_memory_bytes": pool.peak_memory(),
    }


def _share_left(lost: StateLost, request: Request, n_actors: int) -> Request | None:
    """What each of the run's actors asks Ray for once `lost`'s actors are gone: the
    placement's `request` while the nodes left hold them all (None), else a smaller
    share that packs them in; NoRoom where none can."""
    share = packed(request, _nodes(), n_actors)
    if share is None:
        raise NoRoom(lost.round, lost.actor, lost.users, "no GPU is left on the nodes alive")
    return None if share == request else share


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


@dataclass(frozen=True)
class Placed:
    """A run placed on the cluster: its configuration with how it executes made
    concrete, its users' blocks on actors and their resources, and its record."""

    prepared: Prepared
    placement: Placement
    record: RunRecord
    model: torch.nn.Module  # w_0 of a new run (a resumed one starts from its checkpoint)
    group: PlacementGroup | None  # a sweep trial's: the actors take its bundles after the first
    clock: float  # when the run's start-up began, for its startup_seconds

    @property
    def cfg(self) -> RunConfig:
        return self.prepared.cfg

    def row(self, checkpoint: Checkpoint | None) -> dict[str, Any]:
        """The runs row as the run starts (the rest is measured as it goes)."""
        return {
            "started_at": datetime.fromisoformat(self.record.started_at),
            "resumes": self.record.resumes,
            "command": self.record.command,
            "n_actors": len(self.placement.blocks),
            "actor_cpus": self.placement.num_cpus,
            "actor_gpus": self.placement.num_gpus,
            "rounds_done": checkpoint.round if checkpoint else 0,
            **_versions(),
        }


def place(
    prepared: Prepared,
    run_id: str,
    resumed: RunRecord | None = None,
    group: PlacementGroup | None = None,
    command: str | None = None,
) -> Placed:
    """Place a new run's users on actors over the connected cluster's nodes (a sweep
    trial's: on its `group`'s bundles) and settle how it executes; a run `resumed` from
    its record keeps that record's blocks and configuration. `command` is what started
    the run, for its runs row (default: this process's command line)."""
    clock = time.perf_counter()
    cfg = prepared.cfg
    model = initial_model(cfg, prepared.source([]))
    nodes = _nodes() if group is None else group_share(group.bundle_specs)
    if resumed is not None:
        record = dataclasses.replace(resumed, resumes=resumed.resumes + 1, driver=_driver())
        placement = with_resources(cfg, nodes, record.blocks)
    else:
        placement = plan(cfg, nodes)
        cfg = resolve_execution(cfg, model, placement, prepared.source([]), group)
        cfg = resolve_privacy(cfg)
        prepared = dataclasses.replace(prepared, cfg=cfg)
        record = RunRecord(
            run_id,
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
    return Placed(prepared, placement, record, model, group, clock)


def run(
    placed: Placed,
    store: RunStore,
    writer: RunWriter,
    row: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> None:
    """Start the actors and run the rounds of a placed run (a stopped one from its
    `checkpoint`), writing its rows with `writer` and its checkpoints into `store`, and
    adding to its runs `row` what it measures. An actor that dies holding users' state
    sends the run back to its last checkpoint (:class:`RollBacks`); every actor then
    asks for what the nodes left can hold (the same where no node was lost), and Ray
    has PLACE_TIMEOUT_S to place them (a trial's placement group: to move its bundles)."""
    prepared, placement, group, cfg = placed.prepared, placed.placement, placed.group, placed.cfg
    if placed.record.resumes:
        writer.resume(checkpoint.rows if checkpoint else {})
    store.save_record(placed.record)
    template = params_of(placed.model)
    policy = STRATEGIES.load(cfg.strategy)
    hparams = policy.HParams.of(cfg)
    # The users' sizes only where sampling by samples needs them: counting them is a
    # pass over every user (a draw each for generated ones), and a strategy of one's own
    # that never samples so may take its settings alone.
    sized = cfg.sampling == "samples"
    strategy = policy(hparams, prepared.train_sizes()) if sized else policy(hparams)
    initial = strategy.init(template)
    stateful = keeps_user_state(strategy.algorithm, template)
    timing = Timing(cfg, prepared.train_size, initial.weights.nbytes)
    rollbacks = RollBacks(cfg.actor_retries, store, writer)
    work = round_work(prepared) if cfg.balance_rounds else None
    incarnations = share = bound = None
    request = None if group is not None else bundles(placement)[0]
    pool = rounds = None
    idle = False  # the run finished, or its runner stopped it between rounds
    try:
        while True:
            pool = ActorPool(
                placement.blocks,
                actor_factory(prepared, placement, checkpoint, group),
                cfg.actor_retries,
                writer.add,
                # Held updates are state too: an asynchronous server's run rolls back.
                replaceable=not (stateful or strategy.asynchronous),
                incarnations=incarnations,
                request=request,
            )
            rounds = Rounds(
                cfg,
                Coordinator(pool, bool(cfg.balance_rounds), work, stateful),
                strategy,
                initial,
                writer,
                store,
                timing,
                Batch,
                on_progress,
                checkpoint,
                placed.clock,
            )
            try:
                timeline.mark("actors")
                pool.start(checkpoint.round + 1 if checkpoint else 0, share, bound)
                row.setdefault("startup_seconds", time.perf_counter() - placed.clock)
                timeline.mark("rounds")
                rounds.run()
                timeline.mark("finish")
                break
            except StateLost as lost:
                checkpoint = rollbacks.restore(lost)
                pool.stop()
                incarnations = [i + 1 for i in pool.incarnations]  # all restarted
                # The cluster may have lost nodes with the actors (a host that died
                # with states on their way home says only that it died).
                bound = PLACE_TIMEOUT_S
                if request is not None:
                    share = _share_left(lost, request, len(placement.blocks))
        row.update(_peak_memory(pool))
        idle = True
    except Stopped:
        idle = True
        raise
    finally:
        if rounds is not None:
            done = rounds.rounds_done
            row.update(
                wall_seconds=rounds.wall_seconds(), rounds_done=done, epsilon=strategy.epsilon(done)
            )
        if pool is not None:
            pool.stop(keep=idle)
