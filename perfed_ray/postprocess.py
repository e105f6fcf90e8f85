"""What happens to each reporting user's model before it joins the round's sum.

Users' models are weighted and summed on the actors that host them (only one model's
worth of numbers crosses back to the driver), so a step on each user's update, such as
differential privacy's clipping to a norm bound, must run there, before the sum. Each
round has one ordered chain of such steps, made on the driver
(:meth:`perfed_ray.strategy.Strategy.postprocess_users`) and handed with the round's
work to every actor: the strategy's own steps (`Strategy.user_steps`), then the privacy
mechanism's (clipping, and local DP's noise), last, so that nothing after them can
undo the bound the accountant relies on. pfl-research orders its postprocessors so:
each user's statistics go through them in order, the central privacy mechanism last,
and the aggregate through their server sides in reverse, its noise first
(pfl/aggregate/simulate.py). A step is a small picklable value, in the spirit of those
postprocessors and of Flower's ``DifferentialPrivacyClientSideFixedClipping``
(clipping where the update is made). Without any step the actor's sum is computed
exactly as before, at no cost.
"""

from __future__ import annotations

from collections.abc import Sequence

from perfed_ray.algorithms.tree import Params


class UserPostprocessor:
    """A step applied on the actor to the reporting users' models of a round, before
    they are weighted and summed. Subclass it (a plain class with picklable fields:
    it travels to every actor with each round's call) and return it from your
    strategy's `user_steps`.

    `server` is the round's global model, `models` the reporting users' new models,
    each leaf stacked along a leading user axis, `users` their ids in that order (for
    draws keyed by the user); the user's update is `models - server`. Return models of
    the same shapes."""

    def __call__(self, server: Params, models: Params, users: list[int]) -> Params:
        raise NotImplementedError

    def statistics(self, server: Params, models: Params, users: list[int]) -> dict[str, float]:
        """Numbers summed over the round's reporting users, on the actors and then on the
        driver, that the strategy's `aggregate` receives as `stats` (adaptive clipping's
        count of users whose update the bound did not clip), taken from the models
        before the step; none by default."""
        return {}

    def apply(
        self, server: Params, models: Params, users: list[int]
    ) -> tuple[Params, dict[str, float]]:
        """The models after the step and its statistics of the models before it: what
        the actor asks of the round's chain."""
        return self(server, models, users), self.statistics(server, models, users)


class Chain(UserPostprocessor):
    """Steps applied in order, each to the models the one before it returned; their
    statistics, each taken from its own step's input, merged."""

    def __init__(self, steps: Sequence[UserPostprocessor]) -> None:
        self.steps = tuple(steps)

    def apply(
        self, server: Params, models: Params, users: list[int]
    ) -> tuple[Params, dict[str, float]]:
        stats: dict[str, float] = {}
        for step in self.steps:
            models, more = step.apply(server, models, users)
            stats.update(more)
        return models, stats

    def __call__(self, server: Params, models: Params, users: list[int]) -> Params:
        return self.apply(server, models, users)[0]

    def statistics(self, server: Params, models: Params, users: list[int]) -> dict[str, float]:
        return self.apply(server, models, users)[1]


def chain(steps: Sequence[UserPostprocessor | None]) -> UserPostprocessor | None:
    """One step for the given ones in order (None left out): None for none, the step
    itself for one."""
    kept = [s for s in steps if s is not None]
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else Chain(kept)
