"""Never lose a run: real processes, real signals.

The driver is SIGKILLed at named points (mid-round, mid-evaluation, mid-write,
between a checkpoint's write and its rename, before the first checkpoint) and
resumed each time, also under differential privacy (its cohorts, noise, clipping bound
and epsilon); an actor's process is SIGKILLed mid-round; a user whose work fails every
time stops the run. In every case the tables must equal those of a
run that was never interrupted, except for the columns that measure time,
memory and placement rather than results.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import killed_mid_round, run_cli, session_address

from perfed_ray.analysis import OUTCOME, outcome
from perfed_ray.api import simulate
from perfed_ray.cli import main
from perfed_ray.config import from_mapping, revise
from perfed_ray.runtime.checkpoint import RunStore

# Drop-outs and stragglers are on, so `events` has rows to compare too.
CONFIG = {
    "dataset": "gaussian",
    "n_users": 4,
    "fraction": 1.0,
    "rounds": 8,
    "eval_every": 2,
    "checkpoint_every": 3,
    "tau": 2,
    "beta": 0.2,
    "users_per_actor": 2,
    "algorithm": "perfedavg-fo",
    "dropout": 0.2,
    "stragglers": 0.2,
    "final_eval_draws": 2,
}


def _assert_same(out: Path, expected: dict[str, pd.DataFrame], failures: bool = False) -> None:
    """Equal tables; with `failures`, once the recorded actor failures are set aside."""
    got = outcome(out)
    if failures:
        events = got["events"]
        got["events"] = events[events["kind"] != "actor-died"].reset_index(drop=True)
    for name in OUTCOME:
        pd.testing.assert_frame_equal(got[name], expected[name], check_exact=True, obj=name)


# Differential privacy's draws after a crash: Poisson cohorts, the server's noise and
# adaptive clipping's bound (kept in the checkpointed server state), or each user's own
# noise; a clip small enough that updates are clipped and the bound moves.
PRIVATE = {
    "central": {
        "privacy": "central",
        "privacy.adaptive_clip": True,
        "privacy.count_noise": 1.0,
    },
    "local": {"privacy": "local"},
}
PRIVATE_BASE = {
    "fraction": 0.5,
    "sampling": "poisson",
    "privacy.noise_multiplier": 1.0,
    "privacy.clip": 0.05,
}


@pytest.fixture(scope="module")
def reference(ray_session, tmp_path_factory) -> dict[str, pd.DataFrame]:
    """The tables of the same run, never interrupted."""
    out = tmp_path_factory.mktemp("reference")
    simulate(from_mapping(CONFIG), out, progress=False)
    return outcome(out)


_cli = run_cli


@pytest.mark.slow
def test_driver_killed_at_any_point_resumes_to_identical_tables(
    ray_session, reference, tmp_path, capsys
):
    address = session_address(ray_session)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    out = tmp_path / "results"
    # Checkpoints after rounds 0, 3, 6 and 8. Each sitting is killed at another point.
    first = _cli([str(config), "--out", str(out)], address, fault="driver-eval@0")
    assert first.returncode == -signal.SIGKILL, first.stderr
    [run_dir] = (out / "checkpoints").iterdir()
    assert not (run_dir / "checkpoint.npz").exists()  # killed before the first checkpoint
    assert str(run_dir) in first.stderr  # the resume command was printed at the start

    sittings = [
        ("driver-round@5", 3),  # mid-round: back to the checkpoint after round 3
        ("driver-checkpoint@6", 3),  # checkpoint 6 written, not yet renamed: still 3
        ("driver-write@3", 3),  # the 3rd write of the sitting (round 4's evals) half-done
    ]
    for fault, checkpoint_round in sittings:
        killed = _cli(["--resume", str(run_dir)], address, fault=fault)
        assert killed.returncode == -signal.SIGKILL, (fault, killed.stderr)
        saved = RunStore(out, run_dir.name.removeprefix("run_id=")).load()
        assert saved.round == checkpoint_round, fault
        # What a crash leaves behind is readable, and says the run did not finish.
        runs = pd.read_parquet(out / "runs")
        assert runs["status"].tolist() == ["running"]
        for name in OUTCOME:
            pd.read_parquet(out / name)
        if fault.startswith("driver-write"):
            assert list(out.glob("evals/*/.part-*.tmp")), "killed mid-write"

    # the last sitting, and the refusal of one more, in this process: nothing is killed
    assert main(["run", "--quiet", "--resume", str(run_dir)]) == 0
    _assert_same(out, reference)
    runs = pd.read_parquet(out / "runs")
    assert runs[["status", "rounds_done", "resumes"]].values.tolist() == [["finished", 8, 4]]
    assert not list(out.glob("*/*/.*.tmp"))

    capsys.readouterr()
    assert main(["run", "--quiet", "--resume", str(run_dir)]) == 2
    assert "already finished all 8 rounds" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("privacy", PRIVATE)
def test_a_private_run_killed_mid_round_resumes_to_identical_tables(ray_session, tmp_path, privacy):
    """SIGKILL in round 5, resumed from the checkpoint after round 3: rounds 4 and 5
    replayed draw the same cohorts and noise from the saved state, and the rows, epsilon
    included, equal those of the run left alone."""
    values = {**CONFIG, **PRIVATE_BASE, **PRIVATE[privacy]}
    simulate(from_mapping(values), tmp_path / "reference", progress=False)
    out, run_dir, saved = killed_mid_round(ray_session, values, tmp_path)
    assert saved.round == 3
    assert main(["run", "--quiet", "--resume", str(run_dir)]) == 0
    expected = outcome(tmp_path / "reference")
    _assert_same(out, expected)
    rounds = expected["rounds"]
    assert len(set(rounds["n_sampled"])) > 1  # Poisson cohorts
    spent = rounds["epsilon"]
    assert spent.is_monotonic_increasing and spent.lt(float("inf")).all()
    if privacy == "central":  # the bound had moved by round 3, and was saved
        assert saved.server.privacy["clip"][0] != PRIVATE_BASE["privacy.clip"]


@pytest.mark.slow
def test_actor_killed_mid_round_is_replaced_with_identical_numbers(
    ray_session, reference, tmp_path, monkeypatch
):
    monkeypatch.setenv("PERFED_FAULT", "actor@3")  # actor 0 SIGKILLs itself in round 3
    simulate(from_mapping(CONFIG), tmp_path, progress=False)
    _assert_same(tmp_path, reference, failures=True)
    events = pd.read_parquet(tmp_path / "events")
    died = events[events["kind"] == "actor-died"]
    assert died[["round", "actor"]].values.tolist() == [[3, 0]]
    assert died["users"].iloc[0].tolist() == [0, 1]
    assert "replaced by incarnation 1" in died["detail"].iloc[0]
    actors = pd.read_parquet(tmp_path / "actors").sort_values(["actor", "incarnation"])
    assert actors[["actor", "incarnation", "from_round"]].values.tolist() == [
        [0, 0, 0],
        [0, 1, 3],
        [1, 0, 0],
    ]
    assert actors["pid"].nunique() == 3  # the replacement is a new process


@pytest.mark.slow
def test_work_that_keeps_failing_stops_the_run_with_a_clear_message(
    ray_session, tmp_path, monkeypatch
):
    from perfed_ray.runtime.pool import WorkFailed

    monkeypatch.setenv("PERFED_FAULT", "actor-always@2")  # every incarnation dies in round 2
    cfg = from_mapping({**CONFIG, "actor_retries": 1, "dropout": 0.0, "stragglers": 0.0})
    with pytest.raises(WorkFailed, match=r"round 2: the actor hosting users 0, 1 died 2 times"):
        simulate(cfg, tmp_path, progress=False)
    runs = pd.read_parquet(tmp_path / "runs")
    assert runs[["status", "rounds_done"]].values.tolist() == [["failed", 1]]
    assert pd.read_parquet(tmp_path / "rounds")["round"].tolist() == [1]
    events = pd.read_parquet(tmp_path / "events")
    assert (events["kind"] == "actor-died").sum() == 1  # one replacement, then it gave up


@pytest.mark.slow
def test_dropouts_and_stragglers_are_drawn_per_round_and_recorded(reference):
    from perfed_ray.strategy import Strategy

    cfg = from_mapping({**CONFIG, "n_users": 1000, "dropout": 0.3, "stragglers": 0.5})
    users = list(range(1000))
    who = Strategy(cfg).participation(7, users)
    assert who == Strategy(cfg).participation(7, users)  # the round's own stream: replayable
    assert who != Strategy(cfg).participation(8, users)
    assert sorted(who.reporting + who.dropped + who.late) == users  # each user once
    assert 250 < len(who.dropped) < 350 and 300 < len(who.late) < 400  # 30%, 70% * 50%
    nobody = Strategy(revise(cfg, dropout=1.0)).participation(7, users)
    assert nobody.reporting == [] and nobody.dropped == users

    # In the reference run, every sampled user either reported or is an event.
    rounds, events = reference["rounds"], reference["events"]
    gone = events.groupby("round")["users"].apply(lambda us: sum(len(u) for u in us))
    for row in rounds.itertuples():
        assert row.n_reported == row.n_sampled - gone.get(row.round, 0)
    assert set(events["kind"]) == {"dropout", "straggler"}


@pytest.mark.slow
def test_sigterm_ends_a_run_as_interrupted_with_status_130_and_it_resumes(ray_session, tmp_path):
    """A scheduler's SIGTERM (`timeout`, Kubernetes, Slurm) mid-run: the run is marked
    `interrupted`, the CLI exits 130 without a stack dump, and --resume finishes it with
    the tables of a run never stopped (Ray's start-up sets its own SIGTERM handler, which
    would exit 1 as `failed`; perfed-ray's is set after it)."""
    import time

    values = {**CONFIG, "rounds": 300, "eval_every": 100, "checkpoint_every": 5}
    reference = tmp_path / "reference"
    simulate(from_mapping(values), reference, progress=False)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(values))
    out = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if k not in ("PERFED_FAULT", "RAY_ADDRESS")}
    process = subprocess.Popen(  # its own local Ray, as a new user's first run has
        [sys.executable, "-m", "perfed_ray.cli", "run", "--quiet", str(config), "--out", str(out)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    # However long the machine takes, short of a run that hangs: that fails, not the suite.
    hung = time.monotonic() + 900
    while not list(out.glob("rounds/*/part-0.parquet")):
        assert process.poll() is None, process.communicate()[1]  # the run ended first
        if time.monotonic() > hung:
            process.kill()
            pytest.fail(f"no checkpoint in 15 minutes: {process.communicate()[1]}")
        time.sleep(0.05)  # the checkpoint after round 5 is written: mid-run
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "is marked 'interrupted'" in stderr
    runs = pd.read_parquet(out / "runs")
    assert runs["status"].tolist() == ["interrupted"] and runs["rounds_done"].iloc[0] < 300
    [run_dir] = (out / "checkpoints").iterdir()
    simulate(resume=run_dir)
    _assert_same(out, outcome(reference))


def test_an_actor_ray_says_died_with_its_node_is_the_nodes_loss_before_its_table_says_so(
    ray_session,
):
    """Ray's GCS marks a lost node's actors dead as it marks the node, so an actor's death
    can reach the driver before the node table holds the node as dead: the death's own
    words (Ray's, as its GCS writes them) make it the node's loss then. An actor that
    died alone, on a node that is alive, is its own."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError

    from perfed_ray.runtime.pool import lost_with_node

    def died(message: str) -> ActorDiedError:
        context = ActorDiedErrorContext(error_message=message, actor_id=bytes(16))
        return ActorDiedError(context)

    alive = ray_session.get_runtime_context().get_node_id()
    with_node = died(f"The actor is dead because its node has died. Node Id: {alive}")
    assert lost_with_node(alive, with_node) == alive
    assert (
        lost_with_node(alive, died("The actor is dead because its worker process has died."))
        is None
    )
    assert lost_with_node(None, with_node) is None
