"""Rounds in spans: a method whose server's model never moves (`fixed_server`: Local)
sends each actor the rounds up to the next evaluation or checkpoint in one call, and
gets the numbers of one call a round, on a real local Ray."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from perfed_ray.analysis import read_table
from perfed_ray.api import simulate
from perfed_ray.config import from_mapping
from perfed_ray.runtime import rounds, simulation

PLUGINS = Path(__file__).resolve().parent / "plugins"
LOCAL = {
    "dataset": "gaussian",
    "algorithm": "local",
    "n_users": 6,
    "fraction": 0.5,
    "rounds": 12,
    "tau": 5,
    "beta": 0.2,
    "eval_every": 4,
    "checkpoint_every": 6,
    "final_eval_draws": 2,
    "users_per_actor": 3,
}
ROUND_KEYS = ["round", "users", "n_sampled", "n_reported", "train_loss"]
EVAL_KEYS = ["round", "user", "draw", "acc_before", "acc_after", "loss_before", "loss_after"]


def _run(out: Path, **values) -> tuple[pd.DataFrame, pd.DataFrame]:
    simulate(from_mapping({**LOCAL, **values}), out, progress=False)
    evals = read_table(out, "evals").sort_values(["round", "user", "draw"], ignore_index=True)
    return read_table(out, "rounds"), evals


def test_a_span_ends_at_the_next_evaluation_checkpoint_or_last_round():
    cfg = from_mapping({**LOCAL, "eval_every": 4, "checkpoint_every": 6})
    assert [rounds.span_of(cfg, k, 100) for k in (1, 5, 7, 9)] == [
        [1, 2, 3, 4],
        [5, 6],
        [7, 8],
        [9, 10, 11, 12],
    ]
    assert rounds.span_of(cfg, 1, 1) == [1] and rounds.span_of(cfg, 9, 2) == [9, 10]
    late = from_mapping({**LOCAL, "eval_every": 1, "eval_from": 10, "checkpoint_every": 20})
    assert rounds.span_of(late, 1, 100) == list(range(1, 11))  # no evaluation before 10
    assert rounds.span_of(late, 11, 100) == [11]


@pytest.mark.slow
def test_a_fixed_servers_rounds_go_in_spans_with_the_numbers_of_single_rounds(
    ray_session, tmp_path, monkeypatch
):
    monkeypatch.setattr(rounds, "SPAN_SECONDS", 1e9)  # every span as long as it may be
    spans, spans_evals = _run(tmp_path / "spans", trained_users="all")
    monkeypatch.setattr(rounds, "SPAN_SECONDS", 0.0)  # one round a call
    single, single_evals = _run(tmp_path / "single", trained_users="all")
    pd.testing.assert_frame_equal(spans[ROUND_KEYS], single[ROUND_KEYS])
    pd.testing.assert_frame_equal(spans_evals[EVAL_KEYS], single_evals[EVAL_KEYS])
    # A span's weights go out once, with its first round: rounds 1, 2, 5, 7, 9 start one
    # (round 1 alone, then spans end at evaluations 4, 8, 12 and checkpoints 6, 12). It
    # sends what a single round sends, the model (float32) to each of the two actors,
    # and its other rounds send nothing; every round's sums (float64) come back alike.
    users = list(range(LOCAL["n_users"]))
    prepared = simulation.prepare(from_mapping(LOCAL))
    w_0 = simulation.initial_weights(prepared.cfg, prepared.source(users))
    assert single["bytes_sent"].tolist() == [2 * w_0.nbytes] * LOCAL["rounds"]
    starts = [1, 2, 5, 7, 9]
    assert spans["bytes_sent"].tolist() == [
        2 * w_0.nbytes if r in starts else 0 for r in spans["round"]
    ]
    assert spans["bytes_received"].tolist() == [2 * 2 * w_0.nbytes] * LOCAL["rounds"]
    assert single["bytes_received"].tolist() == spans["bytes_received"].tolist()


@pytest.mark.slow
def test_an_actor_killed_inside_a_span_rolls_the_run_back_to_the_same_numbers(
    ray_session, tmp_path, monkeypatch
):
    monkeypatch.setattr(rounds, "SPAN_SECONDS", 1e9)  # spans 1, 2-4, 5-6, 7-8, 9-12
    reference = _run(tmp_path / "reference")
    monkeypatch.setenv("PERFED_FAULT", "actor@3")  # actor 0, inside the span of rounds 2-4
    rolled = _run(tmp_path / "rolled")
    events = read_table(tmp_path / "rolled", "events")
    assert events["kind"].tolist() == ["actor-died"] and events["round"].iloc[0] == 2
    pd.testing.assert_frame_equal(reference[0][ROUND_KEYS], rolled[0][ROUND_KEYS])
    pd.testing.assert_frame_equal(reference[1][EVAL_KEYS], rolled[1][EVAL_KEYS])


@pytest.mark.slow
def test_a_method_that_declares_a_fixed_server_but_moves_it_is_stopped(
    ray_session, tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(PLUGINS))
    with pytest.raises(RuntimeError, match="declares fixed_server, but its server's model moved"):
        _run(tmp_path, algorithm="drifting:Drifting", rounds=3)
    assert read_table(tmp_path, "runs")["status"].iloc[0] == "failed"
