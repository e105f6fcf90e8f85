"""The server's policy (in the spirit of Flower's `Strategy`): which users a round
samples, how their models are weighted in the aggregate, and which users an
evaluation scores. A researcher changes the policy by subclassing
:class:`Strategy` and naming the class in the configuration (`strategy:
mypkg.policies:Mine`); the coordinator keeps the transport (object store,
`ray.wait`, the actors, checkpoints, rows).

Every draw comes from a stream keyed by the round (:mod:`perfed_ray.seeding`), so a
resumed or replayed round samples the same users.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfed_ray.config import RunConfig
from perfed_ray.seeding import Stream, numpy_rng


def sample_users(seed: int, round_: int, n_users: int, m: int) -> list[int]:
    """A_k: m users drawn uniformly without replacement, from round k's own stream."""
    rng = numpy_rng(seed, Stream.USER_SAMPLING, round_)
    return sorted(int(u) for u in rng.choice(n_users, size=m, replace=False))


@dataclass(frozen=True)
class Participation:
    """Who of round k's sampled users reports, drops out, or reports past the deadline."""

    reporting: list[int]
    dropped: list[int]
    late: list[int]


class Strategy:
    """Algorithm 1's policy: m = round(r n) users uniformly without replacement,
    aggregated by their plain mean (`aggregation: mean`) or weighted by their training
    samples (`aggregation: samples`), every user evaluated, or a sample of them
    (`eval_users`). Registered as `uniform`."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self._unseen = self._draw_unseen()

    def sample(self, round_: int) -> list[int]:
        """The users round k trains: never an unseen one."""
        cfg = self.cfg
        if not cfg.unseen_count:
            return sample_users(cfg.seed, round_, cfg.n_users, cfg.users_per_round)
        seen = np.setdiff1d(np.arange(cfg.n_users), self._unseen)
        rng = numpy_rng(cfg.seed, Stream.USER_SAMPLING, round_)
        return sorted(int(u) for u in rng.choice(seen, size=cfg.users_per_round, replace=False))

    def unseen(self) -> list[int]:
        """The users no round trains (`unseen_users`), drawn once from the seed: evaluated
        like the others, they measure what the method gives a newcomer."""
        return list(self._unseen)

    def _draw_unseen(self) -> list[int]:
        cfg = self.cfg
        rng = numpy_rng(cfg.seed, Stream.UNSEEN_USERS)
        return sorted(int(u) for u in rng.choice(cfg.n_users, cfg.unseen_count, replace=False))

    def participation(self, round_: int, users: list[int]) -> Participation:
        """Each sampled user drops out with chance `dropout`, else is cut by the deadline
        with chance `stragglers`; neither kind's update is computed (the server would not
        wait for it)."""
        cfg = self.cfg
        if not (cfg.dropout or cfg.stragglers):
            return Participation(users, [], [])
        draws = numpy_rng(cfg.seed, Stream.PARTICIPATION, round_).random((len(users), 2))
        dropped = [u for u, (d, _) in zip(users, draws, strict=True) if d < cfg.dropout]
        late = [
            u
            for u, (d, s) in zip(users, draws, strict=True)
            if d >= cfg.dropout and s < cfg.stragglers
        ]
        gone = set(dropped) | set(late)
        return Participation([u for u in users if u not in gone], dropped, late)

    def weight(self, n_train: int) -> float:
        """A reporting user's weight in the aggregate, from its number of training samples
        (computed on the actor that hosts the user, which alone knows it)."""
        return float(n_train) if self.cfg.aggregation == "samples" else 1.0

    def evaluated(self, round_: int, final: bool) -> list[int]:
        """The users an evaluation after round k scores: everyone, or `eval_users` of them
        drawn uniformly without replacement from the evaluation's own stream (the final
        evaluation scores everyone unless `sample_final_eval`)."""
        cfg = self.cfg
        m = cfg.users_per_evaluation
        if m >= cfg.n_users or (final and not cfg.sample_final_eval):
            return list(range(cfg.n_users))
        rng = numpy_rng(cfg.seed, Stream.EVALUATED_USERS, round_)
        return sorted(int(u) for u in rng.choice(cfg.n_users, size=m, replace=False))
