"""Evaluation personalises and scores users with the maths of the engine that trained
them: the fused and grouped engines' own stacked ops for a whole block (no per-user
autodiff), any other engine one user at a time under `vmap`. Both give the same scores,
for every method, in float64 (tests/test_engines.py says why) to torch's tolerances."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from conftest import in_float64
from test_engines import METHODS  # every method, a test plug-in's among them

from perfed_ray.config import from_mapping, revise
from perfed_ray.learner import Learner
from perfed_ray.models import initial_model, params_of
from perfed_ray.runtime import simulation

USERS = [0, 1, 2, 3, 4]
ROUND = 2


BASE = {"dataset": "gaussian", "n_users": len(USERS), "fraction": 1.0, "alpha": 0.05, "tau": 2}


@functools.cache
def _shards(model: str):
    """The users' shards (they depend on the data set alone), made once per model."""
    prepared = simulation.prepare(from_mapping({**BASE, "model": model}))
    source = prepared.source(USERS)
    return source, source.shards(USERS, torch.device("cpu"), prepared.data)


def _scores(name: str, values: dict, engine: str, model: str = "mlp"):
    """Every user's scores after one round of training on the sequential engine (so
    stateful methods score their users' own states), evaluated with `engine`."""
    cfg = from_mapping(
        {**BASE, "model": model, "beta": 0.1, "personalise_steps": 2, "algorithm": name, **values}
    )
    source, shards = _shards(model)
    trained, shards = in_float64(initial_model(cfg, source), shards)
    server = params_of(trained)
    trainer = Learner(revise(cfg, engine="sequential"), trained, shards)
    trainer.train(server, USERS, ROUND)
    scoring = initial_model(cfg, source).double()
    learner = Learner(revise(cfg, engine=engine), scoring, shards, trainer.state_vectors())
    assert (learner.engine.ops is None) == (engine in ("vmap", "sequential"))
    table = learner.evaluate(server, USERS, ROUND + 1, 2).to_pandas()
    return table, np.stack(table["acc_steps"]), np.stack(table["loss_steps"])


_VMAPS: dict[tuple, tuple] = {}


def _vmaps(name: str, values: dict, model: str = "mlp"):
    """:func:`_scores` on `vmap`, the reference every engine's evaluation is compared
    with: made once per method, for all the engines compared with it."""
    key = (name, repr(sorted(values.items())), model)
    if key not in _VMAPS:
        _VMAPS[key] = _scores(name, values, "vmap", model)
    return _VMAPS[key]


def _assert_same(got, expected):
    table, accs, losses = got
    then, then_accs, then_losses = expected
    assert table[["user", "draw"]].equals(then[["user", "draw"]])
    torch.testing.assert_close(losses, then_losses)
    torch.testing.assert_close(np.array(table["loss_before"]), np.array(then["loss_before"]))
    torch.testing.assert_close(accs, then_accs)


@pytest.mark.parametrize(("name", "values"), METHODS)
def test_the_fused_engines_evaluation_equals_vmaps(name, values):
    _assert_same(_scores(name, values, "fused"), _vmaps(name, values))


@pytest.mark.parametrize("name", ["fedavg", "perfedavg-hf", "fedrep", "apfl"])
def test_the_grouped_engines_evaluation_equals_vmaps(name):
    values = {"tau": 3} if name == "fedrep" else {}
    _assert_same(_scores(name, values, "grouped", model="cnn"), _vmaps(name, values, "cnn"))


@pytest.mark.parametrize(("name", "values"), METHODS)
def test_the_sequential_engines_evaluation_one_user_at_a_time_equals_vmaps(name, values):
    _assert_same(_scores(name, values, "sequential"), _vmaps(name, values))
