"""User-level differential privacy as the strategy's post-processing: what each
reporting user's update goes through on its actor, how the server turns the round's sum
into the released aggregate, and what the run has spent (`privacy`: none, central,
local; the settings in the `privacy` section).

- `central`, DP-FedAvg (McMahan, Ramage, Talwar, Zhang, "Learning Differentially
  Private Recurrent Language Models", ICLR 2018): each reporting user's update of the
  shared parameters is clipped to L2 norm `privacy.clip` on its actor; the server adds
  Gaussian noise of standard deviation ``noise_multiplier * clip`` to the sum and
  divides by the expected cohort (their fixed-denominator estimator), not by how many
  reported, so that one user's influence on the release is bounded as the accountant
  assumes. With `privacy.adaptive_clip` the bound follows a target quantile of the
  users' update norms (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private
  Learning with Adaptive Clipping", NeurIPS 2021): each user also reports whether the
  bound left its update alone (b_i in {0, 1}), counted centred as b_i - 1/2, so that
  one user moves the count by at most 1/2; the server adds Gaussian noise of deviation
  `privacy.count_noise` to that sum and half the expected cohort back, and moves the
  bound geometrically,
  ``C <- C * exp(-clip_learning_rate * (noisy count / expected cohort - target_quantile))``.
  The count's privacy is paid from the same budget by the update's larger noise,
  ``z_update = (z^-2 - (2 count_noise)^-2)^-1/2`` (their Theorem 1, whose factor 2 is
  the count's sensitivity 1/2), so the accountant sees one Gaussian of multiplier z per
  round: the update sum (sensitivity clip, noise z_update clip) and the count
  (sensitivity 1/2, noise count_noise) are together one Gaussian mechanism of
  multiplier (z_update^-2 + (2 count_noise)^-2)^-1/2 = z. A raw count of b_i would
  have sensitivity 1 under Poisson sampling's add-or-remove neighbours and spend more
  than accounted.
- `local`: each user clips its update and adds its own Gaussian noise of deviation
  ``noise_multiplier * clip`` before the update leaves it; the server averages what
  arrives. The baseline that trusts no server.

The noise multiplier is given (`privacy.noise_multiplier`) or calibrated from the
budget (`auto`: the smallest z whose epsilon after the planned rounds is at most
`privacy.epsilon` at `privacy.delta`), by :mod:`perfed_ray.privacy.accounting`. Every
draw comes from the run's keyed streams (:mod:`perfed_ray.seeding`): a resumed or
replayed round adds the same noise. These are a simulation's pseudo-random numbers, not
a cryptographic generator: the guarantees hold for the mechanism as simulated, for
research, never for a deployment.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from perfed_ray.config.load import revise
from perfed_ray.config.owners import HParams
from perfed_ray.config.settings import Setting
from perfed_ray.errors import ConfigError
from perfed_ray.privacy import UNCLIPPED, accounting
from perfed_ray.seeding import Stream, numpy_rng

if TYPE_CHECKING:
    from perfed_ray.config.schema import RunConfig
    from perfed_ray.postprocess import UserPostprocessor

CLIP = "clip"  # the adaptive bound's key in ServerState.privacy

SETTINGS: dict[str, Setting] = {
    "epsilon": Setting(
        None,
        "the privacy budget of the whole run, at delta (none: no target; then set "
        "noise_multiplier, and epsilon is what it spends)",
        kind=float,
        low=0,
        low_open=True,
        auto=True,
        word="none",
    ),
    "delta": Setting(
        1e-5,
        "delta of (epsilon, delta)-DP (usually well below 1/n_users)",
        low=0,
        low_open=True,
    ),
    "clip": Setting(
        1.0,
        "the L2 norm bound of a user's update (the start, with adaptive_clip)",
        low=0,
        low_open=True,
    ),
    "noise_multiplier": Setting(
        None,
        "the noise's deviation in units of clip; auto: calibrated to epsilon for the "
        "planned rounds; 0 clips without noise (epsilon infinite)",
        kind=float,
        low=0,
        auto=True,
    ),
    "accountant": Setting(
        "rdp",
        "how epsilon is accounted (dp-accounting): Renyi DP, or privacy loss "
        "distributions (tighter; central DP needs sampling: poisson for it)",
        choices=("rdp", "pld"),
    ),
    "per_layer": Setting(
        False, "clip each parameter tensor to clip/sqrt(L) instead of the whole update"
    ),
    "adaptive_clip": Setting(
        False, "move clip towards target_quantile of the users' update norms (central)"
    ),
    "target_quantile": Setting(
        0.5,
        "adaptive clipping: the fraction of users whose update the bound keeps whole",
        low=0,
        high=1,
    ),
    "clip_learning_rate": Setting(
        0.2, "adaptive clipping: the geometric step of the bound", low=0, low_open=True
    ),
    "count_noise": Setting(
        None,
        "adaptive clipping: the deviation of the noise on the count of unclipped users; "
        "auto: the expected cohort / 20, as Andrew et al.",
        kind=float,
        low=0,
        low_open=True,
        auto=True,
    ),
}


@dataclass(frozen=True, kw_only=True)
class PrivacyHParams(HParams):
    """What a mechanism reads of a run: the `privacy` section, the core keys that set
    its accounting (who can be sampled, how, and for how many rounds), and the counts
    the run derives from them."""

    key: ClassVar[str] = "privacy"
    privacy: str
    seed: int
    n_users: int
    fraction: float
    rounds: int
    sampling: str
    aggregation: str
    users_per_round: int
    unseen_count: int

    @property
    def population(self) -> int:
        """The users a round can sample: all but the unseen ones."""
        return self.n_users - self.unseen_count

    @property
    def expected_cohort(self) -> float:
        """A round's expected number of sampled users: m, or q n with Poisson sampling."""
        if self.sampling == "poisson":
            return self.fraction * self.population
        return float(self.users_per_round)


class NoPrivacy:
    """`privacy: none`: users' models are summed as they are and the aggregate is their
    mean; nothing is accounted (epsilon is infinite: no guarantee). The base of every
    mechanism: a mechanism of one's own subclasses it and is named by dotted path."""

    settings: ClassVar[dict[str, Setting]] = SETTINGS
    HParams: ClassVar[type[PrivacyHParams]] = PrivacyHParams
    # Whether the server releases a noised model even in a round where no user reported.
    releases_empty: ClassVar[bool] = False

    def __init__(self, hparams: PrivacyHParams | RunConfig) -> None:
        self.hparams = self.HParams.given(hparams)
        self.settings_ = self.hparams.section

    @classmethod
    def validate(cls, hparams: PrivacyHParams, fixed_server: bool) -> None:
        """Raise ConfigError for settings the mechanism cannot run, before Ray starts."""

    @property
    def noise_multiplier(self) -> float | None:
        return None

    def init(self) -> dict[str, np.ndarray]:
        """The mechanism's state before round 1 (ServerState.privacy)."""
        return {}

    def user_step(
        self, round_: int, state: Mapping[str, np.ndarray], shared: tuple[str, ...]
    ) -> UserPostprocessor | None:
        """What each actor does to round k's reporting users' models before summing,
        given the mechanism's state (`ServerState.privacy`)."""
        return None

    def release(
        self,
        round_: int,
        weights: np.ndarray,
        state: Mapping[str, np.ndarray],
        total: np.ndarray,
        weight: float,
        stats: dict[str, float],
        shared: np.ndarray,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Round k's aggregate (a model: the server's `weights` plus the users' mean
        update) from the weighted sum `total` of the reporting users' models (weights
        adding up to `weight`), and what the mechanism's state gains. The server's first
        step on the sum, and the one place the mechanism's noise is added on the driver
        (central DP's; local DP's is each user's own, in its step on the actor). `shared`
        marks the flat vector's entries that users share."""
        return (total / weight).astype(np.float32), {}

    def epsilon(self, rounds_done: int) -> float:
        """The epsilon the run has spent after `rounds_done` rounds, at delta."""
        return math.inf

    def divergence_advice(self) -> str:
        """The settings of the mechanism a diverged run should look at first, as the
        start of a sentence that goes on to the step sizes; none without privacy."""
        return ""


class _Gaussian(NoPrivacy):
    """What central and local DP share: their checks, the accountant's view of the run
    and the noise multiplier, given or calibrated."""

    kind: ClassVar[str]

    @classmethod
    def validate(cls, hparams: PrivacyHParams, fixed_server: bool) -> None:
        mine = hparams.section
        name = f"privacy = {hparams.privacy}"
        if fixed_server:
            raise ConfigError(
                f"{name}: this method shares no model (its server's model never moves), so "
                f"nothing leaves a user to privatise: run it with privacy: none"
            )
        if mine["delta"] >= 1:
            raise ConfigError(f"privacy.delta = {mine['delta']:g} must be below 1")
        if mine["epsilon"] is None and mine["noise_multiplier"] is None:
            raise ConfigError(
                f"{name} needs a budget, privacy.epsilon, or a privacy.noise_multiplier"
            )
        if hparams.sampling == "samples":
            raise ConfigError(
                f"{name}: sampling: samples favours users by size, which no accountant "
                f"here covers: use sampling: poisson or uniform"
            )
        if hparams.aggregation != "mean":
            raise ConfigError(
                f"{name}: aggregation: samples weights a user by its size, which breaks "
                f"the bound on one user's influence: use aggregation: mean"
            )
        plan = _plan(cls.kind, hparams)
        accounting.check(plan)
        z = mine["noise_multiplier"]
        if z is None:
            _calibrated(plan, mine["epsilon"], hparams.rounds)  # fails here if it cannot
        elif mine["epsilon"] is not None:
            spent = accounting.epsilon(plan, z, hparams.rounds)
            if spent > mine["epsilon"]:
                raise ConfigError(
                    f"privacy.noise_multiplier = {z:g} spends epsilon = {spent:.4g} over "
                    f"{hparams.rounds} rounds, above the budget privacy.epsilon = "
                    f"{mine['epsilon']:g}: raise the noise, lower rounds or leave "
                    f"noise_multiplier auto"
                )

    @property
    def plan(self) -> accounting.Plan:
        return _plan(self.kind, self.hparams)

    @functools.cached_property
    def noise_multiplier(self) -> float:
        z = self.settings_["noise_multiplier"]
        if z is None:
            z = _calibrated(self.plan, self.settings_["epsilon"], self.hparams.rounds)
        return float(z)

    def init(self) -> dict[str, np.ndarray]:
        """Also the epsilon after each planned round, accounted here, in the run's
        set-up (PLD's take seconds for a thousand rounds), not in round 1's time."""
        self._epsilons  # noqa: B018 (computed and kept)
        return super().init()

    @functools.cached_property
    def _epsilons(self) -> np.ndarray:
        return accounting.epsilons(self.plan, self.noise_multiplier, self.hparams.rounds)

    def epsilon(self, rounds_done: int) -> float:
        if rounds_done == 0:
            return 0.0
        return float(self._epsilons[rounds_done - 1])

    def divergence_advice(self) -> str:
        where = "each user's update" if self.kind == "local" else "the sum of updates"
        start = " (the start of the adaptive bound)" if self.settings_["adaptive_clip"] else ""
        return (
            f"first privacy = {self.kind}'s settings: its noise, of deviation "
            f"privacy.noise_multiplier {self.noise_multiplier:.4g} x privacy.clip "
            f"{self.settings_['clip']:g}{start} on {where}: lower privacy.clip or the "
            f"noise (a larger privacy.epsilon); then "
        )

    def bound(self, state: Mapping[str, np.ndarray]) -> float:
        """The clipping bound of the round whose mechanism's state is `state`."""
        if not self.settings_["adaptive_clip"]:
            return float(self.settings_["clip"])
        if CLIP not in state:  # a checkpoint from before ServerState.privacy held it
            raise ConfigError(
                "privacy.adaptive_clip: the server state holds no adaptive bound "
                "(ServerState.privacy); start the run again"
            )
        return float(state[CLIP][0])


class CentralGaussian(_Gaussian):
    """`privacy: central`: DP-FedAvg, optionally with adaptive clipping (module doc)."""

    kind = "central"
    releases_empty = True

    @classmethod
    def validate(cls, hparams: PrivacyHParams, fixed_server: bool) -> None:
        super().validate(hparams, fixed_server)
        mine = hparams.section
        if mine["adaptive_clip"] and mine["noise_multiplier"] != 0:
            sigma_b = _count_noise(hparams)
            z = mine["noise_multiplier"]
            if z is None:
                z = _calibrated(_plan(cls.kind, hparams), mine["epsilon"], hparams.rounds)
            if z >= 2 * sigma_b:
                raise ConfigError(
                    f"privacy.count_noise = {sigma_b:g} leaves nothing of the noise "
                    f"multiplier {z:.4g} for the update (adaptive clipping needs "
                    f"count_noise > z / 2 = {z / 2:.4g}): raise count_noise"
                )

    def init(self) -> dict[str, np.ndarray]:
        state = super().init()
        if not self.settings_["adaptive_clip"]:
            return state
        return {**state, CLIP: np.array([self.settings_["clip"]], dtype=np.float64)}

    def user_step(self, round_, state, shared):
        from perfed_ray.privacy.clipping import ClipUpdates

        adaptive = self.settings_["adaptive_clip"]
        return ClipUpdates(self.bound(state), shared, self.settings_["per_layer"], adaptive)

    def update_noise(self) -> float:
        """The update's noise multiplier: z, or with adaptive clipping what z leaves
        after the count's share (Andrew et al., Theorem 1)."""
        z = self.noise_multiplier
        if not self.settings_["adaptive_clip"] or z == 0:
            return z
        return (z**-2 - (2 * _count_noise(self.hparams)) ** -2) ** -0.5

    def release(self, round_, weights, state, total, weight, stats, shared):
        server = weights.astype(np.float64)
        bound = self.bound(state)
        expected = self.hparams.expected_cohort
        rng = numpy_rng(self.hparams.seed, Stream.CENTRAL_NOISE, round_)
        noise = rng.standard_normal(server.shape) * (self.update_noise() * bound)
        summed = total - weight * server + noise * shared
        moved = {}
        if self.settings_["adaptive_clip"]:
            # Round k's noisy count of unclipped users: the users' centred sum (each
            # b_i - 1/2, sensitivity 1/2: see ClipUpdates), its noise, and half the
            # expected cohort added back (public, as tensorflow-privacy's quantile
            # estimator adds 0.5 to the fraction), never half of those who reported,
            # whose number Poisson sampling keeps private.
            centred = stats.get(UNCLIPPED, 0.0) + rng.normal(0.0, _count_noise(self.hparams))
            count = centred + expected / 2
            step = self.settings_["clip_learning_rate"]
            quantile = self.settings_["target_quantile"]
            moved[CLIP] = np.array([bound * math.exp(-step * (count / expected - quantile))])
        return (server + summed / expected).astype(np.float32), moved


class LocalGaussian(_Gaussian):
    """`privacy: local`: each user clips and noises its own update (module doc)."""

    kind = "local"

    @classmethod
    def validate(cls, hparams: PrivacyHParams, fixed_server: bool) -> None:
        super().validate(hparams, fixed_server)
        if hparams.section["adaptive_clip"]:
            raise ConfigError(
                "privacy.adaptive_clip applies to privacy: central (the server moves "
                "the bound from a noised count); with privacy: local set privacy.clip"
            )

    def user_step(self, round_, state, shared):
        from perfed_ray.privacy.clipping import NoisyUpdates

        bound = self.bound(state)
        std = self.noise_multiplier * bound
        per_layer = self.settings_["per_layer"]
        return NoisyUpdates(bound, shared, per_layer, std, self.hparams.seed, round_)


def _plan(kind: str, hparams: PrivacyHParams) -> accounting.Plan:
    """The run as the accountant sees it: who can be sampled, how, and delta."""
    poisson = hparams.sampling == "poisson"
    return accounting.Plan(
        kind=kind,
        sampling="poisson" if poisson else "fixed",
        population=hparams.population,
        cohort=hparams.expected_cohort if poisson else hparams.users_per_round,
        delta=hparams.section["delta"],
        accountant=hparams.section["accountant"],
    )


@functools.lru_cache(maxsize=256)
def _calibrated(plan: accounting.Plan, epsilon: float, rounds: int) -> float:
    """The calibrated noise multiplier, once per plan in a process: validating a
    configuration and starting its run ask for it twice, a sweep once per trial."""
    return accounting.noise_multiplier(plan, epsilon, rounds)


def _count_noise(hparams: PrivacyHParams) -> float:
    """Adaptive clipping's noise on the count: given, or the expected cohort / 20."""
    given = hparams.section["count_noise"]
    return float(given) if given is not None else hparams.expected_cohort / 20


def resolve(cfg: RunConfig) -> RunConfig:
    """The configuration with an `auto` noise multiplier made the calibrated number, so
    that the runs table, the checkpoint and every actor hold the mechanism as run."""
    if cfg.privacy == "none" or cfg.section("privacy").get("noise_multiplier") is not None:
        return cfg
    from perfed_ray.registry import PRIVACY

    mechanism = PRIVACY.load(cfg.privacy)(cfg)
    return revise(cfg, **{"privacy.noise_multiplier": mechanism.noise_multiplier})
