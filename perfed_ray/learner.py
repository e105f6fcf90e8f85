"""The users an actor hosts, and their side of every round: local training through an
engine, per-user state, and personalised evaluation (PROTOCOL.md).

This is where an algorithm meets users' shards and random streams; it knows nothing
about Ray, so the same object runs inside an actor, in a test, or in a plain loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from perfed_ray.algorithms.base import Algorithm
from perfed_ray.algorithms.tree import Params
from perfed_ray.config import RunConfig
from perfed_ray.data import Shard
from perfed_ray.data.batches import evaluation_indices, gather, round_indices
from perfed_ray.engines import make_engine
from perfed_ray.engines.base import stack, unstack
from perfed_ray.engines.functional import FunctionalOps
from perfed_ray.models import FlatParams
from perfed_ray.registry import ALGORITHMS


@dataclass(frozen=True)
class Evaluation:
    """One user's scores at one evaluation and adaptation draw (PROTOCOL.md, Evaluation)."""

    user: int
    group: str
    draw: int
    n_train: int
    n_test: int
    acc_before: float
    loss_before: float
    acc_after: float
    loss_after: float
    acc_steps: list[float]  # after 0, 1, ..., personalise_steps steps
    loss_steps: list[float]


class Learner:
    """Local training and evaluation of the users whose shards it holds.

    `states` holds each user's per-user state (for methods that keep one), created
    the first time the user needs it and kept until the run ends; it is what a
    checkpoint saves (:meth:`state_vectors`) and a resumed run starts from."""

    def __init__(
        self,
        cfg: RunConfig,
        model: nn.Module,
        shards: dict[int, Shard],
        states: dict[int, np.ndarray] | None = None,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.shards = shards
        self.algorithm: Algorithm = ALGORITHMS.load(cfg.algorithm)(cfg)
        self.engine = make_engine(cfg.engine, self.algorithm, model, bool(cfg.compile))
        self.ops = FunctionalOps(model)
        self.device = next(model.parameters()).device
        self.states: dict[int, Params] = {}
        self.state_layout: FlatParams | None = None
        self.saved_states = states or {}

    def _state(self, user: int, server: Params, keep: bool = True) -> Params | None:
        """The user's state: kept, restored from a checkpoint, or the method's initial
        one (kept from the user's first round on; evaluation only looks at it)."""
        if user in self.states:
            return self.states[user]
        initial = self.algorithm.init_user_state(server)
        if initial is None:
            return None
        self.state_layout = self.state_layout or FlatParams(initial)
        saved = self.saved_states.pop(user, None) if keep else self.saved_states.get(user)
        state = initial if saved is None else self.state_layout.unflatten(saved, self.device)
        if keep:
            self.states[user] = state
        return state

    def _indices(self, user: int, round_: int) -> torch.Tensor:
        algorithm = self.algorithm
        return round_indices(
            self.cfg.seed,
            user,
            round_,
            len(self.shards[user].y_train),
            self.cfg.tau,
            algorithm.batches_per_step,
            self.cfg.batch_size,
            algorithm.draws_per_step,
        )

    def block_batches(self, users: list[int], round_: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh batches for each of the tau steps of a round, for several users, stacked:
        x [U, tau, per_step, B, ...], gathered straight into place."""
        first = self.shards[users[0]]
        idx = [self._indices(u, round_) for u in users]
        x = torch.empty(
            len(users),
            *idx[0].shape,
            *first.x_train.shape[1:],
            dtype=first.x_train.dtype,
            device=self.device,
        )
        y = torch.empty(len(users), *idx[0].shape, dtype=first.y_train.dtype, device=self.device)
        for i, (u, index) in enumerate(zip(users, idx, strict=True)):
            gather(self.shards[u].x_train, index, out=x[i])
            gather(self.shards[u].y_train, index, out=y[i])
        return x, y

    def train(self, server: Params, users: list[int], round_: int) -> tuple[Params, torch.Tensor]:
        """Round k's local work of the given users from the server's model: their models
        stacked along a leading axis and their mean training losses; their states move
        on to the next round."""
        x, y = self.block_batches(users, round_)
        states = stack([self._state(u, server) for u in users])
        models, losses, new_states = self.engine.run(server, x, y, states)
        if new_states is not None:
            self.states.update(zip(users, unstack(new_states, len(users)), strict=True))
        return models, losses

    def n_train(self, user: int) -> int:
        return len(self.shards[user].y_train)

    def state_vectors(self) -> dict[int, np.ndarray]:
        """Every hosted user's state as a flat vector (restored ones not yet used
        included), for a checkpoint."""
        kept = {u: self.state_layout.flatten(s) for u, s in self.states.items()}
        return {**self.saved_states, **kept}

    def _score(self, params: Params, shard: Shard) -> tuple[float, float]:
        logits = self.ops.logits(params, shard.x_test)
        loss = nn.functional.cross_entropy(logits, shard.y_test)
        accuracy = (logits.argmax(dim=1) == shard.y_test).float().mean()
        return float(accuracy), float(loss)

    def evaluate(self, server: Params, user: int, round_: int, draws: int) -> list[Evaluation]:
        """Accuracy on the whole test shard of the server's model (`acc_before`), and of
        the method's personal model before and after each of `personalise_steps` steps of
        its personalisation (SGD of size alpha from the server's model for Per-FedAvg and
        FedAvg) on fresh batches from the user's own data, once per independent draw. A
        user the method has no state for yet is personalised as a newcomer would be."""
        shard = self.shards[user]
        before = self._score(server, shard)
        x, y = (
            (shard.x_test, shard.y_test)
            if self.cfg.adapt_on == "test"
            else (shard.x_train, shard.y_train)
        )
        state = self._state(user, server, keep=False)
        rows = []
        for draw in range(draws):
            per_step = self.algorithm.personalise_batches
            indices = evaluation_indices(
                self.cfg.seed,
                user,
                round_,
                draw,
                len(y),
                self.cfg.batch_size,
                self.cfg.personalise_steps * per_step,
            )
            personal = self.algorithm.personal_model(self.ops, server, state)
            scores = [before if personal is server else self._score(personal, shard)]
            for step in range(self.cfg.personalise_steps):
                batches = [
                    (gather(x, idx), gather(y, idx))
                    for idx in indices[step * per_step : (step + 1) * per_step]
                ]
                personal = self.algorithm.personalise(self.ops, personal, state, batches)
                scores.append(self._score(personal, shard))
            accs, losses = (list(v) for v in zip(*scores, strict=True))
            rows.append(
                Evaluation(
                    user,
                    shard.group,
                    draw,
                    len(shard.y_train),
                    len(shard.y_test),
                    before[0],
                    before[1],
                    accs[-1],
                    losses[-1],
                    accs,
                    losses,
                )
            )
        return rows
