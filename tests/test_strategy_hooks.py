"""A strategy's two post-processing steps, where clipping and noise plug in: one on
each reporting user's model, applied by the actor before it sums them, one on the
aggregate on the driver; and a strategy's own server state, saved with the
checkpoint. Checked on real actors against the same numbers computed here from the
users' models alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import each_users_model, round_sum

import perfed_ray
from perfed_ray.config import ConfigError, from_mapping
from perfed_ray.postprocess import UserPostprocessor
from perfed_ray.runtime import simulation
from perfed_ray.runtime.checkpoint import RunStore
from perfed_ray.runtime.placement import Placement
from perfed_ray.strategy import Strategy

PLUGINS = Path(__file__).resolve().parent / "plugins"
RUN = {
    "dataset": "gaussian",
    "algorithm": "fedavg",
    "engine": "fused",
    "n_users": 6,
    "fraction": 0.5,
    "rounds": 1,
    "tau": 3,
    "beta": 0.2,
    "users_per_actor": 6,
    "strategy": "hooked:Hooked",
}


@pytest.mark.slow
def test_a_strategy_loaded_after_the_actor_class_was_sent_reaches_the_actors(
    ray_session, monkeypatch
):
    """Ray pickles an actor class by value once a session: a registry the class's code
    named directly was the driver's copy of that moment, so a plug-in strategy resolved
    later (in the same session, after a run with the built-in one) was unknown to every
    actor. Runs before the fixture below first resolves the plug-in."""
    built_in = from_mapping({**RUN, "strategy": "uniform"})
    first = simulation.actor_factory(simulation.prepare(built_in), Placement([range(6)], 1.0, 0.0))(
        0, 0
    )
    ray_session.get(first.describe.remote())  # the class is sent now, the plug-in unknown
    ray_session.kill(first)
    monkeypatch.syspath_prepend(str(PLUGINS))
    cfg = from_mapping(RUN)
    actor = simulation.actor_factory(simulation.prepare(cfg), Placement([range(6)], 1.0, 0.0))(0, 0)
    assert ray_session.get(actor.describe.remote())["pid"] > 0  # built: it found Hooked
    ray_session.kill(actor)


def _clipped(update: np.ndarray, bound: float) -> np.ndarray:
    return update * min(1.0, bound / np.linalg.norm(update))


@pytest.fixture
def hooked(monkeypatch, ray_session):
    """The plug-in strategy's module, its configuration, a real actor hosting every
    user, w_0 and the users' own models after round 1 without any step applied."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    import hooked

    cfg = from_mapping(RUN)
    prepared = simulation.prepare(cfg)
    actor = simulation.actor_factory(prepared, Placement([range(6)], 1.0, 0.0))(0, 0)
    w0 = simulation.initial_weights(cfg, prepared.source([0]))
    reporting = Strategy(cfg).sample(1)
    plain = each_users_model(ray_session, actor, w0, reporting, 1)
    yield hooked, cfg, actor, w0, reporting, plain
    ray_session.kill(actor)


def test_the_actor_applies_the_step_to_each_users_model_before_the_sum(hooked, ray_session):
    module, _, actor, w0, reporting, plain = hooked
    step = module.Clip(module.BOUND)
    got = round_sum(ray_session, actor, w0, reporting, 1, postprocess=step)
    each = each_users_model(ray_session, actor, w0, reporting, 1, postprocess=step)
    w = w0.astype(np.float64)
    norms = [np.linalg.norm(plain[u] - w) for u in reporting]
    assert min(norms) > module.BOUND  # every update is clipped: the step did something
    expected = {u: w + _clipped(plain[u] - w, module.BOUND) for u in reporting}
    for u in reporting:
        np.testing.assert_allclose(each[u], expected[u], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.total, sum(expected.values()), rtol=1e-5, atol=1e-6)
    assert got.weight == len(reporting)


def test_no_users_clipped_update_leaves_its_actor_longer_than_the_bound(hooked, ray_session):
    """The built-in privacy step on a real actor: every user's update as summed is
    within the bound (up to float32 rounding), and those it clipped point where they did."""
    from perfed_ray.privacy.clipping import ClipUpdates

    _, cfg, actor, w0, reporting, plain = hooked
    w = w0.astype(np.float64)
    norms = np.array([np.linalg.norm(plain[u] - w) for u in reporting])
    low, high = np.sort(norms)[:2]
    bound = float(low + high) / 2  # some users are clipped, some are not, none on the edge
    keys = tuple(Strategy(cfg).algorithm.shared(_template(cfg)))
    step = ClipUpdates(bound, keys, per_layer=False, count_unclipped=True)
    got = round_sum(ray_session, actor, w0, reporting, 1, postprocess=step)
    each = each_users_model(ray_session, actor, w0, reporting, 1, postprocess=step)
    for u, norm in zip(reporting, norms, strict=True):
        update = each[u] - w
        assert np.linalg.norm(update) <= bound * (1 + 1e-5)
        np.testing.assert_allclose(
            update, (plain[u] - w) * min(1.0, bound / norm), rtol=1e-4, atol=1e-7
        )
    assert got.stats == {"unclipped_centred": float((norms <= bound).sum()) - len(reporting) / 2}


def _template(cfg):
    from perfed_ray.models import initial_model, params_of

    return params_of(initial_model(cfg, simulation.prepare(cfg).source([])))


@pytest.mark.slow
def test_a_strategys_hooks_and_own_state_in_a_real_run(hooked, tmp_path):
    """w_1 of a run with the plug-in strategy is w_0 plus the mean of the users' clipped
    updates plus the known vector (FedAvg, the plain mean, `mean` server step); clipping
    the mean update instead would give another model."""
    module, _, _, w0, reporting, plain = hooked
    result = perfed_ray.simulate(RUN, tmp_path)
    saved = RunStore(tmp_path, result.run_id).load()
    assert saved.round == 1
    w = w0.astype(np.float64)
    updates = [plain[u] - w for u in reporting]
    clipped = np.mean([_clipped(d, module.BOUND) for d in updates], axis=0)
    expected = w + clipped + module.shift(w.size)
    np.testing.assert_allclose(saved.server.weights, expected, rtol=1e-5, atol=1e-6)
    on_the_mean = w + _clipped(np.mean(updates, axis=0), module.BOUND) + module.shift(w.size)
    assert not np.allclose(saved.server.weights, on_the_mean, rtol=1e-5, atol=1e-6)
    assert saved.server.extra["rounds"].tolist() == [1.0]


class _Louder(UserPostprocessor):
    """A strategy's own step that lengthens every update tenfold."""

    def __call__(self, server, models, users):
        return {k: server[k] + 10 * (m - server[k]) for k, m in models.items()}


class _Amplifying(Strategy):
    def user_steps(self, round_, state):
        return [_Louder()]


def test_the_mechanisms_clipping_comes_after_the_strategys_steps():
    """One chain, the strategy's steps first and the mechanism's clipping last: a step
    that lengthens the updates cannot take a contribution past privacy.clip, and the
    unclipped count is taken from what the clipping received."""
    import torch

    from perfed_ray.privacy.mechanisms import UNCLIPPED

    values = {**RUN, "strategy": "uniform", "privacy": "central", "privacy.clip": 0.1}
    adaptive = {"privacy.adaptive_clip": True, "privacy.count_noise": 1.0}
    cfg = from_mapping({**values, "privacy.noise_multiplier": 1.0, **adaptive})
    s = _Amplifying(cfg)
    template = _template(cfg)
    state = s.init(template)
    g = torch.Generator().manual_seed(0)
    server = {k: torch.randn(v.shape, generator=g) for k, v in template.items()}
    scales = torch.tensor([0.0001, 0.001, 0.5])  # 10 x the updates: short ones and long
    models = {
        k: v + torch.randn((3, *v.shape), generator=g) * scales.view(-1, *[1] * v.dim()) / 10
        for k, v in server.items()
    }
    out, stats = s.postprocess_users(1, state).apply(server, models, [0, 1, 2])
    norms = sum((out[k] - server[k].double()).flatten(1).norm(dim=1) ** 2 for k in out).sqrt()
    assert (norms <= 0.1 * (1 + 1e-6)).all()
    longer = sum((models[k] - server[k]).flatten(1).norm(dim=1) ** 2 for k in out).sqrt() * 10
    assert stats == {UNCLIPPED: float((longer <= 0.1).sum()) - 1.5}


def test_a_strategy_that_replaces_the_chain_is_refused(tmp_path, monkeypatch):
    (tmp_path / "replacing.py").write_text(
        "from perfed_ray.strategy import Strategy\n\n\n"
        "class Mine(Strategy):\n    def postprocess_users(self, round_, state):\n"
        "        return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"overrides Strategy\.postprocess_users.*user_steps"):
        from_mapping({**RUN, "strategy": "replacing:Mine"})
