"""A run's life, attacked: its files lost or damaged before a resume, two resumes at
once, a disk that refuses the rows, a value that does not fit the tables, per-user
state files, actors dying in several rounds, stray and corrupt files under analysis.
Whatever happens, the runs row and the exit status say it, and nothing is lost or
left behind silently."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import TINY, session_address

import perfed_ray
from perfed_ray.analysis import outcome, read_table
from perfed_ray.cli import main
from perfed_ray.runtime.pool import WorkFailed

STOPPED = {**TINY, "rounds": 6, "checkpoint_every": 2, "algorithm": "fedavg"}


def _interrupt_after_round_3(progress) -> None:
    if progress.round == 3:
        raise KeyboardInterrupt


@pytest.fixture(scope="module")
def stopped_run(ray_session, tmp_path_factory) -> Path:
    """A results folder holding one run interrupted after round 3 (checkpoint: round 2)."""
    out = tmp_path_factory.mktemp("stopped")
    with pytest.raises(KeyboardInterrupt):
        perfed_ray.simulate(STOPPED, out, progress=_interrupt_after_round_3)
    return out


def _copy(stopped_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the stopped run's results folder, and its checkpoint folder."""
    out = tmp_path / "results"
    shutil.copytree(stopped_run, out)
    [run_dir] = (out / "checkpoints").iterdir()
    return out, run_dir


def _resume(run_dir: Path) -> int:
    return main(["run", "--quiet", "--resume", str(run_dir)])


def _status(out: Path) -> str:
    return pd.read_parquet(out / "runs")["status"].iloc[0]


@pytest.mark.slow
def test_a_lost_or_short_results_file_is_named_and_the_resume_refused(
    stopped_run, tmp_path, capsys
):
    out, run_dir = _copy(stopped_run, tmp_path)
    [rounds] = out.glob("rounds/*/part-0.parquet")
    saved = rounds.read_bytes()
    rounds.unlink()
    assert _resume(run_dir) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {rounds} is missing; the run's checkpoint of round 2 counts 2 rows there: "
        f"restore the file, or start the run again"
    ]
    pq.write_table(pq.read_table(pa.BufferReader(saved)).slice(0, 1), rounds)
    assert _resume(run_dir) == 2
    assert f"error: {rounds} holds 1 rows; the run's checkpoint" in capsys.readouterr().err
    rounds.write_text("not parquet")
    assert _resume(run_dir) == 2
    assert f"error: {rounds} cannot be read (" in capsys.readouterr().err
    assert _status(out) == "interrupted"  # refused before anything was touched

    rounds.write_bytes(saved)  # restored: the run continues, nothing missing
    perfed_ray.simulate(resume=run_dir)
    assert sorted(pd.read_parquet(out / "rounds")["round"]) == [1, 2, 3, 4, 5, 6]
    assert _status(out) == "finished"


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside the weights: the zip's CRC no longer matches
    path.write_bytes(bytes(data))


def _drop_blocks(path: Path) -> None:
    record = json.loads(path.read_text())
    del record["blocks"]
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("damage", "file"),
    [(_truncate, "checkpoint.npz"), (_flip_a_byte, "checkpoint.npz"), (_drop_blocks, "run.json")],
    ids=["truncated-checkpoint", "crc-bad-checkpoint", "record-without-blocks"],
)
def test_a_damaged_checkpoint_or_record_is_one_line_and_exit_2(
    stopped_run, tmp_path, capsys, damage, file
):
    out, run_dir = _copy(stopped_run, tmp_path)
    damage(run_dir / file)
    assert _resume(run_dir) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {run_dir / file} is damaged ("), err
    assert err[0].endswith("): this run cannot be resumed; start it again")
    assert _status(out) == "interrupted"  # and the row still says how it last ended


# Holds the lock until the test closes its stdin (or kills it): for as long as the test
# needs, however slow the machine, where a sleep's end could free it mid-test.
HOLD = """
import sys
from perfed_ray.runtime.lock import RunLock
RunLock(sys.argv[1]).acquire("resumed")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_a_run_being_resumed_is_refused_until_its_driver_ends(stopped_run, tmp_path, capsys):
    """Two resumes of one run would write over each other: the second is refused while
    the first's driver lives, and the lock goes with that driver, SIGKILL included."""
    out, run_dir = _copy(stopped_run, tmp_path)
    run_id = run_dir.name.removeprefix("run_id=")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        assert _resume(run_dir) == 2
        assert capsys.readouterr().err == (
            f"error: run {run_id} is being resumed by process {holder.pid}: wait for it "
            f"to end, or stop it first\n"
        )
    finally:
        holder.kill()
        holder.wait()
    perfed_ray.simulate(resume=run_dir)
    assert _status(out) == "finished"


# `perfed-ray run` connected to the session's Ray, after which no file it writes may grow
# past 30 kB: each write of a bigger file fails (EFBIG) as writes on a full disk do
# (ENOSPC). The runs row (20 kB) and a checkpoint of logistic regression are smaller.
SMALL_FILES_ONLY = """
import resource, signal, sys, ray
ray.init(address=sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error, not a kill
resource.setrlimit(resource.RLIMIT_FSIZE, (80_000, 80_000))
from perfed_ray.cli import main
sys.exit(main(["run", "--quiet", *sys.argv[2:]]))
"""


@pytest.mark.slow
def test_a_disk_that_refuses_the_rows_still_gets_the_failed_status(ray_session, tmp_path):
    """The rows cannot be written (each try fails again); the runs row, a small file,
    still says `failed` with the error, and the message says what the row says."""
    config = tmp_path / "run.yaml"
    # The final evaluation's rows of 200 users and 40 draws: about 240 kB, well over the
    # limit, which the runs row (30 kB, with a column for each configuration key) is
    # well under.
    many = {
        **TINY,
        **{"n_users": 200, "partition": "iid", "batch_size": 10, "fraction": 0.05},
        **{"rounds": 1, "users_per_actor": 100, "model": "logreg", "final_eval_draws": 40},
    }
    config.write_text(yaml.safe_dump(many))
    out = tmp_path / "results"
    address = session_address(ray_session)
    done = subprocess.run(
        [sys.executable, "-c", SMALL_FILES_ONLY, address, str(config), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    runs = pd.read_parquet(out / "runs")
    assert runs["status"].tolist() == ["failed"]
    assert "File too large" in runs["error"].iloc[0]
    assert f"it is marked 'failed' in {out}/runs" in done.stderr
    assert not list(out.glob("*/*/.*.tmp"))  # the failed writes' temporary files are gone


def test_a_value_that_does_not_fit_the_tables_is_refused_before_the_run_starts(tmp_path, capsys):
    """A configuration value too big for its int64 column is a bad input: exit 2 with
    the reason, before anything is written, so no message can claim a status that no
    runs row holds."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(STOPPED))
    out = tmp_path / "results"
    too_big = f"eval_every={2**64}"
    status = main(["run", "--quiet", str(config), "--out", str(out), "--set", too_big])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.splitlines() == [
        f"error: eval_every = {2**64} is out of range: an integer >= 1 below 2**63 (it is "
        "stored in a 64-bit Parquet column)"
    ]
    assert "marked" not in err
    assert read_table(out, "runs").empty and not out.exists()  # nothing started


KILLED_WITH_STATE = """
import os, signal, numpy as np
from perfed_ray.states import StateStore
store = StateStore(range(3))
store.put(1, np.ones(5, np.float32))
assert store.get(1).tolist() == [1.0] * 5
print(os.listdir(os.environ["TMPDIR"]), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as Ray ends an actor: no clean-up runs
"""


def test_per_user_state_files_go_with_their_actor_however_it_ends(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WITH_STATE], capture_output=True, text=True, env=env
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout == "[]\n"  # no name in the folder while it lives
    assert list(tmp_path.iterdir()) == []  # nor after


@pytest.mark.slow
def test_actor_retries_count_per_round_for_methods_with_per_user_state(
    ray_session, tmp_path, monkeypatch
):
    """`actor_retries: 1` lets one actor die once in each round: two deaths in two
    rounds are two roll-backs, and the run finishes with the numbers of one never hit."""
    values = {**TINY, "rounds": 6, "algorithm": "ditto", "engine": "fused", "actor_retries": 1}
    perfed_ray.simulate(values, tmp_path / "reference")
    monkeypatch.setenv("PERFED_FAULT", "actor@3,actor-replacement@5")
    perfed_ray.simulate(values, tmp_path / "rolled")
    events = pd.read_parquet(tmp_path / "rolled" / "events").query("kind == 'actor-died'")
    assert sorted(events["round"]) == [3, 5]
    evals = [outcome(tmp_path / name)["evals"] for name in ("reference", "rolled")]
    pd.testing.assert_frame_equal(*evals, check_exact=True)

    monkeypatch.setenv("PERFED_FAULT", "actor-always@2")  # dies in round 2 whatever happens
    with pytest.raises(WorkFailed, match=r"round 2: the actor hosting users 0, 1, 2, 3 died 2 "):
        perfed_ray.simulate(values, tmp_path / "failed")
    assert _status(tmp_path / "failed") == "failed"


@pytest.mark.slow
def test_analysis_skips_corrupt_and_stray_files_with_one_warning_each(
    tiny_results, tmp_path, capsys
):
    out = tmp_path / "results"
    shutil.copytree(tiny_results, out)
    corrupt = out / "evals" / "run_id=broken" / "part-0.parquet"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"PAR1 this is not a Parquet file")
    stray = out / "runs" / "notes.txt"
    stray.write_text("my notes")
    [one] = sorted(out.glob("rounds/*/part-0.parquet"))[:1]
    _truncate(one)
    runs = len(list((out / "runs").glob("run_id=*")))

    assert main(["summary", str(out)]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 1 + runs
    warned = captured.err.splitlines()
    assert warned == [
        f"warning: skipped {stray}: not a results file ({out}/runs/run_id=<id>/*.parquet)",
        warned[1],
    ]
    assert warned[1].startswith(f"warning: skipped {corrupt}: not a readable Parquet file (")
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    assert f"warning: skipped {one}: not a readable Parquet file" in capsys.readouterr().err
    assert main(["compare", str(out), "--out", str(tmp_path / "report")]) == 0
