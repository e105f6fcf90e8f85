"""The rounds of Algorithm 1 on the driver: who takes part, the server's step, when
to evaluate and checkpoint, and the rows that say what happened.

Each concern has its own object and this loop only orders them: the
:class:`~perfed_ray.strategy.Strategy` makes every server-side decision (the users,
the step on each user's model, the next :class:`~perfed_ray.strategy.ServerState`),
the :class:`~perfed_ray.runtime.coordinator.Coordinator` carries the work to the
actors and the sums back (the only Ray in a round), the writer and the store keep
rows and checkpoints. Fault injection sits with the transport (the
pool, where calls are in flight) and with the files (writer, store), not here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from perfed_ray.config import RunConfig
from perfed_ray.results.writer import RunWriter
from perfed_ray.runtime.checkpoint import Checkpoint, RunStore
from perfed_ray.strategy import RoundPlan, ServerState, Strategy

if TYPE_CHECKING:  # the transport is given, not made here: this module loads no Ray
    from perfed_ray.runtime.coordinator import Coordinator, Sums


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
    """The rounds of one simulation, from round 0 (the strategy's `initial` state) or
    from a checkpoint (its state), writing rows and checkpoints as it goes."""

    def __init__(
        self,
        cfg: RunConfig,
        coordinator: Coordinator,
        strategy: Strategy,
        initial: ServerState,
        writer: RunWriter,
        store: RunStore,
        on_progress: Callable[[Progress], None] | None = None,
        resume_from: Checkpoint | None = None,
        clock: float | None = None,
    ) -> None:
        self.cfg = cfg
        self.coordinator = coordinator
        self.strategy = strategy
        self.writer = writer
        self.store = store
        self.on_progress = on_progress
        self.state = resume_from.server if resume_from else initial
        self.rounds_done = resume_from.round if resume_from else 0
        self.last_accuracy = resume_from.accuracy if resume_from else None
        self.earlier_seconds = resume_from.wall_seconds if resume_from else 0.0
        self.resumed = resume_from is not None
        self.clock = time.perf_counter() if clock is None else clock  # this sitting's start
        self.span_length = 1  # rounds a call (fixed_server), measured as the run goes

    def _plan(self, round_: int) -> RoundPlan:
        """Round k's users as the strategy plans them; dropouts and stragglers go to the
        events table."""
        plan = self.strategy.plan(round_)
        for kind, gone in (("dropout", plan.dropped), ("straggler", plan.late)):
            if gone:
                self.writer.add(
                    "events",
                    [{"round": round_, "kind": kind, "actor": None, "users": gone, "detail": None}],
                )
        return plan

    def _row(self, round_: int, plan: RoundPlan, sums: Sums, start: float, train: float) -> dict:
        """The strategy's state after round k from the reporting users' sum, and round
        k's row: `start` is when its clock started, `train` its seconds out to the
        actors and back."""
        if sums.diverged:
            raise Diverged(round_, sorted(sums.diverged), self.strategy.divergence_advice())
        n = len(plan.reporting)
        gathered = time.perf_counter()
        if n or self.strategy.releases_empty:
            before = self.state.weights
            self.state = self.strategy.aggregate(
                round_, self.state, sums.total, sums.weight, stats=sums.stats
            )
            if self.strategy.fixed and not np.array_equal(before, self.state.weights):
                raise RuntimeError(
                    f"{self.cfg.algorithm} declares fixed_server, but its server's model "
                    f"moved in round {round_}"
                )
        ended = time.perf_counter()  # one reading, so that the parts fit inside the round
        return {
            "round": round_,
            "users": plan.sampled,
            "n_sampled": len(plan.sampled),
            "n_reported": n,
            "train_loss": sums.loss_sum / n if n else float("nan"),
            "wall_seconds": ended - start,
            # Where the round's time went: out to the actors and back (the slowest
            # actor's own share of it: its work), then the server's step.
            "train_seconds": train,
            "actor_seconds": sums.actor_seconds,
            "server_seconds": ended - gathered,
            "bytes_sent": sums.bytes_sent,
            "bytes_received": sums.bytes_received,
            "epsilon": self.strategy.epsilon(round_),
        }

    def run_round(self, round_: int) -> dict:
        """One round k: its users' work in one call per actor, then the server's step."""
        start = time.perf_counter()
        plan = self._plan(round_)
        postprocess = self.strategy.postprocess_users(round_, self.state)
        sent = time.perf_counter()
        sums = self.coordinator.train(
            round_, self.state.weights, plan.reporting, plan.trained, postprocess
        )
        return self._row(round_, plan, sums, start, time.perf_counter() - sent)

    def run_span(self, span: list[int]) -> Iterator[dict]:
        """Rounds whose work went to each actor in one call (a server's model that never
        moves, `fixed_server`), each round's row as it would have been alone; the
        span's time is shared out evenly among its rounds."""
        start = time.perf_counter()
        plans = [self._plan(r) for r in span]
        work = [
            (r, p.reporting, p.trained, self.strategy.postprocess_users(r, self.state))
            for r, p in zip(span, plans, strict=True)
        ]
        sent = time.perf_counter()
        all_sums = self.coordinator.train_rounds(self.state.weights, work)
        share, train = (time.perf_counter() - start) / len(span), (time.perf_counter() - sent)
        for r, plan, sums in zip(span, plans, all_sums, strict=True):
            row = self._row(r, plan, sums, time.perf_counter(), train / len(span))
            yield {**row, "wall_seconds": share + row["wall_seconds"]}

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
        self.last_accuracy = (round_, float(np.mean(table["acc_after"].to_numpy())))
        return table

    def checkpoint(self, round_: int) -> None:
        """Write the rows so far, then the state after round k that counts them: the
        server's whole state and every user's per-user state, fetched from the actors
        (for methods that keep one: others cost no call)."""
        self.writer.flush()
        self.store.save(
            Checkpoint(
                round_,
                self.state,
                dict(self.writer.rows),
                self.wall_seconds(),
                self.last_accuracy,
                self.coordinator.user_states(round_),
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
        if not self.resumed:
            self.writer.add("evals", self.evaluate(0, final=False))
            self.checkpoint(0)
        first, loop_start = self.rounds_done + 1, time.perf_counter()
        while self.rounds_done < cfg.rounds:
            span, seconds = self._span(self.rounds_done + 1), 0.0
            rows = self.run_span(span) if len(span) > 1 else [self.run_round(span[0])]
            for round_, row in zip(span, rows, strict=True):
                self.writer.add("rounds", [row])
                seconds += row["wall_seconds"]
                self.rounds_done = round_
                final = round_ == cfg.rounds
                evaluated = final or (round_ >= cfg.eval_from and round_ % cfg.eval_every == 0)
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
