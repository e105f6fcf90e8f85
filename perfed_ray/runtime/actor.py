"""The Ray actor that hosts users: their shards and per-user state stay here for the
whole run.

Only weights (in) and a weighted sum of weights, losses and scores (out) cross the
actor's boundary; the maths is the :class:`~perfed_ray.learner.Learner`'s.

An actor because the users' shards and states live across calls (Ray's design
patterns: actors for state that lives across calls, tasks for stateless work). Flower's
simulation engine runs clients on a pool of Ray actors too, but builds each client
and loads its data anew on every call; here the users stay with their actor for the
run, so a round pays for neither.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import ray
import torch

from perfed_ray import faults, registry
from perfed_ray.config.schema import RunConfig
from perfed_ray.data import DataArrays, ShardSource
from perfed_ray.data.augment import augmentation
from perfed_ray.data.cache import ShardCache
from perfed_ray.data.validation import hold_out
from perfed_ray.learner import Learner
from perfed_ray.models import FlatParams, initial_model, params_of
from perfed_ray.postprocess import UserPostprocessor
from perfed_ray.runtime.environment import Components, adopt


@dataclass(frozen=True)
class UpdateSum:
    """An actor's part of a round: the weighted sum of its users' new weights (float64,
    so the server's total does not depend on the order in which actors answer), the
    sum of the weights, how many users reported; per-user weights only when asked for."""

    total: np.ndarray
    weight: float
    count: int
    loss_sum: float
    per_user: dict[int, np.ndarray] | None = None
    seconds: float = 0.0  # the actor's own time on the call, to tell work from transport
    guests: dict[int, np.ndarray] | None = None  # new states of users hosted elsewhere
    stats: dict[str, float] = field(default_factory=dict)  # the postprocessor's statistics


def peak_memory_bytes() -> int:
    """This process's peak resident memory (Linux VmHWM), 0 where unknown."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@ray.remote
class UserActor:
    """Hosts the shards of a block of users and runs their local work on its device.

    `actor` and `incarnation` name it in the run's records (a replacement for a dead
    actor is the next incarnation of the same actor); `states` are its users' per-user
    states from the checkpoint a run resumes from; `found` the user's own components,
    resolved by the driver (:mod:`perfed_ray.runtime.environment`)."""

    def __init__(
        self,
        cfg: RunConfig,
        users: list[int],
        source: ShardSource,
        data: DataArrays | None,
        num_cpus: float,
        num_gpus: float,
        actor: int = 0,
        incarnation: int = 0,
        states: dict[int, np.ndarray] | None = None,
        found: Components | None = None,
    ) -> None:
        adopt(cfg, found or {})
        self.actor, self.incarnation = actor, incarnation
        torch.set_num_threads(max(1, int(num_cpus)))
        use_gpu = num_gpus > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda" if use_gpu else "cpu")
        model = initial_model(cfg, source).to(self.device)  # its parameters: w_0
        self.flat = FlatParams(params_of(model))
        budget = None if cfg.shard_cache_mb is None else int(cfg.shard_cache_mb * 2**20)
        held_out = (lambda s: hold_out(s, cfg.validation, cfg.seed)) if cfg.validation else None
        # Balanced rounds send any user's work to any actor: its shard is made here too.
        served = range(cfg.n_users) if cfg.balance_rounds else users
        shards = ShardCache(source, served, self.device, data, budget, held_out)
        augment = augmentation(cfg.augment, source.input_shape, source.scaling)
        self.learner = Learner(cfg, model, shards, states, users, augment)
        # Through the module, not a name imported into this one: Ray pickles an actor
        # class by value, so a registry imported here would be the driver's copy as it
        # stood when the class was first sent, without the components adopted above.
        self.strategy = registry.STRATEGIES.load(cfg.strategy)(cfg)

    def describe(self) -> dict[str, object]:
        """Where this actor runs and its peak memory (also: it is ready)."""
        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "device": str(self.device),
            "gpu_ids": [str(g) for g in context.get_accelerator_ids().get("GPU", [])],
            "peak_memory_bytes": peak_memory_bytes(),
        }

    def train(
        self,
        weights: np.ndarray,
        users: list[int],
        round_: int,
        per_user: bool = False,
        aggregated: list[int] | None = None,
        guests: list[ray.ObjectRef] | None = None,
        postprocess: UserPostprocessor | None = None,
    ) -> UpdateSum:
        """Local updates of the given users from the global weights, weighted and summed
        over the `aggregated` ones (all of them unless given: with `trained_users: all`
        every user trains, its state moves on, and only the sampled ones are summed),
        each of their models through the strategy's `postprocess` first, if it gave one.
        `guests`: the states of the users among them that other actors host (balanced
        rounds), as their hosts handed them over; their new states are sent back."""
        clock = time.perf_counter()
        start = self.flat.unflatten(weights, self.device)  # never modified in place
        visiting: dict[int, np.ndarray | None] | None = None
        if guests is not None:
            store = self.learner.store
            visiting = dict.fromkeys((u for u in users if u not in store), None)
            for handed in ray.get(guests):
                visiting.update(handed)
        return self._round(start, users, round_, per_user, aggregated, visiting, clock, postprocess)

    def train_rounds(
        self,
        weights: np.ndarray,
        rounds: list[tuple[int, list[int], list[int] | None, UserPostprocessor | None]],
    ) -> list[UpdateSum]:
        """Several rounds in one call, for a method whose server's model never moves
        (`fixed_server`): (round, users, aggregated, postprocess) each, as `train` takes
        them, in order, every one from the same weights; one sum a round."""
        clock = time.perf_counter()
        start = self.flat.unflatten(weights, self.device)
        sums = []
        for round_, users, aggregated, postprocess in rounds:
            sums.append(
                self._round(start, users, round_, False, aggregated, None, clock, postprocess)
            )
            clock = time.perf_counter()
        return sums

    def _round(
        self,
        start: dict[str, torch.Tensor],
        users: list[int],
        round_: int,
        per_user: bool,
        aggregated: list[int] | None,
        visiting: dict[int, np.ndarray | None] | None,
        clock: float,
        postprocess: UserPostprocessor | None = None,
    ) -> UpdateSum:
        """One round's local work of `users` from the server's model `start`, summed."""
        if self.actor == 0:
            faults.crash_at("actor-always", round_)
            if self.incarnation == 0:
                faults.crash_at("actor", round_)
            if self.incarnation == 1:
                faults.crash_at("actor-replacement", round_)
        models, losses = self.learner.train(start, users, round_, visiting)
        if aggregated is not None:
            summed = set(aggregated)
            keep = torch.tensor([u in summed for u in users], device=self.device)
            models, losses = {k: v[keep] for k, v in models.items()}, losses[keep]
            users = [u for u in users if u in summed]
        stats = {}
        if postprocess is not None:
            models, stats = postprocess.apply(start, models, users)
        weights_ = [self.strategy.weight(self.learner.n_train(u)) for u in users]
        # The sum is taken in float64 in user order, one leaf at a time, before flattening.
        if all(w == 1.0 for w in weights_):
            total = self.flat.flatten({k: v.sum(0, dtype=torch.float64) for k, v in models.items()})
        else:
            scale = torch.tensor(weights_, dtype=torch.float64, device=self.device)
            total = self.flat.flatten(
                {k: torch.tensordot(scale, v.double(), dims=1) for k, v in models.items()}
            )
        per = (
            {
                u: self.flat.flatten({k: v[i] for k, v in models.items()})
                for i, u in enumerate(users)
            }
            if per_user
            else None
        )
        # float32 losses add up exactly in float64: the same sum whatever the grouping.
        loss_sum = float(losses.double().sum())
        seconds = time.perf_counter() - clock
        return UpdateSum(
            total, float(sum(weights_)), len(users), loss_sum, per, seconds, visiting or None, stats
        )

    def evaluate(self, weights: np.ndarray, users: list[int], round_: int, draws: int) -> pa.Table:
        """The given hosted users' personalised scores for the global weights, as columns."""
        params = self.flat.unflatten(weights, self.device)
        return self.learner.evaluate(params, users, round_, draws)

    def user_states(self) -> dict[int, np.ndarray]:
        """The hosted users' per-user states (empty for methods that keep none)."""
        return self.learner.state_vectors()

    def export_states(self, users: list[int]) -> dict[int, np.ndarray]:
        """The states of these hosted users that exist (a user never trained has none),
        for the actor that trains them this round."""
        return self.learner.state_vectors(users)

    def import_states(self, states: dict[int, np.ndarray], round_: int) -> None:
        """Hosted users' states, trained on another actor in round k, back home."""
        if self.actor == 0 and self.incarnation == 0:
            faults.crash_at("actor-states", round_)
        for user, vector in states.items():
            self.learner.store.put(user, vector)
