"""The rounds of Algorithm 1 on the driver: who takes part, the server's step, when
to evaluate and checkpoint, and the rows that say what happened.

Each concern has its own object and this loop only orders them: the strategy picks
the users, the :class:`~perfed_ray.runtime.coordinator.Coordinator` carries the work
to the actors and the sums back (the only Ray in a round), the
:class:`~perfed_ray.server.Server` turns the sum into the next model, the writer and
the store keep rows and checkpoints. Fault injection sits with the transport (the
pool, where calls are in flight) and with the files (writer, store), not here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from perfed_ray.config import RunConfig
from perfed_ray.results.writer import RunWriter
from perfed_ray.runtime.checkpoint import Checkpoint, RunStore
from perfed_ray.server import Server
from perfed_ray.strategy import Strategy

if TYPE_CHECKING:  # the transport is given, not made here: this module loads no Ray
    from perfed_ray.runtime.coordinator import Coordinator


class Diverged(RuntimeError):
    """Local training produced NaN or infinite weights or losses."""

    def __init__(self, round_: int, users: list[int]) -> None:
        shown = ", ".join(map(str, users[:10])) + (" ..." if len(users) > 10 else "")
        super().__init__(
            f"training diverged in round {round_}: NaN or infinite weights or "
            f"losses from users {shown} (actors holding them); the global model "
            f"of round {round_ - 1} is the last good one; lower beta or alpha"
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
    """The rounds of one simulation, from round 0 or from a checkpoint, writing rows and
    checkpoints as it goes."""

    def __init__(
        self,
        cfg: RunConfig,
        coordinator: Coordinator,
        weights: np.ndarray,
        strategy: Strategy,
        server: Server,
        writer: RunWriter,
        store: RunStore,
        on_progress: Callable[[Progress], None] | None = None,
        resume_from: Checkpoint | None = None,
        clock: float | None = None,
    ) -> None:
        self.cfg = cfg
        self.coordinator = coordinator
        self.strategy = strategy
        self.server = server
        self.writer = writer
        self.store = store
        self.on_progress = on_progress
        self.weights = weights  # w_0, or the checkpoint's w_k when resuming
        if resume_from is not None:  # the server optimiser's state of that round too
            server.state = dict(resume_from.server)
        self.rounds_done = resume_from.round if resume_from else 0
        self.last_accuracy = resume_from.accuracy if resume_from else None
        self.earlier_seconds = resume_from.wall_seconds if resume_from else 0.0
        self.resumed = resume_from is not None
        self.clock = time.perf_counter() if clock is None else clock  # this sitting's start

    def run_round(self, round_: int) -> dict:
        """One round k: w_{k+1} from the (weighted) mean of the reporting users'
        w_{k+1,tau}."""
        start = time.perf_counter()
        users = self.strategy.sample(round_)
        who = self.strategy.participation(round_, users)
        for kind, gone in (("dropout", who.dropped), ("straggler", who.late)):
            if gone:
                self.writer.add(
                    "events",
                    [{"round": round_, "kind": kind, "actor": None, "users": gone, "detail": None}],
                )
        trained = self.strategy.trained(round_, who.reporting)
        sent = time.perf_counter()
        sums = self.coordinator.train(round_, self.weights, who.reporting, trained)
        if sums.diverged:
            raise Diverged(round_, sorted(sums.diverged))
        n = len(who.reporting)
        gathered = time.perf_counter()
        if n:
            self.weights = self.server.next_model(self.weights, sums.total, sums.weight)
        return {
            "round": round_,
            "users": users,
            "n_sampled": len(users),
            "n_reported": n,
            "train_loss": sums.loss_sum / n if n else float("nan"),
            "wall_seconds": time.perf_counter() - start,
            # Where the round's time went: out to the actors and back (the slowest
            # actor's own share of it: its work), then the server's step.
            "train_seconds": gathered - sent,
            "actor_seconds": sums.actor_seconds,
            "server_seconds": time.perf_counter() - gathered,
            "bytes_sent": sums.bytes_sent,
            "bytes_received": sums.bytes_received,
        }

    def evaluate(self, round_: int, final: bool) -> pa.Table:
        """The strategy's users' personalised scores as the columns of the evals table."""
        draws = self.cfg.final_eval_draws if final else 1
        users = self.strategy.evaluated(round_, final)
        table = self.coordinator.evaluate(round_, self.weights, users, draws)
        n = table.num_rows
        unseen = np.isin(table["user"].to_numpy(), np.asarray(self.strategy.unseen()))
        table = table.append_column("round", pa.repeat(pa.scalar(round_, pa.int64()), n))
        table = table.append_column("final", pa.repeat(pa.scalar(final), n))
        table = table.append_column("unseen", pa.array(unseen))
        self.last_accuracy = (round_, float(np.mean(table["acc_after"].to_numpy())))
        return table

    def checkpoint(self, round_: int) -> None:
        """Write the rows so far, then the state after round k that counts them: the
        global model and every user's per-user state, fetched from the actors (for
        methods that keep one: others cost no call)."""
        self.writer.flush()
        states = self.coordinator.user_states(round_) if self.server.stateful else {}
        self.store.save(
            Checkpoint(
                round_,
                self.weights,
                dict(self.writer.rows),
                self.wall_seconds(),
                self.last_accuracy,
                states,
                dict(self.server.state),
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
        for round_ in range(first, cfg.rounds + 1):
            self.writer.add("rounds", [self.run_round(round_)])
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
        return self.weights
