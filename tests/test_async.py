"""The simulated clock and the servers on it (issue 43): a synchronous round lasts as
long as its slowest kept user, over-commitment keeps the first to arrive, deadlines and
users going offline cut tasks; FedBuff aggregates K arrivals in time order weighted by
1/sqrt(1 + staleness), FedAsync mixes each arrival in; FedBuff whose tasks all start
from the current model is FedAvg, row for row; rows do not depend on placement or
engine, and a run SIGKILLed mid-run resumes to the same tables."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from conftest import each_users_model, killed_mid_round

from perfed_ray.analysis import OUTCOME, outcome, read_table
from perfed_ray.api import simulate
from perfed_ray.asynchronous import FedAsync, FedBuff, staleness_weight
from perfed_ray.cli import main
from perfed_ray.clock import Schedule, Timing
from perfed_ray.config import from_mapping
from perfed_ray.errors import ConfigError
from perfed_ray.population.devices import Device, task_seconds
from perfed_ray.strategy import ServerState, Step, Strategy

SPEEDS = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]  # ms per sample of users 0 to 5
SAMPLES = 2 * 40  # FedAvg's task: tau = 2 batches of 40
CLOCK = {
    "dataset": "gaussian",
    "n_users": 6,
    "fraction": 0.5,
    "tau": 2,
    "algorithm": "fedavg",
    "devices": "table",
}


def _devices(tmp_path, speeds=SPEEDS) -> str:
    path = tmp_path / "devices.csv"
    pd.DataFrame(
        {
            "user": range(len(speeds)),
            "compute_ms_per_sample": speeds,
            "download_kbps": 1e6,
            "upload_kbps": 1e6,
        }
    ).to_csv(path, index=False)
    return str(path)


def _seconds(user: int, model_bytes: int = 1000) -> float:
    return task_seconds(Device(SPEEDS[user], 1e6, 1e6), model_bytes, model_bytes, SAMPLES)


def _clock(tmp_path, **values):
    """A configuration, its strategy, timing and a clock at 0."""
    cfg = from_mapping({**CLOCK, "devices.file": _devices(tmp_path), **values})
    policy = {"uniform": Strategy, "fedbuff": FedBuff, "fedasync": FedAsync}[cfg.strategy]
    return cfg, policy(cfg), Timing(cfg, lambda u: 100, 1000), Schedule()


def test_a_round_lasts_as_long_as_its_slowest_user_and_the_next_starts_then(tmp_path):
    _, strategy, timing, schedule = _clock(tmp_path)
    first = strategy.next_step(1, schedule, timing)
    assert first.time == max(_seconds(u) for u in first.users) == schedule.now
    assert [t.outcome for t in first.resolved] == ["aggregated"] * 3
    assert first.reporting == first.users == first.trained
    second = strategy.next_step(2, schedule, timing)
    assert {t.start for t in second.resolved} == {first.time}
    assert second.time == first.time + max(_seconds(u) for u in second.users)
    assert [t.version for t in second.resolved] == [1, 1, 1]


def test_over_commitment_keeps_the_first_to_arrive(tmp_path):
    _, strategy, timing, schedule = _clock(tmp_path, overcommit=2.0)
    step = strategy.next_step(1, schedule, timing)
    assert step.users == list(range(6))  # ceil(2 * 3): everyone
    assert step.reporting == [0, 1, 2]  # the three fastest
    outcomes = {t.user: t.outcome for t in step.resolved}
    assert outcomes == {
        0: "aggregated",
        1: "aggregated",
        2: "aggregated",
        3: "late",
        4: "late",
        5: "late",
    }
    assert step.time == _seconds(2)  # the third arrival ends the round


def test_a_deadline_cuts_slow_tasks_and_the_round_waits_for_it(tmp_path):
    deadline = (_seconds(2) + _seconds(3)) / 2
    _, strategy, timing, schedule = _clock(tmp_path, fraction=1.0, deadline=deadline)
    step = strategy.next_step(1, schedule, timing)
    late = [t for t in step.resolved if t.outcome == "late"]
    assert [t.user for t in late] == [3, 4, 5]
    assert {t.end for t in late} == {deadline}
    assert step.reporting == [0, 1, 2]
    assert step.time == deadline  # fewer than the cohort arrived: it waited it out


def test_a_user_going_offline_mid_task_is_lost(tmp_path):
    online = tmp_path / "online.csv"
    rows = [(u, 0.0, 1000.0) for u in range(5)] + [(5, 0.0, 1.0), (5, 2.0, 1000.0)]
    pd.DataFrame(rows, columns=["user", "start", "end"]).to_csv(online, index=False)
    avail = {
        "availability": "table",
        "availability.file": str(online),
        "availability.period": 1000.0,
    }
    _, strategy, timing, schedule = _clock(tmp_path, fraction=1.0, **avail)
    step = strategy.next_step(1, schedule, timing)
    lost = {t.user: (t.outcome, t.end) for t in step.resolved if t.outcome != "aggregated"}
    assert lost == {5: ("offline", 1.0)}
    assert step.reporting == [0, 1, 2, 3, 4]
    # At 1.5 s user 5 is offline: a round starting then does not draw it.
    schedule.now = 1.5
    assert 5 not in strategy.next_step(2, schedule, timing).users


def test_fedbuff_aggregates_k_arrivals_in_time_order_weighted_by_staleness(tmp_path):
    fedbuff = {"strategy": "fedbuff", "fedbuff.concurrency": 3, "fedbuff.buffer_size": 2}
    _, strategy, timing, schedule = _clock(tmp_path, **fedbuff)
    tasks, before = {}, 0.0
    for round_ in range(1, 9):
        step = strategy.next_step(round_, schedule, timing)
        aggregated = [t for t in step.resolved if t.outcome == "aggregated"]
        tasks.update({t.id: t for t in step.resolved})
        assert len(aggregated) == 2 and step.users == [t.user for t in aggregated]
        ends = [(t.end, t.id) for t in aggregated]
        assert ends == sorted(ends) and before <= ends[0][0] and ends[-1][0] == step.time
        for t, (id_, factor) in zip(aggregated, step.summed, strict=True):
            staleness = round_ - 1 - t.version
            assert t.id == id_ and t.row()["staleness"] == staleness >= 0
            assert factor == pytest.approx(1 / math.sqrt(1 + staleness))
        # Concurrency kept: the slots freed at the step's instant refill after its step.
        freed = sum(t.end == step.time for t in step.resolved)
        assert len(schedule.flight) + freed == 3 == step.metrics["in_flight"] + freed
        before = step.time
    # Every task that ended before a step's time was in by then: time order, no skips.
    done = sorted(tasks.values(), key=lambda t: (t.end, t.id))
    assert [t.round for t in done] == sorted(t.round for t in done)
    assert max(t.row()["staleness"] for t in done) > 0  # fast users lap slow ones


def test_updates_staler_than_max_staleness_are_thrown_away(tmp_path):
    values = {"fedbuff.concurrency": 3, "fedbuff.buffer_size": 1, "fedbuff.max_staleness": 0}
    _, strategy, timing, schedule = _clock(tmp_path, strategy="fedbuff", **values)
    steps = [strategy.next_step(r, schedule, timing) for r in range(1, 7)]
    late = [t for step in steps for t in step.resolved if t.outcome == "late"]
    assert late and all(t.round is None for t in late)
    assert sorted(t.id for t in late) == sorted(i for step in steps for i in step.discard)
    assert {s for step in steps for _, s in step.summed} == {1.0}  # all fresh


def test_staleness_functions():
    assert staleness_weight("constant", 7, 0.5, 10, 4) == 1.0
    assert staleness_weight("polynomial", 3, 0.5, 10, 4) == 0.5
    assert staleness_weight("hinge", 4, 0.5, 10, 4) == 1.0
    assert staleness_weight("hinge", 6, 0.5, 10, 4) == 1 / 21


def _state(strategy) -> ServerState:
    import torch

    return strategy.init({"w": torch.tensor([1.0, 2.0, 4.0])})


def _step(summed) -> Step:
    return Step(1, [0], [], None, [], summed, [], True, 0.0, 0, [])


def test_fedasync_mixes_the_users_model_in_by_alpha_times_staleness(tmp_path):
    _, strategy, _, _ = _clock(tmp_path, strategy="fedasync", **{"fedasync.alpha": 0.5})
    state = _state(strategy)
    x = np.array([3.0, 2.0, 0.0])
    s = staleness_weight("polynomial", 3, 0.5, 10, 4)
    new = strategy.server_step(_step([(0, s)]), state, 2 * x, 2.0, 0.0)
    mix = 0.5 * s
    np.testing.assert_allclose(new.weights, (1 - mix) * state.weights + mix * x, rtol=1e-6)


def test_fedbuffs_step_adds_the_weighted_mean_update_to_the_current_model(tmp_path):
    _, strategy, _, _ = _clock(tmp_path, strategy="fedbuff")
    state = _state(strategy)
    w = state.weights.astype(np.float64)
    fresh = np.array([2.0, 2.0, 2.0])  # a model from w
    stale = np.array([1.0, -1.0, 0.5])  # an update of a task from an older model
    total, weight, rebased = 1.0 * fresh + 0.5 * stale, 1.5, 0.5
    new = strategy.server_step(_step([(0, 1.0), (1, 0.5)]), state, total, weight, rebased)
    expected = w + (1.0 * (fresh - w) + 0.5 * stale) / 1.5
    np.testing.assert_allclose(new.weights, expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"strategy": "fedasync", "fedasync.concurrency": 7}, "more tasks in flight than the 6"),
        ({"strategy": "fedbuff", "dropout": 0.1}, "dropout = 0.1 is a synchronous round's"),
        ({"strategy": "fedbuff", "sampling": "poisson"}, "sampling = 'poisson' is a synchronous"),
        ({"overcommit": 0.5}, "overcommit = 0.5 is out of range"),
        ({"overcommit": 1.5, "sampling": "poisson"}, "sampling: poisson has none"),
        ({"deadline": 0}, "deadline = 0.0 is out of range"),
    ],
)
def test_settings_the_clock_or_an_asynchronous_server_cannot_run_are_refused(values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        from_mapping({**CLOCK, "devices": "equal", **values})


@pytest.mark.slow
def test_an_actor_holds_updates_and_sums_stale_ones_as_updates(ray_session):
    """Tasks trained in one call are held; a later call sums a fresh one as its model and
    stale ones as their updates (model minus the model they started from), weighted."""
    from perfed_ray.runtime import simulation
    from perfed_ray.runtime.messages import Batch
    from perfed_ray.runtime.placement import Placement

    cfg = from_mapping({**CLOCK, "devices": "equal", "strategy": "fedbuff"})
    prepared = simulation.prepare(cfg)
    actor = simulation.actor_factory(prepared, Placement([range(6)], 1.0, 0.0))(0, 0)
    w0 = simulation.initial_weights(cfg, prepared.source([0]))
    plain = each_users_model(ray_session, actor, w0, [0, 1, 2], 1)
    held = Batch(1, [0, 1, 2], [10, 11, 12], summed=[(10, 1.0)], rebase=True)
    [first] = ray_session.get(actor.work.remote(w0, [held]))
    np.testing.assert_array_equal(first.total, plain[0].astype(np.float64))
    assert (first.weight, first.rebased) == (1.0, 0.0)
    w2 = w0 + 0.5  # two steps later the server's model is another
    later = Batch(3, [], [], summed=[(11, 0.5), (12, 0.25)], rebase=True)
    [second] = ray_session.get(actor.work.remote(w2, [later]))
    update = 0.5 * (plain[1].astype(np.float64) - w0) + 0.25 * (plain[2].astype(np.float64) - w0)
    np.testing.assert_allclose(second.total, update, rtol=1e-12, atol=1e-12)
    assert (second.weight, second.rebased) == (0.75, 0.75)
    assert ray_session.get(actor.held.remote()) == ({}, {})  # nothing left behind
    ray_session.kill(actor)


TINY = {
    "dataset": "gaussian",
    "n_users": 8,
    "fraction": 0.5,
    "rounds": 4,
    "tau": 2,
    "beta": 0.2,
    "eval_every": 2,
    "final_eval_draws": 1,
    "users_per_actor": 4,
}
RESULTS = ["users", "n_sampled", "n_reported", "train_loss", "sim_time"]
TASKS = ["task", "user", "version", "start", "end", "round", "staleness", "outcome"]
SCORES = ["round", "user", "acc_before", "loss_before", "acc_after", "loss_after", "sim_time"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedavg", "ditto"])
def test_fedbuff_with_the_cohort_in_flight_and_in_the_buffer_is_fedavg(
    ray_session, tmp_path, algorithm
):
    """Equal devices, concurrency = buffer_size = the cohort: every task starts from the
    current model, so FedBuff is Algorithm 1: the same users, the same rows (Ditto's
    per-user states included)."""
    tables = {}
    for name, extra in {
        "sync": {},
        "fedbuff": {"strategy": "fedbuff", "fedbuff.concurrency": 4, "fedbuff.buffer_size": 4},
    }.items():
        out = tmp_path / name
        simulate(from_mapping({**TINY, "algorithm": algorithm, **extra}), out, progress=False)
        tables[name] = (
            read_table(out, "rounds"),
            read_table(out, "evals"),
            read_table(out, "tasks"),
        )
    (rounds, evals, tasks), (buff_rounds, buff_evals, buff_tasks) = tables.values()
    pd.testing.assert_frame_equal(rounds[RESULTS], buff_rounds[RESULTS], check_exact=True)
    key = ["round", "user"]
    pd.testing.assert_frame_equal(
        evals[SCORES].sort_values(key, ignore_index=True),
        buff_evals[SCORES].sort_values(key, ignore_index=True),
        check_exact=True,
    )
    pd.testing.assert_frame_equal(tasks[TASKS], buff_tasks[TASKS], check_exact=True)


ASYNC = {
    "fedbuff": {
        "strategy": "fedbuff",
        "fedbuff.concurrency": 4,
        "fedbuff.buffer_size": 2,
        "algorithm": "ditto",
    },
    "fedasync": {"strategy": "fedasync", "fedasync.concurrency": 3, "algorithm": "fedavg"},
}
HETEROGENEOUS = {**TINY, "rounds": 8, "checkpoint_every": 3, "devices": "lognormal"}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ASYNC)
def test_asynchronous_rows_do_not_depend_on_placement_or_engine(ray_session, tmp_path, strategy):
    got = []
    for i, placement in enumerate(
        [{"users_per_actor": 8, "engine": "vmap"}, {"users_per_actor": 3, "engine": "sequential"}]
    ):
        out = tmp_path / str(i)
        values = {**HETEROGENEOUS, **ASYNC[strategy], **placement}
        simulate(from_mapping(values), out, progress=False)
        got.append(outcome(out))
    first, second = got
    assert first["tasks"]["staleness"].max() > 0  # updates did arrive stale
    pd.testing.assert_frame_equal(first["tasks"][TASKS], second["tasks"][TASKS], check_exact=True)
    mine = ["round", "users", "n_sampled", "n_reported", "sim_time", "staleness_mean"]
    pd.testing.assert_frame_equal(first["rounds"][mine], second["rounds"][mine])
    for name, columns in (("rounds", ["train_loss"]), ("evals", ["loss_after", "acc_after"])):
        np.testing.assert_allclose(first[name][columns], second[name][columns], rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ASYNC)
def test_an_asynchronous_run_killed_mid_run_resumes_to_identical_tables(
    ray_session, tmp_path, strategy
):
    """SIGKILL in step 5, resumed from the checkpoint after step 3: the clock, the tasks
    in flight, the buffer and the held updates come back, and every table equals that of
    the run left alone."""
    values = {**HETEROGENEOUS, **ASYNC[strategy]}
    simulate(from_mapping(values), tmp_path / "alone", progress=False)
    expected = outcome(tmp_path / "alone")
    out, run_dir, saved = killed_mid_round(ray_session, values, tmp_path)
    assert saved.round == 3 and saved.schedule["flight"] and saved.held
    assert main(["run", "--quiet", "--resume", str(run_dir)]) == 0
    got = outcome(out)
    for name in OUTCOME:
        pd.testing.assert_frame_equal(got[name], expected[name], check_exact=True, obj=name)
