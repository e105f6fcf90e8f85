"""Which actor hosts which users, and what each actor asks Ray for."""

from __future__ import annotations

from dataclasses import dataclass

from perfed_ray.config import RunConfig


@dataclass(frozen=True)
class Placement:
    """Users split into contiguous blocks, one block per actor, and the actors' resources."""

    blocks: list[list[int]]
    num_cpus: float
    num_gpus: float

    @property
    def host_of(self) -> dict[int, int]:
        """user -> index of the actor that hosts it."""
        return {u: a for a, block in enumerate(self.blocks) for u in block}


def plan(cfg: RunConfig, cluster: dict[str, float]) -> Placement:
    """Place cfg.n_users users on actors of cfg.users_per_actor users each.

    An `auto` resource request shares the cluster's CPUs (GPUs) evenly among
    the actors, at most one each, so every actor can be alive at once: actors
    hold their shards for the whole run and must never wait to be scheduled.
    """
    k = cfg.users_per_actor
    blocks = [list(range(s, min(s + k, cfg.n_users))) for s in range(0, cfg.n_users, k)]
    n = len(blocks)
    cpus = cfg.num_cpus_per_actor
    if cpus is None:
        cpus = min(1.0, cluster.get("CPU", 1.0) / n)
    gpus = cfg.num_gpus_per_actor
    if gpus is None:
        gpus = min(1.0, cluster.get("GPU", 0.0) / n)
    # Ray accepts resource requests in units of 1e-4.
    return Placement(blocks, _floor4(cpus), _floor4(gpus))


def _floor4(x: float) -> float:
    return int(x * 10_000) / 10_000
