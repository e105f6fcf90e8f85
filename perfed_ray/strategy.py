"""The server's side of a round, as one value: which users a round samples, which of
them report, how each one's model is weighted, how their weighted sum becomes the next
global model (the method's own server rule, then the server optimiser's step), and
which users an evaluation scores. A researcher changes any of it by subclassing
:class:`Strategy` and naming the class in the configuration (`strategy:
mypkg.policies:Mine`); the round's order (:mod:`perfed_ray.runtime.rounds`) asks the
strategy and nothing else, and the coordinator keeps the transport.

The hooks follow Flower's ``Strategy`` (flwr/server/strategy/strategy.py): `plan` is
its ``configure_fit``, `aggregate` its ``aggregate_fit``, `evaluated` its
``configure_evaluate``. The server's state is explicit, as in FedJAX's
``FederatedAlgorithm`` (fedjax/core/federated_algorithm.py, fedjax/algorithms/
fed_avg.py): `init` makes the :class:`ServerState` before round 1 and `aggregate`
returns the next one, which the checkpoint saves and restores whole. Post-processing
is one ordered chain, as pfl-research's postprocessors are: on each reporting user's
model, on the actor, the strategy's own steps (`user_steps`) and then the privacy
mechanism's clipping (and local noise), last; on the driver, the mechanism's release
(its noise: the one place noise is added) and then the strategy's own step on the
aggregate (`postprocess_aggregate`). A strategy adds steps; the mechanism's keep their
place, and its state its own field of the server state (`ServerState.privacy`).

Every draw comes from a stream keyed by the round (:mod:`perfed_ray.seeding`), so a
resumed or replayed round samples the same users.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import numpy as np
import torch

from perfed_ray.algorithms.base import Algorithm, make_algorithm
from perfed_ray.algorithms.tree import Params
from perfed_ray.clock import Schedule, Task, Timing
from perfed_ray.config import RunConfig
from perfed_ray.config.owners import HParams
from perfed_ray.errors import ConfigError
from perfed_ray.models import FlatParams
from perfed_ray.optimizers.server import ServerOptimizer
from perfed_ray.postprocess import UserPostprocessor, chain
from perfed_ray.privacy.mechanisms import NoPrivacy
from perfed_ray.registry import PRIVACY, SERVER_OPTIMIZERS
from perfed_ray.seeding import Stream, numpy_rng


@dataclass(frozen=True)
class ServerState:
    """Everything the server keeps from one round to the next, and all a checkpoint
    needs of it: the global model w_k as the flat float32 vector that travels, the
    server optimiser's state (FedAdam's moments; empty for `mean`), whatever else a
    strategy keeps (`extra`, arrays by name: a subclass's own, saved alike) and the
    privacy mechanism's (`privacy`: adaptive clipping's bound), apart from `extra` so
    that a strategy that sets its own cannot drop it. A step returns a new state
    rather than changing this one."""

    weights: np.ndarray
    optimizer: Mapping[str, np.ndarray] = field(default_factory=dict)
    extra: Mapping[str, np.ndarray] = field(default_factory=dict)
    privacy: Mapping[str, np.ndarray] = field(default_factory=dict)


def draw_online(
    rng: np.random.Generator,
    candidates: np.ndarray,
    m: int,
    online: Callable[[np.ndarray], np.ndarray],
) -> list[int]:
    """m of the `candidates` (sorted, distinct) that are online, uniformly without
    replacement: m drawn, those offline put back out of reach and the missing ones drawn
    from the rest, until m are online or none is left. Online users are exchangeable in
    it, so the result is uniform among them, and it asks about as few users as it draws:
    where everyone is online it is one ``choice`` of m (the draw Algorithm 1's rounds
    always made), whatever the population. The draws are positions in the sorted users
    left, taken out by position, so a redraw costs a copy of them and no sort: the
    driver's cost per arrival stays flat in the population. Sorted."""
    chosen: list[int] = []
    left = candidates
    while len(chosen) < m and len(left):
        at = rng.choice(len(left), size=min(m - len(chosen), len(left)), replace=False)
        picked = left[at]
        up = online(picked)
        chosen += picked[up].tolist()
        if up.all():
            break
        left = np.delete(left, at)
    return sorted(chosen)


@dataclass(frozen=True)
class Participation:
    """Who of round k's sampled users reports, drops out, or reports past the deadline."""

    reporting: list[int]
    dropped: list[int]
    late: list[int]


@dataclass(frozen=True)
class Step:
    """What one server step (a row of `rounds`) runs, as its strategy decided it: the
    `trained` users' local work from the current model (their tasks' ids `tasks`),
    then either the `reporting` ones among them summed at once (a synchronous round)
    or, with `reporting` None, the trained updates held on the actors until a step
    sums them; `summed`, the held tasks (id, staleness factor) this step aggregates,
    as they are (`rebase` False) or moved onto the current model (their update added
    to it: FedBuff's); `discard`, held ones thrown away. `time` is the simulated
    second the step's model is made; `resolved`, the tasks that ended (the tasks
    table's rows); `events`, (kind, users) rows of `events`; `metrics`, the
    strategy's own columns of the row."""

    round: int
    users: list[int]
    trained: list[int]
    reporting: list[int] | None
    tasks: list[int]
    summed: list[tuple[int, float]]
    discard: list[int]
    rebase: bool
    time: float
    dispatched: int
    resolved: list[Task]
    events: list[tuple[str, list[int]]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def reported(self) -> int:
        """How many users' updates the step aggregates."""
        return len(self.summed) if self.reporting is None else len(self.reporting)


@dataclass(frozen=True, kw_only=True)
class StrategyHParams(HParams):
    """What a strategy reads of a run: the core keys its hooks name, the counts the run
    derives from `fraction`, `unseen_users` and `eval_users` (so that a strategy rounds
    them as the run's checks did), and the three components its server step applies, made
    for it: the method (`method`, as `algorithm` is the core key that names it), whose
    server rule it runs, the server optimiser, and the privacy mechanism (`mechanism`, as
    `privacy` is the core key that names it). A strategy that reads more core keys
    subclasses it as its ``HParams``."""

    key: ClassVar[str] = "strategy"
    seed: int
    n_users: int
    fraction: float
    sampling: str
    aggregation: str
    trained_users: str
    sample_final_eval: bool
    dropout: float
    stragglers: float
    overcommit: float
    users_per_round: int
    unseen_count: int
    users_per_evaluation: int
    method: Algorithm
    optimizer: ServerOptimizer
    mechanism: NoPrivacy

    @classmethod
    def of(cls, cfg: RunConfig, **made: Any) -> Self:
        """Also the method, the server optimiser and the privacy mechanism the run names."""
        return super().of(
            cfg,
            method=make_algorithm(cfg),
            optimizer=SERVER_OPTIMIZERS.load(cfg.server_optimizer)(cfg),
            mechanism=PRIVACY.load(cfg.privacy)(cfg),
            **made,
        )


class Strategy:
    """Algorithm 1's server: m = round(r n) users without replacement, uniformly
    (`sampling: uniform`) or in proportion to their training samples (`sampling:
    samples`, as Ditto's and FedProx's authors draw them: numpy's `choice` with p the
    users' shares of all samples), or each user on its own with probability `fraction`
    (`sampling: poisson`, so cohorts vary: the sampling that differential privacy's
    amplification by subsampling assumes), aggregated by their plain mean (`aggregation: mean`)
    or weighted by their training samples (`aggregation: samples`); the sampled users
    train, or every user does (`trained_users: all`); every user evaluated, or a
    sample of them (`eval_users`). Registered as `uniform`.

    The next model is the method's own server rule (`Algorithm.server_update`) applied
    to the reporting users' aggregate, then the server optimiser's step towards it
    (`server_optimizer`). The aggregate is their weighted mean, or under differential
    privacy (`privacy`) the privacy mechanism's release: clipped on the actors, noised
    on the driver (:mod:`perfed_ray.privacy.mechanisms`).

    Made from its `HParams`, on the driver and on every actor (which only weighs its
    users). `sizes` are the users' training-sample counts, known on the driver (needed
    for `sampling: samples` alone)."""

    # What the strategy reads of a run; a strategy that reads more subclasses it.
    HParams: ClassVar[type[StrategyHParams]] = StrategyHParams
    # Whether its steps aggregate updates of tasks started from older models (so that
    # the actors hold updates between calls, and privacy's one-cohort-a-step
    # accounting does not apply).
    asynchronous: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a subclass that replaces the round's chain of user steps: it would drop
        the privacy mechanism's clipping while the run still reported an epsilon."""
        super().__init_subclass__(**kwargs)
        if "postprocess_users" in cls.__dict__:
            raise TypeError(
                f"{cls.__name__} overrides Strategy.postprocess_users, the round's chain with "
                f"the privacy mechanism's steps: add steps of its own in user_steps instead"
            )

    def __init__(
        self, hparams: StrategyHParams | RunConfig, sizes: np.ndarray | None = None
    ) -> None:
        self.hparams = self.HParams.given(hparams)
        self.sizes = sizes
        # The method whose server rule the step applies, and the server optimiser whose
        # state `ServerState` holds.
        self.algorithm: Algorithm = self.hparams.method
        self.optimizer: ServerOptimizer = self.hparams.optimizer
        self.privacy: NoPrivacy = self.hparams.mechanism
        self._unseen = self._draw_unseen()
        self._seen = np.setdiff1d(np.arange(self.hparams.n_users), self._unseen)

    @property
    def drawn(self) -> int:
        """Users a round draws: ceil(overcommit * m), over-committed (FedScale's)."""
        hp = self.hparams
        return math.ceil(hp.overcommit * hp.users_per_round - 1e-9)

    def sample(
        self, round_: int, online: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> list[int]:
        """The users round k aggregates: never an unseen one, only `online` ones (all
        users by default; `online` answers for an array of users at once),
        ceil(overcommit * m) of them (m unless over-committed)."""
        hp = self.hparams
        online = online or (lambda users: np.ones(len(users), dtype=bool))
        rng = numpy_rng(hp.seed, Stream.USER_SAMPLING, round_)
        seen = self._seen
        if hp.sampling == "poisson":
            joins = rng.random(len(seen))
            joined = seen[joins < hp.fraction]
            return joined[online(joined)].tolist()
        if hp.sampling == "uniform":
            pool = np.arange(hp.n_users) if not hp.unseen_count else seen
            return draw_online(rng, pool, self.drawn, online)
        if self.sizes is None:
            raise ValueError("sampling: samples needs the users' training sizes")
        pool = seen[online(seen)]
        p = self.sizes[pool] / self.sizes[pool].sum()
        m = min(self.drawn, len(pool))
        return sorted(int(u) for u in rng.choice(pool, m, replace=False, p=p))

    @classmethod
    def validate(cls, cfg: RunConfig) -> None:
        """Raise ConfigError for settings the strategy cannot run, before Ray starts."""
        if cfg.overcommit > 1 and cfg.sampling == "poisson":
            raise ConfigError(
                f"overcommit = {cfg.overcommit:g} over-commits a cohort of m users; "
                f"sampling: poisson has none: use uniform or samples sampling"
            )

    def next_step(self, round_: int, schedule: Schedule, timing: Timing) -> Step:
        """Round k on the simulated clock: it starts when round k-1 ended (`schedule.now`)
        and samples among the users online then; each sampled user that did not drop out
        or straggle (the `dropout` and `stragglers` draws, which stand beside the clock:
        their tasks end at once) starts a task, which arrives, is cut by the deadline or
        is lost offline (:meth:`Timing.task`); the first m to arrive are kept (all of
        them unless over-committed), the rest are late. The round ends when its m-th
        kept task arrives, or when its last task is resolved if fewer than m arrive;
        nobody online: when the first user comes online. The kept users report."""
        now = schedule.now
        users = self.sample(round_, lambda users: timing.online(users, now))
        who = self.participation(round_, users)
        gone = {**dict.fromkeys(who.dropped, "dropped"), **dict.fromkeys(who.late, "late")}
        tasks = []
        for user in users:
            task = timing.task(schedule.new_id(), user, schedule.version, now)
            if user in gone:
                task.outcome, task.end = gone[user], now
            tasks.append(task)
        cohort = len(users) if self.hparams.sampling == "poisson" else self.hparams.users_per_round
        arrived = sorted((t for t in tasks if t.arrives), key=lambda t: (t.end, t.id))
        kept, cut = arrived[:cohort], arrived[cohort:]
        for task in kept:
            task.outcome, task.round = "aggregated", round_
        for task in cut:
            task.outcome = "late"
        if kept and len(kept) == cohort:
            end = kept[-1].end
        elif tasks:
            end = max(t.end for t in tasks)
        else:
            end = min((timing.next_online(int(u), now) for u in self._seen), default=now)
        reporting = sorted(t.user for t in kept)
        trained = self.trained(round_, reporting)
        schedule.now = end if math.isfinite(end) else now
        schedule.advance()
        return Step(
            round_,
            users,
            trained,
            reporting,
            [],  # summed at once: nothing is held
            [],
            [],
            False,
            schedule.now,
            len(users),
            tasks,
            [("dropout", who.dropped), ("straggler", who.late)],
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
        """The state after a step from the sum `total` of its users' models, weighted by
        weights adding up to `weight` (of which `rebased`, those of updates added to the
        current model rather than summed as models); unchanged where nobody reported
        (unless the privacy mechanism releases noise regardless)."""
        if not step.reported and not self.releases_empty:
            return state
        return self.aggregate(step.round, state, total, weight, stats)

    def trained(self, round_: int, reporting: list[int]) -> list[int]:
        """The users round k trains: the reporting ones (`reporting` itself), or every
        user that is not unseen (`trained_users: all`), whose per-user state then moves on
        each round though only the reporting ones reach the server."""
        if self.hparams.trained_users == "sampled":
            return reporting
        return [int(u) for u in self._seen]

    def unseen(self) -> list[int]:
        """The users no round trains (`unseen_users`), drawn once from the seed: evaluated
        like the others, they measure what the method gives a newcomer."""
        return list(self._unseen)

    def _draw_unseen(self) -> list[int]:
        hp = self.hparams
        rng = numpy_rng(hp.seed, Stream.UNSEEN_USERS)
        return sorted(int(u) for u in rng.choice(hp.n_users, hp.unseen_count, replace=False))

    def participation(self, round_: int, users: list[int]) -> Participation:
        """Each sampled user drops out with chance `dropout`, else is cut by the deadline
        with chance `stragglers`; neither kind's update is computed (the server would not
        wait for it)."""
        hp = self.hparams
        if not (hp.dropout or hp.stragglers):
            return Participation(users, [], [])
        draws = numpy_rng(hp.seed, Stream.PARTICIPATION, round_).random((len(users), 2))
        dropped = [u for u, (d, _) in zip(users, draws, strict=True) if d < hp.dropout]
        late = [
            u
            for u, (d, s) in zip(users, draws, strict=True)
            if d >= hp.dropout and s < hp.stragglers
        ]
        gone = set(dropped) | set(late)
        return Participation([u for u in users if u not in gone], dropped, late)

    def weight(self, n_train: int) -> float:
        """A reporting user's weight in the aggregate, from its number of training samples
        (computed on the actor that hosts the user, which alone knows it)."""
        return float(n_train) if self.hparams.aggregation == "samples" else 1.0

    def evaluated(self, round_: int, final: bool) -> list[int]:
        """The users an evaluation after round k scores: everyone, or `eval_users` of them
        drawn uniformly without replacement from the evaluation's own stream (the final
        evaluation scores everyone unless `sample_final_eval`)."""
        hp = self.hparams
        m = hp.users_per_evaluation
        if m >= hp.n_users or (final and not hp.sample_final_eval):
            return list(range(hp.n_users))
        rng = numpy_rng(hp.seed, Stream.EVALUATED_USERS, round_)
        return sorted(int(u) for u in rng.choice(hp.n_users, size=m, replace=False))

    # -- the server's step -------------------------------------------------------------
    @property
    def fixed(self) -> bool:
        """Whether the global model stays w_0 for good (the method's `fixed_server`): no
        round then waits for the one before it."""
        return self.algorithm.fixed_server

    def init(self, template: Params) -> ServerState:
        """The state before round 1, from w_0 as a parameter tree. It also fixes how the
        flat vector reads as that tree for the method's server rule, so a sitting calls
        it once before its first `aggregate`, a resumed one too (whose checkpoint's
        state then replaces the result)."""
        self.layout = FlatParams(template)
        weights = self.layout.flatten(template)
        self.shared = self.algorithm.shared(template)
        self._shared_mask = self.layout.flatten(
            {k: torch.full(v.shape, float(k in self.shared)) for k, v in template.items()}
        ).astype(np.float64)
        return ServerState(weights, self.optimizer.init(weights), privacy=self.privacy.init())

    def aggregate(
        self,
        round_: int,
        state: ServerState,
        total: np.ndarray,
        weight: float,
        stats: Mapping[str, float] | None = None,
    ) -> ServerState:
        """The state after round k from the state before it and the weighted sum
        `total` of the reporting users' models (their weights add up to `weight`;
        `stats`, what the users' postprocessors counted): w_{k+1} from their mean, or
        the privacy mechanism's release (with its noise), then the strategy's
        `postprocess_aggregate`, the method's server rule and the server optimiser's
        step."""
        released, moved = self.privacy.release(
            round_,
            state.weights,
            state.privacy,
            total,
            weight,
            dict(stats or {}),
            self._shared_mask,
        )
        mean = self.postprocess_aggregate(round_, state, released)
        target = self.server_rule(state.weights, mean)
        new, moments = self.optimizer.step(state.weights, target, state.optimizer)
        return dataclasses.replace(
            state,
            weights=np.asarray(new, dtype=np.float32),
            optimizer=moments,
            privacy={**state.privacy, **moved},
        )

    @property
    def releases_empty(self) -> bool:
        """Whether a round none of whose users reported still moves the model (central
        DP's noise is released whoever reports, as its accounting assumes)."""
        return self.privacy.releases_empty

    def epsilon(self, rounds_done: int) -> float:
        """The privacy spent after `rounds_done` rounds, at the mechanism's delta
        (infinite without differential privacy: nothing is guaranteed)."""
        return self.privacy.epsilon(rounds_done)

    def divergence_advice(self) -> str:
        """What to change first when training diverges, before the step sizes: the
        privacy mechanism's noise and clip, where there is one."""
        return self.privacy.divergence_advice()

    def server_rule(self, weights: np.ndarray, aggregate: np.ndarray) -> np.ndarray:
        """The target the server optimiser moves w_k towards: the method's
        `server_update` of the aggregate (Algorithm 1: the aggregate itself, with no
        trip through the parameter tree; pFedMe mixes it with w_k)."""
        if type(self.algorithm).server_update is Algorithm.server_update:
            return aggregate
        layout = self.layout
        mixed = self.algorithm.server_update(layout.unflatten(weights), layout.unflatten(aggregate))
        return layout.flatten(mixed)

    def postprocess_users(self, round_: int, state: ServerState) -> UserPostprocessor | None:
        """The chain each actor applies to round k's reporting users' models before it
        sums them: the strategy's `user_steps` in order, then the privacy mechanism's
        step (clipping, and local DP's noise), last, so that every user's contribution
        to the sum is within the mechanism's bound whatever the strategy's steps do;
        None without any: the sum as it is, at no cost. Not to be overridden (a subclass
        that does is refused): a strategy adds its steps in `user_steps`."""
        mechanism = self.privacy.user_step(round_, state.privacy, self.shared)
        return chain([*self.user_steps(round_, state), mechanism])

    def user_steps(self, round_: int, state: ServerState) -> Sequence[UserPostprocessor]:
        """The strategy's own steps on round k's reporting users' models, on the actors,
        before the privacy mechanism's; none by default."""
        return ()

    def postprocess_aggregate(
        self, round_: int, state: ServerState, aggregate: np.ndarray
    ) -> np.ndarray:
        """The strategy's step on round k's aggregate, on the driver, after the privacy
        mechanism's release (which adds the mechanism's noise, in `release`: whatever a
        step here does to that private release costs no privacy), before the server
        rule; the aggregate as it is by default."""
        return aggregate
