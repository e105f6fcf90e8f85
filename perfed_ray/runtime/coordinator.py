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
from perfed_ray.runtime.placement import balanced, host_finder, hosted
from perfed_ray.runtime.pool import ActorPool, StateLost

if TYPE_CHECKING:  # an actor's answer and what it applies; both modules load torch
    from perfed_ray.postprocess import UserPostprocessor
    from perfed_ray.runtime.actor import UpdateSum


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
    stats: dict[str, float] = field(default_factory=dict)  # the postprocessor's, summed

    def add(self, part: UpdateSum, users: list[int]) -> None:
        """An actor's part (its `UpdateSum`) of the round, trained by `users`."""
        if not (np.isfinite(part.total).all() and np.isfinite(part.loss_sum)):
            self.diverged += users
        self.total += part.total
        self.weight += part.weight
        self.loss_sum += part.loss_sum
        self.bytes_received += part.total.nbytes
        self.actor_seconds = max(self.actor_seconds, part.seconds)
        for name, value in part.stats.items():
            self.stats[name] = self.stats.get(name, 0.0) + value


Work = Callable[[int], float]  # a user's share of a round's local work (its steps)
# A round of a span: (round, reporting, trained, the step on each user's model).
RoundWork = tuple[int, list[int], list[int], "UserPostprocessor | None"]


def _summed(reporting: list[int], trained: list[int]) -> set[int] | None:
    """The users an actor's sum counts among those it trains: all (None) when the two
    lists are the same users, else the reporting ones (every user trains each round)."""
    return None if reporting == trained else set(reporting)


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

    def train(
        self,
        round_: int,
        weights: np.ndarray,
        reporting: list[int],
        trained: list[int],
        postprocess: UserPostprocessor | None = None,
    ) -> Sums:
        """Local training of round k from `weights` by the `trained` users; the sum counts
        the `reporting` ones, each user's model through `postprocess` first (if any)."""
        ref = ray.put(weights)
        by_actor = self._by_actor(trained, self.work)
        visits = self._visits(round_, by_actor) if self.states and self.balance else {}
        summed = _summed(reporting, trained)
        calls = {
            a: (
                ref,
                us,
                round_,
                None if summed is None else [u for u in us if u in summed],
                visits.get(a),
                postprocess,
            )
            for a, us in by_actor.items()
        }
        sums = Sums(
            np.zeros(weights.shape, dtype=np.float64), bytes_sent=weights.nbytes * len(calls)
        )
        for a, part in self.pool.gather(round_, "train", calls):
            sums.add(part, by_actor[a])
            if part.guests:
                self._send_home(round_, part.guests)
        return sums

    def train_rounds(self, weights: np.ndarray, rounds: list[RoundWork]) -> list[Sums]:
        """Several rounds' local work, (round, reporting, trained, postprocess) each as
        `train` takes them, all from the same `weights` (a server's model that never
        moves), in one call to each actor: a Sums a round. Users stay on their hosts:
        over several rounds an actor's share of the work evens out, and no state has
        to travel."""
        first = rounds[0][0]
        self._settle(first)
        ref = ray.put(weights)
        plans: dict[int, list[tuple]] = {}
        for round_, reporting, trained, postprocess in rounds:
            summed = _summed(reporting, trained)
            for a, us in hosted(trained, self.host_of).items():
                aggregated = None if summed is None else [u for u in us if u in summed]
                plans.setdefault(a, []).append((round_, us, aggregated, postprocess))
        sums = {r: Sums(np.zeros(weights.shape, dtype=np.float64)) for r, *_ in rounds}
        sums[first].bytes_sent = weights.nbytes * len(plans)  # sent once, for them all
        calls = {a: (ref, plan) for a, plan in plans.items()}
        for a, parts in self.pool.gather(first, "train_rounds", calls, last=rounds[-1][0]):
            for (round_, us, *_), part in zip(plans[a], parts, strict=True):
                sums[round_].add(part, us)
        return [sums[r] for r, *_ in rounds]

    def evaluate(self, round_: int, weights: np.ndarray, users: list[int], draws: int) -> pa.Table:
        """The users' personalised scores from `weights`, each computed on the actor that
        hosts the user, in the order of the actors."""
        ref = ray.put(weights)
        by_actor = self._by_actor(users, balance=self.balance and not self.states)
        calls = {a: (ref, us, round_, draws) for a, us in by_actor.items()}
        scores = dict(self.pool.gather(round_, "evaluate", calls))
        return pa.concat_tables([scores[a] for a in sorted(scores)])

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
