"""The server's steps on the driver, as one event-driven loop: what each step runs,
the server's step, when to evaluate and checkpoint, and the rows that say what
happened.

Each concern has its own object and this loop only orders them: the
:class:`~perfed_ray.strategy.Strategy` makes every server-side decision (it moves the
simulated clock through its :class:`~perfed_ray.clock.Schedule` to its next step and
says which users train and which updates are summed, the step on each user's model,
the next :class:`~perfed_ray.strategy.ServerState`, its own metrics), the
:class:`~perfed_ray.runtime.coordinator.Coordinator` carries the work to the actors
and the sums back (the only Ray in a step), the writer and the store keep rows and
checkpoints. A synchronous round is the step whose tasks all start and end within it;
an asynchronous server's step sums updates its actors have held since the step that
trained them. Steps whose composition does not depend on the model (a server's model
that never moves, `fixed_server`) go to the actors several in a call (a span).
Fault injection sits with the transport (the pool, where calls are in flight) and with
the files (writer, store), not here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from perfed_ray.clock import Schedule, Timing
from perfed_ray.config import RunConfig
from perfed_ray.results.writer import RunWriter
from perfed_ray.runtime.checkpoint import Checkpoint, RunStore
from perfed_ray.strategy import ServerState, Step, Strategy

if TYPE_CHECKING:  # the transport is given, not made here: this module loads no Ray
    from perfed_ray.runtime.coordinator import Coordinator, Sums
    from perfed_ray.runtime.messages import Batch


# A fixed server's rounds go to the actors in spans of about this many seconds, holding
# at most SPAN_BYTES of per-round sums (a float64 model each) on the driver.
SPAN_SECONDS = 1.0
SPAN_BYTES = 2**26


def span_of(cfg: RunConfig, round_: int, length: int) -> list[int]:
    """Up to `length` rounds from round k, ending at the next evaluation or checkpoint
    (which need the users' states of that round) or the last round."""
    evaluation = max(round_, cfg.eval_from)
    ends = (
        round_ + length - 1,
        cfg.rounds,
        -(-round_ // cfg.checkpoint_every) * cfg.checkpoint_every,
        -(-evaluation // cfg.eval_every) * cfg.eval_every,
    )
    return list(range(round_, min(ends) + 1))


class Diverged(RuntimeError):
    """Local training produced NaN or infinite weights or losses."""

    def __init__(self, round_: int, users: list[int], first: str = "") -> None:
        shown = ", ".join(map(str, users[:10])) + (" ..." if len(users) > 10 else "")
        super().__init__(
            f"training diverged in round {round_}: NaN or infinite weights or "
            f"losses from users {shown} (actors holding them); the global model "
            f"of round {round_ - 1} is the last good one; {first}lower beta or alpha"
        )
        self.round = round_
        self.users = users


class Stopped(Exception):
    """Raised by a progress callback to end the run early on its runner's decision (a
    sweep's scheduler stopping a trial that does poorly): the run is marked `stopped`,
    not `interrupted`, so the runs table says why it ended."""


@dataclass(frozen=True)
class Progress:
    """What the coordinator reports after each round (to a callback, which may raise
    :class:`Stopped` or KeyboardInterrupt to end the run there)."""

    round: int
    rounds: int
    rounds_per_second: float
    accuracy: float | None  # mean personalised accuracy at the last evaluation
    accuracy_round: int | None


class Rounds:
    """The steps of one simulation, from step 0 (the strategy's `initial` state, the
    clock at 0) or from a checkpoint (its state, clock, queue and held updates),
    writing rows and checkpoints as it goes. `timing` gives the tasks their lengths;
    `batch` makes the transport's description of a step's work (the coordinator's
    :class:`~perfed_ray.runtime.coordinator.Batch`, given so that this module loads no
    Ray)."""

    def __init__(
        self,
        cfg: RunConfig,
        coordinator: Coordinator,
        strategy: Strategy,
        initial: ServerState,
        writer: RunWriter,
        store: RunStore,
        timing: Timing,
        batch: type[Batch],
        on_progress: Callable[[Progress], None] | None = None,
        resume_from: Checkpoint | None = None,
        clock: float | None = None,
    ) -> None:
        self.cfg = cfg
        self.coordinator = coordinator
        self.strategy = strategy
        self.writer = writer
        self.store = store
        self.timing = timing
        self.batch = batch
        self.on_progress = on_progress
        self.state = resume_from.server if resume_from else initial
        self.rounds_done = resume_from.round if resume_from else 0
        self.last_accuracy = resume_from.accuracy if resume_from else None
        self.earlier_seconds = resume_from.wall_seconds if resume_from else 0.0
        self.resume_from = resume_from
        saved = resume_from.schedule if resume_from else None
        # A checkpoint older than the simulated clock resumes its clock at 0.
        self.schedule = Schedule.from_json(saved) if saved else Schedule(version=self.rounds_done)
        self.clock = time.perf_counter() if clock is None else clock  # this sitting's start
        self.span_length = 1  # rounds a call (fixed_server), measured as the run goes

    def _record(self, step: Step) -> None:
        """A step's dropouts and stragglers to the events table, its ended tasks to the
        tasks table."""
        for kind, gone in step.events:
            if gone:
                self.writer.add(
                    "events",
                    [
                        {
                            "round": step.round,
                            "kind": kind,
                            "actor": None,
                            "users": gone,
                            "detail": None,
                        }
                    ],
                )
        if step.resolved:
            self.writer.add("tasks", [t.row() for t in step.resolved])

    def _work(self, step: Step) -> Batch:
        held = step.reporting is None
        return self.batch(
            step.round,
            step.trained,
            step.tasks if held else None,
            step.reporting,
            step.summed,
            step.discard,
            step.rebase,
            self.strategy.postprocess_users(step.round, self.state),
        )

    def _step(self, step: Step, sums: Sums) -> None:
        """The server's step: the strategy's, from the sum of the step's updates."""
        if sums.diverged:
            raise Diverged(step.round, sorted(sums.diverged), self.strategy.divergence_advice())
        before = self.state.weights
        self.state = self.strategy.server_step(
            step, self.state, sums.total, sums.weight, sums.rebased, sums.stats
        )
        if self.strategy.fixed and not np.array_equal(before, self.state.weights):
            raise RuntimeError(
                f"{self.cfg.algorithm} declares fixed_server, but its server's model "
                f"moved in round {step.round}"
            )

    def run_steps(self, span: list[int]) -> Iterator[dict]:
        """Steps whose work goes to each actor in one call (several only where the
        server's model never moves), each step's row as it would have been alone; the
        call's time is shared out evenly among its steps."""
        start = time.perf_counter()
        steps = [self.strategy.next_step(r, self.schedule, self.timing) for r in span]
        for step in steps:
            self._record(step)
        batches = [self._work(step) for step in steps]
        sent = time.perf_counter()
        all_sums = self.coordinator.run(self.state.weights, batches)
        back = time.perf_counter()
        share, train = (back - start) / len(span), (back - sent) / len(span)
        for step, sums in zip(steps, all_sums, strict=True):
            gathered = time.perf_counter()
            self._step(step, sums)
            server = time.perf_counter() - gathered
            yield self._row(step, sums, share + server, train, server)

    def _row(self, step: Step, sums: Sums, wall: float, train: float, server: float) -> dict:
        """Step k's row: `wall` its seconds, `train` those out to the actors and back,
        `server` those of the server's step; then the strategy's own metrics."""
        n = step.reported
        return {
            "round": step.round,
            "users": step.users,
            "n_sampled": step.dispatched,
            "n_reported": n,
            "train_loss": sums.loss_sum / n if n else float("nan"),
            "wall_seconds": wall,
            # Where the round's time went: out to the actors and back (the slowest
            # actor's own share of it: its work), then the server's step.
            "train_seconds": train,
            "actor_seconds": sums.actor_seconds,
            "server_seconds": server,
            "bytes_sent": sums.bytes_sent,
            "bytes_received": sums.bytes_received,
            "epsilon": self.strategy.epsilon(step.round),
            "sim_time": step.time,
            **step.metrics,
        }

    def _span(self, round_: int) -> list[int]:
        """The rounds that go in one call from round k: k alone, unless the server's model
        never moves."""
        return span_of(self.cfg, round_, self.span_length) if self.strategy.fixed else [round_]

    def _resize(self, span: list[int], seconds: float) -> None:
        """The next span's length, from this one's rounds' seconds (evaluations and
        checkpoints aside): about SPAN_SECONDS (progress and Ctrl-C stay prompt), at
        most SPAN_BYTES of per-round sums."""
        most = max(1, SPAN_BYTES // (8 * self.state.weights.size))
        per_round = max(seconds / len(span), 1e-9)
        self.span_length = max(1, min(most, int(SPAN_SECONDS / per_round)))

    def evaluate(self, round_: int, final: bool) -> pa.Table:
        """The strategy's users' personalised scores as the columns of the evals table."""
        draws = self.cfg.final_eval_draws if final else 1
        users = self.strategy.evaluated(round_, final)
        table = self.coordinator.evaluate(round_, self.state.weights, users, draws)
        n = table.num_rows
        unseen = np.isin(table["user"].to_numpy(), np.asarray(self.strategy.unseen()))
        table = table.append_column("round", pa.repeat(pa.scalar(round_, pa.int64()), n))
        table = table.append_column("final", pa.repeat(pa.scalar(final), n))
        table = table.append_column("unseen", pa.array(unseen))
        table = table.append_column("sim_time", pa.repeat(pa.scalar(self.schedule.now), n))
        self.last_accuracy = (round_, float(np.mean(table["acc_after"].to_numpy())))
        return table

    def checkpoint(self, round_: int) -> None:
        """Write the rows so far, then the state after round k that counts them: the
        server's whole state, the clock and its queue, the updates the actors hold, and
        every user's per-user state, fetched from the actors (for methods that keep one:
        others cost no call)."""
        self.writer.flush()
        held, bases = self.coordinator.held(round_)
        self.store.save(
            Checkpoint(
                round_,
                self.state,
                dict(self.writer.rows),
                self.wall_seconds(),
                self.last_accuracy,
                self.coordinator.user_states(round_),
                self.schedule.to_json(),
                held,
                bases,
            )
        )

    def wall_seconds(self) -> float:
        """Seconds spent on this run, over all sittings up to their last checkpoint."""
        return self.earlier_seconds + time.perf_counter() - self.clock

    def run(self) -> np.ndarray:
        """The remaining rounds, with evaluations at round 0, every eval_every rounds from
        eval_from on and at the end, and checkpoints at round 0, every checkpoint_every
        rounds and at the end; rows are written at each evaluation and checkpoint."""
        cfg = self.cfg
        if self.resume_from is None:
            self.writer.add("evals", self.evaluate(0, final=False))
            self.checkpoint(0)
        elif self.resume_from.held:
            self.coordinator.hold(self.resume_from.held, self.resume_from.bases)
        first, loop_start = self.rounds_done + 1, time.perf_counter()
        while self.rounds_done < cfg.rounds:
            span, seconds = self._span(self.rounds_done + 1), 0.0
            for round_, row in zip(span, self.run_steps(span), strict=True):
                self.writer.add("rounds", [row])
                seconds += row["wall_seconds"]
                self.rounds_done = round_
                final = round_ == cfg.rounds
                evaluated = final or (round_ >= cfg.eval_from and round_ % cfg.eval_every == 0)
                if final and self.schedule.pending():  # still in flight as the run ends
                    self.writer.add("tasks", [t.row() for t in self.schedule.pending()])
                if evaluated:
                    self.writer.add("evals", self.evaluate(round_, final))
                if final or round_ % cfg.checkpoint_every == 0:
                    self.checkpoint(round_)
                elif evaluated:
                    self.writer.flush()
                if self.on_progress:
                    acc_round, acc = self.last_accuracy or (None, None)
                    rate = (round_ - first + 1) / max(time.perf_counter() - loop_start, 1e-9)
                    self.on_progress(Progress(round_, cfg.rounds, rate, acc, acc_round))
            self._resize(span, seconds)
        return self.state.weights
