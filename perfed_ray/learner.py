"""A user's side of the protocol: local training and personalised evaluation.

This is where the pure rules of :mod:`perfed_ray.algorithms` meet a user's
shard and random stream; it knows nothing about Ray, so the same object
runs inside an actor, in a test, or in a plain loop over users.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from perfed_ray.algorithms import (
    RULES,
    Batch,
    Params,
    StepSizes,
    adapt,
    local_update,
    local_update_many,
)
from perfed_ray.config import RunConfig
from perfed_ray.data import Shard
from perfed_ray.models import cross_entropy_loss, predict
from perfed_ray.seeding import Stream, torch_generator


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


class LocalLearner:
    """Runs Algorithm 1's inner loop and the one-step-adapted evaluation for any user."""

    def __init__(self, cfg: RunConfig, model: nn.Module) -> None:
        self.cfg = cfg
        self.model = model
        self.rule = RULES[cfg.algorithm]
        self.loss = cross_entropy_loss(model)
        self.steps = StepSizes(cfg.alpha, cfg.beta, cfg.delta, cfg.hf_delta == "normalized")

    def _indices(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """One batch of indices, drawn uniformly without replacement from range(n)."""
        return torch.randperm(n, generator=gen)[: self.cfg.batch_size]

    def _batch(self, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> Batch:
        idx = self._indices(len(y), gen).to(y.device)
        return x[idx], y[idx]

    def local_batches(self, shard: Shard, round_: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh D, D', D'' for each of the tau steps of a round: x [tau, 3, B, ...]."""
        gen = torch_generator(self.cfg.seed, Stream.LOCAL_TRAINING, shard.user, round_)
        idx = torch.stack([self._indices(len(shard.y_train), gen)
                           for _ in range(3 * self.cfg.tau)])
        idx = idx.view(self.cfg.tau, 3, -1).to(shard.y_train.device)
        return shard.x_train[idx], shard.y_train[idx]

    def train(self, params: Params, shard: Shard, round_: int) -> tuple[Params, float]:
        """tau local steps from the global model, each with fresh D, D', D''."""
        x, y = self.local_batches(shard, round_)
        params, loss = local_update(self.rule, self.loss, params, x, y, self.steps)
        return params, float(loss)

    def train_many(self, params: Params, shards: list[Shard],
                   round_: int) -> tuple[Params, torch.Tensor]:
        """:meth:`train` for several users in one vectorised pass (the same draws);
        parameters come back stacked along a leading user axis."""
        batches = [self.local_batches(shard, round_) for shard in shards]
        x = torch.stack([b[0] for b in batches])
        y = torch.stack([b[1] for b in batches])
        return local_update_many(self.rule, self.loss, params, x, y, self.steps)

    def _score(self, params: Params, shard: Shard) -> tuple[float, float]:
        logits = predict(self.model, params, shard.x_test)
        loss = nn.functional.cross_entropy(logits, shard.y_test)
        accuracy = (logits.argmax(dim=1) == shard.y_test).float().mean()
        return float(accuracy), float(loss)

    def evaluate(self, params: Params, shard: Shard, round_: int,
                 draws: int) -> list[Evaluation]:
        """Accuracy on the whole test shard before and after ONE SGD step of size
        alpha on a batch from the user's own data, once per independent draw."""
        acc_before, loss_before = self._score(params, shard)
        source = (shard.x_test, shard.y_test) if self.cfg.adapt_on == "test" else (
            shard.x_train, shard.y_train)
        rows = []
        for draw in range(draws):
            gen = torch_generator(self.cfg.seed, Stream.EVALUATION, shard.user, round_, draw)
            adapted = adapt(self.loss, params, self._batch(*source, gen), self.cfg.alpha)
            acc_after, loss_after = self._score(adapted, shard)
            rows.append(Evaluation(shard.user, shard.group, draw, len(shard.y_train),
                                   len(shard.y_test), acc_before, loss_before, acc_after,
                                   loss_after))
        return rows
