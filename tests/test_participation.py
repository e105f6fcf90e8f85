"""Who trains and who is drawn: every user training while the sampled ones are
aggregated (`trained_users: all`), and users drawn in proportion to their samples
(`sampling: samples`)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

import perfed_ray
from perfed_ray.analysis import MEASURED
from perfed_ray.config import ConfigError, from_mapping, revise
from perfed_ray.runtime import simulation
from perfed_ray.strategy import Strategy
from tests.conftest import TINY

SPREAD = {**TINY, "n_users": 6, "fraction": 1 / 6, "rounds": 3, "eval_every": 3}


def _tables(result) -> dict[str, pd.DataFrame]:
    rounds = result.table("rounds").drop(columns=[*MEASURED, "bytes_received"])
    evals = result.table("evals").sort_values(["round", "user", "draw"]).reset_index(drop=True)
    return {"rounds": rounds.drop(columns="trained_users"), "evals": evals[["acc_after"]]}


@pytest.mark.slow
def test_every_user_training_leaves_a_stateless_methods_numbers_unchanged(ray_session, tmp_path):
    """FedAvg keeps no per-user state, so users trained but not aggregated change
    nothing: the aggregate is the sampled users' alone."""
    runs = {
        who: perfed_ray.simulate(
            {**SPREAD, "algorithm": "fedavg", "trained_users": who}, tmp_path / who
        )
        for who in ("sampled", "all")
    }
    sampled, every = (_tables(runs[w]) for w in ("sampled", "all"))
    pd.testing.assert_frame_equal(sampled["rounds"], every["rounds"])
    pd.testing.assert_frame_equal(sampled["evals"], every["evals"])
    # The model (float32) out to each actor called: the one sampled user's actor, or
    # every user's (both of them).
    users = list(range(SPREAD["n_users"]))
    prepared = simulation.prepare(from_mapping({**SPREAD, "algorithm": "fedavg"}))
    w_0 = simulation.initial_weights(prepared.cfg, prepared.source(users))
    actors = runs["all"].table("actors")
    assert sorted(u for block in actors["users"] for u in block) == users and len(actors) == 2
    sent = {w: runs[w].table("rounds")["bytes_sent"].tolist() for w in runs}
    assert sent["sampled"] == [w_0.nbytes] * SPREAD["rounds"]
    assert sent["all"] == [len(actors) * w_0.nbytes] * SPREAD["rounds"]


@pytest.mark.slow
def test_every_user_training_moves_every_users_own_model(ray_session, tmp_path):
    """Local training's users keep their models: with one user a round, only the users
    drawn have moved from w_0 after three rounds, unless every user trains every round."""
    moved, results = {}, {}
    for who in ("sampled", "all"):
        result = results[who] = perfed_ray.simulate(
            {**SPREAD, "algorithm": "local", "trained_users": who, "users_per_actor": 3},
            tmp_path / who,
        )
        final = result.table("evals").query("final and draw == 0")
        personal = np.array([steps[0] for steps in final["loss_steps"]])
        moved[who] = set(final.loc[personal != final["loss_before"].to_numpy(), "user"])
    drawn = {u for users in results["sampled"].table("rounds")["users"] for u in users}
    assert moved["all"] == set(range(6))
    assert moved["sampled"] == drawn and len(drawn) <= 3


def test_users_are_drawn_in_proportion_to_their_samples():
    cfg = from_mapping({**TINY, "n_users": 4, "fraction": 0.25, "sampling": "samples"})
    sizes = np.array([10, 10, 10, 970])
    strategy = Strategy(cfg, sizes)
    counts = Counter(u for r in range(400) for u in strategy.sample(r))
    assert counts[3] > 360  # p = 0.97
    assert strategy.sample(5) == Strategy(cfg, sizes).sample(5)  # the round's own stream
    uniformly = Strategy(revise(cfg, sampling="uniform"))
    uniform = Counter(u for r in range(400) for u in uniformly.sample(r))
    assert uniform[3] < 140
    with pytest.raises(ValueError, match="training sizes"):
        Strategy(cfg).sample(0)


def test_sampling_by_samples_never_draws_an_unseen_user():
    cfg = from_mapping(
        {**TINY, "n_users": 10, "fraction": 0.3, "sampling": "samples", "unseen_users": 0.2}
    )
    strategy = Strategy(cfg, np.arange(1, 11) * 10)
    drawn = {u for r in range(100) for u in strategy.sample(r)}
    assert drawn.isdisjoint(strategy.unseen()) and len(drawn) == 8


@pytest.mark.slow
def test_a_run_drawn_by_samples_records_it(ray_session, tmp_path):
    result = perfed_ray.simulate({**TINY, "sampling": "samples"}, tmp_path)
    assert result.table("runs")["sampling"].tolist() == ["samples"]
    # each round's users are those drawn in proportion to the training sizes the run
    # recorded for them (its evals rows)
    evals = result.table("evals").drop_duplicates("user").sort_values("user")
    assert evals["user"].tolist() == list(range(TINY["n_users"]))
    strategy = Strategy(from_mapping({**TINY, "sampling": "samples"}), evals["n_train"].to_numpy())
    for row in result.table("rounds").itertuples():
        assert sorted(row.users) == sorted(strategy.sample(row.round)), row.round
    with pytest.raises(ConfigError, match="trained_users = 'some' is not allowed"):
        from_mapping({"trained_users": "some"})
