"""The steps a privacy mechanism takes on each reporting user's update, on the actor
that hosts the user, before the round's sum: clipping to a norm bound, and for local
differential privacy the user's own Gaussian noise.

Only what leaves a user is privatised: the update of the method's shared parameters
(`shared`, :meth:`perfed_ray.algorithms.base.Algorithm.shared`). A personal part (FedRep's
head) never reaches the server under privacy: each user's model carries the server's
value there, so its update is zero and the sum carries nothing of it.

Norms are taken over the whole shared update (`per_layer: false`, McMahan et al. 2018's
flat clipping) or per parameter tensor, each to ``clip / sqrt(L)`` of the L shared
tensors, so that the whole update's norm stays within `clip` either way (their
per-layer clipping with equal bounds).

The updates are taken, scaled and returned in float64: each user's model goes to the
sum as the server's model plus its clipped update, both in float64, so the update that
reaches the sum is the clipped one up to float64 rounding of the model (an ulp of |w|,
2^-53 |w|), far below a relative 1e-6 of any bound. A float32 model would carry it
only to an ulp of |w| in float32 per coordinate, which a small bound on a large model
does not absorb.
"""

from __future__ import annotations

import math

import torch

from perfed_ray.algorithms.tree import Params, per_user
from perfed_ray.postprocess import UserPostprocessor
from perfed_ray.privacy import UNCLIPPED
from perfed_ray.seeding import Stream, torch_generator


class ClipUpdates(UserPostprocessor):
    """Each user's shared update scaled down to norm `bound` where it is longer; its
    personal parameters set back to the server's. `count_unclipped` reports adaptive
    clipping's statistic, ``unclipped_centred``: the sum over users of b_i - 1/2, b_i
    being 1 where the bound left the user's update whole. Centred, one user moves it by
    at most 1/2 whether it is added, removed or replaced, the sensitivity Andrew et al.'s
    Theorem 1 accounts (tensorflow-privacy's QuantileEstimatorQuery shifts its records
    by -0.5 for that reason); the server adds half the expected cohort back."""

    def __init__(
        self, bound: float, shared: tuple[str, ...], per_layer: bool, count_unclipped: bool
    ) -> None:
        self.bound = float(bound)
        self.shared = shared
        self.per_layer = per_layer
        self.count_unclipped = count_unclipped

    def _updates(self, server: Params, models: Params) -> dict[str, torch.Tensor]:
        return {k: models[k].double() - server[k].double() for k in self.shared}

    def _scales(self, updates: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each shared tensor's per-user factor, min(1, bound / norm)."""
        if self.per_layer:
            bound = self.bound / math.sqrt(len(updates))
            return {
                k: (bound / _norms(u).clamp_min(1e-30)).clamp(max=1.0) for k, u in updates.items()
            }
        norms = sum(_norms(u) ** 2 for u in updates.values()).sqrt()
        scale = (self.bound / norms.clamp_min(1e-30)).clamp(max=1.0)
        return dict.fromkeys(updates, scale)

    def _clip(
        self, server: Params, models: Params
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The users' clipped shared updates in float64, each leaf stacked along the
        user axis, and the factors that clipped them."""
        updates = self._updates(server, models)
        scales = self._scales(updates)
        return {k: u * per_user(scales[k], u) for k, u in updates.items()}, scales

    def _count(self, scales: dict[str, torch.Tensor], users: list[int]) -> dict[str, float]:
        if not self.count_unclipped:
            return {}
        # a user is unclipped when no part of its update was scaled down (per tensor,
        # with per_layer): the fraction adaptive clipping steers towards its quantile
        whole = torch.stack([s >= 1.0 for s in scales.values()]).all(0)
        return {UNCLIPPED: float(whole.sum()) - len(users) / 2}

    def _summed(
        self, server: Params, models: Params, updates: dict[str, torch.Tensor], users: list[int]
    ) -> Params:
        """The models the sum takes from the users' clipped updates."""
        return _models(server, models, updates)

    def apply(
        self, server: Params, models: Params, users: list[int]
    ) -> tuple[Params, dict[str, float]]:
        """The step and its count from one pass over the updates (the actor's call)."""
        updates, scales = self._clip(server, models)
        return self._summed(server, models, updates, users), self._count(scales, users)

    def __call__(self, server: Params, models: Params, users: list[int]) -> Params:
        return self._summed(server, models, self._clip(server, models)[0], users)

    def statistics(self, server: Params, models: Params, users: list[int]) -> dict[str, float]:
        return self._count(self._scales(self._updates(server, models)), users)


class NoisyUpdates(ClipUpdates):
    """Local differential privacy: each user's clipped shared update plus Gaussian
    noise of standard deviation `std`, drawn on the actor from the user's own stream
    keyed by (seed, round, user): the update that leaves the user is already private."""

    def __init__(
        self,
        bound: float,
        shared: tuple[str, ...],
        per_layer: bool,
        std: float,
        seed: int,
        round_: int,
    ) -> None:
        super().__init__(bound, shared, per_layer, count_unclipped=False)
        self.std = float(std)
        self.seed = seed
        self.round = round_

    def _summed(
        self, server: Params, models: Params, updates: dict[str, torch.Tensor], users: list[int]
    ) -> Params:
        """The models the sum takes from the users' clipped updates, each noised."""
        sizes = [server[k].numel() for k in self.shared]
        for i, user in enumerate(users):
            gen = torch_generator(self.seed, Stream.LOCAL_NOISE, self.round, user)
            noise = torch.randn(sum(sizes), generator=gen, dtype=torch.float32) * self.std
            for k, part in zip(self.shared, noise.split(sizes), strict=True):
                updates[k][i] += part.view_as(server[k]).to(updates[k])
        return _models(server, models, updates)


def _models(server: Params, models: Params, updates: dict[str, torch.Tensor]) -> Params:
    """The users' models the sum takes, in float64 (the module's docstring says why):
    the server's plus each shared update, and the server's own value for every personal
    parameter."""
    return {
        k: server[k].double() + updates[k] if k in updates else server[k].double().expand_as(m)
        for k, m in models.items()
    }


def _norms(u: torch.Tensor) -> torch.Tensor:
    """Each user's L2 norm of a stacked leaf [n, ...], in float64."""
    return u.flatten(1).double().norm(dim=1)
