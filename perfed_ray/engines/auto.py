"""`engine: auto`: the fastest engine for a model, algorithm and device, by measurement.

The fused engine is known best for the linear chains it runs (the MLP, logistic
regression: BENCHMARKS.md), so they are not measured. For any other model no rule
holds: on CPU the CIFAR-10 CNN runs fastest one user after another (its convolutions
are compute-bound, and `vmap` or a grouped convolution only adds work), on a GPU
batching users should win. So every engine that applies is timed on a few users' round
of local steps, in turns, the best of each kept, and the fastest chosen: turns go on
for a budget of a second or two and every engine runs at least MIN_TURNS of them,
however long a turn takes, so that a slow method is never judged on a single turn
each, one sample of a shared machine's noise. The timed round is shaped as
the real one: tau steps, or one step an epoch with the users' counts of steps passed as
a round in epochs passes them. Both change the engines' costs: a batched engine masks
steps by those counts, and FedRep's head and body steps cost differently one user at a
time, in the round's mix. The result is cached on disk per workload (model, shapes,
algorithm, steps, device, torch version, threads): a machine measures a workload once.

This module knows nothing of Ray: where the measurement runs (the driver, or a task
with the actors' GPU) is the runtime's choice (:mod:`perfed_ray.runtime.simulation`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
from torch import nn

from perfed_ray.algorithms.base import make_algorithm
from perfed_ray.algorithms.tree import tree_map
from perfed_ray.config.schema import RunConfig
from perfed_ray.engines import make_engine
from perfed_ray.engines.base import Engine, stack
from perfed_ray.engines.grouped import grouped_chain
from perfed_ray.engines.stacked import chain_of
from perfed_ray.masks import index, random_masks, sites
from perfed_ray.models import params_of

CACHE_ENV = "PERFED_ENGINE_CACHE"
BUDGET = 1.5  # seconds a measurement takes, unless one turn of the engines takes longer
MIN_TURNS = 3  # timed rounds of each engine, at least
MEASURED_USERS = 4  # at most
MEASURED_STEPS = 20  # at most: a round's steps (tau, or one an epoch)
MARGIN = 0.1  # a batched engine must be 10% faster than the reference to be chosen: a
# shared machine's noise should not turn a tie into a choice cached for good


def cache_file() -> Path:
    """$PERFED_ENGINE_CACHE, else engines.json under the user's cache, beside the
    compiled kernels (:func:`perfed_ray.engines.fused.compile_cache`)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache/perfed-ray/engines.json")


def known(model: nn.Module) -> str | None:
    """The engine known best without a measurement: fused for a linear chain."""
    return "fused" if chain_of(model) is not None else None


def candidates(model: nn.Module) -> list[str]:
    """The engines timed for a model that is no linear chain, the reference first."""
    return ["sequential", "vmap", *(["grouped"] if grouped_chain(model) else [])]


def fastest(seconds: Mapping[str, float], reference: str = "sequential") -> str:
    """The engine of the fewest seconds, if it beats the reference by more than MARGIN;
    else the reference, the simplest engine, and never one measured slower than it."""
    best = min(seconds, key=seconds.__getitem__)
    if reference in seconds and seconds[best] > seconds[reference] * (1 - MARGIN):
        return reference
    return best


@dataclass(frozen=True)
class Workload:
    """What an actor's engine runs, as far as its speed depends on it."""

    input_shape: tuple[int, ...]
    n_classes: int
    users: int  # an actor's users in a round
    threads: int
    device: str  # "cpu", "cuda"

    def key(self, cfg: RunConfig, model: nn.Module) -> tuple[str, dict]:
        """(the cache's key, the description it hashes)."""
        where = torch.device(self.device)
        described = {
            "model": f"{type(model).__module__}.{type(model).__qualname__}",
            "parameters": [[k, list(v.shape)] for k, v in model.named_parameters()],
            **asdict(self),
            "measured_users": min(self.users, MEASURED_USERS),
            "measured_steps": measured_steps(cfg),
            "in_epochs": cfg.steps_vary,
            "batch_size": cfg.batch_size,
            "algorithm": cfg.algorithm,
            "client_optimizer": cfg.client_optimizer,
            "device": torch.cuda.get_device_name(where) if where.type == "cuda" else cpu_name(),
            "torch": torch.__version__,
        }
        text = json.dumps(described, sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:24], described


def cpu_name() -> str:
    """The CPU's model name (Linux), else the platform's word for it: part of what a
    measured choice is cached under, and what the benchmarks record of the machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@contextmanager
def _threads(n: int):
    """torch's intra-op threads set to an actor's for the measurement, then restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measured_steps(cfg: RunConfig) -> int:
    """The steps of the measured round: tau, or one per epoch (at most MEASURED_STEPS)."""
    return min(cfg.tau if cfg.local_epochs is None else cfg.local_epochs, MEASURED_STEPS)


def measure(
    cfg: RunConfig, model: nn.Module, work: Workload, most: int = MEASURED_USERS
) -> dict[str, float]:
    """Seconds of a round of `work`'s users (at most `most`) under each
    candidate engine: a warm-up turn with one user (first calls pay one-off costs),
    then turns in alternation until BUDGET seconds have passed since the start and each
    engine has had MIN_TURNS, the best of each kept. Random inputs: an engine's speed
    depends on shapes, not values."""
    device = torch.device(work.device)
    model = copy.deepcopy(model).to(device)
    algorithm = make_algorithm(cfg)
    server = params_of(model)
    users = min(work.users, most)
    shape = (users, measured_steps(cfg), algorithm.batches_per_step, cfg.batch_size)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(*shape, math.prod(work.input_shape), generator=gen).to(device)
    y = torch.randint(0, work.n_classes, shape, generator=gen).to(device)
    states = stack([algorithm.init_user_state(server)] * users)
    masks = random_masks(sites(model, x.shape[-1:]), shape)
    masks = None if masks is None else {k: m.to(device) for k, m in masks.items()}
    # users' own counts where they vary, as Learner passes them
    steps = torch.full((users,), shape[1], device=device) if cfg.steps_vary else None
    engines = {name: make_engine(name, algorithm, model, False) for name in candidates(model)}

    def timed(engine: Engine, n: int) -> float:
        clock = time.perf_counter()
        engine.run(
            server,
            x[:n],
            y[:n],
            None if states is None else tree_map(lambda s: s[:n], states),
            None if steps is None else steps[:n],
            index(masks, slice(n)),
        )
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - clock

    best = dict.fromkeys(engines, math.inf)
    with _threads(work.threads):
        start = time.perf_counter()
        for engine in engines.values():
            timed(engine, 1)
        turns = 0
        while turns < MIN_TURNS or time.perf_counter() - start < BUDGET:
            turns += 1
            for name, engine in engines.items():
                best[name] = min(best[name], timed(engine, users))
    return best


def _read(path: Path) -> dict:
    """The cache's entries; an unreadable or corrupt file is an empty cache."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _write(path: Path, entries: dict) -> None:
    """Replace the file whole, so a concurrent reader never sees half of it; a cache
    that cannot be written is only a cache."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        part.write_text(json.dumps(entries, indent=1, sort_keys=True))
        os.replace(part, path)
    except OSError as error:
        print(f"perfed-ray: engine cache {path} not written: {error}", file=sys.stderr)


def choose(cfg: RunConfig, model: nn.Module, work: Workload, path: Path | None = None) -> str:
    """The engine `auto` stands for: fused for a linear chain, else the cached choice
    for this workload, else the fastest measured now (and cached)."""
    if known(model):
        return known(model)
    path = path or cache_file()
    key, described = work.key(cfg, model)
    cached = _read(path).get(key)
    if isinstance(cached, dict) and cached.get("engine") in candidates(model):
        return cached["engine"]
    seconds = measure(cfg, model, work)
    engine = fastest(seconds)
    entries = _read(path)  # again: another run may have written meanwhile
    entries[key] = {
        "engine": engine,
        "seconds": seconds,
        "workload": described,
        "measured_at": datetime.now(UTC).isoformat(),
    }
    _write(path, entries)
    timings = ", ".join(f"{name} {s * 1000:.0f} ms" for name, s in seconds.items())
    n = described["measured_steps"]
    round_ = f"{described['measured_users']} users' {n} step{'s' if n > 1 else ''}"
    print(f"perfed-ray: engine auto: {engine} ({round_}: {timings})", file=sys.stderr)
    return engine
