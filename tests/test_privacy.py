"""User-level differential privacy: the steps on users' updates (clipping, local noise)
against the same numbers computed here from the updates alone, the server's release
against DP-FedAvg's formula, adaptive clipping's bound against Andrew et al.'s rule,
Poisson cohorts, the settings a run refuses, and real runs whose rows carry the
accountant's epsilon."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import each_users_model, round_sum

import perfed_ray
from perfed_ray.config import from_mapping
from perfed_ray.errors import ConfigError
from perfed_ray.privacy import accounting
from perfed_ray.privacy.clipping import ClipUpdates, NoisyUpdates
from perfed_ray.privacy.mechanisms import CLIP, UNCLIPPED, CentralGaussian, resolve
from perfed_ray.results.reader import read_runs, read_table
from perfed_ray.strategy import ServerState, Strategy

SHAPES = {"a.weight": (3, 4), "a.bias": (3,), "b.weight": (2, 3), "b.bias": (2,)}
BASE = {"dataset": "gaussian", "algorithm": "fedavg", "n_users": 40, "fraction": 0.25}


def _models(n: int, scale: np.ndarray, seed: int = 0) -> tuple[dict, dict]:
    """A server model and `n` users' models whose updates have the given norms' scale."""
    g = torch.Generator().manual_seed(seed)
    server = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    models = {
        k: server[k]
        + torch.randn((n, *s), generator=g) * torch.tensor(scale).view(-1, *[1] * len(s))
        for k, s in SHAPES.items()
    }
    return server, models


def _flat_updates(server: dict, models: dict, keys) -> np.ndarray:
    return np.concatenate(
        [(models[k] - server[k]).flatten(1).double().numpy() for k in keys], axis=1
    )


def test_clipping_bounds_every_users_shared_update_and_leaves_short_ones_alone():
    scale = np.array([0.01, 0.5, 3.0, 10.0], dtype=np.float32)
    server, models = _models(4, scale)
    shared = ("a.weight", "a.bias", "b.weight")  # b.bias personal, as a FedRep head would be
    bound = 1.0
    step = ClipUpdates(bound, shared, per_layer=False, count_unclipped=True)
    out = step(server, models, [0, 1, 2, 3])
    before = _flat_updates(server, models, shared)
    after = _flat_updates(server, out, shared)
    norms = np.linalg.norm(before, axis=1)
    assert norms[0] < bound < norms[2]  # both kinds present
    assert (np.linalg.norm(after, axis=1) <= bound * (1 + 1e-6)).all()
    expected = before * np.minimum(1.0, bound / norms)[:, None]
    np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-7)
    assert torch.equal(out["b.bias"], server["b.bias"].double().expand(4, -1))  # nothing leaves
    stats = step.statistics(server, models, [0, 1, 2, 3])  # each user's b_i - 1/2
    assert stats == {UNCLIPPED: float((norms <= bound).sum()) - 2.0}


def test_per_layer_clipping_bounds_each_tensor_and_so_the_whole_update():
    server, models = _models(3, np.array([2.0, 5.0, 0.001], dtype=np.float32))
    shared = tuple(SHAPES)
    out = ClipUpdates(1.0, shared, per_layer=True, count_unclipped=False)(server, models, [0, 1, 2])
    for k in shared:
        u = (out[k] - server[k]).flatten(1).double().norm(dim=1)
        assert (u <= 0.5 * (1 + 1e-6)).all()  # 1 / sqrt(4 tensors)
    assert (np.linalg.norm(_flat_updates(server, out, shared), axis=1) <= 1.0 * (1 + 1e-6)).all()
    np.testing.assert_allclose(  # the smallest update is under every bound: untouched
        _flat_updates(server, out, shared)[2], _flat_updates(server, models, shared)[2], rtol=1e-6
    )


def test_local_noise_is_each_users_own_whoever_it_is_summed_with():
    """The noise a user adds is keyed by (seed, round, user): the same on any actor, in
    any company; it has the deviation asked for, and other users' and rounds' differ."""
    server, models = _models(3, np.array([0.1, 0.2, 0.3], dtype=np.float32))
    shared = tuple(SHAPES)
    step = NoisyUpdates(1e6, shared, False, std=2.0, seed=7, round_=3)
    together = _flat_updates(server, step(server, models, [5, 9, 11]), shared)
    alone = _flat_updates(server, step(server, {k: v[1:2] for k, v in models.items()}, [9]), shared)
    np.testing.assert_array_equal(together[1], alone[0])
    noise = together - _flat_updates(server, models, shared)
    assert not np.allclose(noise[0], noise[1])
    later = NoisyUpdates(1e6, shared, False, std=2.0, seed=7, round_=4)
    assert not np.allclose(
        _flat_updates(server, later(server, models, [5, 9, 11]), shared), together
    )
    big = {k: torch.zeros((1, 200, 100)) for k in ["w"]}
    drawn = NoisyUpdates(1e9, ("w",), False, std=2.0, seed=1, round_=1)(
        {"w": torch.zeros(200, 100)}, big, [0]
    )["w"]
    assert abs(float(drawn.std()) - 2.0) < 0.05 and abs(float(drawn.mean())) < 0.05


def _strategy(core: dict | None = None, **privacy) -> Strategy:
    """A central-DP strategy of BASE with `core` keys and these privacy settings."""
    values = {**BASE, **(core or {}), "privacy": "central"}
    values.update({f"privacy.{k}": v for k, v in privacy.items()})
    return Strategy(resolve(from_mapping(values)))


def _release(s: Strategy, round_: int, state: ServerState, total, weight, stats=None):
    """The strategy's mechanism's release of round k from `state` and the users' sum."""
    return s.privacy.release(
        round_, state.weights, state.privacy, total, weight, stats or {}, s._shared_mask
    )


def _template() -> dict:
    return {k: torch.zeros(s) for k, s in SHAPES.items()}


@pytest.mark.parametrize(
    "values, expected",
    [
        ({}, 10.0),  # fixed: m = 0.25 x 40
        ({"sampling": "poisson", "unseen_users": 0.25}, 7.5),  # q n of the 30 seen users
    ],
)
def test_the_central_release_is_dp_fedavgs_noised_sum_over_the_expected_cohort(values, expected):
    """From a server model far from zero: with no noise the release is w + (sum of
    clipped updates) / m for any number who reported, m the expected cohort (fixed, or
    Poisson's q times the seen users); with noise, the release minus that has deviation
    z_update * C / m, C the adaptive bound the state holds (not privacy.clip) and
    z_update what Andrew et al.'s Theorem 1 leaves of z after the count's noise."""
    adaptive = {"adaptive_clip": True, "count_noise": 3.0, "clip": 1.0}
    quiet = _strategy(values, noise_multiplier=0.0, **adaptive)
    state = quiet.init(_template())
    rng = np.random.default_rng(0)
    d = state.weights.size
    state = ServerState(rng.normal(size=d).astype(np.float32) + 5, privacy={CLIP: np.array([0.5])})
    updates = rng.normal(size=(3, d)) * 0.1  # three reported
    total = (state.weights.astype(np.float64) + updates).sum(0)
    released = _release(quiet, 1, state, total, 3.0)[0]
    w = state.weights.astype(np.float64)
    np.testing.assert_allclose(released - w, updates.sum(0) / expected, rtol=1e-5, atol=1e-6)
    assert quiet.epsilon(1) == math.inf

    noisy = _strategy(values, noise_multiplier=4.0, **adaptive)
    noisy.init(_template())
    draws = np.stack([_release(noisy, r, state, total, 3.0)[0] for r in range(1, 400)])
    z_update = (4.0**-2 - (2 * 3.0) ** -2) ** -0.5
    std = (draws - (w + updates.sum(0) / expected)).std()
    assert std == pytest.approx(z_update * 0.5 / expected, rel=0.03)
    again = _release(noisy, 5, state, total, 3.0)[0]
    np.testing.assert_array_equal(again, draws[4])  # round 5's noise, drawn again


def test_local_noise_is_z_times_the_clip_through_the_mechanism():
    """privacy: local's step, as the strategy makes it for a round: each user's update
    clipped to privacy.clip and noised with deviation noise_multiplier * clip."""
    values = {**BASE, "privacy": "local", "privacy.noise_multiplier": 3.0, "privacy.clip": 0.2}
    s = Strategy(resolve(from_mapping(values)))
    template = {"w": torch.zeros(20000)}
    state = s.init(template)
    server = {"w": torch.full((20000,), 2.0)}
    models = {"w": server["w"] + torch.zeros(2, 20000)}  # no update of their own
    models["w"][1, 0] = 100.0  # one long update: clipped to 0.2 before the noise
    out = s.postprocess_users(1, state)(server, models, [0, 1])
    noise = (out["w"] - server["w"].double()).numpy()
    assert noise[0].std() == pytest.approx(3.0 * 0.2, rel=0.02)
    assert abs(noise[1, 0]) < 0.2 + 5 * 0.6  # 0.2 and its noise: clipped from 100
    assert abs(noise[1, 1:].std() - 0.6) < 0.02


def _fraction(s: Strategy, before: float, after: float) -> float:
    """The noisy fraction of unclipped users a release moved the bound by, read back
    from Andrew et al.'s rule C' = C exp(-eta (fraction - target_quantile))."""
    options = s.privacy.settings_
    return options["target_quantile"] - math.log(after / before) / options["clip_learning_rate"]


def _sum_of(step: ClipUpdates, server: dict, models: dict) -> tuple[np.ndarray, dict]:
    """What the actors hand the driver: the flat float64 sum of the users' models after
    the step, and the step's statistics."""
    users = list(range(next(iter(models.values())).shape[0]))
    stats = step.statistics(server, models, users)
    out = step(server, models, users)
    return np.concatenate([out[k].double().sum(0).flatten().numpy() for k in out]), stats


def test_adaptive_clipping_moves_the_bound_by_andrew_et_als_geometric_rule():
    """The bound moves by the noisy count of unclipped users over the expected cohort
    (m = 10), whoever reported (3 here: dividing by them would read 0.67), with the
    count's noise of deviation count_noise (on: 2.0, so 0.2 in the fraction): 2 of the
    3 unclipped, counted as Andrew et al. and tensorflow-privacy do, sum(b_i - 1/2) +
    noise + m/2, read as a fraction of m, average (2 - 1.5) / 10 + 0.5 = 0.55."""
    s = _strategy(
        noise_multiplier=0.0,
        clip=1.0,
        adaptive_clip=True,
        clip_learning_rate=0.2,
        target_quantile=0.5,
        count_noise=2.0,
    )
    state = s.init(_template())
    assert state.privacy[CLIP].tolist() == [1.0]
    server, models = _models(3, np.array([0.01, 0.02, 5.0], dtype=np.float32), seed=3)
    step = s.postprocess_users(1, state)
    total, stats = _sum_of(step, server, models)
    state = ServerState(
        np.concatenate([v.flatten().numpy() for v in server.values()]), privacy=state.privacy
    )
    fractions = np.array(
        [
            _fraction(s, 1.0, _release(s, r, state, total, 3.0, stats)[1][CLIP][0])
            for r in range(1, 4001)
        ]
    )
    assert fractions.mean() == pytest.approx(0.55, abs=0.012)  # 4 standard errors
    assert fractions.std() == pytest.approx(2.0 / 10, rel=0.05)


def test_the_update_noise_pays_for_the_counts_by_andrew_et_als_theorem_1():
    paid = _strategy(noise_multiplier=1.0, adaptive_clip=True, count_noise=2.0).privacy
    assert paid.update_noise() == pytest.approx((1 - 1 / 16) ** -0.5)


def _noise_multiplier_spent(sampling: str) -> tuple[float, float]:
    """The noise multiplier adaptive clipping's round really has, from the Gaussian
    mechanism's closed form for its two released sums, and the one accounted.

    Two neighbouring cohorts are run through the clipping step and the server's release
    with the same draws: under Poisson sampling one more user (add or remove one), for
    fixed cohorts one user replaced by another (replace one); in each, the one user
    whose update is the bound's length and, on one side, left whole, so that it moves
    the update sum and the count both as far as one user can. The releases' difference
    gives each sum's sensitivity (the update sum's from the model, the count's from the
    bound's step); their draws over many rounds each noise's deviation. The pair is one
    Gaussian mechanism of sensitivity 1 and noise multiplier
    1 / sqrt((sens_update / std_update)^2 + (sens_count / std_count)^2), the
    multiplier to compare with what the accountant composes for the round."""
    z, sigma_b, clip, eta = 2.92, 3.96, 0.5, 0.2  # the privacy grid's epsilon-1 z and count noise
    values = {
        "n_users": 1000,
        "fraction": 0.08,
        "sampling": sampling if sampling == "poisson" else "uniform",
        "privacy.noise_multiplier": z,
        "privacy.adaptive_clip": True,
        "privacy.count_noise": sigma_b,
        "privacy.clip": clip,
        "privacy.clip_learning_rate": eta,
    }
    cfg = from_mapping({**BASE, "privacy": "central", **values})
    s = Strategy(cfg)
    m = s.privacy.hparams.expected_cohort
    template = {"w": torch.zeros(2000)}
    s.init(template)
    rng = np.random.default_rng(5)
    server = {"w": torch.tensor(rng.normal(size=2000), dtype=torch.float32)}
    weights = server["w"].numpy()
    direction = rng.normal(size=2000)
    direction /= np.linalg.norm(direction)
    others = rng.normal(size=(6, 2000)) * np.array([0.001, 0.01, 0.1, 1, 2, 3])[:, None]
    whole = (1 - 1e-9) * clip * direction  # left whole, as long as the bound allows
    cut = -3 * clip * direction  # clipped, to the bound's length the other way
    if sampling == "poisson":
        cohorts = (others, np.vstack([others, whole]))
    else:
        cohorts = (np.vstack([others, cut]), np.vstack([others, whole]))
    step = s.postprocess_users(1, s.init(template))
    state = s.init(template)
    state = ServerState(weights, privacy=state.privacy)

    def release(updates: np.ndarray, round_: int) -> tuple[np.ndarray, float]:
        models = {"w": server["w"] + torch.tensor(updates, dtype=torch.float32)}
        total, stats = _sum_of(step, server, models)
        model, extra = _release(s, round_, state, total, float(len(updates)), stats)
        return model.astype(np.float64) * m, _fraction(s, clip, extra[CLIP][0]) * m

    (model_a, count_a), (model_b, count_b) = release(cohorts[0], 1), release(cohorts[1], 1)
    sens_update = np.linalg.norm(model_b - model_a)  # the update sum's, m * the model's
    sens_count = abs(count_b - count_a)
    draws = [release(cohorts[0], r) for r in range(2, 2002)]
    std_update = np.std([d[0] for d in draws[:50]], axis=0).mean()
    std_count = np.std([d[1] for d in draws])
    spent = 1 / math.hypot(sens_update / std_update, sens_count / std_count)
    plan = s.privacy.plan
    return spent, accounting._event(plan, s.privacy.noise_multiplier).event.noise_multiplier


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_adaptive_clipping_spends_the_noise_multiplier_it_accounts(sampling):
    """Andrew et al.'s Theorem 1 holds as run: the update's noise and the count's are
    together one Gaussian of the accounted multiplier (z under Poisson sampling, z / 2
    of sensitivity 1 for a replaced user with fixed cohorts). A raw count of unclipped
    users (sensitivity 1, not 1/2, when a user is added or removed) spent about 2.46
    where 2.92 was accounted."""
    spent, accounted = _noise_multiplier_spent(sampling)
    assert spent == pytest.approx(accounted, rel=0.03)


def test_poisson_cohorts_vary_around_q_n_and_never_hold_an_unseen_user():
    s = Strategy(from_mapping({**BASE, "sampling": "poisson", "unseen_users": 0.25}))
    unseen = set(s.unseen())
    sizes = []
    for r in range(1, 400):
        users = s.sample(r)
        assert not unseen & set(users) and users == sorted(set(users))
        sizes.append(len(users))
    assert len(set(sizes)) > 3  # they vary
    assert np.mean(sizes) == pytest.approx(0.25 * 30, rel=0.1)
    assert s.sample(17) == s.sample(17)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"privacy.epsilon": 0}, "privacy.epsilon = 0.0 is out of range: a number > 0"),
        ({"privacy.epsilon": -1}, "privacy.epsilon = -1.0 is out of range"),
        ({"privacy.epsilon": 1, "privacy.delta": 1}, "privacy.delta = 1 must be below 1"),
        ({}, "privacy = central needs a budget, privacy.epsilon, or a privacy.noise_multiplier"),
        (
            {"privacy.epsilon": 1, "privacy.noise_multiplier": 0.5, "rounds": 100},
            "privacy.noise_multiplier = 0.5 spends epsilon = ",
        ),
        ({"privacy.epsilon": 1, "aggregation": "samples"}, "use aggregation: mean"),
        ({"privacy.epsilon": 1, "sampling": "samples"}, "use sampling: poisson or uniform"),
        ({"privacy.epsilon": 1, "algorithm": "local"}, "run it with privacy: none"),
    ],
)
def test_bad_privacy_settings_are_one_line(values, message):
    with pytest.raises(ConfigError, match=None) as err:
        from_mapping({**BASE, "privacy": "central", **values})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_local_and_central_together_is_refused():
    for value in ["central,local", "local+central", ["central", "local"]]:
        refused = r"privacy = .* is not allowed.*: one of none, central, local,"
        with pytest.raises(ConfigError, match=refused):
            from_mapping({**BASE, "privacy": value, "privacy.epsilon": 1})


def test_an_auto_noise_multiplier_is_the_accountants_calibration_for_the_run():
    values = {**BASE, "privacy": "central", "privacy.epsilon": 2.0, "rounds": 30}
    cfg = from_mapping({**values, "sampling": "poisson"})
    z = resolve(cfg).section("privacy")["noise_multiplier"]
    plan = accounting.Plan("central", "poisson", 40, 10.0, 1e-5, "rdp")
    assert z == accounting.noise_multiplier(plan, 2.0, 30)
    assert accounting.epsilon(plan, z, 30) <= 2.0 < accounting.epsilon(plan, 0.99 * z, 30)
    assert isinstance(CentralGaussian(resolve(cfg)).noise_multiplier, float)


def test_fedrep_shares_its_body_alone():
    from perfed_ray.algorithms.base import make_algorithm

    cfg = from_mapping({**BASE, "algorithm": "fedrep"})
    template = _template()
    assert make_algorithm(cfg).shared(template) == ("a.weight", "a.bias")
    assert make_algorithm(from_mapping(BASE)).shared(template) == tuple(SHAPES)


@pytest.mark.slow
def test_a_central_dp_run_writes_the_epsilon_it_spent_each_round(ray_session, tmp_path):
    values = {
        **BASE,
        "rounds": 6,
        "eval_every": 3,
        "tau": 2,
        "sampling": "poisson",
        "privacy": "central",
        "privacy.epsilon": 3.0,
        "privacy.accountant": "pld",
        "privacy.clip": 0.5,
    }
    result = perfed_ray.simulate(values, tmp_path)
    runs = read_runs(tmp_path)
    z = runs["privacy.noise_multiplier"].iloc[0]
    plan = accounting.Plan("central", "poisson", 40, 10.0, 1e-5, "pld")
    assert z == pytest.approx(accounting.noise_multiplier(plan, 3.0, 6), rel=1e-12)
    rounds = read_table(tmp_path, "rounds", result.run_id).sort_values("round")
    spent = rounds["epsilon"].to_numpy()
    np.testing.assert_allclose(spent, accounting.epsilons(plan, z, 6), rtol=1e-12)
    assert spent[-1] <= 3.0 and np.all(np.diff(spent) > 0)
    assert len(set(rounds["n_sampled"])) > 1  # Poisson cohorts


@pytest.mark.slow
@pytest.mark.parametrize("privacy", ["central", "local"])
def test_fedrep_under_dp_keeps_the_servers_head_where_it_started(ray_session, tmp_path, privacy):
    """The head never leaves a user: the server's copy of it is w_0's after any number of
    rounds, while the body moved (noised on the server, or by each user)."""
    from perfed_ray.models import initial_model, params_of
    from perfed_ray.runtime.checkpoint import RunStore
    from perfed_ray.runtime.simulation import prepare

    values = {
        **BASE,
        "algorithm": "fedrep",
        "rounds": 3,
        "tau": 2,
        "privacy": privacy,
        "privacy.noise_multiplier": 0.5,
        "checkpoint_every": 3,
    }
    result = perfed_ray.simulate(values, tmp_path)
    cfg = from_mapping(values)
    s = Strategy(cfg)
    w0 = s.init(params_of(initial_model(cfg, prepare(cfg).source([])))).weights
    saved = RunStore(tmp_path, result.run_id).load().server.weights
    head = s._shared_mask == 0
    assert head.any() and (~head).any()
    np.testing.assert_array_equal(saved[head], w0[head])
    assert not np.allclose(saved[~head], w0[~head])


def test_the_adaptive_bound_survives_a_real_checkpoint(tmp_path):
    """The bound after a round, in the mechanism's part of the server state, written to
    a checkpoint file and read back, beside a strategy's own state."""
    from perfed_ray.runtime.checkpoint import Checkpoint, RunStore

    s = _strategy(noise_multiplier=0.0, adaptive_clip=True, count_noise=1e-9)
    state = s.init(_template())
    new = s.aggregate(
        1,
        state,
        np.tile(state.weights, 10).reshape(10, -1).sum(0),
        10.0,
        stats={UNCLIPPED: 10.0 - 5.0},
    )
    new = ServerState(new.weights, new.optimizer, {"mine": np.ones(2)}, new.privacy)
    assert new.privacy[CLIP][0] < 1.0  # every user unclipped: the bound shrank
    store = RunStore(tmp_path, "r")
    store.folder.mkdir(parents=True)
    store.save(Checkpoint(1, new, {"rounds": 1}, 1.0, None, {}))
    loaded = store.load().server
    assert loaded.privacy[CLIP].tolist() == new.privacy[CLIP].tolist()
    assert loaded.extra["mine"].tolist() == [1.0, 1.0]
    np.testing.assert_array_equal(loaded.weights, new.weights)
    resumed = s.postprocess_users(2, loaded)
    assert resumed.bound == new.privacy[CLIP][0]


def test_with_per_layer_clipping_a_user_is_unclipped_only_if_no_tensor_was():
    """Adaptive clipping steers the fraction of users the bound left whole: per tensor,
    one tensor over its share of the bound makes the user clipped, even when the whole
    update is shorter than the bound."""
    server = {"a": torch.zeros(4), "b": torch.zeros(4)}
    models = {"a": torch.tensor([[0.9, 0, 0, 0], [0.1, 0, 0, 0]]), "b": torch.zeros(2, 4)}
    step = ClipUpdates(1.0, ("a", "b"), per_layer=True, count_unclipped=True)
    # user 0's whole update (0.9) is under 1, its tensor a over 1/sqrt(2)
    assert step.statistics(server, models, [0, 1]) == {UNCLIPPED: 1.0 - 1.0}


def test_a_strategy_that_weighs_users_itself_is_refused_under_privacy(tmp_path, monkeypatch):
    (tmp_path / "weighing.py").write_text(
        "from perfed_ray.strategy import Strategy\n\n\n"
        "class BySize(Strategy):\n    def weight(self, n_train):\n        return float(n_train)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    values = {**BASE, "strategy": "weighing:BySize", "privacy.noise_multiplier": 1.0}
    from_mapping(values)  # without privacy, its own weights are its business
    with pytest.raises(ConfigError, match=r"keep Strategy\.weight under privacy"):
        from_mapping({**values, "privacy": "central"})


@pytest.mark.slow  # CIFAR-10 and its CNN on a real actor: about 10 s
def test_a_small_bound_holds_to_rounding_of_the_update_on_the_cifar_cnn(ray_session):
    """Clip 0.05 on the CIFAR CNN's 0.6M weights: each user's contribution to the
    actor's sum (the sum of one user's model, less the server's) is its clipped update
    to a relative 1e-6 of the bound, and so within it. A float32 model, w + u rounded,
    carried the update only to an ulp of |w| per weight, beyond 1e-6 of such a bound."""
    from perfed_ray.models import initial_model, params_of
    from perfed_ray.runtime import simulation
    from perfed_ray.runtime.placement import Placement

    clip = 0.05
    values = {"dataset": "cifar10", "model": "cnn", "n_users": 2, "fraction": 1.0}
    cfg = from_mapping({**values, "tau": 2, "beta": 1.0, "batch_size": 8, "users_per_actor": 2})
    prepared = simulation.prepare(cfg)
    actor = simulation.actor_factory(prepared, Placement([range(2)], 1.0, 0.0))(0, 0)
    w = simulation.initial_weights(cfg, prepared.source([0]))
    template = params_of(initial_model(cfg, prepared.source([])))
    step = ClipUpdates(clip, Strategy(cfg).algorithm.shared(template), False, False)
    w64 = w.astype(np.float64)
    for u in (0, 1):
        plain = each_users_model(ray_session, actor, w, [u], 1)[u]
        update = plain - w64
        assert np.linalg.norm(update) > 2 * clip  # clipped: the bound is what it keeps
        exact = update * clip / np.linalg.norm(update)
        one = round_sum(ray_session, actor, w, [u], 1, postprocess=step)
        contribution = one.total - w64
        assert np.linalg.norm(contribution - exact) <= 1e-6 * clip
        assert np.linalg.norm(contribution) <= clip * (1 + 1e-6)
    ray_session.kill(actor)


@pytest.mark.slow  # a run that diverges, on the shared Ray
def test_a_private_run_that_diverges_names_the_privacy_settings_first(ray_session, tmp_path):
    from conftest import DIVERGES

    from perfed_ray.runtime.rounds import Diverged

    values = {**DIVERGES, "privacy": "local", "privacy.noise_multiplier": 5.0}
    with pytest.raises(Diverged) as err:
        perfed_ray.simulate({**values, "privacy.clip": 2.0}, tmp_path, progress=False)
    advice = str(err.value).split("is the last good one; ")[1]
    assert advice.startswith(
        "first privacy = local's settings: its noise, of deviation privacy.noise_multiplier "
        "5 x privacy.clip 2 on each user's update: lower privacy.clip or the noise"
    )
    assert advice.endswith("then lower beta or alpha")
