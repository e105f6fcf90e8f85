"""The server of Algorithm 1, on the driver: sample, broadcast, gather, average.

The coordinator sees users only as ids hosted by actors and models only as
flat weight vectors; what a local update computes is the actors' business.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import ray

from perfed_ray.config import RunConfig
from perfed_ray.results.writer import RunWriter
from perfed_ray.runtime.placement import Placement
from perfed_ray.seeding import Stream, numpy_rng


def sample_users(seed: int, round_: int, n_users: int, m: int) -> list[int]:
    """A_k: m users drawn uniformly without replacement, from round k's own stream."""
    rng = numpy_rng(seed, Stream.USER_SAMPLING, round_)
    return sorted(int(u) for u in rng.choice(n_users, size=m, replace=False))


class Diverged(RuntimeError):
    """Local training produced NaN or infinite weights or losses."""

    def __init__(self, round_: int, users: list[int]) -> None:
        shown = ", ".join(map(str, users[:10])) + (" ..." if len(users) > 10 else "")
        super().__init__(f"training diverged in round {round_}: NaN or infinite weights or "
                         f"losses from users {shown} (actors holding them); the global model "
                         f"of round {round_ - 1} is the last good one; lower beta or alpha")
        self.round = round_
        self.users = users


@dataclass(frozen=True)
class Progress:
    """What the coordinator reports after each round."""

    round: int
    rounds: int
    rounds_per_second: float
    accuracy: float | None  # mean personalised accuracy at the last evaluation
    accuracy_round: int | None


class Coordinator:
    """Runs the rounds of one simulation over a fixed set of user actors."""

    def __init__(self, cfg: RunConfig, actors: list[ray.actor.ActorHandle],
                 placement: Placement, weights: np.ndarray, writer: RunWriter,
                 on_progress: Callable[[Progress], None] | None = None) -> None:
        self.cfg = cfg
        self.actors = actors
        self.host_of = placement.host_of
        self.weights = weights
        self.writer = writer
        self.on_progress = on_progress
        self.rounds_done = 0
        self.last_accuracy: tuple[int, float] | None = None

    def run_round(self, round_: int) -> dict:
        """One round k: w_{k+1} = mean of the sampled users' w_{k+1,tau}.

        Actors return the sum of their users' weights; the sums are added as
        they arrive (`ray.wait`), so the driver holds one model's worth of
        partial results however many users or actors there are.
        """
        start = time.perf_counter()
        users = sample_users(self.cfg.seed, round_, self.cfg.n_users, self.cfg.users_per_round)
        by_actor: dict[int, list[int]] = {}
        for u in users:
            by_actor.setdefault(self.host_of[u], []).append(u)
        ref = ray.put(self.weights)
        pending = [self.actors[a].train.remote(ref, us, round_) for a, us in by_actor.items()]
        calls = len(pending)
        total = np.zeros(self.weights.shape, dtype=np.float64)
        loss_sum, received, diverged = 0.0, 0, []
        users_of = dict(zip(pending, by_actor.values(), strict=True))
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            part = ray.get(done[0])
            if not (np.isfinite(part.total).all() and np.isfinite(part.loss_sum)):
                diverged += users_of[done[0]]
            total += part.total
            loss_sum += part.loss_sum
            received += part.total.nbytes
        if diverged:
            raise Diverged(round_, sorted(diverged))
        self.weights = (total / len(users)).astype(np.float32)
        return {
            "round": round_,
            "users": users,
            "n_sampled": len(users),
            "train_loss": loss_sum / len(users),
            "wall_seconds": time.perf_counter() - start,
            "bytes_sent": self.weights.nbytes * calls,
            "bytes_received": received,
        }

    def evaluate(self, round_: int, final: bool) -> list[dict]:
        """Every user's personalised scores, computed on the actor that hosts it."""
        draws = self.cfg.final_eval_draws if final else 1
        ref = ray.put(self.weights)
        rows = [row for batch in ray.get([a.evaluate.remote(ref, round_, draws)
                                          for a in self.actors]) for row in batch]
        for row in rows:
            row.update(round=round_, final=final)
        self.last_accuracy = (round_, float(np.mean([r["acc_after"] for r in rows])))
        return rows

    def run(self) -> np.ndarray:
        """All rounds, with evaluations at round 0, every eval_every rounds and at the end;
        rows are flushed to Parquet at each evaluation."""
        cfg = self.cfg
        self.writer.add("evals", self.evaluate(0, final=False))
        self.writer.flush()
        start = time.perf_counter()
        for round_ in range(1, cfg.rounds + 1):
            self.writer.add("rounds", [self.run_round(round_)])
            self.rounds_done = round_
            final = round_ == cfg.rounds
            if final or round_ % cfg.eval_every == 0:
                self.writer.add("evals", self.evaluate(round_, final))
                self.writer.flush()
            if self.on_progress:
                acc_round, acc = self.last_accuracy or (None, None)
                rate = round_ / max(time.perf_counter() - start, 1e-9)
                self.on_progress(Progress(round_, cfg.rounds, rate, acc, acc_round))
        return self.weights
