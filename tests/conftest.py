"""Shared fixtures: one real local Ray for the whole session, the real data root."""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml

# Torch's OpenMP threads (libgomp) spin between parallel regions, waiting for the next,
# unless told to sleep: on 2 cores shared with the session's Ray actors (and, on a
# developer's machine, with other work) the spinning takes the cores the work needs,
# and in-process engine tests took 15-20 times as long (test_dropout's engine tests:
# 88-106 s against 5.6 s at load average 4). Set before torch loads it; Ray's workers
# and the commands the tests run inherit it. The numbers are the same either way.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from perfed_ray.data.datasets import resolve_root

REPO = Path(__file__).resolve().parents[1]
# The data root the library itself would use ($PERFED_DATA, else its cache folder; the
# README says how to fill it), made absolute and exported, because tests run the CLI
# from other working directories.
os.environ["PERFED_DATA"] = str(resolve_root(None))
# A finished run's actors host the session's next runs (perfed_ray.runtime.hosts):
# starting an actor's process is most of a small run's CPU.
os.environ.setdefault("PERFED_RAY_WARM_HOSTS", "1")


# The modules that take longest with two workers (--durations, whole suite), handed
# out first: loadscope gives each worker whole modules in collection order (pyproject's
# --no-loadscope-reorder), and a long module handed out last keeps one worker busy
# while the other has nothing left. The rest follow in file order.
LONGEST_FIRST = (
    "test_bench.py",
    "test_node_loss.py",
    "test_sweep.py",
    "test_recovery.py",
    "test_simulation.py",
    "test_plugins.py",
    "test_async.py",
    "test_cluster.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the session (for each pytest-xdist worker, its own). Started
    again once if its start fails: on a machine loaded far past its cores, a raylet
    gave up waiting for its dashboard agent ("Timed out waiting for file
    metrics_agent_port") and every test of that worker failed with it.

    Workers' and the raylet's log lines are not streamed to this process
    (`log_to_driver=False`): tests here read their own stderr, and a line another
    test's killed actor left ("(raylet) ... Failed to send wait complete") failed
    one in CI. Runs a test starts as a subprocess keep Ray's default."""
    import ray

    def start() -> None:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )

    try:
        start()
    except Exception:  # whatever the start raised; a second failure is reported
        ray.shutdown()
        start()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def mnist():
    """The real MNIST arrays, loaded once."""
    from perfed_ray.data import load_dataset

    return load_dataset("mnist", None, False, 0)


@pytest.fixture(scope="session")
def cifar10():
    """The real CIFAR-10 arrays, loaded once."""
    from perfed_ray.data import load_dataset

    return load_dataset("cifar10", None, False, 0)


TINY = {
    "dataset": "gaussian",
    "n_users": 4,
    "fraction": 0.5,
    "rounds": 4,
    "tau": 2,
    "eval_every": 2,
    "final_eval_draws": 3,
    "users_per_actor": 4,
}
DIVERGES = {
    "dataset": "gaussian",
    "n_users": 6,
    "fraction": 0.5,
    "rounds": 6,
    "tau": 5,
    "eval_every": 6,
    "alpha": 0.05,
    "beta": 2.0,
    "final_eval_draws": 3,
    "users_per_actor": 3,
    "algorithm": "perfedavg-hf",
}  # NaN in round 2


@pytest.fixture(scope="session")
def tiny_results(ray_session, tmp_path_factory):
    """A real results folder: TINY with FedAvg and HF for seeds 0 and 1, HF seed 0 with
    standardized inputs, and one run (DIVERGES) that diverges in round 2."""
    from perfed_ray.api import simulate
    from perfed_ray.config import from_mapping
    from perfed_ray.runtime.rounds import Diverged

    out = tmp_path_factory.mktemp("tiny-results")
    configs = [
        {**TINY, "algorithm": a, "seed": s} for a in ("fedavg", "perfedavg-hf") for s in (0, 1)
    ]
    configs.append({**TINY, "algorithm": "perfedavg-hf", "input_scale": "standardize"})
    for values in configs:
        simulate(from_mapping(values), out, progress=False)
    with pytest.raises(Diverged):
        simulate(from_mapping(DIVERGES), out, progress=False)
    return out


def in_float64(model, shards: dict) -> tuple:
    """A model and its users' shards in float64: engines compared there agree to
    torch's float64 tolerances on any CPU (tests/test_engines.py says why float32's
    rounding would not)."""
    from dataclasses import replace

    doubled = {
        u: replace(s, x_train=s.x_train.double(), x_test=s.x_test.double())
        for u, s in shards.items()
    }
    return model.double(), doubled


def experiment_script(name: str) -> Iterator[ModuleType]:
    """experiments/<name>.py imported as a module, for a module-scoped fixture (with
    experiments/ on the path, as when it runs as a script, for its sibling imports)."""
    sys.path.insert(0, str(REPO / "experiments"))
    spec = importlib.util.spec_from_file_location(name, REPO / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[name]
    sys.path.remove(str(REPO / "experiments"))


def run_cells_here(cells: list, out: Path, jobs: int) -> int:
    """experiments/table1.py's `run_cells` with each cell's `perfed-ray run` called in
    this process, on the session's Ray (its `run_cells_in_process`): for the scripts
    built on it, whose tests are of their grids and tables (a process per cell is
    test_table1_script's)."""
    from table1 import run_cells_in_process

    return run_cells_in_process(cells, out, jobs)


def round_sum(ray_session, actor, weights, users: list[int], round_: int, postprocess=None):
    """The actor's sum of `users`' models after their local work in synchronous round k,
    each through `postprocess` first if given: one step's `work` call, as a round sends it."""
    from perfed_ray.runtime.messages import Batch

    batch = Batch(round_, users, postprocess=postprocess)
    [part] = ray_session.get(actor.work.remote(weights, [batch]))
    return part


def each_users_model(ray_session, actor, weights, users: list[int], round_: int, **step) -> dict:
    """Each user's model after its local work in `round_`, a call of the actor's per
    user: an actor sends only sums, and one user's sum is its model times its weight."""
    parts = [round_sum(ray_session, actor, weights, [u], round_, **step) for u in users]
    return {u: part.total / part.weight for u, part in zip(users, parts, strict=True)}


def killed_mid_round(
    ray_session, values: dict, folder: Path, pythonpath: Path | None = None
) -> tuple[Path, Path, object]:
    """A run of `values` started by `perfed-ray run` in its own process and SIGKILLed in
    round 5: its results folder, its run's checkpoint folder (what --resume takes) and
    the checkpoint it left."""
    from perfed_ray.runtime.checkpoint import RunStore

    config = folder / "run.yaml"
    config.write_text(yaml.safe_dump(values))
    out = folder / "results"
    address = session_address(ray_session)
    killed = run_cli([str(config), "--out", str(out)], address, "driver-round@5", pythonpath)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [run_dir] = (out / "checkpoints").iterdir()
    return out, run_dir, RunStore(out, run_dir.name.removeprefix("run_id=")).load()


def session_address(ray_session) -> str:
    """The session's Ray, for a driver of another process to join: the idle hosts of
    this process's earlier runs, which hold its CPUs, let go first."""
    from perfed_ray.runtime import hosts

    hosts.release()
    return ray_session.get_runtime_context().gcs_address


def run_cli(
    args: list[str], address: str, fault: str | None = None, pythonpath: Path | None = None
) -> subprocess.CompletedProcess:
    """`perfed-ray run --quiet ARGS` in its own process, on the session's Ray cluster;
    `fault` arms a crash (perfed_ray/faults.py), `pythonpath` holds users' modules."""
    env = {**os.environ, "RAY_ADDRESS": address}
    env.pop("PERFED_FAULT", None)
    if fault:
        env["PERFED_FAULT"] = fault
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, "-m", "perfed_ray.cli", "run", "--quiet", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
