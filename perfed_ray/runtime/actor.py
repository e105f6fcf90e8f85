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
from typing import NamedTuple

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
from perfed_ray.runtime.messages import Batch, UpdateSum


class Held(NamedTuple):
    """An asynchronous task's update, held until a server step sums it: its user, the
    model version it started from, its model and its mean training loss."""

    user: int
    version: int
    model: dict[str, torch.Tensor]
    loss: torch.Tensor


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
    resolved by the driver (:mod:`perfed_ray.runtime.environment`); `fault` the crashes
    the driver has armed (:mod:`perfed_ray.faults`), for the tests of recovery."""

    def __init__(self, *hosted: object) -> None:
        self._host(*hosted)

    def host(self, *hosted: object) -> None:
        """Take another run's block of users (arguments as for a new actor) in this
        process, as :mod:`perfed_ray.runtime.hosts` lends it. A failure ends the process,
        as a failed creation would: the run's pool replaces it with a new actor."""
        try:
            self._host(*hosted)
        except Exception:
            ray.actor.exit_actor()

    def vacate(self) -> None:
        """Drop the run's users (their shards pin the data set in the object store) and
        count peak memory anew for the next run this process hosts."""
        self.__dict__.clear()
        try:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # Linux: reset the peak resident memory (VmHWM)
        except OSError:
            pass

    def _host(
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
        fault: str | None = None,
    ) -> None:
        faults.arm(fault)  # the driver's (perfed_ray/faults.py), or none
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
        # An asynchronous server's updates in flight: task -> (user, the version it
        # started from, its model, its loss), and those versions' models: memory grows
        # with the tasks in flight, not with the users.
        self.updates: dict[int, Held] = {}
        self.bases: dict[int, dict[str, torch.Tensor]] = {}

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

    def work(
        self,
        weights: np.ndarray,
        batches: list[Batch],
        guests: list[ray.ObjectRef] | None = None,
    ) -> list[UpdateSum]:
        """Server steps' work in one call, in order, all from the same weights (several
        only for a method whose server's model never moves, `fixed_server`): a
        synchronous round's users trained (their states moving on) and the reporting ones
        among them summed, each model through the step's `postprocess` first, or an
        asynchronous step's tasks trained and held, then the held updates it asks for
        summed. One sum a step. `guests`: the states of the users among them that other
        actors host (balanced rounds, one step), as their hosts handed them over; their
        new states are sent back."""
        clock = time.perf_counter()
        start = self.flat.unflatten(weights, self.device)
        visiting = self._visiting(batches[0].users, guests)
        sums = []
        for batch in batches:
            if batch.tasks is None:
                sums.append(
                    self._round(
                        start,
                        batch.users,
                        batch.round,
                        batch.reporting,
                        visiting,
                        clock,
                        batch.postprocess,
                    )
                )
            else:
                sums.append(self._held(start, batch, visiting, clock))
            clock = time.perf_counter()
        return sums

    def _visiting(
        self, users: list[int], guests: list[ray.ObjectRef] | None
    ) -> dict[int, np.ndarray | None] | None:
        """The states of the `users` other actors host, as their hosts handed them over."""
        if guests is None:
            return None
        store = self.learner.store
        visiting = dict.fromkeys((u for u in users if u not in store), None)
        for handed in ray.get(guests):
            visiting.update(handed)
        return visiting

    def _held(
        self,
        start: dict[str, torch.Tensor],
        batch: Batch,
        visiting: dict[int, np.ndarray | None] | None,
        clock: float,
    ) -> UpdateSum:
        """An asynchronous step: its new tasks trained from `start` (the model after
        round k-1) and held, then the held updates it names summed, each weighted by the
        strategy's weight of its user times its factor; with `rebase`, one started from
        an older model as its update (its model minus that one), whose weights are
        `rebased` in the answer, so the server adds them times its current model."""
        version = batch.round - 1
        if batch.users:
            self._faults(batch.round)
            models, losses = self.learner.train(start, batch.users, batch.round, visiting)
            self.bases[version] = start
            for i, task in enumerate(batch.tasks):
                model = {k: v[i].clone() for k, v in models.items()}
                self.updates[task] = Held(batch.users[i], version, model, losses[i].clone())
        for task in batch.discard:
            del self.updates[task]
        taken = [(self.updates.pop(t), f) for t, f in batch.summed]
        scale = [self.strategy.weight(self.learner.n_train(h.user)) * f for h, f in taken]
        stale = [batch.rebase and h.version != version for h, _ in taken]
        total = np.zeros(self.flat.size, dtype=np.float64)
        for rebased in (False, True):  # models as they are; then updates, as models' moves
            chosen = [i for i, s in enumerate(stale) if s == rebased]
            if not chosen:
                continue
            models = {
                k: torch.stack([self._as_summed(taken[i][0], k, rebased) for i in chosen])
                for k in start
            }
            total += self._sum(models, [scale[i] for i in chosen])
        in_use = {h.version for h in self.updates.values()}
        self.bases = {v: b for v, b in self.bases.items() if v in in_use or v == version}
        losses = torch.stack([h.loss for h, _ in taken]) if taken else torch.zeros(0)
        return UpdateSum(
            total,
            float(sum(scale)),
            float(losses.double().sum()),
            seconds=time.perf_counter() - clock,
            guests=visiting or None,
            rebased=float(sum(a for a, s in zip(scale, stale, strict=True) if s)),
        )

    def _as_summed(self, held: Held, leaf: str, rebased: bool) -> torch.Tensor:
        """A held model's leaf, or with `rebased` its update: the model minus the one it
        started from, in float64."""
        if not rebased:
            return held.model[leaf]
        return held.model[leaf].double() - self.bases[held.version][leaf].double()

    def _sum(self, models: dict[str, torch.Tensor], scale: list[float]) -> np.ndarray:
        """The users' models (stacked along a leading axis) weighted by `scale` and
        summed in float64 in user order, one leaf at a time, before flattening."""
        if all(w == 1.0 for w in scale):
            return self.flat.flatten({k: v.sum(0, dtype=torch.float64) for k, v in models.items()})
        weights = torch.tensor(scale, dtype=torch.float64, device=self.device)
        return self.flat.flatten(
            {k: torch.tensordot(weights, v.double(), dims=1) for k, v in models.items()}
        )

    def _faults(self, round_: int) -> None:
        if self.actor == 0:
            faults.crash_at("actor-always", round_)
            if self.incarnation == 0:
                faults.crash_at("actor", round_)
            if self.incarnation == 1:
                faults.crash_at("actor-replacement", round_)

    def _round(
        self,
        start: dict[str, torch.Tensor],
        users: list[int],
        round_: int,
        aggregated: list[int] | None,
        visiting: dict[int, np.ndarray | None] | None,
        clock: float,
        postprocess: UserPostprocessor | None = None,
    ) -> UpdateSum:
        """One round's local work of `users` from the server's model `start`, summed."""
        self._faults(round_)
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
        total = self._sum(models, weights_)
        # float32 losses add up exactly in float64: the same sum whatever the grouping.
        loss_sum = float(losses.double().sum())
        seconds = time.perf_counter() - clock
        return UpdateSum(total, float(sum(weights_)), loss_sum, seconds, visiting or None, stats)

    def evaluate(self, weights: np.ndarray, users: list[int], round_: int, draws: int) -> pa.Table:
        """The given hosted users' personalised scores for the global weights, as columns."""
        params = self.flat.unflatten(weights, self.device)
        return self.learner.evaluate(params, users, round_, draws)

    def held(self) -> tuple[dict[int, tuple], dict[int, np.ndarray]]:
        """The held updates, task -> (user, version, flat model, loss), and the flat
        models they started from, for a checkpoint."""
        held = {
            t: (h.user, h.version, self.flat.flatten(h.model), float(h.loss))
            for t, h in self.updates.items()
        }
        versions = {v for _, v, _, _ in held.values()}
        return held, {v: self.flat.flatten(self.bases[v]) for v in versions}

    def hold(self, held: dict[int, tuple], bases: dict[int, np.ndarray]) -> None:
        """Held updates back from a checkpoint (as `held` gave them)."""
        for v, weights in bases.items():
            self.bases[v] = self.flat.unflatten(weights, self.device)
        for t, (u, v, model, loss) in held.items():
            tree = self.flat.unflatten(model, self.device)
            self.updates[t] = Held(u, v, tree, torch.tensor(loss, dtype=torch.float32))

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
