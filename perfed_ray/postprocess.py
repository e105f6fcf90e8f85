"""What happens to each reporting user's model before it joins the round's sum.

Users' models are weighted and summed on the actors that host them (only one model's
worth of numbers crosses back to the driver), so a step on each user's update, such as
differential privacy's clipping to a norm bound, must run there, before the sum. The
strategy makes such a step for a round (:meth:`perfed_ray.strategy.Strategy.
postprocess_users`) and the coordinator hands it, with the round's work, to every actor.
It is a small picklable value, in the spirit of pfl-research's postprocessors (a
user's statistics transformed before aggregation) and of Flower's
``DifferentialPrivacyClientSideFixedClipping`` (clipping where the update is made).
Without one (the default) the actor's sum is computed exactly as before, at no cost.
"""

from __future__ import annotations

from perfed_ray.algorithms.tree import Params


class UserPostprocessor:
    """A step applied on the actor to the reporting users' models of a round, before
    they are weighted and summed. Subclass it (a plain class with picklable fields:
    it travels to every actor with each round's call) and return it from your
    strategy's `postprocess_users`.

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
