"""`perfed-ray sweep`: sweep files expanded and checked before Ray starts, trials run as
Ray Tune trials on the session's Ray (each a run with the tables `perfed-ray run`
writes, its numbers those of the same configuration run alone, even after the sweep
was killed by SIGKILL and resumed), runs that say why they ended
(finished, stopped early, diverged, interrupted by SIGTERM), and step sizes picked on
validation samples."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import TINY, experiment_script, session_address

from perfed_ray import simulate
from perfed_ray.analysis import OUTCOME, final_accuracy, outcome, read_runs, read_table
from perfed_ray.cli import main
from perfed_ray.config import revise
from perfed_ray.data.shards import Shard
from perfed_ray.data.validation import hold_out
from perfed_ray.errors import ConfigError
from perfed_ray.lifecycle import RunLife
from perfed_ray.results.layout import SWEEPS
from perfed_ray.runtime.checkpoint import RunStore
from perfed_ray.runtime.lock import RunLock
from perfed_ray.sweep import spec

REPO = Path(__file__).resolve().parents[1]
# 2 x 2 trials of 60 rounds, each reserving 1 of the session's 2 CPUs: two side by side;
# each reports to TensorBoard where its extra is installed (as in CI), grouped by sweep.
BOARD = importlib.util.find_spec("tensorboard") is not None
TRIAL = {
    **TINY,
    "rounds": 60,
    "eval_every": 20,
    "checkpoint_every": 10,
    "report_to": ["tensorboard"] if BOARD else [],
}
SWEEP = {
    "name": "tiny",
    "config": TRIAL,
    "grid": {"algorithm": ["fedavg", "perfedavg-fo"]},
    "seeds": 2,
    "resources": {"driver_cpus": 0.5, "cpus": 0.5},
}
VARIED = ["algorithm", "seed"]


def _write(folder: Path, doc: dict, name: str = "sweep.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _sweep(args: list[str], address: str) -> subprocess.Popen:
    """`perfed-ray sweep ARGS` in its own process, on the session's Ray."""
    env = {**os.environ, "RAY_ADDRESS": address}
    env.pop("PERFED_FAULT", None)
    return subprocess.Popen(
        [sys.executable, "-m", "perfed_ray.cli", "sweep", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _by_trial(out: Path) -> dict[str, pd.DataFrame]:
    """What the runs computed (no timings, no run ids), rows ordered by trial."""
    tables = outcome(out)
    for name, keys in OUTCOME.items():
        if not tables[name].empty:
            order = [*VARIED, *keys]
            tables[name] = tables[name].sort_values(order, kind="stable").reset_index(drop=True)
    return tables


def _assert_same(got: dict[str, pd.DataFrame], expected: dict[str, pd.DataFrame]) -> None:
    for name in OUTCOME:
        pd.testing.assert_frame_equal(got[name], expected[name], check_exact=True, obj=name)


# Sweep files, before Ray.


def test_sweep_files_hold_the_experiment_scripts_grids():
    sweeps = REPO / "experiments" / "sweeps"
    for table1 in experiment_script("table1"):
        main_grid = table1.grid(table1.CONFIGS, 3, False, table1.ALGORITHMS)
        study = table1.grid(table1.CONFIGS, 3, True, table1.ALGORITHMS, main=False)
        assert set(spec.load(sweeps / "table1.yaml").trials) == {c.cfg() for c in main_grid}
        assert set(spec.load(sweeps / "table1-study.yaml").trials) == {c.cfg() for c in study}
        assert (len(main_grid), len(study)) == (90, 54)
    for comparison in experiment_script("comparison"):
        cells = comparison.grid(comparison.CONFIGS, 3, comparison.METHODS, (), set())
        assert set(spec.load(sweeps / "comparison.yaml").trials) == {c.cfg() for c in cells}
    search = spec.load(sweeps / "step-sizes.yaml")
    assert search.search == ("algorithm",) and all(t.validation == 0.2 for t in search.trials)


def test_a_private_sweeps_summary_says_what_each_trials_epsilon_does_not_cover(tmp_path):
    row = _write(tmp_path, {**TRIAL, "n_users": 4}, "row.yaml")
    doc = {"base": [row.name], "grid": [{"beta": [0.01, 0.1]}], "seeds": [0, 1]}
    assert spec.load(_write(tmp_path, doc)).privacy_note() is None
    private = ["privacy=central", "privacy.noise_multiplier=1.0", "validation=0.2"]
    searched = {**doc, "search": {"per": ["algorithm"]}}
    note = spec.load(_write(tmp_path, searched), private).privacy_note()
    assert note.startswith("privacy: each trial's epsilon is its own run's alone. 4 trials")
    assert "same users and the best is chosen on their validation accuracy" in note
    assert "the sweep as a whole is not accounted" in note


def test_a_sweep_file_expands_in_order_samples_reproducibly_and_sizes_trials(tmp_path):
    rows = [_write(tmp_path, {**TRIAL, "n_users": n}, f"row{n}.yaml") for n in (4, 6)]
    doc = {
        "base": [r.name for r in rows],
        "grid": [{"algorithm": ["fedavg", "perfedavg-fo"]}, {"algorithm": ["local"], "tau": [3]}],
        "sample": {
            "samples": 4,
            "method": "quasi-random",
            "seed": 7,
            "loguniform": {"beta": [0.001, 0.1]},
            "uniform": {"batch_size": [10, 30]},
            "choice": {"aggregation": ["mean", "samples"]},
        },
        "seeds": [0, 5],
        "resources": {"cpus": 2},
    }
    sweep = spec.load(_write(tmp_path, doc), ["rounds=30"], ["driver_cpus=1"])
    assert sweep.name == "sweep" and len(sweep.trials) == 2 * 3 * 4 * 2
    assert sweep.varied == [
        "n_users",
        "tau",
        "beta",
        "batch_size",
        "algorithm",
        "seed",
        "aggregation",
    ]
    first = sweep.trials[:8]  # row 4, FedAvg: 4 samples x 2 seeds, seeds innermost
    assert [(t.n_users, t.algorithm, t.seed) for t in first[:2]] == [
        (4, "fedavg", 0),
        (4, "fedavg", 5),
    ]
    assert {t.rounds for t in sweep.trials} == {30}  # --set, for every trial
    points = [(t.beta, t.batch_size, t.aggregation) for t in first[::2]]
    assert len(set(points)) == 4
    assert all(0.001 <= b <= 0.1 and isinstance(s, int) and 10 <= s <= 30 for b, s, _ in points)
    # The same points for every grid point and row, and again when the file is read again.
    assert [(t.beta, t.batch_size, t.aggregation) for t in sweep.trials[-8::2]] == points
    assert spec.load(_write(tmp_path, doc), ["rounds=30"]).trials == sweep.trials
    random = spec.load(_write(tmp_path, {**doc, "sample": {**doc["sample"], "method": "random"}}))
    assert [(t.beta, t.batch_size) for t in random.trials[:8:2]] != [p[:2] for p in points]
    ninth = sweep.trials[9]  # row 4, the grid's second point, the first sample, seed 5
    assert sweep.describe(9) == (
        f"sweep-0009 n_users=4 tau=2 beta={ninth.beta} batch_size={ninth.batch_size} "
        f"algorithm=perfedavg-fo seed=5 aggregation={ninth.aggregation}"
    )
    # users_per_actor: auto fills what a trial reserves with actors, one CPU each.
    auto = revise(sweep.trials[0], users_per_actor=None)
    assert sweep.resources.bundles(auto) == [{"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}]
    assert sweep.resources.bundles(sweep.trials[0]) == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert spec.Sweep.from_dict(sweep.to_dict()) == sweep


BAD_SWEEPS = [
    ({"grdi": {"seed": [1]}}, "unknown section (did you mean 'grid'?)"),
    ({"grid": {"alpah": [0.1]}}, "grid: unknown configuration key 'alpah' (did you mean 'alpha'?)"),
    ({"grid": {"batch_size": []}}, "grid: batch_size must be a non-empty list of values"),
    (
        {"grid": {"batch_size": [0, 1]}},
        "trial batch_size=0: batch_size = 0 is out of range: an integer in [1, 1000000]",
    ),
    (
        {"grid": {"batch_size": [2]}, "config": {"batch_size": 3}},
        "config: batch_size is varied by the sweep",
    ),
    ({"grid": {"seed": [1]}, "seeds": 2}, "seeds: seed is also varied by grid"),
    (
        {"grid": [{"batch_size": [2]}, {"batch_size": [2]}]},
        "grid: trials 0 and 1 are the same configuration",
    ),
    ({"sample": {"samples": 2, "uniform": {"model": [0, 1]}}}, "model is not a number"),
    ({"sample": {"samples": 2, "loguniform": {"beta": [0, 1]}}}, "beta = 0 must be > 0"),
    ({"name": "a/b"}, "name: 'a/b' may hold letters, digits, '-' and '_' only"),
    ({"resources": {"cpus": 0}}, "resources: cpus = 0 must be > 0"),
    (
        {"grid": {"batch_size": [2, 3]}, "early_stopping": {"grace_rounds": 3}},
        "grace_rounds = 3 is not a multiple of eval_every = 2",
    ),
    (
        {"grid": {"beta": [0.1, 0.2]}, "search": {"per": "algorithm"}},
        "search: picks values by validation accuracy, never by test accuracy: set validation",
    ),
]


@pytest.mark.parametrize(("doc", "message"), BAD_SWEEPS, ids=[m[:30] for _, m in BAD_SWEEPS])
def test_bad_sweep_files_are_one_line_errors_naming_file_and_section(tmp_path, doc, message):
    path = _write(tmp_path, {"config": TINY, **doc} if "config" not in doc else doc)
    with pytest.raises(ConfigError, match=r"^sweep .*sweep\.yaml: ") as raised:
        spec.load(path)
    assert message in str(raised.value)


def test_the_cli_refuses_bad_sweeps_and_mixed_resumes_with_status_2(tmp_path, capsys):
    path = _write(tmp_path, {"config": TINY, "grid": {"alpah": [0.1]}})
    assert main(["sweep", str(path)]) == 2
    assert main(["sweep", "--resume", str(tmp_path), str(path)]) == 2
    assert main(["sweep", "--resume", str(tmp_path)]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert (
        errors[0].startswith("error: sweep ") and "unknown configuration key 'alpah'" in errors[0]
    )
    assert errors[1] == (
        "error: --resume continues a sweep as it was given: drop the sweep file, --set, "
        "--resources and --out"
    )
    assert "is not a sweep" in errors[2] and len(errors) == 3


def test_a_trials_run_id_is_safe_and_a_run_with_a_record_is_never_started_again(tmp_path):
    with pytest.raises(ConfigError, match="run id 'a/b' is not allowed"):
        RunLife.new(tmp_path, "a/b")
    folder = RunStore(tmp_path, "tiny-0000").folder
    folder.mkdir(parents=True)
    with RunLife.new(tmp_path, "tiny-0000"):  # killed before its record: nothing to continue
        pass
    assert not folder.exists()  # claimed and let go without a record: cleaned up
    folder.mkdir(parents=True)
    (folder / RunStore.RECORD).write_text("{}")
    with pytest.raises(ConfigError, match=r"run tiny-0000 already exists .* --resume"):
        RunLife.new(tmp_path, "tiny-0000")


def test_a_validation_split_is_drawn_from_training_samples_never_test_ones():
    shard = Shard(
        3, "A", torch.arange(20.0)[:, None], torch.arange(20), torch.zeros(5, 1), torch.zeros(5)
    )
    held = hold_out(shard, 0.25, seed=1)
    train, valid = held.y_train.tolist(), held.y_test.tolist()
    assert len(valid) == 5 and sorted(train + valid) == list(range(20))
    assert held.x_test[:, 0].tolist() == valid  # samples and labels moved together
    assert hold_out(shard, 0.25, seed=1).y_test.tolist() == valid  # drawn from the seed
    assert hold_out(shard, 0.25, seed=2).y_test.tolist() != valid
    other = Shard(4, "A", shard.x_train, shard.y_train, shard.x_test, shard.y_test)
    assert hold_out(other, 0.25, seed=1).y_test.tolist() != valid  # and the user


# Sweeps on the session's Ray.


def _tune_pids(out: Path, sweep: str, run_id: str) -> set[int]:
    """The processes Tune ran trial `run_id` in, from the trial's result.json."""
    lines = (out / SWEEPS / sweep / run_id / "result.json").read_text().splitlines()
    return {json.loads(line)["pid"] for line in lines}


def _poll(out: Path, process: subprocess.Popen, ready) -> None:
    """Wait until `ready(runs, rounds)` holds for the tables under `out`, however long the
    machine takes; the sweep ending first fails (it is finite, so the wait is too)."""
    while True:
        assert process.poll() is None, process.communicate()[1]
        runs, rounds = read_runs(out), read_table(out, "rounds")
        if not runs.empty and not rounds.empty and ready(runs, rounds):
            return
        time.sleep(0.05)


def _mid_run(runs: pd.DataFrame, rounds: pd.DataFrame) -> set[str]:
    """The trials with rounds written that have not finished."""
    running = runs.loc[runs["status"] == "running", "run_id"]
    return set(running) & set(rounds["run_id"])


def _wait_stopped(pid: int) -> None:
    """Until the kernel has stopped `pid`: SIGSTOP lands when the process next leaves a
    system call, so one writing its runs row may still rename it into place."""
    while True:
        with open(f"/proc/{pid}/stat") as stat:  # FileNotFoundError: it has exited
            state = stat.read().rpartition(")")[2].split()[0]
        if state in ("T", "t"):
            return
        if state in ("Z", "X"):
            raise ProcessLookupError(pid)  # it exited before the signal landed
        time.sleep(0.01)


def _frozen_mid_run(out: Path, process: subprocess.Popen) -> int:
    """Once a trial has finished: a trial mid-run frozen by SIGSTOP to its driver (the
    process whose id its run's lock holds), and that process's id. A trial seen mid-run
    may finish before the signal lands, so the tables are read again once the kernel
    says it is stopped: mid-run still, it stays so for as long as the test needs;
    finished, it is let go on and another is looked for."""
    while True:
        _poll(out, process, lambda runs, rounds: (runs["status"] == "finished").any())
        _poll(out, process, lambda runs, rounds: bool(_mid_run(runs, rounds)))
        for run_id in _mid_run(read_runs(out), read_table(out, "rounds")):
            try:  # a trial that has just ended may have let its lock go, or its process
                pid = int((RunStore(out, run_id).folder / RunLock.FILE).read_text().split()[0])
                os.kill(pid, signal.SIGSTOP)
                _wait_stopped(pid)
            except (FileNotFoundError, IndexError, ProcessLookupError):
                continue
            if run_id in _mid_run(read_runs(out), read_table(out, "rounds")):
                return pid
            os.kill(pid, signal.SIGCONT)


@dataclass(frozen=True)
class Swept:
    """The 2 x 2 sweep, SIGKILLed once a trial had finished while another was mid-run
    (one to skip, one to continue from its checkpoint, maybe some not started), then
    resumed, each in its own process on the session's Ray: its results folder, the
    statuses its runs had when it was killed, and what both processes printed."""

    out: Path
    killed: set[str]
    printed: str


@pytest.fixture(scope="module")
def swept(ray_session, tmp_path_factory) -> Swept:
    folder = tmp_path_factory.mktemp("swept")
    address, out = session_address(ray_session), folder / "results"
    first = _sweep([str(_write(folder, SWEEP)), "--out", str(out)], address)
    trial = _frozen_mid_run(out, first)
    first.kill()
    stdout, stderr = first.communicate(timeout=60)
    with contextlib.suppress(ProcessLookupError):  # Ray may have ended it already
        os.kill(trial, signal.SIGKILL)  # where it was frozen
    killed = set(read_runs(out)["status"])
    resumed = _sweep(["--resume", str(out)], address)
    more, errors = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, errors
    return Swept(out, killed, stdout + stderr + more + errors)


@pytest.mark.slow
def test_a_sweep_runs_each_trial_as_the_same_configuration_run_alone(ray_session, swept, tmp_path):
    """Killed and resumed, it still ends with every trial's numbers those of the same
    configuration run alone, each trial once."""
    out, printed = swept.out, swept.printed
    runs = read_runs(out)
    assert sorted(runs["run_id"]) == [f"tiny-000{i}" for i in range(4)]
    assert set(runs["status"]) == {"finished"} and set(runs["rounds_done"]) == {60}
    assert set(runs["actor_cpus"]) == {0.5}  # sized by what each trial reserved
    assert (out / SWEEPS / "tiny" / "sweep.json").is_file()
    assert set(pd.read_parquet(out / "evals")["run_id"]) == set(runs["run_id"])
    assert "start tiny-0003 algorithm=perfedavg-fo seed=1" in printed
    if BOARD:  # each trial its own TensorBoard run, in the sweep's folder
        boards = sorted(p.name for p in (out / "tensorboard" / "tiny").iterdir())
        assert boards == sorted(runs["run_id"])
    for chatter in ("Traceback", "worker processes have been started", "Token authentication"):
        assert chatter not in printed
    alone = tmp_path / "alone"
    for algorithm in SWEEP["grid"]["algorithm"]:
        for seed in range(SWEEP["seeds"]):
            simulate({**TRIAL, "algorithm": algorithm, "seed": seed}, alone)
    _assert_same(_by_trial(out), _by_trial(alone))


@pytest.mark.slow
def test_a_sweep_killed_by_sigkill_resumes_its_runs_and_is_never_started_again(swept, monkeypatch):
    """The killed sweep's runs said nothing (no chance to); the resume continued at least
    one from its checkpoint rather than starting it again; the same sweep asked again
    into its folder is refused."""
    assert "running" in swept.killed
    runs = read_runs(swept.out)
    assert set(runs["status"]) == {"finished"} and len(runs) == 4
    assert runs["resumes"].sum() >= 1
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main sets its own
    monkeypatch.delenv("RAY_AIR_NEW_OUTPUT", raising=False)  # and this, for Tune
    again = main(["sweep", str(_write(swept.out.parent, SWEEP)), "--out", str(swept.out)])
    assert again == 2  # exists


@pytest.mark.slow
def test_runs_say_why_they_ended_and_the_search_picks_on_validation(ray_session, tmp_path):
    """Finished, stopped early, diverged and interrupted side by side. One trial at a time
    (each reserves both CPUs): the first, whose step size learns, sets the bar the
    second, whose step size barely moves, is stopped by at round 20; the third diverges
    in round 2 (an outcome, not a failure); the fourth, the first again for longer (so
    never below the bar), is running when the sweep gets a scheduler's SIGTERM."""
    doc = {
        "name": "search",
        "config": {
            **{k: v for k, v in TRIAL.items() if k != "rounds"},
            "algorithm": "fedavg",
            "validation": 0.25,
        },
        "grid": [{"beta": [0.3, 0.00001, 1e6], "rounds": [40]}, {"beta": [0.3], "rounds": [400]}],
        "resources": {"driver_cpus": 1, "cpus": 1},
        "early_stopping": {"grace_rounds": 20, "reduction_factor": 2},
        "search": {"per": ["algorithm"]},
    }
    out = tmp_path / "results"
    process = _sweep(
        [str(_write(tmp_path, doc)), "--out", str(out)],
        session_address(ray_session),
    )
    _poll(out, process, lambda runs, rounds: "search-0003" in set(rounds["run_id"]))
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "continue the sweep with" in stderr
    runs = read_runs(out).sort_values("run_id")
    assert runs["status"].tolist() == ["finished", "stopped", "diverged", "interrupted"]
    assert runs["rounds_done"].tolist()[:3] == [40, 20, 1]
    assert runs["error"].iloc[1].startswith("Stopped: stopped by the sweep's scheduler")
    assert "end   search-0001: stopped after round 20" in stderr
    assert "end   search-0002: diverged after round 1" in stderr
    evals = read_table(out, "evals")  # a quarter of each user's training samples scored
    assert (evals["n_test"] == ((evals["n_train"] + evals["n_test"]) / 4).round()).all()
    best = yaml.safe_load((out / SWEEPS / "search" / "best.yaml").read_text())
    accuracy = final_accuracy(evals).set_index("run_id")["accuracy"]["search-0000"]
    assert best == [
        {
            "algorithm": "fedavg",
            "beta": 0.3,
            "rounds": 40,
            "accuracy": accuracy,
            "seeds": 1,
            "runs": ["search-0000"],
        }
    ]
    assert "best by validation accuracy, per algorithm:" in stdout
    # Trials of one shape one after another: Tune hands the first trial's process on to
    # each next one (Tune's own result.json says where each ran), and with it the actor
    # a finished or stopped run left idle; a diverged run's actor is not kept.
    trials = {run_id: _tune_pids(out, "search", run_id) for run_id in runs["run_id"]}
    assert len(set().union(*trials.values())) == 1, trials
    actors = read_table(out, "actors").groupby("run_id")["pid"].agg(set)
    assert actors["search-0000"] == actors["search-0001"] == actors["search-0002"]
    assert not actors["search-0003"] & actors["search-0002"]
