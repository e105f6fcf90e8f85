"""Placement planning, Synthetic(alpha, beta) and Synthetic-IID users, and generated-data
runs on Ray."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import each_users_model, round_sum

import perfed_ray
from perfed_ray.api import simulate
from perfed_ray.config import ConfigError, from_mapping, revise
from perfed_ray.data.synthetic import synthetic_iid_user, synthetic_user
from perfed_ray.runtime import simulation
from perfed_ray.runtime.launch import actor_factory
from perfed_ray.runtime.placement import plan, spread


def test_auto_placement_sizes_the_pool_from_the_cluster():
    cfg = from_mapping({"n_users": 10_000, "users_per_actor": "auto"})
    p = plan(cfg, [{"CPU": 2.0}])
    assert (len(p.blocks), p.num_cpus, p.num_gpus) == (2, 1.0, 0.0)
    assert [len(b) for b in p.blocks] == [5000, 5000]
    # At most 4 actors share a GPU where both requests are auto (GPU time-slicing).
    p = plan(cfg, [{"CPU": 16.0, "GPU": 2.0}])
    assert (len(p.blocks), p.num_cpus, p.num_gpus) == (8, 1.0, 0.25)
    p = plan(cfg, [{"CPU": 16.0, "GPU": 0.5}])  # a sweep trial's share of a GPU
    assert (len(p.blocks), p.num_gpus) == (2, 0.25)
    p = plan(revise(cfg, num_gpus_per_actor=0.125), [{"CPU": 16.0, "GPU": 2.0}])
    assert (len(p.blocks), p.num_gpus) == (16, 0.125)
    p = plan(revise(cfg, num_cpus_per_actor=1.0), [{"CPU": 16.0, "GPU": 2.0}])
    assert (len(p.blocks), p.num_gpus) == (16, 0.125)
    p = plan(revise(cfg, num_gpus_per_actor=0.5), [{"CPU": 16.0, "GPU": 2.0}])
    assert (len(p.blocks), p.num_gpus) == (4, 0.5)
    p = plan(revise(cfg, num_cpus_per_actor=0.25), [{"CPU": 2.0}])
    assert len(p.blocks) == 8
    # A CPU head and CPU workers beside GPU workers: GPU-sharing actors fit on the GPU
    # nodes only, so only their CPUs count.
    mixed = [{"CPU": 8.0}, {"CPU": 16.0}, {"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 1.0}]
    p = plan(cfg, mixed)
    assert (len(p.blocks), p.num_cpus, p.num_gpus) == (8, 1.0, 0.25)
    p = plan(revise(cfg, num_gpus_per_actor=0.0), mixed)
    assert (len(p.blocks), p.num_gpus) == (32, 0.0)


def test_fixed_users_per_actor_shares_the_cluster_among_actors():
    p = plan(from_mapping({"n_users": 50, "users_per_actor": 1}), [{"CPU": 2.0, "GPU": 1.0}])
    assert (len(p.blocks), p.num_cpus, p.num_gpus) == (50, 0.04, 0.02)
    p = plan(from_mapping({"n_users": 50, "users_per_actor": 25}), [{"CPU": 2.0}])
    assert (len(p.blocks), p.num_cpus) == (2, 1.0)


def test_spread_covers_every_user_once_in_near_equal_blocks():
    blocks = spread(10, 3)
    assert sorted(u for b in blocks for u in b) == list(range(10))
    assert {len(b) for b in blocks} <= {3, 4}
    assert spread(2, 5) == [range(0, 1), range(1, 2)]


def test_synthetic_users_are_a_function_of_seed_and_id():
    a = synthetic_user(0, 1.0, 1.0, 7)
    b = synthetic_user(0, 1.0, 1.0, 7)
    c = synthetic_user(0, 1.0, 1.0, 8)
    d = synthetic_user(1, 1.0, 1.0, 7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0][:5], c[0][:5])  # another user
    assert not np.array_equal(a[0][:5], d[0][:5])  # another seed
    sizes = [
        len(synthetic_user(0, 1.0, 1.0, u)[1]) + len(synthetic_user(0, 1.0, 1.0, u)[3])
        for u in range(200)
    ]
    assert min(sizes) >= 50 and max(sizes) > 5 * np.median(sizes)  # power law
    x_train, y_train, _, _ = a
    assert x_train.shape[1] == 60 and x_train.dtype == np.float32
    assert set(np.unique(y_train)) <= set(range(10))


def test_synthetic_needs_its_natural_partition():
    with pytest.raises(ConfigError, match="need partition: natural"):
        from_mapping({"dataset": "synthetic"})
    with pytest.raises(ConfigError, match="does not fit"):
        from_mapping({"dataset": "mnist", "partition": "natural"})


@pytest.mark.slow
def test_synthetic_run_generates_users_inside_actors(ray_session, tmp_path):
    cfg = from_mapping(
        {
            "dataset": "synthetic",
            "partition": "natural",
            "n_users": 40,
            "fraction": 0.25,
            "rounds": 6,
            "eval_every": 3,
            "tau": 5,
            "beta": 0.05,
            "alpha": 0.01,
            "users_per_actor": "auto",
            "final_eval_draws": 1,
        }
    )
    prepared = simulation.prepare(cfg)
    assert prepared.data is None  # nothing about the data on the driver
    simulate(prepared.cfg, tmp_path, progress=False)
    evals = pd.read_parquet(tmp_path / "evals")
    final = evals[evals["final"]].set_index("user")
    for u in (0, 17, 39):
        x_train, _, x_test, _ = synthetic_user(0, 1.0, 1.0, u)
        assert final.loc[u, "n_train"] == len(x_train) and final.loc[u, "n_test"] == len(x_test)
    runs = pd.read_parquet(tmp_path / "runs")
    assert runs["n_actors"].iloc[0] == 2
    assert runs["startup_seconds"].iloc[0] > 0
    assert runs["actors_peak_memory_bytes"].iloc[0] > runs["driver_peak_memory_bytes"].iloc[0] / 10
    acc = evals.groupby("round")["acc_after"].mean()
    assert acc[6] > acc[0]


@pytest.mark.slow
def test_actor_batched_update_matches_the_learner_one_user_at_a_time(ray_session):
    """The fused path inside an actor gives each user what the sequential learner gives."""
    import torch

    from perfed_ray.learner import Learner
    from perfed_ray.models import FlatParams, build_model, params_of
    from perfed_ray.runtime.placement import Placement

    cfg = from_mapping(
        {
            "dataset": "gaussian",
            "n_users": 4,
            "fraction": 0.5,
            "tau": 3,
            "alpha": 0.05,
            "algorithm": "perfedavg",
            "engine": "fused",
        }
    )
    prepared = simulation.prepare(cfg)
    actor = actor_factory(prepared, Placement([[0, 1, 2, 3]], 1.0, 0.0))(0, 0)
    source = prepared.source([0, 1, 2, 3])
    weights = simulation.initial_weights(cfg, source)
    result = round_sum(ray_session, actor, weights, [0, 2, 3], 5)
    each = each_users_model(ray_session, actor, weights, [0, 2, 3], 5)
    ray_session.kill(actor)

    model = build_model(cfg.model, source.input_shape, source.n_classes)
    flat = FlatParams(params_of(model))
    shards = source.shards([0, 2, 3], torch.device("cpu"), prepared.data)
    learner = Learner(revise(prepared.cfg, engine="sequential"), model, shards)
    models, _ = learner.train(flat.unflatten(weights), [0, 2, 3], 5)
    expected = {
        u: flat.flatten({k: v[i] for k, v in models.items()}) for i, u in enumerate((0, 2, 3))
    }
    assert result.weight == 3
    for u, vector in expected.items():
        np.testing.assert_allclose(each[u], vector, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.total, sum(expected.values()), rtol=1e-5, atol=1e-5)


def test_sample_weighted_aggregation_weights_each_user_by_its_training_samples(ray_session):
    """aggregation: samples (the strategy's weight, computed where the shard is): the
    actor's total is sum n_i w_i and its weight sum n_i."""
    from perfed_ray.runtime.placement import Placement

    cfg = from_mapping(
        {
            "dataset": "gaussian",
            "partition": "dirichlet",
            "n_users": 4,
            "fraction": 0.5,
            "tau": 2,
            "aggregation": "samples",
        }
    )
    prepared = simulation.prepare(cfg)
    actor = actor_factory(prepared, Placement([[0, 1, 2, 3]], 1.0, 0.0))(0, 0)
    weights = simulation.initial_weights(cfg, prepared.source([0]))
    result = round_sum(ray_session, actor, weights, [0, 1, 3], 1)
    each = each_users_model(ray_session, actor, weights, [0, 1, 3], 1)
    ray_session.kill(actor)
    n = {u: len(prepared.users[u].train) for u in (0, 1, 3)}
    assert len(set(n.values())) == 3  # Dirichlet shards differ in size
    assert result.weight == sum(n.values())
    expected = sum(n[u] * each[u] for u in n)
    np.testing.assert_allclose(result.total, expected, rtol=1e-6, atol=1e-6)


def _pooled_linear_accuracy(generate, users: range) -> float:
    """Training accuracy of one multinomial logistic regression fitted to the pooled
    training data of `users`: near 1 when one W, b labels everyone."""
    parts = [generate(0, 1.0, 1.0, u) for u in users]
    x = torch.from_numpy(np.concatenate([p[0] for p in parts]))
    y = torch.from_numpy(np.concatenate([p[1] for p in parts]))
    model = torch.nn.Linear(x.shape[1], 10)
    optimiser = torch.optim.LBFGS(model.parameters(), max_iter=200)

    def loss():
        optimiser.zero_grad()
        value = torch.nn.functional.cross_entropy(model(x), y)
        value.backward()
        return value

    optimiser.step(loss)
    return float((model(x).argmax(1) == y).float().mean())


def test_synthetic_iid_users_share_one_model_and_centre_while_synthetic_users_do_not():
    assert _pooled_linear_accuracy(synthetic_iid_user, range(20)) > 0.99
    assert _pooled_linear_accuracy(synthetic_user, range(20)) < 0.95
    means = np.stack([synthetic_iid_user(0, 1.0, 1.0, u)[0].mean(0) for u in range(20)])
    assert np.abs(means).max() < 1.0  # v = 0 for every user
    x_train, _, x_test, _ = synthetic_iid_user(0, 1.0, 1.0, 3)
    assert len(x_train) == int(0.8 * (len(x_train) + len(x_test)))  # the paper's 80/20


@pytest.mark.slow
def test_synthetic_iid_runs_with_logistic_regression(ray_session, tmp_path):
    result = perfed_ray.simulate(
        {
            "dataset": "synthetic-iid",
            "partition": "natural",
            "model": "logreg",
            "algorithm": "fedavg",
            "n_users": 20,
            "fraction": 0.5,
            "rounds": 20,
            "eval_every": 20,
            "tau": 5,
            "beta": 0.1,
            "final_eval_draws": 1,
        },
        tmp_path,
    )
    evals = result.table("evals")
    start = evals.loc[evals["round"] == 0, "acc_before"].mean()
    assert evals.loc[evals["final"], "acc_before"].mean() > start + 0.2  # it learns
    with pytest.raises(ConfigError, match="model = cnn needs images"):
        from_mapping({"dataset": "synthetic-iid", "partition": "natural", "model": "cnn"})
