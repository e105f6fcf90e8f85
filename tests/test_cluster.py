"""A real two-node Ray cluster on this machine (cluster/local.sh), with token
authentication: the CLI runs on it with --address, its users land on both nodes,
its numbers equal a plain local Ray's, and clients without the right token are
refused. The cluster is stopped whatever the tests do."""

from __future__ import annotations

import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from perfed_ray.api import simulate
from perfed_ray.config import load

# A real two-node Ray cluster started and stopped per module (under pytest-xdist's
# --dist loadscope, on one worker): the full tier only.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
LOCAL_SH = REPO / "cluster" / "local.sh"
WORKERS = 1
# Two actors of two users; one CPU each, so each of the two one-CPU nodes hosts one.
CONFIG = (
    "dataset: mnist\nn_users: 4\nfraction: 0.5\nrounds: 2\ntau: 2\neval_every: 1\n"
    "final_eval_draws: 2\nusers_per_actor: 2\ndata_transport: data_root\n"
)


def _free_base_port(workers: int = WORKERS) -> int:
    """A base port whose offsets used by local.sh (0, 1, 2, 10, 10 + i) are all free."""
    for _ in range(100):
        base = random.randrange(20000, 29000)
        try:
            for offset in (0, 1, 2, *range(10, 11 + workers)):
                with socket.socket() as s:
                    s.bind(("", base + offset))
            return base
        except OSError:
            continue
    raise RuntimeError("no free ports for the test cluster")


def _env(**values: str | None) -> dict[str, str]:
    """This process's environment with `ray` of this Python first on PATH, changed by
    `values` (None removes a variable)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for key, value in values.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _session(sid: int) -> str:
    """The processes left in session `sid` (a node's, led by its `ray start`), if any."""
    return subprocess.run(
        ["ps", "-o", "pid=", "-s", str(sid)], capture_output=True, text=True
    ).stdout


@contextmanager
def local_cluster(workers: int = WORKERS, **settings: str) -> Iterator[tuple[str, dict, Path]]:
    """A head and `workers` worker nodes with a fresh token, `settings` in the nodes'
    environment (PERFED_CLUSTER_CPUS, RAY_ configuration); yields (address, env with
    the token, the cluster's state folder). Torn down in any case, and checked to be
    gone: every process of every node."""
    # Short: Ray's Unix sockets live under it (a pytest tmp_path is too long for them).
    state = Path(tempfile.mkdtemp(prefix="prc-", dir="/tmp"))
    env = _env(
        PERFED_CLUSTER_DIR=str(state),
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        RAY_ADDRESS=None,
        **settings,
    )
    try:
        # The ports are free when probed, but Ray binds them later and another process
        # (other tests' Rays on a shared machine) may take one first: a start that fails
        # (local.sh stops what it started) is tried again on other ports.
        failures = []
        for _ in range(3):
            env["PERFED_CLUSTER_PORT"] = str(_free_base_port(workers))
            up = subprocess.run(
                ["bash", str(LOCAL_SH), "up", str(workers)],
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
            )
            if up.returncode == 0:
                break
            failures.append(up.stdout + up.stderr)
        assert up.returncode == 0, "\n".join(failures)
        yield f"127.0.0.1:{env['PERFED_CLUSTER_PORT']}", env, state
    finally:
        pids = (
            [int(line.split()[0]) for line in (state / "pids").read_text().splitlines()]
            if (state / "pids").exists()
            else []
        )
        down = subprocess.run(
            ["bash", str(LOCAL_SH), "down"], env=env, capture_output=True, text=True, timeout=120
        )
        shutil.rmtree(state, ignore_errors=True)
        assert down.returncode == 0, down.stdout + down.stderr
        for _ in range(50):  # processes just killed take a moment to be reaped
            left = {pid: _session(pid) for pid in pids if _session(pid)}
            if not left:
                break
            time.sleep(0.2)
        assert not left, f"cluster processes left running: {left}"


@pytest.fixture(scope="module")
def cluster():
    """A head and one worker node; yields (address, env with the token)."""
    with local_cluster() as (address, env, _):
        yield address, env


def cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perfed_ray.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def test_an_address_where_nothing_listens_is_reported_at_once(tmp_path):
    """At once: by the probe of the port before Ray is asked (whose own attempts go on
    retrying), so the refused connection is the error's reason, and no run begins."""
    with socket.socket() as held:
        # Bound and never listening: a connection is refused, and no other process can
        # take the port before the CLI tries it (as it could once the socket closed).
        held.bind(("127.0.0.1", 0))
        closed = held.getsockname()[1]
        result = cli(
            "run",
            "--set",
            "dataset=gaussian",
            "--set",
            "n_users=2",
            "--set",
            "fraction=0.5",
            "--address",
            f"127.0.0.1:{closed}",
            "--out",
            str(tmp_path / "out"),
            env=_env(),
            cwd=tmp_path,
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot reach a Ray cluster at 127.0.0.1:{closed} (Connection refused): "
        "is it up, and is this the head's address and port?"
    )
    assert "Traceback" not in result.stderr and not (tmp_path / "out" / "runs").exists()


@pytest.mark.slow
def test_run_on_the_cluster_spreads_users_and_matches_a_local_run(cluster, ray_session, tmp_path):
    address, env = cluster
    config = tmp_path / "mnist.yaml"
    config.write_text(CONFIG)
    run = cli(
        "run",
        str(config),
        "--address",
        address,
        "--out",
        str(tmp_path / "cluster"),
        "--quiet",
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "finished" in run.stdout

    actors = pd.read_parquet(tmp_path / "cluster" / "actors")
    assert actors["node_id"].nunique() == 1 + WORKERS  # every node hosted users
    assert sorted(u for users in actors["users"] for u in users) == [0, 1, 2, 3]

    assert_same_as_local(tmp_path / "cluster", config, tmp_path / "local")


@pytest.mark.slow
def test_a_sweep_on_the_cluster_places_each_trials_actors_and_matches_a_local_run(
    cluster, ray_session, tmp_path
):
    """A trial's placement group spans the nodes its actors need; its driver runs beside
    the sweep's, which reserves no CPU for it here."""
    address, env = cluster
    config = tmp_path / "mnist.yaml"
    config.write_text(CONFIG)
    (tmp_path / "sweep.yaml").write_text(
        "base: mnist.yaml\nseeds: 1\nresources: {driver_cpus: 0, cpus: 2}\n"
    )
    sweep = cli(
        "sweep", "sweep.yaml", "--address", address, "--out", "swept", env=env, cwd=tmp_path
    )
    assert sweep.returncode == 0, sweep.stderr
    assert "Traceback" not in sweep.stderr
    actors = pd.read_parquet(tmp_path / "swept" / "actors")
    assert actors["node_id"].nunique() == 1 + WORKERS  # one actor on each one-CPU node
    assert_same_as_local(tmp_path / "swept", config, tmp_path / "local")


def assert_same_as_local(out: Path, config: Path, local: Path) -> None:
    """The rows under `out` have the numbers of `config` run on the session's plain Ray
    (into `local`, once: a later call with the same `local` compares with that run)."""
    if not (local / "runs").exists():
        simulate(load(config), local, progress=False)
    for table, keys in (("rounds", ["round"]), ("evals", ["round", "user", "draw"])):
        on_cluster, on_local = (
            pd.read_parquet(folder / table).sort_values(keys).reset_index(drop=True)
            for folder in (out, local)
        )
        metrics = (
            ["train_loss"]
            if table == "rounds"
            else ["n_train", "n_test", "acc_before", "loss_before", "acc_after", "loss_after"]
        )
        pd.testing.assert_frame_equal(
            on_cluster[keys + metrics], on_local[keys + metrics], check_exact=True
        )


def test_workers_run_the_drivers_code_shipped_through_runtime_env(cluster, tmp_path):
    address, env = cluster
    probe = (
        "import ray\n"
        "from perfed_ray.runtime.connect import connect\n"
        f"connect({address!r})\n"
        "@ray.remote(num_cpus=0.5, scheduling_strategy='SPREAD')\n"
        "def where():\n"
        "    import time, perfed_ray\n"
        # held a second, so that the tasks overlap and SPREAD has to use every node
        # (tasks that end at once may all be served by one node's workers under load)
        "    time.sleep(1)\n"
        "    return ray.get_runtime_context().get_node_id(), perfed_ray.__file__\n"
        "for node, path in set(ray.get([where.remote() for _ in range(8)])):\n"
        "    print(node, path)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    seen = [line.split() for line in result.stdout.splitlines()]
    assert len({node for node, _ in seen}) == 1 + WORKERS  # the head and every worker
    assert all("runtime_resources/py_modules_files" in path for _, path in seen)


@pytest.mark.parametrize(
    ("token", "via"),
    [(None, "RAY_ADDRESS"), ("wrong", "--address")],
    ids=["no token", "wrong token"],
)
def test_a_client_without_the_token_is_refused(cluster, tmp_path, token, via):
    address, env = cluster
    config = tmp_path / "easy.yaml"
    config.write_text("dataset: gaussian\nn_users: 2\nfraction: 0.5\nrounds: 1\n")
    # No token anywhere: not in the environment, not in this HOME's ~/.ray/auth_token.
    env = {**env, "HOME": str(tmp_path)}
    env.pop("RAY_AUTH_TOKEN")
    if token is None:
        env.pop("RAY_AUTH_MODE")
    else:
        env["RAY_AUTH_TOKEN"] = token
    if via == "RAY_ADDRESS":
        env["RAY_ADDRESS"] = address
    where = ["--address", address] if via == "--address" else []
    result = cli("run", str(config), *where, "--out", str(tmp_path / "out"), env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "refused this client's token" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "runs").exists()
