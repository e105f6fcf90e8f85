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
    """Algorithm 1's policy: m = round(r n) users without replacement, uniformly
    (`sampling: uniform`) or in proportion to their training samples (`sampling:
    samples`, as Ditto's and FedProx's authors draw them: numpy's `choice` with p the
    users' shares of all samples), aggregated by their plain mean (`aggregation: mean`)
    or weighted by their training samples (`aggregation: samples`); the sampled users
    train, or every user does (`trained_users: all`); every user evaluated, or a
    sample of them (`eval_users`). Registered as `uniform`.

    `sizes` are the users' training-sample counts, known on the driver (needed for
    `sampling: samples` alone)."""

    def __init__(self, cfg: RunConfig, sizes: np.ndarray | None = None) -> None:
        self.cfg = cfg
        self.sizes = sizes
        self._unseen = self._draw_unseen()
        self._seen = np.setdiff1d(np.arange(cfg.n_users), self._unseen)

    def sample(self, round_: int) -> list[int]:
        """The users round k aggregates: never an unseen one."""
        cfg = self.cfg
        if cfg.sampling == "uniform" and not cfg.unseen_count:
            return sample_users(cfg.seed, round_, cfg.n_users, cfg.users_per_round)
        seen = self._seen
        p = None
        if cfg.sampling == "samples":
            if self.sizes is None:
                raise ValueError("sampling: samples needs the users' training sizes")
            p = self.sizes[seen] / self.sizes[seen].sum()
        rng = numpy_rng(cfg.seed, Stream.USER_SAMPLING, round_)
        return sorted(int(u) for u in rng.choice(seen, cfg.users_per_round, replace=False, p=p))

    def trained(self, round_: int, reporting: list[int]) -> list[int]:
        """The users round k trains: the reporting ones (`reporting` itself), or every
        user that is not unseen (`trained_users: all`), whose per-user state then moves on
        each round though only the reporting ones reach the server."""
        if self.cfg.trained_users == "sampled":
            return reporting
        return [int(u) for u in self._seen]

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
