"""Bad input a user can give, each answered with exit status 2 and one line on stderr
before Ray starts, with nothing left behind: no results folder, no data folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli, session_address

import perfed_ray
from perfed_ray.config import from_mapping
from perfed_ray.errors import ConfigError, InputError

TINY_RUN = {"dataset": "gaussian", "n_users": 4, "fraction": 0.5}
TINY = [arg for k, v in TINY_RUN.items() for arg in ("--set", f"{k}={v}")]


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None, data: bool = True) -> str:
    """`perfed-ray run ARGS --out cwd/out`, which must fail on input: its one stderr line.
    `env` is added to the environment; without `data`, $PERFED_DATA is taken out of it."""
    ray_tmp = cwd / "ray-tmp"  # where a Ray started by the run would keep its session
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), **(env or {})}
    if not data:
        env.pop("PERFED_DATA")
    result = subprocess.run(
        [sys.executable, "-m", "perfed_ray.cli", "run", *args, "--out", str(cwd / "out")],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not (cwd / "out").exists()  # nothing started, nothing made
    assert not ray_tmp.exists(), "Ray was started before the input was found bad"
    return lines[0]


FILES = [
    (b"tag: caf\xe9\n", "is not UTF-8 text: byte 0xe9 at line 1, column 9; save it as UTF-8"),
    (b"rounds: 2\ntau: 3\nrounds: 4\n", "line 3, column 1: key 'rounds' is given twice (first"),
    (b"rounds: 2\n  tau: [1,\n", "line 2, column 6: mapping values are not allowed here"),
    (b"tau: [1, 2\n", "line 2, column 1: expected ',' or ']', but got '<stream end>'"),
    (b"seed: 1180591620717411303424\n", "seed = 1180591620717411303424 is out of range"),
    (b"rounds: 1.0e+30\n", "rounds = 1e+30 is out of range: an integer >= 1 below 2**63"),
]


@pytest.mark.parametrize(("text", "message"), FILES, ids=[m[:24] for _, m in FILES])
def test_a_bad_configuration_file_is_one_line_naming_it_and_where(tmp_path, text, message):
    (tmp_path / "bad.yaml").write_bytes(text)
    line = _run("bad.yaml", *TINY, cwd=tmp_path)
    assert "'bad.yaml'" in line or "seed" in line or "rounds" in line
    assert message in line


REFUSED_AT_ONCE = [
    ("run", "rounds: -3\n", "error: rounds = -3 is out of range: an integer >= 1"),
    ("sweep", "base: nowhere.yaml\n", "configuration file 'nowhere.yaml' does not exist"),
]


@pytest.mark.parametrize(("command", "text", "message"), REFUSED_AT_ONCE)
def test_a_bad_file_is_refused_before_the_runs_machinery_loads(tmp_path, command, text, message):
    """`perfed-ray run` and `sweep` check their file before they load what a run
    needs: a bad one is refused without importing torch, Ray, pandas or pyarrow (torch
    alone takes seconds, tens on a loaded machine)."""
    (tmp_path / "bad.yaml").write_text(text)
    heavy = ["pandas", "pyarrow", "ray", "torch"]
    probe = (
        f"import sys; from perfed_ray.cli import main; status = main([{command!r}, 'bad.yaml']); "
        f"print(status, sorted(set({heavy!r}) & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert result.stdout.strip() == "2 []", result.stdout + result.stderr
    assert message in result.stderr.strip()


def test_anchors_and_overrides_of_merged_keys_are_no_duplicates(tmp_path):
    from perfed_ray import yamlfile

    path = tmp_path / "anchors.yaml"
    path.write_text("base: &b {tau: 2, rounds: 3}\nrun:\n  <<: *b\n  tau: 4\n")
    assert yamlfile.read(path, "file") == {
        "base": {"tau": 2, "rounds": 3},
        "run": {"tau": 4, "rounds": 3},
    }


NUMBERS = [
    ("rounds=1e30", "rounds = '1e30' is out of range: an integer >= 1 below 2**63"),
    (
        "n_users=10000000",
        "10000000 users of at least batch_size = 40 training samples each need 400000000 "
        "samples; the gaussian training set has 10000: lower n_users or batch_size",
    ),
]


@pytest.mark.parametrize(("pair", "message"), NUMBERS, ids=[p for p, _ in NUMBERS])
def test_absurd_numbers_are_refused_at_once(tmp_path, pair, message):
    assert message in _run(*TINY, "--set", pair, cwd=tmp_path)


def test_absurd_numbers_from_python_are_refused_too():
    for values, message in [
        ({"seed": 2**70}, "seed = 1180591620717411303424 is out of range"),
        ({"rounds": 1e30}, "rounds = 1e+30 is out of range"),
        ({"batch_size": 1e9}, "batch_size = 1000000000.0 is out of range"),
        ({"n_users": 1e12}, "n_users = 1000000000000.0 is out of range"),
        ({"n_users": "1e12"}, "n_users = '1e12' is out of range: an integer in [1, 100000000]"),
        ({"batch_size": "1e9"}, "batch_size = '1e9' is out of range: an integer in [1, 1000000]"),
        ({"seed": "2**70"}, "seed = '2**70' is not allowed: an integer >= 0"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            from_mapping(values)
    assert from_mapping({"rounds": "1e3"}).rounds == 1000  # YAML 1.1 reads 1e3 as a string


def test_a_plug_in_that_does_not_import_names_its_file_and_line(tmp_path):
    (tmp_path / "broken_method.py").write_text('"""A method."""\nclass Broken(:\n    pass\n')
    line = _run("--set", "algorithm=broken_method:Broken", cwd=tmp_path)
    assert f"invalid syntax at {tmp_path / 'broken_method.py'}, line 2" in line
    (tmp_path / "raising_method.py").write_text("x = 1\nraise RuntimeError('no GPU here')\n")
    line = _run("--set", "algorithm=raising_method:Raising", cwd=tmp_path)
    assert f"RuntimeError: no GPU here at {tmp_path / 'raising_method.py'}, line 2" in line


PRIVATE = ["--set", "privacy=central", "--set", "rounds=50", "--set", "privacy.epsilon=1"]


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (["privacy.noise_multiplier=0.3"], "privacy.noise_multiplier = 0.3 spends epsilon = "),
        (["privacy=central,local"], "privacy = 'central,local' is not allowed"),
    ],
    ids=["over-budget", "central-and-local"],
)
def test_bad_privacy_settings_exit_2_before_ray_starts(tmp_path, pairs, message):
    sets = [arg for pair in pairs for arg in ("--set", pair)]
    assert message in _run(*TINY, *PRIVATE, *sets, cwd=tmp_path)


# The rest of the asynchronous strategies' checks: tests/test_async.py, in-process.
ASYNCHRONOUS = [
    (
        ["strategy=fedbuff", "fedbuff.concurrency=2", "fedbuff.buffer_size=3"],
        "fedbuff.buffer_size = 3 is larger than fedbuff.concurrency = 2",
    ),
    (["strategy=fedbuff", "fedbuff.buffer_size=0"], "fedbuff.buffer_size = 0 is out of range"),
    (["strategy=fedasync", "fedasync.concurrency=0"], "fedasync.concurrency = 0 is out of range"),
    (
        ["strategy=fedbuff", *PRIVATE[1::2]],
        "strategy = fedbuff with privacy = central: differential privacy's accounting",
    ),
]


@pytest.mark.parametrize(("pairs", "message"), ASYNCHRONOUS)
def test_bad_clock_and_asynchronous_settings_exit_2_before_ray_starts(tmp_path, pairs, message):
    sets = [arg for pair in pairs for arg in ("--set", pair)]
    assert message in _run(*TINY, *sets, cwd=tmp_path)


OFFLINE = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}  # refused


def test_a_misspelt_data_root_is_refused_even_with_download_on(tmp_path):
    line = _run("--set", f"data_root={tmp_path / 'daat'}", "--set", "download=true", cwd=tmp_path)
    assert f"data root {tmp_path / 'daat'} does not exist" in line
    assert not (tmp_path / "daat").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        (
            "mnist",
            "MNIST not found under {root}/MNIST/raw (missing train-images-idx3-ubyte.gz, "
            "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz), "
            "and downloading failed (",
        ),
        ("cifar10", "CIFAR-10 not found under {root} (neither cifar-10-batches-py/ nor"),
    ],
)
def test_offline_without_data_says_what_is_missing_and_makes_nothing(tmp_path, dataset, message):
    root = tmp_path / "data"
    root.mkdir()
    line = _run(
        "--set", f"dataset={dataset}", "--set", f"data_root={root}", cwd=tmp_path, env=OFFLINE
    )
    assert message.format(root=root) in line and "download" in line.split("failed")[1]
    assert list(root.iterdir()) == []  # no empty MNIST/raw, no half download
    home = tmp_path / "home"  # the default data root is made only to download into
    env = {**OFFLINE, "HOME": str(home)}
    line = _run("--set", f"dataset={dataset}", cwd=tmp_path, env=env, data=False)
    assert "downloading failed" in line and not home.exists()


def test_every_misspelt_name_gets_the_one_hint(tmp_path):
    """Keys, sections of a sweep file and component names: one hint, from one place."""
    from perfed_ray.errors import did_you_mean
    from perfed_ray.sweep import spec

    assert did_you_mean("alpah", ["alpha", "beta"]) == " (did you mean 'alpha'?)"
    assert did_you_mean("zzz", ["alpha"]) == ""
    sweep = tmp_path / "sweep.yaml"
    for values, wanted, loader in [
        ({"alpah": 0.1}, "alpha", from_mapping),
        ({"algorithm": "fedavgg"}, "fedavg", from_mapping),
        ("gird: {}\n", "grid", None),
        ("grid: {alpah: [0.1]}\n", "alpha", None),
    ]:
        with pytest.raises(ConfigError, match=re.escape(f"(did you mean {wanted!r}?)")):
            if loader is None:
                sweep.write_text(values)
                spec.load(sweep)
            else:
                loader(values)


def test_actors_the_cluster_cannot_hold_exit_2_at_once_naming_both(ray_session, tmp_path):
    """Ray would wait for ever for them; the run refuses before asking, writing nothing
    (its own process, so that a wait for ever is the time-out's failure, not a hang)."""
    address = session_address(ray_session)
    result = run_cli([*TINY, "--set", "num_cpus_per_actor=1000", "--out", str(tmp_path)], address)
    assert result.returncode == 2, result.stderr
    assert "error: each actor asks for 1000 CPU, but the largest node has 2 CPU" in result.stderr
    with pytest.raises(ConfigError, match="each actor asks for 1 GPU, but the largest node has 0"):
        perfed_ray.simulate(TINY_RUN, tmp_path, num_gpus_per_actor=1)
    with pytest.raises(ConfigError, match="4 actors ask for 4 CPU together, but the cluster has 2"):
        perfed_ray.simulate(TINY_RUN, tmp_path, num_cpus_per_actor=1, users_per_actor=1)
    assert list(tmp_path.iterdir()) == []


def _no_trial_built(values: object) -> None:
    raise AssertionError(f"a trial was built before the sweep's size was refused: {values}")


def test_a_sweep_larger_than_it_can_run_is_refused_at_once(ray_session, tmp_path, monkeypatch):
    """Refused from the counts alone, before a single trial is validated."""
    from perfed_ray.sweep import runner, spec

    path = tmp_path / "sweep.yaml"
    config = "dataset: gaussian, n_users: 4, fraction: 0.5, rounds: 2"
    base = f"config: {{{config}}}\n"
    for text, message in [
        (
            "sample: {samples: 100000000, uniform: {alpha: [0.001, 0.01]}}\n",
            "sample: samples = 100000000 give 100000000 trials; a sweep runs at most 10000",
        ),
        ("seeds: 10001\n", "trials: base, grid, sample and seeds give 10001 trials"),
        (
            f"config: {{{config}, num_gpus_per_actor: 1}}\n",
            "each actor asks for 1 GPU (num_gpus_per_actor), more than the trial reserves "
            "for all its actors (resources: gpus = 0)",
        ),
    ]:
        path.write_text(text if text.startswith("config") else base + text)
        with monkeypatch.context() as patch:
            if not text.startswith("config"):  # too many: refused before any is built
                patch.setattr(spec.configuration, "from_mapping", _no_trial_built)
            with pytest.raises(ConfigError, match=re.escape(message)):
                spec.load(path)
    path.write_text(base)
    folder, sweep = runner.check(spec.load(path, resources=["cpus=1000"]), tmp_path / "out")
    with pytest.raises(InputError, match="4 actors ask for 4 CPU together, but the cluster has 2"):
        runner.run(folder, new=sweep)
    assert not (tmp_path / "out").exists()  # nothing recorded: nothing to resume
