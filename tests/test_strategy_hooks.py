"""A strategy's two post-processing steps, where clipping and noise plug in: one on
each reporting user's model, applied by the actor before it sums them, one on the
aggregate on the driver; and a strategy's own server state, saved with the
checkpoint. Checked on real actors against the same numbers computed here from the
users' models alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import perfed_ray
from perfed_ray.config import from_mapping
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
    reporting = Strategy(cfg).plan(1).reporting
    plain = ray_session.get(actor.train.remote(w0, reporting, 1, per_user=True))
    yield hooked, cfg, actor, w0, reporting, plain
    ray_session.kill(actor)


def test_the_actor_applies_the_step_to_each_users_model_before_the_sum(hooked, ray_session):
    module, _, actor, w0, reporting, plain = hooked
    step = module.Clip(module.BOUND)
    got = ray_session.get(actor.train.remote(w0, reporting, 1, per_user=True, postprocess=step))
    w = w0.astype(np.float64)
    norms = [np.linalg.norm(plain.per_user[u] - w) for u in reporting]
    assert min(norms) > module.BOUND  # every update is clipped: the step did something
    expected = {u: w + _clipped(plain.per_user[u] - w, module.BOUND) for u in reporting}
    for u in reporting:
        np.testing.assert_allclose(got.per_user[u], expected[u], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.total, sum(expected.values()), rtol=1e-5, atol=1e-6)
    assert got.weight == plain.weight == len(reporting)


def test_no_users_clipped_update_leaves_its_actor_longer_than_the_bound(hooked, ray_session):
    """The built-in privacy step on a real actor: every user's update as summed is
    within the bound (up to float32 rounding), and those it clipped point where they did."""
    from perfed_ray.privacy.clipping import ClipUpdates

    _, cfg, actor, w0, reporting, plain = hooked
    w = w0.astype(np.float64)
    norms = np.array([np.linalg.norm(plain.per_user[u] - w) for u in reporting])
    low, high = np.sort(norms)[:2]
    bound = float(low + high) / 2  # some users are clipped, some are not, none on the edge
    keys = tuple(Strategy(cfg).algorithm.shared(_template(cfg)))
    step = ClipUpdates(bound, keys, per_layer=False, count_unclipped=True)
    got = ray_session.get(actor.train.remote(w0, reporting, 1, per_user=True, postprocess=step))
    for u, norm in zip(reporting, norms, strict=True):
        update = got.per_user[u] - w
        assert np.linalg.norm(update) <= bound * (1 + 1e-5)
        np.testing.assert_allclose(
            update, (plain.per_user[u] - w) * min(1.0, bound / norm), rtol=1e-4, atol=1e-7
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
    updates = [plain.per_user[u] - w for u in reporting]
    clipped = np.mean([_clipped(d, module.BOUND) for d in updates], axis=0)
    expected = w + clipped + module.shift(w.size)
    np.testing.assert_allclose(saved.server.weights, expected, rtol=1e-5, atol=1e-6)
    on_the_mean = w + _clipped(np.mean(updates, axis=0), module.BOUND) + module.shift(w.size)
    assert not np.allclose(saved.server.weights, on_the_mean, rtol=1e-5, atol=1e-6)
    assert saved.server.extra["rounds"].tolist() == [1.0]
