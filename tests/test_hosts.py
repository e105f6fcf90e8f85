"""Warm hosts (perfed_ray/runtime/hosts.py): a finished run's actor processes host the
next run of the same driver that asks Ray for the same share, with the rows of new
actors; a run asking for another share lets them go first; a failed run's actors end."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import DIVERGES, TINY

from perfed_ray.analysis import read_table
from perfed_ray.api import simulate
from perfed_ray.runtime import hosts
from perfed_ray.runtime.rounds import Diverged

# Two actors of three users, with per-user state (Ditto): what a host holds of a run
# must not reach the next one.
RUN = {**TINY, "algorithm": "ditto", "n_users": 6, "users_per_actor": 3, "rounds": 6}


def _run(values: dict, out) -> tuple[list[int], dict[str, pd.DataFrame]]:
    simulate(values, out, progress=False)
    pids = read_table(out, "actors").sort_values("actor")["pid"].tolist()
    tables = {
        "rounds": read_table(out, "rounds")[["round", "users", "train_loss"]].assign(
            users=lambda t: t["users"].map(tuple)
        ),
        "evals": read_table(out, "evals")[["round", "draw", "user", "loss_after", "acc_after"]],
    }
    return pids, tables


@pytest.mark.slow
def test_the_next_run_with_the_same_share_is_hosted_by_the_same_processes_to_the_same_rows(
    ray_session, tmp_path
):
    hosts.release()  # new processes for the first run, whatever ran before
    fresh, first = _run(RUN, tmp_path / "first")
    warm, second = _run(RUN, tmp_path / "second")
    assert set(warm) == set(fresh) and len(set(warm)) == 2  # the same two processes
    for name, table in first.items():
        pd.testing.assert_frame_equal(table, second[name])

    # Another share (one actor of six users) lets the idle ones go and starts anew.
    other, _ = _run({**RUN, "users_per_actor": 6, "num_cpus_per_actor": 2}, tmp_path / "other")
    assert not set(other) & set(warm)
    # (Had they kept the session's two CPUs, this run could not have started.)


@pytest.mark.slow
def test_a_run_that_fails_ends_its_actors_instead_of_keeping_them(ray_session, tmp_path):
    hosts.release()
    with pytest.raises(Diverged):
        simulate(DIVERGES, tmp_path / "failed", progress=False)
    assert not hosts._idle  # nothing kept of a run that did not finish
    simulate(RUN, tmp_path / "next", progress=False)  # on new processes
    assert hosts._idle
