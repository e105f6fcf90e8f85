"""One simulation from configuration to Parquet: data, actors, rounds, results.

Everything that can fail because of the user's input (configuration, data
root, partition) is checked in :func:`prepare`, before Ray starts.
"""

from __future__ import annotations

import logging
import platform
import secrets
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow
import ray
import torch

import perfed_ray
from perfed_ray.config import RunConfig
from perfed_ray.data import (
    DataArrays,
    PartitionedShards,
    ShardSource,
    SyntheticShards,
    UserIndices,
    load_dataset,
    partition,
    resolve_root,
)
from perfed_ray.data.datasets import PAPER_A
from perfed_ray.models import FlatParams, build_model, params_of
from perfed_ray.results.writer import RunWriter
from perfed_ray.runtime.actor import UserActor, peak_memory_bytes
from perfed_ray.runtime.coordinator import Coordinator, Diverged, Progress
from perfed_ray.runtime.placement import Placement, plan
from perfed_ray.seeding import Stream, numpy_rng


@dataclass(frozen=True)
class Prepared:
    """A run's validated inputs: the data set (none for generated ones) and its users."""

    cfg: RunConfig
    data: DataArrays | None
    users: list[UserIndices] | None

    def source(self, block: list[int]) -> ShardSource:
        """What the actor hosting `block` needs to build its shards: ids and seeds
        or index sets, never samples."""
        cfg = self.cfg
        if self.data is None:
            return SyntheticShards(cfg.seed, cfg.synthetic_alpha, cfg.synthetic_beta)
        return PartitionedShards(cfg.dataset, str(cfg.data_root), cfg.seed,
                                 {u: self.users[u] for u in block}, self.data.input_shape,
                                 self.data.n_classes)


def prepare(cfg: RunConfig) -> Prepared:
    """Load the data set and partition it; raises DataError for unusable input.

    `auto` values that depend on the data are resolved here, so the stored
    configuration says what the run actually used.
    """
    if cfg.dataset == "synthetic":
        return Prepared(cfg, None, None)
    cfg = cfg.replace(data_root=str(resolve_root(cfg.data_root)),
                      paper_a=cfg.paper_a or PAPER_A[cfg.dataset])
    data = load_dataset(cfg.dataset, cfg.data_root, cfg.download, cfg.seed)
    return Prepared(cfg, data, partition(cfg, data))


def initial_weights(cfg: RunConfig, source: ShardSource) -> np.ndarray:
    """w_0: PyTorch's default initialisation, drawn from the run's seed."""
    init_seed = int(numpy_rng(cfg.seed, Stream.MODEL_INIT).integers(2**31))
    model = build_model(cfg.model, source.input_shape, source.n_classes, seed=init_seed)
    params = params_of(model)
    return FlatParams(params).flatten(params)


def new_run_id(cfg: RunConfig) -> str:
    """Sortable by start time, unique across concurrent runs."""
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{cfg.algorithm}-{secrets.token_hex(3)}"


def start_actors(prepared: Prepared, placement: Placement) -> list[ray.actor.ActorHandle]:
    """One actor per block of users, spread over the cluster's nodes; waits until
    every actor holds its shards."""
    cfg = prepared.cfg
    shared = prepared.data is not None and cfg.data_transport == "object_store"
    data_ref = ray.put(prepared.data) if shared else None
    actors = [
        UserActor.options(num_cpus=placement.num_cpus, num_gpus=placement.num_gpus,
                          scheduling_strategy="SPREAD").remote(
            cfg, block, prepared.source(block), data_ref, placement.num_cpus,
            placement.num_gpus)
        for block in placement.blocks
    ]
    ray.get([a.describe.remote() for a in actors])
    return actors


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


def _peak_memory(actors: list[ray.actor.ActorHandle]) -> dict[str, int]:
    """Peak resident memory of the driver and of all actors together."""
    described = ray.get([a.describe.remote() for a in actors])
    return {"driver_peak_memory_bytes": peak_memory_bytes(),
            "actors_peak_memory_bytes": sum(d["peak_memory_bytes"] for d in described)}


def run(prepared: Prepared, out: Path, on_progress: Callable[[Progress], None] | None = None,
        run_id: str | None = None) -> str:
    """Run one simulation on the connected Ray cluster (a local one if none);
    returns its run id. The runs row says `finished` only if every round ran."""
    cfg = prepared.cfg
    if not ray.is_initialized():
        ray.init(include_dashboard=False, logging_level=logging.WARNING)
    run_id = run_id or new_run_id(cfg)
    writer = RunWriter(out, run_id, cfg)
    placement = plan(cfg, ray.cluster_resources())
    started, clock = datetime.now(UTC), time.perf_counter()
    row = {"status": "running", "started_at": started, "n_actors": len(placement.blocks),
           "actor_cpus": placement.num_cpus, "actor_gpus": placement.num_gpus,
           "command": " ".join(sys.argv), "rounds_done": 0, **_versions()}
    writer.write_run(row)
    actors: list[ray.actor.ActorHandle] = []
    coordinator = None
    try:
        actors = start_actors(prepared, placement)
        row["startup_seconds"] = time.perf_counter() - clock
        coordinator = Coordinator(cfg, actors, placement,
                                  initial_weights(cfg, prepared.source([])), writer, on_progress)
        coordinator.run()
        row["status"] = "finished"
        row.update(_peak_memory(actors))
    except BaseException as err:
        row["status"] = ("interrupted" if isinstance(err, KeyboardInterrupt) else
                         "diverged" if isinstance(err, Diverged) else "failed")
        row["error"] = f"{type(err).__name__}: {err}"
        raise
    finally:
        writer.flush()
        row.update(ended_at=datetime.now(UTC), wall_seconds=time.perf_counter() - clock,
                   rounds_done=coordinator.rounds_done if coordinator else 0)
        writer.write_run(row)
        for actor in actors:
            ray.kill(actor)
    return run_id
