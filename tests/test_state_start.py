"""Where a user's first per-user state starts: Ditto's personal model
(`ditto.personal_start`) and FedRep's head (`fedrep.head_start`) from the global model
of the round the user first trains in (`global`; a user that never trained is scored
on it), or from the run's initial model w_0 (`initial`), made on the actor from the
run's seed; on every engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import round_sum

from perfed_ray.algorithms import client_update
from perfed_ray.algorithms.fedrep import head_keys
from perfed_ray.config import from_mapping
from perfed_ray.engines.base import steps_of
from perfed_ray.engines.functional import FunctionalOps
from perfed_ray.learner import Learner
from perfed_ray.models import FlatParams, build_model, initial_model, params_of
from perfed_ray.runtime import simulation
from perfed_ray.runtime.launch import actor_factory
from perfed_ray.runtime.placement import Placement

USERS = [0, 1, 2, 3]
ROUND = 3  # a later round: its global model is not w_0
SETTINGS = {"ditto": "personal_start", "fedrep": "head_start"}


def _prepared(name: str, start: str, engine: str = "sequential"):
    cfg = from_mapping(
        {
            "dataset": "gaussian",
            "n_users": len(USERS),
            "fraction": 0.5,
            "tau": 3,
            "beta": 0.2,
            "algorithm": name,
            name: {SETTINGS[name]: start},
            "engine": engine,
        }
    )
    return simulation.prepare(cfg)


def _learner(prepared) -> Learner:
    source = prepared.source(USERS)
    shards = source.shards(USERS, torch.device("cpu"), prepared.data)
    return Learner(prepared.cfg, initial_model(prepared.cfg, source), shards)


def _global(prepared) -> dict[str, torch.Tensor]:
    """A global model of a later round: any weights other than w_0's."""
    source = prepared.source(USERS)
    return params_of(build_model(prepared.cfg.model, source.input_shape, source.n_classes, 7))


def _personal_model(name: str, start_model: dict, server: dict) -> dict:
    """The model a never-trained user is scored on: Ditto's v, or FedRep's head over the
    server's body."""
    if name == "ditto":
        return start_model
    head = set(head_keys(server))
    return {k: start_model[k] if k in head else v for k, v in server.items()}


def _states_after(learner: Learner, server: dict, start_model: dict) -> list[dict]:
    """Each user's state after one round from `start_model`'s state, one user at a time."""
    algorithm, ops = learner.algorithm, FunctionalOps(learner.model)
    x, y, *_ = learner.block_batches(USERS, ROUND)
    first = algorithm.init_user_state(start_model)
    return [
        client_update(algorithm, ops, server, steps_of(x[i], y[i]), first)[2]
        for i in range(len(USERS))
    ]


def _close(a: dict, b: dict) -> bool:
    return all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)


def _other(start: str) -> str:
    return "global" if start == "initial" else "initial"


@pytest.mark.parametrize("start", ["global", "initial"])
@pytest.mark.parametrize("name", ["ditto", "fedrep"])
def test_a_user_never_trained_is_scored_from_the_global_model_or_from_w0(name, start):
    prepared = _prepared(name, start)
    learner, server = _learner(prepared), _global(prepared)
    w0 = params_of(initial_model(prepared.cfg, prepared.source(USERS)))
    firsts = {
        "global": _personal_model(name, server, server),
        "initial": _personal_model(name, w0, server),
    }
    own = {  # each candidate's own scores, as the server's model
        s: learner.evaluate(model, USERS, ROUND, 1)["loss_before"].to_numpy()
        for s, model in firsts.items()
    }
    curves = learner.evaluate(server, USERS, ROUND, 1)["loss_steps"].to_pylist()
    got = np.array([curve[0] for curve in curves])  # the personal model before any step
    np.testing.assert_allclose(got, own[start], rtol=1e-5)
    assert not np.allclose(got, own[_other(start)], rtol=1e-3)


@pytest.mark.parametrize("engine", ["sequential", "vmap", "fused"])
@pytest.mark.parametrize("start", ["global", "initial"])
@pytest.mark.parametrize("name", ["ditto", "fedrep"])
def test_a_users_first_round_trains_from_the_global_model_or_from_w0(name, start, engine):
    prepared = _prepared(name, start, engine)
    learner, server = _learner(prepared), _global(prepared)
    w0 = params_of(initial_model(prepared.cfg, prepared.source(USERS)))
    learner.train(server, USERS, ROUND)
    vectors = learner.state_vectors()
    got = [learner.state_layout.unflatten(vectors[u]) for u in USERS]
    expected = {
        s: _states_after(learner, server, m) for s, m in (("global", server), ("initial", w0))
    }
    assert all(_close(g, e) for g, e in zip(got, expected[start], strict=True))
    assert not any(_close(g, e) for g, e in zip(got, expected[_other(start)], strict=True))


@pytest.mark.parametrize("name", ["ditto", "fedrep"])
def test_the_actor_makes_the_drivers_w0_from_the_seed(ray_session, name):
    """A user first trained in a later round on a real actor starts from the w_0 the
    driver made for the run, not from the actor's own draw."""
    prepared = _prepared(name, "initial", "fused")
    server = _global(prepared)
    flat = FlatParams(server)
    actor = actor_factory(prepared, Placement([USERS], 1.0, 0.0))(0, 0)
    round_sum(ray_session, actor, flat.flatten(server), USERS, ROUND)
    vectors = ray_session.get(actor.user_states.remote())
    ray_session.kill(actor)
    w0 = flat.unflatten(simulation.initial_weights(prepared.cfg, prepared.source(USERS)))
    learner = _learner(prepared)
    expected = _states_after(learner, server, w0)
    layout = FlatParams(expected[0])
    got = [layout.unflatten(vectors[u]) for u in USERS]
    assert all(_close(g, e) for g, e in zip(got, expected, strict=True))
