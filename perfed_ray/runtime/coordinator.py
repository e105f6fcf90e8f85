"""The transport between the driver and the user actors: broadcast a model, fan calls
out to the actors that host the users, gather and add up what comes back.

It sees users only as ids hosted by actors and models only as flat weight vectors. It
does not decide who takes part or what the server does with the sum (the strategy,
which says so by value: the lists of users, and the step each actor applies to its
users' models before summing them), when rows and checkpoints are written
(:class:`~perfed_ray.runtime.rounds.Rounds`), or how a dead actor is replaced (the
pool): it is the one place the rounds touch Ray.

A round's model is put into the object store once and every actor's call is given
the reference (Ray's design patterns: pass a large argument of many calls by
reference), and each actor returns one weighted sum rather than its users' models,
the running sum FedJAX's server keeps for the same reason: memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import ray
from ray.exceptions import RayActorError

from perfed_ray.errors import first_line
from perfed_ray.runtime.messages import Batch
from perfed_ray.runtime.placement import balanced, host_finder, hosted
from perfed_ray.runtime.pool import ActorPool, StateLost

if TYPE_CHECKING:  # an actor's answer
    from perfed_ray.runtime.messages import UpdateSum


@dataclass
class Sums:
    """A round's training results added up as they arrived: the driver holds one
    model's worth of partial results however many users or actors there are."""

    total: np.ndarray  # the weighted sum of the reporting users' new weights (float64)
    weight: float = 0.0  # the sum of their weights
    loss_sum: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    diverged: list[int] = field(default_factory=list)  # users of actors that sent NaN/inf
    actor_seconds: float = 0.0  # the slowest actor's own time: the round's work, not transport
    rebased: float = 0.0  # the weights of updates summed as updates, not models
    stats: dict[str, float] = field(default_factory=dict)  # the postprocessor's, summed

    def add(self, part: UpdateSum, users: list[int]) -> None:
        """An actor's part (its `UpdateSum`) of the round, trained by `users`."""
        if not (np.isfinite(part.total).all() and np.isfinite(part.loss_sum)):
            self.diverged += users
        self.total += part.total
        self.weight += part.weight
        self.rebased += part.rebased
        self.loss_sum += part.loss_sum
        self.bytes_received += part.total.nbytes
        self.actor_seconds = max(self.actor_seconds, part.seconds)
        for name, value in part.stats.items():
            self.stats[name] = self.stats.get(name, 0.0) + value


Work = Callable[[int], float]  # a user's share of a round's local work (its steps)


class Coordinator:
    """Calls on the pool's actors, each given the users it hosts or, with `balance`, an
    even share of the round's users by their `work` (None: equal), which any actor can
    serve from the shared data. Where users keep per-user `states` on their hosts, a
    user trained away from its host takes its state with the task, asked of the host
    as the round starts, and the new state goes back to the host when the round's
    results arrive; evaluations stay with the hosts."""

    def __init__(
        self,
        pool: ActorPool,
        balance: bool = False,
        work: Work | None = None,
        states: bool = False,
    ) -> None:
        self.pool = pool
        self.host_of = host_finder(pool.blocks)
        self.balance = balance
        self.work = work
        self.states = states
        self.returning: dict[ray.ObjectRef, int] = {}  # states on their way home -> host
        self.holder: dict[int, int] = {}  # held updates' task ids -> the actor holding them

    def _by_actor(
        self, users: list[int], work: Work | None = None, balance: bool | None = None
    ) -> dict[int, list[int]]:
        if self.balance if balance is None else balance:
            return balanced(users, self.host_of, len(self.pool.blocks), work)
        return hosted(users, self.host_of)

    def _settle(self, round_: int) -> None:
        """Wait until the states on their way home are there: a host that died with
        them lost its users' states, which rolls the run back as a death in a call does."""
        for ref, host in self.returning.items():
            try:
                ray.get(ref)
            except RayActorError as err:
                raise StateLost(
                    round_, host, list(self.pool.blocks[host]), first_line(err)
                ) from None
        self.returning = {}

    def _visits(
        self, round_: int, by_actor: dict[int, list[int]]
    ) -> dict[int, list[ray.ObjectRef]]:
        """For each actor, its guests' states (users it serves that another actor hosts),
        asked of their hosts now. An actor runs its calls in the order they were made,
        so a host hands over a state after taking back the previous round's."""
        self._settle(round_)
        visits: dict[int, list[ray.ObjectRef]] = {}
        for a, us in by_actor.items():
            away = hosted([u for u in us if self.host_of(u) != a], self.host_of)
            if away:
                actors = self.pool.actors
                visits[a] = [actors[h].export_states.remote(vs) for h, vs in away.items()]
        return visits

    def _send_home(self, round_: int, states: dict[int, np.ndarray]) -> None:
        for h, us in hosted(list(states), self.host_of).items():
            home = self.pool.actors[h].import_states
            self.returning[home.remote({u: states[u] for u in us}, round_)] = h

    def run(self, weights: np.ndarray, batches: list[Batch]) -> list[Sums]:
        """Server steps' work from `weights` in one call to each actor that has some: one
        step, whose users may be balanced over the actors (a user trained away from its
        host takes its state along), or several (a span, for a server's model that never
        moves), users on their hosts, where over several steps an actor's share evens
        out and no state travels. A held update is summed by the actor that trained it.
        A Sums a step."""
        single = len(batches) == 1
        ref = ray.put(weights)
        parts: dict[int, list[tuple[int, Batch]]] = {}
        visits: dict[int, list[ray.ObjectRef]] = {}
        for i, batch in enumerate(batches):
            if single:
                by_actor = self._by_actor(batch.users, self.work)
                if self.states and self.balance:
                    visits = self._visits(batch.round, by_actor)
            else:
                by_actor = hosted(batch.users, self.host_of)
            task_of = dict(zip(batch.users, batch.tasks or [], strict=False))
            for a, us in by_actor.items():
                self.holder.update({task_of[u]: a for u in us if u in task_of})
            holds: dict[int, set[int]] = {}
            for t in [*(t for t, _ in batch.summed), *batch.discard]:
                holds.setdefault(self.holder.pop(t), set()).add(t)
            for a in sorted(set(by_actor) | set(holds)):
                part = batch.on(by_actor.get(a, []), holds.get(a, set()))
                parts.setdefault(a, []).append((i, part))
        if not visits:
            self._settle(batches[0].round)
        sums = [Sums(np.zeros(weights.shape, dtype=np.float64)) for _ in batches]
        sums[0].bytes_sent = weights.nbytes * len(parts)  # sent once, for them all
        calls = {a: (ref, [p for _, p in mine], visits.get(a)) for a, mine in parts.items()}
        first, last = batches[0].round, batches[-1].round
        for a, answers in self.pool.gather(first, "work", calls, last=last):
            for (i, part), answer in zip(parts[a], answers, strict=True):
                sums[i].add(answer, part.users)
                if answer.guests:
                    self._send_home(part.round, answer.guests)
        return sums

    def evaluate(self, round_: int, weights: np.ndarray, users: list[int], draws: int) -> pa.Table:
        """The users' personalised scores from `weights`, each computed on the actor that
        hosts the user, in the order of the actors."""
        ref = ray.put(weights)
        by_actor = self._by_actor(users, balance=self.balance and not self.states)
        calls = {a: (ref, us, round_, draws) for a, us in by_actor.items()}
        scores = dict(self.pool.gather(round_, "evaluate", calls))
        return pa.concat_tables([scores[a] for a in sorted(scores)])

    def held(self, round_: int) -> tuple[dict[int, tuple], dict[int, np.ndarray]]:
        """The updates the actors hold (task id -> (user, version, model, loss, the actor
        holding it)) and the models they started from (version -> weights), for a
        checkpoint; no call where none is held."""
        held: dict[int, tuple] = {}
        bases: dict[int, np.ndarray] = {}
        actors = sorted(set(self.holder.values()))
        for a, (mine, started) in self.pool.gather(round_, "held", dict.fromkeys(actors, ())):
            held.update({t: (*update, a) for t, update in mine.items()})
            bases.update(started)
        return held, bases

    def hold(self, held: dict[int, tuple], bases: dict[int, np.ndarray]) -> None:
        """Give held updates back to the actors (a resumed run's, from its checkpoint),
        each to the actor that held it (its sums are grouped as they were), with the
        models they started from."""
        by_actor: dict[int, dict[int, tuple]] = {}
        for task, (*update, a) in held.items():
            by_actor.setdefault(a, {})[task] = tuple(update)
            self.holder[task] = a
        ray.get(
            [
                self.pool.actors[a].hold.remote(
                    mine, {v: bases[v] for v in {u[1] for u in mine.values()}}
                )
                for a, mine in by_actor.items()
            ]
        )

    def user_states(self, round_: int) -> dict:
        """Every user's per-user state, fetched from the actors that keep it (none, and
        no call, for a method whose users keep none)."""
        if not self.states:
            return {}
        self._settle(round_)
        states: dict = {}
        for _, part in self.pool.gather(
            round_, "user_states", dict.fromkeys(range(len(self.pool.blocks)), ())
        ):
            states.update(part)
        return states
