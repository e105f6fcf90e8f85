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

A node that dies takes its actors with it. Ray fails their calls once its health
checks have declared the node dead (its node table says so), which is the pool's
signal: each lost actor is recorded as a `node-died` event and replaced on a
surviving node. Where the survivors have no free share of the request left, the
replacement asks Ray for what is free (down to no CPU at all: Ray's resources are
logical), so it shares a surviving node's CPUs rather than waiting for ever for a slot
that will never come, and it still hosts the same block: the users are trained and
evaluated in the same groups as before, so every number stays the same. (Spreading the
block over the survivors instead would change how users are stacked together in an
evaluation, and with it a float32 loss in the last bit.) A replacement that Ray has
not placed within :data:`PLACE_TIMEOUT_S` stops the run (:class:`NoRoom`) rather than
wait without a bound.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, ObjectLostError, RayActorError

from perfed_ray import faults
from perfed_ray.errors import first_line
from perfed_ray.runtime import hosts

# (actor, incarnation, the Ray request to use instead of the placement's) -> handle
ActorFactory = Callable[[int, int, "Request | None"], ray.actor.ActorHandle]
Record = Callable[[str, list[dict[str, Any]]], None]  # (table, rows)
Request = dict[str, float]  # what one actor asks of Ray: {"CPU": ..., "GPU": ...}

# How long a replacement may take to be placed and load its users before the run stops:
# far more than a placement the cluster has room for takes, so reaching it means there
# is none (a placement group whose bundle cannot be rescheduled, memory).
PLACE_TIMEOUT_S = 120.0


class RunLost(RuntimeError):
    """The run cannot go on with the cluster it has: its message names what was lost,
    in one line, and the run is marked `failed`, to be continued with --resume."""


class WorkFailed(RunLost):
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

    def events(self, checkpoint_round: int) -> list[dict[str, Any]]:
        """The `events` rows of the roll-back."""
        return [
            {
                "round": self.round,
                "kind": "actor-died",
                "actor": self.actor,
                "users": self.users,
                "detail": f"{self.detail}; per-user state lost: every actor rolled back to "
                f"the checkpoint of round {checkpoint_round} and the rounds after "
                f"it replayed",
            }
        ]

    def failed(self, attempts: int) -> WorkFailed:
        return WorkFailed(self.round, self.actor, self.users, attempts, self.detail)


class NodeLost(StateLost):
    """A node died with actors hosting users with per-user state: the run rolls back,
    its actors restarted on the nodes that are left (:func:`.placement.packed`)."""

    def __init__(self, round_: int, node: str, actors: dict[int, list[int]], detail: str) -> None:
        first = min(actors)
        super().__init__(round_, first, actors[first], detail)
        self.node, self.actors = node, actors

    def events(self, checkpoint_round: int) -> list[dict[str, Any]]:
        return [
            {
                "round": self.round,
                "kind": "node-died",
                "actor": actor,
                "users": users,
                "detail": f"node {self.node} died ({self.detail}) with actors "
                f"{sorted(self.actors)}; per-user state lost: every actor restarted on "
                f"the nodes left, rolled back to the checkpoint of round "
                f"{checkpoint_round}, and the rounds after it replayed",
            }
            for actor, users in sorted(self.actors.items())
        ]


class NoRoom(RunLost):
    """What a lost actor hosted cannot be started again on the cluster that is left."""

    def __init__(self, round_: int, actor: int, users: list[int], why: str) -> None:
        super().__init__(
            f"round {round_}: the actor hosting users {_shown(users)} was lost and {why}; "
            f"continue with --resume once the cluster has room again"
        )
        self.round, self.actor, self.users = round_, actor, users


def dead_nodes() -> set[str]:
    """The ids of the nodes Ray's node table holds as dead."""
    return {node["NodeID"] for node in ray.nodes() if not node["Alive"]}


# How Ray (its GCS) says an actor died with its node. It marks the node's actors dead
# as it marks the node, and a driver may read its node table in between.
NODE_DIED = "because its node has died"


def lost_with_node(node: str | None, death: BaseException | None) -> str | None:
    """`node`, where an actor on it died with it: Ray's node table holds it as dead, or
    the actor's `death` (Ray's verdict) says so; else None (the actor died alone)."""
    if node is None:
        return None
    return node if NODE_DIED in str(death) or node in dead_nodes() else None


def free_share(request: Request) -> Request | None:
    """What a replacement asks Ray for: None (its placement's `request`) where the
    cluster has that much free, else what it has free of each, floored to Ray's 1e-4
    units; possibly no CPU (it then shares a node's CPUs) or no GPU (which the caller
    refuses: the actor would train on the CPU)."""
    free = ray.available_resources()
    if all(free.get(k, 0.0) + 1e-9 >= v for k, v in request.items()):
        return None
    return {k: min(v, int(free.get(k, 0.0) * 10_000) / 10_000) for k, v in request.items()}


def _shown(users: list[int]) -> str:
    return ", ".join(map(str, users[:10])) + (" ..." if len(users) > 10 else "")


class ActorPool:
    """Actor i hosts blocks[i]; `record` receives the rows of `events` and `actors`;
    without `replaceable` (users with per-user state) a death raises StateLost
    (NodeLost where its node died). Each actor asks Ray for `request`, or, in a
    placement group (`request` None), takes its bundle, which Ray moves off a dead node
    where it can."""

    def __init__(
        self,
        blocks: list[list[int]],
        start_actor: ActorFactory,
        retries: int,
        record: Record,
        replaceable: bool = True,
        incarnations: list[int] | None = None,
        request: Request | None = None,
    ) -> None:
        self.blocks = blocks
        self.replaceable = replaceable
        self.start_actor = start_actor
        self.retries = retries
        self.record = record
        self.request = request
        self.actors: list[ray.actor.ActorHandle] = []
        self.nodes: list[str] = []  # the node each actor runs on
        self.incarnations = incarnations or [0] * len(blocks)

    def start(
        self, from_round: int, share: Request | None = None, bound: float | None = None
    ) -> None:
        """Start every actor, each asking Ray for `share` instead of its request if
        given, and wait until all hold their shards: without a bound where the cluster
        was seen to hold them all, else for `bound` seconds at most (NoRoom). One that
        dies meanwhile (its node lost as the run starts) is replaced as in a round."""
        n = len(self.blocks)
        self.actors = [self.start_actor(i, self.incarnations[i], share) for i in range(n)]
        refs = [a.describe.remote() for a in self.actors]
        ready, _ = ray.wait(refs, num_returns=n, timeout=bound)
        if len(ready) < n:
            i = next(i for i, ref in enumerate(refs) if ref not in ready)
            raise NoRoom(
                from_round, i, self.blocks[i], f"Ray placed it again not within {bound:g} s"
            )
        self.nodes = [""] * n
        failures: Counter[int] = Counter()
        for i, ref in enumerate(refs):
            try:
                described = ray.get(ref)
            except RayActorError as err:
                self._replace(i, from_round, err, failures)  # records its actors row
                continue
            self.nodes[i] = described["node_id"]
            self.record("actors", [self._row(i, described, from_round)])

    def peak_memory(self) -> int:
        """The actors' peak resident memory together, of those still alive to say."""
        refs = [a.describe.remote() for a in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PLACE_TIMEOUT_S)
        total = 0
        for ref in ready:
            try:
                total += ray.get(ref)["peak_memory_bytes"]
            except RayActorError:  # lost with its node after the last round
                continue
        return total

    def stop(self, keep: bool = False) -> None:
        """End the actors, or with `keep` (a run that finished, or was stopped between
        rounds) leave them to host the next run (:mod:`perfed_ray.runtime.hosts`)."""
        hosts.give_back(self.actors, keep)
        self.actors = []

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
            except (RayActorError, ObjectLostError) as err:
                # Unreachable, or its result lost with its node's object store: dead
                # only once Ray says so (a fault that passes: the same call again).
                death = err if isinstance(err, ActorDiedError) else self._verdict(i)
                if death is None:
                    pending[self._call(i, method, args[i])] = i
                    continue
                node = lost_with_node(self.nodes[i], death)
                if not self.replaceable:
                    detail = first_line(err)
                    if node is None:
                        raise StateLost(round_, i, self.blocks[i], detail) from None
                    lost = {j: list(self.blocks[j]) for j, n in enumerate(self.nodes) if n == node}
                    raise NodeLost(round_, node, lost, detail) from None
                self._replace(i, round_, err, failures, node)
                pending[self._call(i, method, args[i])] = i
                continue
            yield i, result

    def _verdict(self, i: int) -> BaseException | None:
        """None if actor i, unreachable (its connection or its result lost: the first
        signs of a node going), answers again; else Ray's word that it is dead, which for
        a lost node comes when the head's health checks give the node up (or the wait
        timed out). Waiting for that verdict keeps a replacement off the dying node and
        records the loss as the node's."""
        deadline = time.monotonic() + PLACE_TIMEOUT_S
        while time.monotonic() < deadline:
            probe = self.actors[i].describe.remote()
            ray.wait([probe], timeout=deadline - time.monotonic())
            try:
                ray.get(probe, timeout=0)
                return None
            except ActorUnavailableError:
                time.sleep(0.5)
            except (RayActorError, ray.exceptions.GetTimeoutError) as dead:
                return dead
        return TimeoutError(f"actor {i} unreachable for {PLACE_TIMEOUT_S:g} s")

    def _replace(
        self,
        i: int,
        round_: int,
        err: BaseException,
        failures: Counter[int],
        node: str | None = None,
    ) -> None:
        """Start a new incarnation of actor i (which died with its `node`, if given);
        raise WorkFailed past the retry limit, NoRoom where it cannot be placed."""
        while True:
            failures[i] += 1
            if failures[i] > self.retries:
                raise WorkFailed(round_, i, self.blocks[i], failures[i], first_line(err))
            ray.kill(self.actors[i], no_restart=True)
            share = None if self.request is None else free_share(self.request)
            if share is not None and self.request.get("GPU", 0.0) and not share["GPU"]:
                raise NoRoom(round_, i, self.blocks[i], "no GPU is free on the nodes left")
            self.incarnations[i] += 1
            self.actors[i] = self.start_actor(i, self.incarnations[i], share)
            self.record("events", [self._died(i, round_, err, node, share)])
            ready, _ = ray.wait([self.actors[i].describe.remote()], timeout=PLACE_TIMEOUT_S)
            if not ready:
                ray.kill(self.actors[i], no_restart=True)
                raise NoRoom(
                    round_,
                    i,
                    self.blocks[i],
                    f"Ray placed no replacement within {PLACE_TIMEOUT_S:g} s",
                )
            try:
                described = ray.get(ready[0])
            except RayActorError as again:
                err, node = again, None
                continue
            self.nodes[i] = described["node_id"]
            self.record("actors", [self._row(i, described, round_)])
            return

    def _died(
        self, i: int, round_: int, err: BaseException, node: str | None, share: Request | None
    ) -> dict[str, Any]:
        """The `events` row of actor i's death, its replacement started."""
        replaced = (
            f"replaced by incarnation {self.incarnations[i]}, which reloaded the users' shards"
        )
        if share is not None:
            asked = ", ".join(f"{v:g} {k}" for k, v in share.items())
            replaced += f", asking Ray for {asked}, what the nodes left had free"
        kind, why = (
            ("actor-died", first_line(err))
            if node is None
            else ("node-died", f"node {node} died ({first_line(err)})")
        )
        return {
            "round": round_,
            "kind": kind,
            "actor": i,
            "users": list(self.blocks[i]),
            "detail": f"{why}; {replaced}",
        }

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
