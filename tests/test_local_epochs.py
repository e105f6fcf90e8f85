"""Local work in epochs: each user passes over its own shard, so users of different
sizes take different numbers of steps."""

from __future__ import annotations

import math

import pytest
import torch

import perfed_ray
from perfed_ray.config import ConfigError, from_mapping
from perfed_ray.data.batches import epoch_indices, steps_in
from perfed_ray.learner import Learner
from perfed_ray.models import initial_model
from perfed_ray.runtime import simulation
from tests.conftest import TINY


def test_each_epoch_is_a_permutation_of_the_shard_in_full_batches():
    idx = epoch_indices(0, user=3, round_=2, n=23, epochs=2, batch_size=5)
    assert idx.shape == (2 * 5, 1, 5) == (steps_in(23, 2, 99, 5), 1, 5)
    for epoch in idx.view(2, 25).tolist():
        assert set(epoch) == set(range(23))  # every sample once ...
        assert epoch[23:] == epoch[:2]  # ... and the last batch filled from the start
    assert not torch.equal(idx[:5], idx[5:])  # a fresh permutation each epoch
    assert torch.equal(idx, epoch_indices(0, 3, 2, 23, 2, 5))  # the user's own stream
    small = epoch_indices(0, 3, 2, n=3, epochs=1, batch_size=5)
    assert small.shape == (1, 1, 5) and set(small.flatten().tolist()) == {0, 1, 2}


def test_per_fedavg_keeps_tau_and_fedrep_splits_its_epochs():
    with pytest.raises(ConfigError, match="local_epochs = 2 does not apply to algorithm"):
        from_mapping({"algorithm": "perfedavg-hf", "local_epochs": 2})
    with pytest.raises(ConfigError, match=r"local_epochs = 3 is not fedrep\.head_epochs"):
        from_mapping({"algorithm": "fedrep", "local_epochs": 3})
    from_mapping({"algorithm": "fedrep", "local_epochs": 11})  # the authors' 10 + 1


def test_each_user_takes_its_own_epochs_of_steps_over_its_own_samples():
    """Counted by hand from each user's shard: ceil(n / B) batches an epoch, and each
    epoch's steps hold every one of the user's own samples."""
    cfg = from_mapping({**TINY, "algorithm": "fedavg", "local_epochs": 2, "batch_size": 60})
    prepared = simulation.prepare(cfg)
    users = list(range(cfg.n_users))
    source = prepared.source(users)
    shards = source.shards(users, torch.device("cpu"), prepared.data)
    learner = Learner(prepared.cfg, initial_model(prepared.cfg, source), shards)
    x, _, steps, _ = learner.block_batches(users, round_=1)
    sizes = [len(shards[u].y_train) for u in users]
    assert len(set(sizes)) > 1, "the partition gives users of different sizes"
    assert steps.tolist() == [2 * math.ceil(n / 60) for n in sizes]
    for u in users:
        own = x[u, : steps[u]].reshape(2, -1, *x.shape[4:])  # [epoch, samples, features]
        shard = {tuple(row) for row in shards[u].x_train.flatten(1).tolist()}
        for epoch in own:
            assert {tuple(row) for row in epoch.flatten(1).tolist()} == shard


@pytest.mark.slow
def test_a_run_in_epochs_masks_the_steps_users_do_not_take_as_a_loop_over_users_does(
    ray_session, tmp_path
):
    """The batched engine runs users of different step counts together, masking each
    one's steps past its own; its rows equal those of the sequential engine, which runs
    each user's own steps alone."""
    base = {**TINY, "algorithm": "fedrep", "local_epochs": 2, "batch_size": 60}
    base["fedrep"] = {"head_epochs": 1, "body_epochs": 1}
    result = perfed_ray.simulate({**base, "sgd": {"momentum": 0.5}}, tmp_path / "a")
    assert result.table("runs")["status"].tolist() == ["finished"]
    looped = perfed_ray.simulate(
        {**base, "sgd": {"momentum": 0.5}, "engine": "sequential"}, tmp_path / "b"
    )
    a, b = (
        r.table("rounds").sort_values("round")["train_loss"].to_numpy() for r in (result, looped)
    )
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-6)
