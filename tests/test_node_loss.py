"""A cluster that loses a node mid-run (cluster/local.sh, every process of the node
SIGKILLed at once, as when a machine vanishes): the run goes on by itself to the rows
of a local run, with room for a replacement (without it: the node-loss benchmark's
smoke test, tests/test_bench.py); the head lost takes the
driver with it, and `--resume` on a new cluster continues to the same rows; a sweep
that loses a node gives the same tables.

The head declares a silent node dead after about five seconds here (Ray's default:
about thirty), so that each test takes what its runs and clusters take."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_cluster import LOCAL_SH, REPO, assert_same_as_local, cli, local_cluster

from perfed_ray.results.reader import read_table

sys.path.insert(0, str(REPO / "experiments" / "bench"))
# The head's failure detector shortened (a health check a second, dead after five
# missed), and which worker node hosts an actor: as the benchmark of the same loss.
from node_loss import FAST_DETECTION, worker_with_an_actor

pytestmark = pytest.mark.slow

# Three actors of two users (a local run places them the same), checkpoints every two
# rounds; the node is killed once round 5's progress line is out.
RUN = {
    "dataset": "mnist",
    "n_users": 6,
    "fraction": 0.5,
    "rounds": 12,
    "tau": 2,
    "eval_every": 2,
    "checkpoint_every": 2,
    "final_eval_draws": 2,
    "users_per_actor": 2,
    "data_transport": "data_root",
}
KILL_AT = 5
PERFED_RAY = [sys.executable, "-m", "perfed_ray.cli"]


def _kill_node(env: dict, node: int | None = None) -> int:
    """SIGKILL node `node` (None: a worker hosting an actor) whole; its index."""
    state = Path(env["PERFED_CLUSTER_DIR"])
    node = worker_with_an_actor(state) if node is None else node
    killed = subprocess.run(
        ["bash", str(LOCAL_SH), "kill-node", str(node)], env=env, capture_output=True, text=True
    )
    assert killed.returncode == 0, killed.stderr
    return node


def _run_losing_a_node(
    config: Path, out: Path, address: str, env: dict, node: int | None = None, **extra: str
) -> tuple[int, str]:
    """`perfed-ray run` on the cluster, node `node` killed once round KILL_AT is shown
    (the driver stopped meanwhile); its exit status and what it printed on stderr."""
    run = subprocess.Popen(
        [*PERFED_RAY, "run", str(config), "--address", address, "--out", str(out)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**env, **extra},
        cwd=config.parent,
    )
    seen, killed = [], False
    for line in run.stderr:
        seen.append(line)
        shown = line.split()[1].split("/")[0] if line.startswith("round ") else "0"
        if not killed and int(shown) >= KILL_AT:
            # The driver held while the node goes: at tens of rounds a second, the run
            # would otherwise end (final evaluation and all) before the node is gone.
            run.send_signal(signal.SIGSTOP)
            try:
                _kill_node(env, node)
            finally:
                run.send_signal(signal.SIGCONT)
            killed = True
    assert killed, "".join(seen)
    return run.wait(timeout=300), "".join(seen)


def _config(tmp_path: Path, **changes) -> Path:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**RUN, **changes}))
    return config


def _node_died(out: Path) -> pd.DataFrame:
    events = read_table(out, "events")
    return events[events["kind"] == "node-died"]


def test_a_worker_lost_with_room_rolls_per_user_state_back_to_the_same_rows(ray_session, tmp_path):
    """Ditto keeps a model per user on its actor: the node's loss rolls the run back to
    its last checkpoint, every actor restarted where the cluster has room."""
    config = _config(tmp_path, algorithm="ditto")
    with local_cluster(2, PERFED_CLUSTER_CPUS="2", **FAST_DETECTION) as (address, env, _):
        code, stderr = _run_losing_a_node(config, tmp_path / "cluster", address, env)
    assert code == 0, stderr
    died = _node_died(tmp_path / "cluster")
    events = read_table(tmp_path / "cluster", "events")[["round", "kind", "detail"]]
    assert not died.empty and died["detail"].str.contains("rolled back").all(), (
        events.to_string(),
        stderr[-2000:],
    )
    assert_same_as_local(tmp_path / "cluster", config, tmp_path / "local")


def test_the_head_lost_resumes_on_a_new_cluster_and_a_sweep_losing_a_node_matches(
    ray_session, tmp_path
):
    """The head's loss ends the driver (Ray's reconnection bound, shortened here, or the
    lost connection's error first); the run continues with --resume on a new cluster to
    a local run's rows. On that cluster, a sweep whose trial loses a node (its driver or its actors:
    Tune restores the trial from its checkpoint, or its pool replaces the actors) gives
    the tables of an undisturbed run."""
    config = _config(tmp_path, algorithm="fedavg")
    out = tmp_path / "cluster"
    with local_cluster(1, PERFED_CLUSTER_CPUS="2", **FAST_DETECTION) as (address, env, _):
        code, stderr = _run_losing_a_node(
            config, out, address, env, node=0, RAY_gcs_rpc_server_reconnect_timeout_s="5"
        )
    assert code != 0, stderr
    # The driver is gone: killed by Ray when the head stayed away past the reconnection
    # bound (its row still says running), or first failed on the lost connection (its
    # row says failed, with that line); either way resumable.
    assert read_table(out, "runs")["status"].iloc[0] in ("running", "failed")
    [run_dir] = (out / "checkpoints").iterdir()
    with local_cluster(2, PERFED_CLUSTER_CPUS="2", **FAST_DETECTION) as (address, env, _):
        resumed = cli("run", "--resume", str(run_dir), "--address", address, env=env, cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr
        assert_same_as_local(out, config, tmp_path / "local")

        (tmp_path / "sweep.yaml").write_text(
            "base: run.yaml\nseeds: 1\nresources: {driver_cpus: 0, cpus: 3}\n"
        )
        sweep = subprocess.Popen(
            [*PERFED_RAY, "sweep", "sweep.yaml", "--address", address, "--out", "swept"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        started = time.monotonic()
        while not list((tmp_path / "swept").glob("checkpoints/*/checkpoint.npz")):
            assert sweep.poll() is None and time.monotonic() - started < 240, sweep.stdout.read()
            time.sleep(0.2)
        _kill_node(env)
        output, _ = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, output
    # The trial lost something: its actors, replaced, or its driver, and Tune restored it.
    swept = read_table(tmp_path / "swept", "runs")
    assert swept["resumes"].iloc[0] == 1 or not _node_died(tmp_path / "swept").empty
    assert_same_as_local(tmp_path / "swept", config, tmp_path / "local")  # the trial's config
