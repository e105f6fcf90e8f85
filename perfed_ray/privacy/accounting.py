"""The privacy accountant of user-level DP (issue 37): epsilon spent after k rounds for a
noise multiplier z, and the z that a target epsilon asks for, from Google's
`dp-accounting` (RDP or PLD, the library pfl-research uses).

What is accounted, per round, for the unit of privacy one user (all of its data):

- `central`, `poisson` (DP-FedAvg, McMahan et al. 2018): each of `population` users
  joins a round with probability q = cohort / population; each reporting user's
  update is clipped to norm <= clip and the server adds Gaussian noise of std z*clip to
  the sum. Adding or removing one user moves the sum by at most clip, so a round is
  `PoissonSampledDpEvent(q, GaussianDpEvent(z))` under ADD_OR_REMOVE_ONE, the
  relation Poisson amplification assumes (`RdpAccountant` or `PLDAccountant`).
- `central`, `fixed`: exactly `cohort` of `population` users without replacement.
  The population size is then public and neighbours replace one user, whose clipped
  update can move the sum by up to 2*clip. dp-accounting's noise multiplier is "the
  ratio of the standard deviation of the Gaussian noise to the l2-sensitivity"
  (the docstring of `_compute_rdp_sample_wor_gaussian` in
  dp_accounting/rdp/rdp_privacy_accountant.py, Wang, Balle and Kasiviswanathan 2019,
  Theorem 27, "replace one data point"), so a round is
  `SampledWithoutReplacementDpEvent(population, cohort, GaussianDpEvent(z / 2))` under
  REPLACE_ONE; only `RdpAccountant` accounts it (the PLD accountant has no
  sampling-without-replacement event, so `check` refuses pld with fixed cohorts).
- `local`: each user releases its own update with Gaussian noise of std z*clip. The
  update can be replaced by any other of norm <= clip (sensitivity 2*clip), so one
  participation is `GaussianDpEvent(z / 2)`. No amplification by sampling (the server
  sees who reports), and the worst-case user takes part in every round: after k
  rounds, that event composed k times, whatever `sampling` says.

Epsilon is the smallest the accountant proves at `delta`. RDP uses dp-accounting's
default orders (pfl's too) and its conversion (`compute_epsilon`, Proposition 12 of
Canonne, Kamath and Steinke 2020). PLD uses a value discretisation interval of 1e-3
(`PLD_INTERVAL`, pessimistic estimates and connect-the-dots, the library's
defaults). pfl and dp-accounting default to 1e-4; 1e-3 adds about 0.001 to epsilon
after 1,000 rounds (0.13% at epsilon 1; still an upper bound: a coarser pessimistic
PLD only rounds up), moves calibrated noise multipliers by at most 0.12% from pfl's
(experiments/results/privacy-accountants/accountants.md) and is about 8 times faster, which the
per-round `epsilons` of a 1,000-round run need. RDP's epsilon for k
rounds is one round's RDP curve times k (the accountant's own arithmetic, so
`epsilons` and `epsilon` agree bit for bit); PLD's is the one-round PLD self-composed
k times, as `PLDAccountant.compose(event, k)` does; for local DP, where a round is a
plain Gaussian and k of them are one Gaussian of std divided by sqrt(k), PLD's answer
is that Gaussian's exact epsilon (the analytic Gaussian mechanism of Balle and Wang
2018, `dp_accounting.get_epsilon_gaussian`), which a discretised PLD approaches from
above (a large local epsilon's PLD is wide, and took seconds a round).

`dp_accounting` is imported inside the functions: importing this module is cheap, and
a configuration can be checked without loading it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from perfed_ray.errors import ConfigError

KINDS = ("central", "local")
SAMPLINGS = ("poisson", "fixed")
ACCOUNTANTS = ("rdp", "pld")
PLD_INTERVAL = 1e-3  # the PLD's value discretisation interval: see the docstring
RTOL = 1e-5  # noise_multiplier's bracket: its ends within this relative distance
LARGEST_Z = 1e6  # no target epsilon needs more noise than this: refused beyond


@dataclass(frozen=True)
class Plan:
    """What the accountant sees of a run."""

    kind: str  # "central" (DP-FedAvg: noise on the sum of clipped updates) or "local"
    sampling: str  # "poisson" (each user joins with prob. cohort/population) or "fixed"
    population: int  # users that rounds can sample (the run's seen users)
    cohort: int | float  # fixed: m; poisson: the expected cohort q*population
    delta: float
    accountant: str  # "rdp" or "pld"

    @property
    def q(self) -> float:
        """The sampling rate: a user's probability of taking part in a round."""
        return self.cohort / self.population


def check(plan: Plan) -> None:
    """Raise a one-line ConfigError for a plan the accountant cannot account."""
    for name, value, known in (
        ("privacy", plan.kind, KINDS),
        ("sampling", plan.sampling, SAMPLINGS),
        ("privacy.accountant", plan.accountant, ACCOUNTANTS),
    ):
        if value not in known:
            raise ConfigError(f"{name}: {value!r} is not one of {', '.join(known)}")
    if not 0 < plan.delta < 1:
        raise ConfigError(f"privacy.delta: {plan.delta} is not in (0, 1)")
    if plan.population < 1 or int(plan.population) != plan.population:
        raise ConfigError(f"privacy: the population ({plan.population}) is not a count >= 1")
    if not 0 < plan.cohort <= plan.population:
        raise ConfigError(
            f"privacy: the cohort ({plan.cohort}) is not in (0, population = {plan.population}]"
        )
    if plan.sampling == "fixed" and int(plan.cohort) != plan.cohort:
        raise ConfigError(f"privacy: a fixed cohort ({plan.cohort}) must be a whole number")
    if plan.kind == "central" and plan.sampling == "fixed" and plan.accountant == "pld":
        raise ConfigError(
            "privacy.accountant: pld cannot account fixed-size cohorts (dp-accounting's PLD "
            "has no sampling without replacement): use sampling: poisson or accountant: rdp"
        )


def epsilon(plan: Plan, noise_multiplier: float, rounds: int) -> float:
    """The epsilon spent after `rounds` rounds at `noise_multiplier`: 0.0 for none,
    infinite without noise."""
    check(plan)
    _check_run(noise_multiplier, rounds)
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    with _quiet():
        return _after(plan, _one_round(plan, noise_multiplier), rounds)


def epsilons(plan: Plan, noise_multiplier: float, rounds: int) -> np.ndarray:
    """The epsilon spent after each of rounds 1..`rounds`, equal to `epsilon` of each:
    one round's account is made once and only its composition repeated."""
    check(plan)
    _check_run(noise_multiplier, rounds)
    if noise_multiplier == 0:
        return np.full(rounds, math.inf)
    with _quiet():
        one = _one_round(plan, noise_multiplier)
        return np.array([_after(plan, one, k) for k in range(1, rounds + 1)], dtype=np.float64)


@contextmanager
def _quiet() -> Iterator[None]:
    """dp-accounting logs, through absl, each RDP order it leaves out where its series
    does not converge (orders near 1 at large q): epsilon stays an upper bound, and a
    run would print dozens of such lines at its start."""
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def noise_multiplier(plan: Plan, target_epsilon: float, rounds: int) -> float:
    """The smallest noise multiplier (within a relative 1e-5) whose epsilon after
    `rounds` rounds is at most `target_epsilon`; the one returned always is."""
    check(plan)
    _check_run(1.0, rounds)
    if not target_epsilon > 0:
        raise ConfigError(f"privacy.epsilon: {target_epsilon} is not > 0")
    if rounds == 0:
        return 0.0

    def gap(z: float) -> float:
        """log(epsilon / target): <= 0 where z is noise enough; falls as z grows."""
        spent = epsilon(plan, z, rounds)
        return math.log(spent / target_epsilon) if spent > 0 else -math.inf

    # Bracket [low, high] (gap(low) > 0 >= gap(high)), then Brent's method on log z
    # (scipy's brentq, as dp_accounting.calibrate_dp_mechanism does), and the end of
    # its last bracket that is noise enough.
    low, high = 0.5, 1.0
    while gap(high) > 0:
        low, high = high, 2 * high
        if high > LARGEST_Z:
            raise ConfigError(
                f"privacy.epsilon: {target_epsilon} needs a noise multiplier over {LARGEST_Z:g}"
            )
    while gap(low) <= 0:
        low, high = low / 2, low
        if high < 1e-6:
            return high
    from scipy.optimize import brentq

    root = math.exp(brentq(lambda x: gap(math.exp(x)), math.log(low), math.log(high), rtol=RTOL))
    z = min(high, root * (1 + RTOL))
    return z if gap(z) <= 0 else high


def _check_run(noise_multiplier: float, rounds: int) -> None:
    if not noise_multiplier >= 0 or math.isinf(noise_multiplier):
        raise ConfigError(f"privacy.noise_multiplier: {noise_multiplier} is not finite and >= 0")
    if rounds < 0 or int(rounds) != rounds:
        raise ConfigError(f"privacy: rounds ({rounds}) is not a count >= 0")


def _event(plan: Plan, z: float) -> Any:
    """One round's DpEvent for one user (the module's docstring says why)."""
    from dp_accounting import dp_event

    if plan.kind == "local":
        return dp_event.GaussianDpEvent(z / 2)
    if plan.sampling == "fixed":
        return dp_event.SampledWithoutReplacementDpEvent(
            plan.population, int(plan.cohort), dp_event.GaussianDpEvent(z / 2)
        )
    return dp_event.PoissonSampledDpEvent(plan.q, dp_event.GaussianDpEvent(z))


def _relation(plan: Plan) -> Any:
    from dp_accounting import NeighboringRelation

    if plan.kind == "central" and plan.sampling == "fixed":
        return NeighboringRelation.REPLACE_ONE
    return NeighboringRelation.ADD_OR_REMOVE_ONE


def _one_round(plan: Plan, z: float) -> Any:
    """What `_after` composes: RDP's curve over its orders, or the one-round PLD (for
    local DP, the Gaussian's noise multiplier: its PLD is known in closed form)."""
    if plan.accountant == "rdp":
        return _rdp_curve(plan, z)
    if plan.kind == "local":
        return z / 2
    return _pld_one_round(plan.q, z)


def _after(plan: Plan, one: Any, k: int) -> float:
    """Epsilon after k rounds of `one` round's account, at the plan's delta."""
    if plan.accountant == "rdp":
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        orders, rdp = one
        return float(compute_epsilon(orders, k * rdp, plan.delta)[0])
    if plan.kind == "local":  # k Gaussians of std s are one of std s / sqrt(k), exactly
        from dp_accounting import get_epsilon_gaussian

        return float(get_epsilon_gaussian(one / math.sqrt(k), plan.delta))
    from dp_accounting.pld import privacy_loss_distribution as pld

    # PLDAccountant.compose(PoissonSampledDpEvent, k), with the one-round PLD reused.
    composed = pld.identity(value_discretization_interval=PLD_INTERVAL)
    return float(composed.compose(one.self_compose(k)).get_epsilon_for_delta(plan.delta))


def _rdp_curve(plan: Plan, z: float) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP at each) of one round, as `RdpAccountant` composes it."""
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(neighboring_relation=_relation(plan)).compose(_event(plan, z))
    return accountant.orders, accountant.rdp


@lru_cache(maxsize=8)
def _pld_one_round(q: float, z: float) -> Any:
    """One Poisson-sampled Gaussian round's PLD (ADD_OR_REMOVE_ONE), as
    `PLDAccountant` makes it; kept, since building it is most of a short account."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_gaussian_mechanism(
        standard_deviation=z, value_discretization_interval=PLD_INTERVAL, sampling_prob=q
    )
