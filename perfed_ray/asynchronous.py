"""Asynchronous servers on the simulated clock: FedBuff and FedAsync.

FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation",
AISTATS 2022, Algorithm 1): `concurrency` users train at once, each from the model it
was sent; an update arriving after s server steps (its staleness) enters a buffer
weighted by s(staleness), and every `buffer_size` arrivals the server steps with their
weighted mean. The mean is of the updates (the users' models minus the models they
started from), added to the current model, and that model goes through the method's
server rule and the `server_optimizer` as a synchronous round's aggregate does (the
paper's server learning rate is FedAvgM's or the plain mean's; FLSim's
``HybridAggregator`` steps with the buffer's weighted mean in the same way). With every
task started from the current model, the rebased mean is the users' mean model, so
with equal devices and concurrency = buffer_size = the cohort FedBuff is Algorithm 1:
the same users, the same rows (tests/test_async.py).

FedAsync (Xie et al., "Asynchronous Federated Optimization", 2019, Algorithm 1 and
Section 5.2): every arrival steps the server, mixing the user's model x in,
w <- (1 - a_t) w + a_t x with a_t = `alpha` s(staleness): the model itself, not its
update, as the paper (and FLSim's ``fed_async_aggregation``) does; the two differ when
the update is stale.

Staleness functions (FedAsync's, which FedBuff's paper uses too): `constant` 1,
`polynomial` (1 + s)^-`staleness_exponent` (0.5: FedBuff's 1/sqrt(1 + s)), `hinge` 1
for s <= `hinge_b`, else 1 / (`hinge_a` (s - `hinge_b`) + 1). An update staler than
`max_staleness` is thrown away (`late`). Unlike FLSim's, nothing is normalised by an
average staleness: FedBuff's mean divides by the weights' sum (FedML's async adds the
weights up without dividing, which moves the model further the staler it is).

A new task is drawn whenever a slot is free, among the online users that are neither
in flight nor already given the current model, uniformly, from keyed streams: a
version's first draw from its round's own stream (`USER_SAMPLING`, the step it leads
to), so the first draw of each step is a synchronous round's, the next ones from
`TASK_SAMPLING` keyed by (step, draw).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from perfed_ray.clock import Schedule, Task, Timing
from perfed_ray.config import RunConfig
from perfed_ray.config.settings import Setting
from perfed_ray.errors import ConfigError
from perfed_ray.seeding import Stream, numpy_rng
from perfed_ray.strategy import ServerState, Step, Strategy, StrategyHParams, draw_online

STALENESS = ("constant", "polynomial", "hinge")

SETTINGS: dict[str, Setting] = {
    "concurrency": Setting(
        None,
        "tasks in flight at once; auto: the cohort, round(fraction * n_users)",
        kind=int,
        low=1,
        auto=True,
    ),
    "staleness": Setting(
        "polynomial",
        "how an update's weight falls with its staleness s: constant, polynomial "
        "(1 + s)^-staleness_exponent, or hinge",
        choices=STALENESS,
    ),
    "staleness_exponent": Setting(0.5, "the polynomial's exponent (0.5: 1/sqrt(1 + s))", low=0),
    "hinge_a": Setting(10.0, "the hinge's slope past hinge_b: 1 / (a (s - b) + 1)", low=0),
    "hinge_b": Setting(4, "the staleness up to which the hinge weighs an update 1", low=0),
    "max_staleness": Setting(
        None,
        "updates staler than this are thrown away (late); off: none",
        kind=int,
        low=0,
        auto=True,
        word="off",
    ),
}


def staleness_weight(kind: str, s: int, exponent: float, a: float, b: int) -> float:
    """s(staleness): FedAsync's constant, polynomial and hinge functions."""
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((1 + s) ** -exponent)
    return 1.0 if s <= b else 1.0 / (a * (s - b) + 1)


class Asynchronous(Strategy):
    """What FedBuff and FedAsync share: tasks kept in flight, arrivals buffered in time
    order, a server step every `buffer` of them (the class's own count)."""

    asynchronous: ClassVar[bool] = True
    settings: ClassVar[dict[str, Setting]] = SETTINGS
    rebase: ClassVar[bool] = True

    def __init__(
        self, hparams: StrategyHParams | RunConfig, sizes: np.ndarray | None = None
    ) -> None:
        super().__init__(hparams, sizes)
        mine = self.hparams.section
        self.concurrency = mine["concurrency"] or self.hparams.users_per_round
        self.max_staleness = mine["max_staleness"]

    @property
    def buffer(self) -> int:
        """Arrivals a server step aggregates."""
        return 1

    @classmethod
    def validate(cls, cfg: RunConfig) -> None:
        name = f"strategy = {cfg.strategy}"
        if cfg.privacy != "none":
            raise ConfigError(
                f"{name} with privacy = {cfg.privacy}: differential privacy's accounting "
                f"assumes one cohort a step, which an asynchronous server does not have; "
                f"use strategy: uniform"
            )
        for key, allowed in (
            ("sampling", "uniform"),
            ("trained_users", "sampled"),
            ("overcommit", 1.0),
            ("dropout", 0.0),
            ("stragglers", 0.0),
        ):
            if getattr(cfg, key) != allowed:
                raise ConfigError(
                    f"{key} = {getattr(cfg, key)!r} is a synchronous round's; {name} "
                    f"draws each task among the idle online users: leave {key} at {allowed!r}"
                )
        mine = cfg.settings_of("strategy")
        concurrency = mine["concurrency"] or cfg.users_per_round
        trainable = cfg.n_users - cfg.unseen_count
        if concurrency > trainable:
            raise ConfigError(
                f"{cfg.strategy}.concurrency = {concurrency} is more tasks in flight than "
                f"the {trainable} users that train: lower it"
            )

    def weight_of(self, staleness: int) -> float:
        """s(staleness), as the strategy's settings shape it."""
        mine = self.hparams.section
        return staleness_weight(
            mine["staleness"],
            staleness,
            mine["staleness_exponent"],
            mine["hinge_a"],
            mine["hinge_b"],
        )

    def _fill(self, schedule: Schedule, timing: Timing) -> int:
        """Dispatch tasks at `schedule.now` until `concurrency` are in flight or nobody
        idle is online; how many were dispatched."""
        need = self.concurrency - len(schedule.flight)
        if need <= 0:
            return 0
        hp, key = self.hparams, schedule.version + 1
        taken = np.array(sorted(schedule.busy() | schedule.drawn), dtype=np.int64)
        pool = np.arange(hp.n_users) if not hp.unseen_count else self._seen
        idle = np.delete(pool, np.searchsorted(pool, taken))  # the taken are drawn from pool
        rng = (
            numpy_rng(hp.seed, Stream.USER_SAMPLING, key)
            if schedule.draws == 0
            else numpy_rng(hp.seed, Stream.TASK_SAMPLING, key, schedule.draws)
        )
        schedule.draws += 1
        now = schedule.now
        users = draw_online(rng, idle, need, lambda users: timing.online(users, now))
        for user in users:
            schedule.drawn.add(user)
            schedule.push(timing.task(schedule.new_id(), user, schedule.version, now))
        return len(users)

    def _wait(self, schedule: Schedule, timing: Timing) -> None:
        """Nothing in flight and nobody to draw: the clock moves to when the first idle
        user comes online (a rare case, worth a pass over the users)."""
        busy = schedule.busy() | schedule.drawn
        first = min(
            (timing.next_online(int(u), schedule.now) for u in self._seen if u not in busy),
            default=np.inf,
        )
        if not np.isfinite(first) or first <= schedule.now:
            raise RuntimeError(
                f"no task in flight at simulated second {schedule.now:g} and no idle user "
                f"will come online: the server cannot take step {schedule.version + 1}"
            )
        schedule.now = first

    def next_step(self, round_: int, schedule: Schedule, timing: Timing) -> Step:
        """The next server step: tasks dispatched and resolved in time order (ties in
        dispatch order) until `buffer` updates have arrived; the tasks dispatched from
        the current model are trained in this step's call, before their sum. Free slots
        are filled once every task ending at the current instant is in, so that tasks
        that end together free their slots together (a synchronous round's cohort)."""
        resolved: list[Task] = []
        discard: list[int] = []
        dispatched = 0
        while len(schedule.buffer) < self.buffer:
            if schedule.next_end() > schedule.now:  # this instant's arrivals are all in
                dispatched += self._fill(schedule, timing)
            if not schedule.flight:
                self._wait(schedule, timing)
                continue
            task = schedule.pop()
            if not task.arrives:
                resolved.append(task)
                continue
            stale = schedule.version - task.version
            if self.max_staleness is not None and stale > self.max_staleness:
                task.outcome = "late"
                resolved.append(task)
                discard.append(task.id)
                continue
            schedule.buffer.append(task)
        train = schedule.untrained()
        for task in train:
            task.trained = True
        summed, staleness = [], []
        for task in schedule.buffer:
            s = schedule.version - task.version
            task.outcome, task.round = "aggregated", round_
            summed.append((task.id, self.weight_of(s)))
            staleness.append(s)
        arrived, schedule.buffer = schedule.buffer, []
        resolved += arrived
        schedule.advance()
        return Step(
            round_,
            [t.user for t in arrived],
            [t.user for t in train],
            None,
            [t.id for t in train],
            summed,
            discard,
            self.rebase,
            schedule.now,
            dispatched,
            resolved,
            metrics={
                "staleness_mean": float(np.mean(staleness)),
                "staleness_max": int(max(staleness)),
                "in_flight": len(schedule.flight),
            },
        )


class FedBuff(Asynchronous):
    """FedBuff: a server step every `buffer_size` arrivals, with their staleness-weighted
    mean update added to the current model, through the server optimiser. Registered as
    `fedbuff`."""

    settings: ClassVar[dict[str, Setting]] = {
        **SETTINGS,
        "buffer_size": Setting(
            None,
            "arrivals a server step aggregates (K); auto: concurrency / 10, at least 1",
            kind=int,
            low=1,
            auto=True,
        ),
    }

    @property
    def buffer(self) -> int:
        return self.hparams.section["buffer_size"] or max(1, self.concurrency // 10)

    @classmethod
    def validate(cls, cfg: RunConfig) -> None:
        super().validate(cfg)
        mine = cfg.settings_of("strategy")
        concurrency = mine["concurrency"] or cfg.users_per_round
        if mine["buffer_size"] is not None and mine["buffer_size"] > concurrency:
            raise ConfigError(
                f"fedbuff.buffer_size = {mine['buffer_size']} is larger than "
                f"fedbuff.concurrency = {concurrency}: a step would wait for more updates "
                f"than are ever in flight"
            )

    def server_step(
        self,
        step: Step,
        state: ServerState,
        total: np.ndarray,
        weight: float,
        rebased: float,
        stats: Mapping[str, float] | None = None,
    ) -> ServerState:
        """The weighted mean of the rebased models: the current one plus the buffer's
        weighted mean update (`rebased` weighs the updates the sum holds as updates)."""
        current = state.weights.astype(np.float64)
        return super().server_step(step, state, total + rebased * current, weight, 0.0, stats)


class FedAsync(Asynchronous):
    """FedAsync: every arrival mixed in, w <- (1 - a_t) w + a_t x, a_t = alpha s(staleness).
    Registered as `fedasync`."""

    settings: ClassVar[dict[str, Setting]] = {
        **SETTINGS,
        "alpha": Setting(0.6, "the mixing weight a of an update of staleness 0", low=0, high=1),
    }
    rebase: ClassVar[bool] = False

    def server_step(
        self,
        step: Step,
        state: ServerState,
        total: np.ndarray,
        weight: float,
        rebased: float,
        stats: Mapping[str, float] | None = None,
    ) -> ServerState:
        """The mixed model as the aggregate the method's server rule and the server
        optimiser take (the plain mean's step lands on it)."""
        [(_, factor)] = step.summed
        mix = self.hparams.section["alpha"] * factor
        current = state.weights.astype(np.float64)
        mixed = (1 - mix) * weight * current + mix * total
        return super().server_step(step, state, mixed, weight, 0.0, stats)
