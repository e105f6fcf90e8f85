"""The command line as a user meets it: bad input exits 2 with one clear line, before Ray
starts; a good run prints its summary; `summary` reads a results folder."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from perfed_ray.cli import main
from perfed_ray.config import ConfigError, from_mapping, load


def _cifar_npz(path: Path, classes: int, per_class: int = 600) -> None:
    """A real CIFAR-10-shaped .npz holding only the first `classes` classes."""
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(classes), per_class)
    x = rng.integers(0, 256, size=(len(y), 32, 32, 3), dtype=np.uint8)
    np.savez(path, x_train=x, y_train=y, x_test=x[: len(y) // 5], y_test=y[: len(y) // 5])


# Files some bad inputs need, made under the test's folder (EMPTY in the arguments).
SETUPS = {
    "five-classes": lambda d: _cifar_npz(d / "cifar10.npz", classes=5),
    "corrupt": lambda d: (d / "cifar10.npz").write_bytes(b"PK\x03\x04 not a zip archive"),
    "foreign-out": lambda d: ((d / "out").mkdir(), (d / "out" / "notes.txt").write_text("x")),
    "out-is-a-file": lambda d: (d / "out").write_text("x"),
    "run-folders": lambda d: [
        (d / f / "checkpoints/run_id=x").mkdir(parents=True) for f in ("out", "other")
    ],
}

BAD_INPUTS = [
    (["--set", "fraction=1.5"], "fraction = 1.5 is out of range: a number in (0, 1]"),
    (["--set", "tau=0"], "tau = 0 is out of range: an integer >= 1"),
    (
        ["--set", "algorithm=maml"],
        "algorithm = 'maml' is not allowed: one of fedavg, perfedavg, perfedavg-fo, perfedavg-hf",
    ),
    (["--set", "n_users=ten"], "n_users = 'ten' is not allowed: an integer in [1, 100000000]"),
    (["--set", "alpah=0.1"], "unknown configuration key 'alpah' (did you mean 'alpha'?)"),
    (["--set", "beta"], "--set 'beta' is not of the form key=value"),
    (
        ["--set", "data_root=/nonexistent/data", "--set", "download=false"],
        "data root /nonexistent/data does not exist: set data_root or $PERFED_DATA",
    ),
    (
        ["--set", "dataset=cifar10", "--set", "data_root=EMPTY", "--set", "download=false"],
        "CIFAR-10 not found under",
    ),
    (
        ["--set", "dataset=mnist", "--set", "data_root=EMPTY", "--set", "download=false"],
        "MNIST not found under",
    ),
    (["no-such-file.yaml"], "configuration file 'no-such-file.yaml' does not exist"),
    (["--set", "partition=paper", "--set", "n_users=1"], "n_users = 1 is too small"),
    (
        ["--set", "n_users=10", "--set", "fraction=0.05"],
        "fraction * n_users = 0.05 * 10 = 0.5 samples no user per round: raise fraction to at "
        "least 0.1",
    ),
    (["--set", "dropout=-0.1"], "dropout = -0.1 is out of range: a number in [0, 1]"),
    (["--set", "checkpoint_every=1.5"], "checkpoint_every = 1.5 is not allowed: an integer"),
    (
        ["--set", "dataset=gaussian", "--set", "paper_a=900"],
        "gaussian training set has 1000 samples of class 0, but the partition needs 24750: "
        "lower n_users (or paper_a)",
    ),
    (
        [
            "--set",
            "dataset=cifar10",
            "--set",
            "data_root=EMPTY",
            "--set",
            "n_users=4",
            "--set",
            "fraction=0.5",
            "five-classes",
        ],
        "cifar10 training set has no samples of class 5, but the partition needs classes 0 to 9",
    ),
    (
        ["--set", "dataset=cifar10", "--set", "data_root=EMPTY", "corrupt"],
        "cifar10.npz is not a readable CIFAR-10 .npz",
    ),
    (["foreign-out"], "is not empty and not a perfed-ray results folder (it holds notes.txt)"),
    (["out-is-a-file"], "cannot be created (File exists): choose a writable folder"),
    (["--resume", "EMPTY"], "is not a run folder: give <results>/checkpoints/run_id=<id>"),
    (
        ["--resume", "EMPTY/other/checkpoints/run_id=x", "run-folders"],
        "differs from the folder of the run being resumed",
    ),
    (["--resume", "EMPTY/out/checkpoints/run_id=x", "run-folders"], "run.json does not exist"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS, ids=[m[:30] for _, m in BAD_INPUTS])
def test_bad_input_exits_2_with_one_clear_line(tmp_path, monkeypatch, capsys, args, message):
    """In this process, through the command's `main` (a process of its own per case cost
    a second or two of imports each; the exit through the `perfed-ray` entry point, with
    no Ray started, is test_bad_input's)."""
    for name in set(args) & set(SETUPS):
        SETUPS[name](tmp_path)
    args = [a.replace("EMPTY", str(tmp_path)) for a in args if a not in SETUPS]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main sets its own
    try:
        status = main(["run", *args, "--out", str(tmp_path / "out")])
    except SystemExit as exit_:  # argparse's own refusals
        status = exit_.code
    stderr = capsys.readouterr().err
    assert status == 2, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message.replace("EMPTY", str(tmp_path)) in errors[0]
    assert not (tmp_path / "out" / "runs").exists()  # nothing started, nothing written


def test_yaml_file_problems(tmp_path):
    listing = tmp_path / "list.yaml"
    listing.write_text("- dataset\n- mnist\n")
    with pytest.raises(ConfigError, match="must be a mapping of key: value"):
        load(listing)
    floats = tmp_path / "floats.yaml"
    floats.write_text("beta: 1e-3\nalpha: 0\nnum_gpus_per_actor: auto\n")
    cfg = load(floats, ["tau=4", "tag=table 1"])
    assert (cfg.beta, cfg.alpha, cfg.tau, cfg.tag) == (0.001, 0.0, 4, "table 1")
    assert cfg.num_gpus_per_actor is None
    with pytest.raises(ConfigError, match="users_per_actor = 60 is larger than n_users"):
        from_mapping({"users_per_actor": 60})


def _main(capsys, *args: str) -> tuple[int, str, str]:
    """The command's `main` in this process: its status, what it printed and logged."""
    capsys.readouterr()
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.slow
def test_run_and_summary_through_the_cli(ray_session, tmp_path, capsys, monkeypatch):
    """In this process, on the session's Ray (a run's own Ray and its exit are
    test_local_ray's)."""
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main sets its own
    config = tmp_path / "easy.yaml"
    config.write_text(
        "dataset: gaussian\nn_users: 4\nfraction: 0.5\nrounds: 3\n"
        "eval_every: 3\ntau: 2\nbeta: 0.2\nfinal_eval_draws: 2\n"
    )
    out = tmp_path / "results"
    status, stdout, stderr = _main(
        capsys, "run", str(config), "--set", "algorithm=perfedavg-fo", "--out", str(out)
    )
    assert status == 0, stderr
    assert "round 3/3" in stderr and "rounds/s" in stderr
    assert "perfedavg-fo" in stdout and "finished" in stdout

    status, stdout, stderr = _main(capsys, "summary", str(out), "--markdown")
    assert status == 0, stderr
    lines = stdout.strip().splitlines()
    assert lines[0].startswith("| run_id") and len(lines) == 3
    assert "| gaussian | paper | perfedavg-fo | 2 | 0.01 | - | 0 | finished | 3/3 |" in lines[2]

    [run_dir] = (out / "checkpoints").iterdir()
    status, _, stderr = _main(capsys, "run", "--resume", str(run_dir), "--set", "tau=3")
    assert status == 2 and stderr.splitlines() == [
        f"error: --resume: run {run_dir.name.removeprefix('run_id=')} was started with a "
        "different configuration: tau = 2 there, 3 here; give --resume alone to continue "
        "it as it was, or start a new run"
    ], stderr
    status, _, stderr = _main(capsys, "run", "--resume", str(run_dir))
    assert status == 2 and "already finished all 3 rounds" in stderr

    status, _, stderr = _main(capsys, "summary", str(tmp_path / "nothing"))
    assert status == 2 and "does not exist" in stderr


def test_rays_worker_start_up_warnings_are_hidden_and_other_lines_kept(capsys):
    import ray._private.worker as ray_worker

    from perfed_ray.runtime import chatter

    original = ray_worker.print_to_stdstream
    try:
        chatter.hide()
        chatter.hide()  # idempotent: one filter, not two
        warning = (
            "WARNING: 40 PYTHON worker processes have been started on node: abc with "
            "address: 1.2.3.4, which is 20x the maximum expected startup concurrency"
        )
        ray_worker.print_to_stdstream(
            {"lines": [warning], "pid": "raylet", "is_err": False}, ignore_prefix=False
        )
        ray_worker.print_to_stdstream(
            {"lines": [warning, "a real error"], "pid": "raylet", "is_err": False},
            ignore_prefix=False,
        )
    finally:
        ray_worker.print_to_stdstream = original
    out = capsys.readouterr().out
    assert "worker processes" not in out and out.count("a real error") == 1
