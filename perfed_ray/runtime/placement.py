"""Which actor hosts which users, and what each actor asks Ray for."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perfed_ray.config.schema import RunConfig


@dataclass(frozen=True)
class Placement:
    """Users split into contiguous blocks (ranges: a million users are two numbers per
    actor, not a million objects), one block per actor, and the actors' resources."""

    blocks: list[range]
    num_cpus: float
    num_gpus: float


def host_finder(blocks: Sequence[range]):
    """user -> index of the actor hosting it, by bisection over the blocks' starts."""
    starts = [block.start for block in blocks]
    return lambda user: bisect.bisect_right(starts, user) - 1


def hosted(users: Sequence[int], host_of: Callable[[int], int]) -> dict[int, list[int]]:
    """A round's users by the actor hosting each, in the order given."""
    split: dict[int, list[int]] = {}
    for u in users:
        split.setdefault(host_of(u), []).append(u)
    return split


def balanced(
    users: Sequence[int],
    host_of: Callable[[int], int],
    n_actors: int,
    work: Callable[[int], float] | None = None,
) -> dict[int, list[int]]:
    """A round's users spread over `n_actors` so that no actor waits long for a busier
    one, moving as few as that takes: each user starts on its host, then users move
    from the busiest actor to the least busy (ties: the lower actor) while a move lowers
    the busier of the two, the user whose work (`work`, else 1) comes nearest half
    their difference first. Fewer moves, fewer per-user states travelling (and shards
    made away from their host). Each actor's users in id order; actors given none are
    left out."""
    weigh = work or (lambda _: 1.0)
    split = {a: sorted(us) for a, us in hosted(users, host_of).items()}
    load = [sum(map(weigh, split.get(a, ()))) for a in range(n_actors)]
    while True:
        busy = max(range(n_actors), key=lambda a: (load[a], -a))
        idle = min(range(n_actors), key=lambda a: (load[a], a))
        gap = load[busy] - load[idle]
        # Moving u lowers the pair's larger load iff 0 < work(u) < gap; the sum of
        # squared loads then falls, so the loop ends.
        movable = [u for u in split.get(busy, ()) if 0 < weigh(u) < gap]
        if not movable:
            return {a: us for a, us in sorted(split.items()) if us}
        u = min(movable, key=lambda u: (abs(gap - 2 * weigh(u)), u))
        split[busy].remove(u)
        bisect.insort(split.setdefault(idle, []), u)
        load[busy] -= weigh(u)
        load[idle] += weigh(u)


def _fits(available: float, each: float) -> int:
    return max(1, math.floor(available / each + 1e-9))


def spread(n_users: int, n_actors: int) -> list[range]:
    """Users 0..n-1 in n_actors contiguous blocks whose sizes differ by at most one."""
    n_actors = min(n_actors, n_users)
    bounds = [round(i * n_users / n_actors) for i in range(n_actors + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(n_actors)]


ACTORS_PER_GPU = 4  # at most, where requests are auto: see plan
Nodes = list[dict[str, float]]  # each alive node's resources, as ray.nodes() lists them


def capacity(cfg: RunConfig, nodes: Nodes) -> tuple[float, float]:
    """The CPUs and GPUs the actors can use. Actors that ask for a GPU share (set, or
    `auto` on a cluster with GPUs) can only run on GPU nodes, so the CPUs of CPU-only
    nodes (a CPU head, a CPU worker group) must not count, or the pool is sized for
    more actors than the GPU nodes can hold and the run waits for ever."""
    gpus = sum(n.get("GPU", 0.0) for n in nodes)
    share = cfg.num_gpus_per_actor if cfg.num_gpus_per_actor is not None else gpus
    cpus = sum(n.get("CPU", 0.0) for n in nodes if not share or n.get("GPU", 0.0) > 0)
    return cpus, gpus


def plan(cfg: RunConfig, nodes: Nodes) -> Placement:
    """Place cfg.n_users users on actors.

    `users_per_actor: auto` makes as many actors as the cluster runs at once
    given each actor's request (one CPU unless configured, and the configured
    GPU share), users spread evenly over them: Flower sizes its pool the same
    way. An `auto` resource request shares the usable CPUs (GPUs) evenly
    among the actors, at most one each, so every actor is alive at once:
    actors hold their shards for the whole run and must never wait to be
    scheduled. Ray packs fractional GPU requests onto one GPU before the next,
    so equal shares that fill the cluster put actors on every GPU.

    With GPUs and both requests `auto`, at most ACTORS_PER_GPU actors share a GPU: a
    GPU runs one process's kernels at a time unless MPS is on, and on an H100, HF's
    1000 users a round ran at 54,000 user-steps/s with 16 actors on it, 108,000 with 4
    (BENCHMARKS.md, GPU). A configured share sets the count instead.
    """
    cpus, gpus = capacity(cfg, nodes)
    if cfg.users_per_actor is None:
        n = _fits(cpus or 1.0, cfg.num_cpus_per_actor or 1.0)
        if cfg.num_gpus_per_actor:
            n = min(n, _fits(gpus, cfg.num_gpus_per_actor))
        elif gpus and cfg.num_gpus_per_actor is None and cfg.num_cpus_per_actor is None:
            n = min(n, max(1, math.floor(ACTORS_PER_GPU * gpus + 1e-9)))
        blocks = spread(cfg.n_users, n)
    else:
        k = cfg.users_per_actor
        blocks = [range(s, min(s + k, cfg.n_users)) for s in range(0, cfg.n_users, k)]
    return with_resources(cfg, nodes, blocks)


def with_resources(cfg: RunConfig, nodes: Nodes, blocks: list[range]) -> Placement:
    """The actors' requests for given blocks (also those of a resumed run, whose blocks
    are kept but whose cluster may have changed)."""
    n = len(blocks)
    cpus, gpus = capacity(cfg, nodes)
    want_cpus, want_gpus = cfg.num_cpus_per_actor, cfg.num_gpus_per_actor
    # Ray accepts resource requests in units of 1e-4.
    return Placement(
        blocks,
        _floor4(min(1.0, (cpus or 1.0) / n) if want_cpus is None else want_cpus),
        _floor4(min(1.0, gpus / n) if want_gpus is None else want_gpus),
    )


def _floor4(x: float) -> float:
    return int(x * 10_000) / 10_000


def bundles(placement: Placement) -> list[dict[str, float]]:
    """One Ray resource bundle per actor: what a sweep trial's placement group holds after
    its driver's own bundle, so the trial's actors are reserved with it."""
    one = {"CPU": placement.num_cpus, "GPU": placement.num_gpus}
    return [{k: v for k, v in one.items() if v} for _ in placement.blocks]


def group_share(specs: list[dict[str, float]]) -> Nodes:
    """The actors' bundles of a trial's placement group (bundle 0 is its driver's) as the
    one node placement plans on, so a trial sizes its actors by what it reserved, not by
    the whole cluster."""
    return [{k: sum(b.get(k, 0.0) for b in specs[1:]) for k in ("CPU", "GPU")}]


def packed(request: dict[str, float], nodes: Nodes, n: int) -> dict[str, float] | None:
    """What each of `n` actors asks Ray for so that all of them fit on `nodes` at once:
    `request` where they do, else the largest smaller share of each resource that packs
    them in (Ray's resources are logical: actors then share the nodes' CPUs). None where
    no share can: a GPU request with no GPU left (a share of none would train on the
    CPU). A run that lost nodes goes on so, with the same blocks, hence the same
    numbers, on fewer CPUs."""
    fitted = {}
    for key, each in request.items():
        have = [node.get(key, 0.0) for node in nodes]
        shares = {_floor4(min(each, c / m)) for c in have for m in range(1, n + 1)}
        fitted[key] = max(
            (r for r in shares | {each} if r and sum(math.floor(c / r + 1e-9) for c in have) >= n),
            default=0.0,
        )
        if key == "GPU" and not fitted[key]:
            return None
    return fitted


def _amount(resources: dict[str, float]) -> str:
    return ", ".join(f"{resources.get(k, 0.0):g} {k}" for k in ("CPU", "GPU"))


def unfit(requests: list[dict[str, float]], nodes: Nodes, what: str = "actor") -> str | None:
    """Why Ray could never start every one of `requests` (one per actor, all alive at
    once) on `nodes`, in words naming what is asked and what there is; None if it can.
    Ray itself would wait for ever: for an actor larger than every node, or for more
    than the whole cluster holds."""
    for key in ("CPU", "GPU"):
        largest = max((node.get(key, 0.0) for node in nodes), default=0.0)
        asked = max((r.get(key, 0.0) for r in requests), default=0.0)
        if asked > largest + 1e-9:
            return (
                f"each {what} asks for {asked:g} {key}, but the largest node has {largest:g} "
                f"{key} (the cluster: {len(nodes)} nodes, {_amount(_total(nodes))})"
            )
        total, have = sum(r.get(key, 0.0) for r in requests), _total(nodes)[key]
        if total > have + 1e-9:
            return (
                f"{len(requests)} {what}s ask for {total:g} {key} together, but the cluster "
                f"has {have:g} {key} ({len(nodes)} nodes, {_amount(_total(nodes))})"
            )
    return None


def _total(nodes: Nodes) -> dict[str, float]:
    return {k: sum(node.get(k, 0.0) for node in nodes) for k in ("CPU", "GPU")}
