"""The user actors of a run, kept whole: an actor that dies is replaced and its work re-run.

Results are taken as each actor finishes (`ray.wait`, as Ray's design patterns advise
over one `ray.get` of them all), so the driver adds up one actor's sum while others
still work, and a dead actor's call is sent again as soon as its failure arrives.

An actor holds a fixed block of users. When its process dies (killed, out of
memory, node lost), Ray fails the calls in flight with ``RayActorError``; the pool
then starts a new incarnation for the same block, which reloads the same shards,
and sends it the same call again. Local work is a deterministic function of the
weights, the users and the round, so the run's numbers do not change. Each
replacement is recorded (``events``, ``actors``); an actor that keeps dying in the
same round stops the run instead of being retried for ever.

Where users keep per-user state on their actor (pFedMe, Ditto, FedRep, a user's own
stateful method), a dead actor's states since the last checkpoint are lost with it,
so a replacement alone would compute other numbers: the pool raises
:class:`StateLost` instead, and the run rolls every actor back to the last checkpoint
and replays the rounds from there (:func:`perfed_ray.runtime.simulation.run`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import ray
from ray.exceptions import RayActorError

from perfed_ray import faults
from perfed_ray.errors import first_line

ActorFactory = Callable[[int, int], ray.actor.ActorHandle]  # (actor, incarnation) -> handle
Record = Callable[[str, list[dict[str, Any]]], None]  # (table, rows)


class WorkFailed(RuntimeError):
    """An actor died more often in one round than the run allows."""

    def __init__(
        self, round_: int, actor: int, users: list[int], attempts: int, detail: str
    ) -> None:
        super().__init__(
            f"round {round_}: the actor hosting users {_shown(users)} died {attempts} times "
            f"(last: {detail}); stopping rather than retrying for ever. Look for what kills "
            f"it (memory, a failing node) in the Ray logs (/tmp/ray/session_latest/logs), "
            f"then continue with --resume, or raise actor_retries"
        )
        self.round = round_
        self.users = users


class StateLost(RuntimeError):
    """An actor hosting users with per-user state died: the run must roll back."""

    def __init__(self, round_: int, actor: int, users: list[int], detail: str) -> None:
        super().__init__(
            f"round {round_}: the actor hosting users {_shown(users)} died "
            f"({detail}) with their per-user state"
        )
        self.round, self.actor, self.users, self.detail = round_, actor, users, detail

    def event(self, checkpoint_round: int) -> dict[str, Any]:
        """The `events` row of the roll-back."""
        return {
            "round": self.round,
            "kind": "actor-died",
            "actor": self.actor,
            "users": self.users,
            "detail": f"{self.detail}; per-user state lost: every actor rolled back to "
            f"the checkpoint of round {checkpoint_round} and the rounds after "
            f"it replayed",
        }

    def failed(self, attempts: int) -> WorkFailed:
        return WorkFailed(self.round, self.actor, self.users, attempts, self.detail)


def _shown(users: list[int]) -> str:
    return ", ".join(map(str, users[:10])) + (" ..." if len(users) > 10 else "")


class ActorPool:
    """Actor i hosts blocks[i]; `record` receives the rows of `events` and `actors`;
    without `replaceable` (users with per-user state) a death raises StateLost."""

    def __init__(
        self,
        blocks: list[list[int]],
        start_actor: ActorFactory,
        retries: int,
        record: Record,
        replaceable: bool = True,
        incarnations: list[int] | None = None,
    ) -> None:
        self.blocks = blocks
        self.replaceable = replaceable
        self.start_actor = start_actor
        self.retries = retries
        self.record = record
        self.actors: list[ray.actor.ActorHandle] = []
        self.incarnations = incarnations or [0] * len(blocks)

    def start(self, from_round: int) -> None:
        """Start every actor and wait until all hold their shards."""
        self.actors = [self.start_actor(i, self.incarnations[i]) for i in range(len(self.blocks))]
        self.record("actors", [self._row(i, d, from_round) for i, d in enumerate(self.describe())])

    def describe(self) -> list[dict[str, Any]]:
        return ray.get([a.describe.remote() for a in self.actors])

    def stop(self) -> None:
        for actor in self.actors:
            ray.kill(actor)

    def gather(
        self, round_: int, method: str, args: dict[int, tuple], last: int | None = None
    ) -> Iterator[tuple[int, Any]]:
        """Call ``method(*args[i])`` on every actor i now, for round k (to round `last`
        where a call carries several); the iterator yields (i, result) in the order
        results arrive, re-running a call whose actor died."""
        pending = {self._call(i, method, a): i for i, a in args.items()}
        for n in range(round_, (round_ if last is None else last) + 1):
            faults.in_flight(method, n)
        return self._collect(round_, method, args, pending)

    def _call(self, i: int, method: str, args: tuple) -> ray.ObjectRef:
        return getattr(self.actors[i], method).remote(*args)

    def _collect(
        self, round_: int, method: str, args: dict[int, tuple], pending: dict[ray.ObjectRef, int]
    ) -> Iterator[tuple[int, Any]]:
        failures: Counter[int] = Counter()
        while pending:
            [done], _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(done)
            try:
                result = ray.get(done)
            except RayActorError as err:
                if not self.replaceable:
                    raise StateLost(round_, i, self.blocks[i], first_line(err)) from None
                self._replace(i, round_, err, failures)
                pending[self._call(i, method, args[i])] = i
                continue
            yield i, result

    def _replace(self, i: int, round_: int, err: BaseException, failures: Counter[int]) -> None:
        """Start a new incarnation of actor i; raise WorkFailed past the retry limit."""
        while True:
            failures[i] += 1
            if failures[i] > self.retries:
                raise WorkFailed(round_, i, self.blocks[i], failures[i], first_line(err))
            ray.kill(self.actors[i], no_restart=True)
            self.incarnations[i] += 1
            self.actors[i] = self.start_actor(i, self.incarnations[i])
            self.record(
                "events",
                [
                    {
                        "round": round_,
                        "kind": "actor-died",
                        "actor": i,
                        "users": self.blocks[i],
                        "detail": f"{first_line(err)}; replaced by incarnation "
                        f"{self.incarnations[i]}, which reloaded the users' shards",
                    }
                ],
            )
            try:
                described = ray.get(self.actors[i].describe.remote())
            except RayActorError as again:
                err = again
                continue
            self.record("actors", [self._row(i, described, round_)])
            return

    def _row(self, i: int, described: dict[str, Any], from_round: int) -> dict[str, Any]:
        return {
            "actor": i,
            "incarnation": self.incarnations[i],
            "from_round": from_round,
            "users": self.blocks[i],
            "node_id": described["node_id"],
            "node_ip": described["node_ip"],
            "pid": described["pid"],
            "device": described["device"],
            "gpu_ids": described["gpu_ids"],
        }
