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

import perfed_ray
from perfed_ray.config import from_mapping
from perfed_ray.errors import ConfigError
from perfed_ray.privacy import accounting
from perfed_ray.privacy.clipping import ClipUpdates, NoisyUpdates
from perfed_ray.privacy.mechanisms import CLIP, CentralGaussian, resolve
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
    assert torch.equal(out["b.bias"], server["b.bias"].expand(4, -1))  # nothing of it leaves
    stats = step.statistics(server, models, [0, 1, 2, 3])
    assert stats == {"unclipped": float((norms <= bound).sum())}


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


def _strategy(**privacy) -> Strategy:
    values = {**BASE, "privacy": "central", **{f"privacy.{k}": v for k, v in privacy.items()}}
    return Strategy(resolve(from_mapping(values)))


def _release(s: Strategy, round_: int, state: ServerState, total, weight, stats=None):
    """The strategy's mechanism's release of round k from `state` and the users' sum."""
    extra = state.extra
    return s.privacy.release(
        round_, state.weights, extra, total, weight, stats or {}, s._shared_mask
    )


def _template() -> dict:
    return {k: torch.zeros(s) for k, s in SHAPES.items()}


def test_the_central_release_is_dp_fedavgs_noised_sum_over_the_expected_cohort():
    """With no noise the release is w + (sum of clipped updates) / m for any number who
    reported; with noise, the release minus that has deviation z * clip / m."""
    quiet = _strategy(noise_multiplier=0.0, clip=1.0)
    state = quiet.init(_template())
    d = state.weights.size
    rng = np.random.default_rng(0)
    updates = rng.normal(size=(3, d)) * 0.1  # three of the m = 10 reported
    total = (state.weights + updates).sum(0)
    released = _release(quiet, 1, state, total, 3.0)[0]
    np.testing.assert_allclose(released, updates.sum(0) / 10, rtol=1e-6, atol=1e-7)
    assert quiet.epsilon(1) == math.inf

    noisy = _strategy(noise_multiplier=4.0, clip=0.5)
    noisy.init(_template())
    draws = np.stack([_release(noisy, r, state, total, 3.0)[0] for r in range(1, 200)])
    std = (draws - updates.sum(0) / 10).std()
    assert abs(std - 4.0 * 0.5 / 10) < 0.01
    again = _release(noisy, 5, state, total, 3.0)[0]
    np.testing.assert_array_equal(again, draws[4])  # round 5's noise, drawn again


def test_adaptive_clipping_moves_the_bound_by_andrew_et_als_geometric_rule():
    s = _strategy(
        noise_multiplier=0.0,
        clip=1.0,
        adaptive_clip=True,
        clip_learning_rate=0.2,
        target_quantile=0.5,
        count_noise=1e-9,
    )
    state = s.init(_template())
    assert state.extra[CLIP].tolist() == [1.0]
    total = np.tile(state.weights, 10).reshape(10, -1).sum(0)
    _, extra = _release(s, 1, state, total, 10.0, {"unclipped": 10.0})
    assert extra[CLIP][0] == pytest.approx(math.exp(-0.2 * (1.0 - 0.5)), rel=1e-6)
    _, extra = _release(s, 1, state, total, 10.0, {"unclipped": 0.0})
    assert extra[CLIP][0] == pytest.approx(math.exp(0.2 * 0.5), rel=1e-6)
    # The update's noise pays for the count's: z_update = (z^-2 - (2 sigma_b)^-2)^-1/2.
    paid = _strategy(noise_multiplier=1.0, adaptive_clip=True, count_noise=2.0).privacy
    assert paid.update_noise() == pytest.approx((1 - 1 / 16) ** -0.5)


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


def test_state_extra_survives_as_the_checkpoint_keeps_it():
    s = _strategy(noise_multiplier=0.0, adaptive_clip=True, count_noise=1e-9)
    state = s.init(_template())
    new = s.aggregate(
        1, state, np.tile(state.weights, 10).reshape(10, -1).sum(0), 10.0, stats={"unclipped": 10.0}
    )
    assert isinstance(new, ServerState) and new.extra[CLIP][0] < 1.0


def test_with_per_layer_clipping_a_user_is_unclipped_only_if_no_tensor_was():
    """Adaptive clipping steers the fraction of users the bound left whole: per tensor,
    one tensor over its share of the bound makes the user clipped, even when the whole
    update is shorter than the bound."""
    server = {"a": torch.zeros(4), "b": torch.zeros(4)}
    models = {"a": torch.tensor([[0.9, 0, 0, 0], [0.1, 0, 0, 0]]), "b": torch.zeros(2, 4)}
    step = ClipUpdates(1.0, ("a", "b"), per_layer=True, count_unclipped=True)
    # user 0's whole update (0.9) is under 1, its tensor a over 1/sqrt(2)
    assert step.statistics(server, models, [0, 1]) == {"unclipped": 1.0}


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
