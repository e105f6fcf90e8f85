"""The local Ray a run starts for itself is stopped quickly and completely at exit; a Ray
someone else started is left running."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import ray

from perfed_ray import timeline
from perfed_ray.config import from_mapping
from perfed_ray.runtime import local_ray

# A driver that starts its own Ray, stops it as a run's exit does, and reports what was
# left of the node's processes and how each ended.
DRIVER = textwrap.dedent(
    """
    import json, os, sys
    import ray
    from perfed_ray.config import from_mapping
    from perfed_ray.runtime import local_ray

    local_ray.start([from_mapping({"dataset": "gaussian", "n_users": 10})])
    niceness = ray.get(ray.remote(lambda: os.getpriority(os.PRIO_PROCESS, 0)).remote())
    node = ray._private.worker._global_node
    processes = [(kind, info.process) for kind, infos in node.all_processes.items()
                 for info in infos]
    shutdown, at_shutdown = ray.shutdown, []
    def spy():  # how the monitor stands when Ray's own shutdown begins
        at_shutdown.extend(p.poll() for kind, p in processes if kind == "monitor")
        shutdown()
    ray.shutdown = spy
    local_ray.stop()
    print(json.dumps({
        "worker_niceness": niceness,
        "system_config": node._ray_params._system_config,
        "initialized": ray.is_initialized(),
        "kinds": sorted({kind for kind, _ in processes}),
        "alive": [kind for kind, p in processes if p.poll() is None],
        "monitor_at_shutdown": at_shutdown,
    }))
    """
)


@pytest.mark.slow  # about 5-7 s: a whole run in a process of its own
def test_a_runs_own_ray_is_stopped_whole_with_its_monitor_killed_before_the_shutdown():
    result = subprocess.run(
        [sys.executable, "-c", DRIVER],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert not report["initialized"]
    assert "monitor" in report["kinds"] and "raylet" in report["kinds"]
    assert report["alive"] == []
    # a model's sums come back inline with the reply, not through the object store
    assert report["system_config"]["max_direct_call_object_size"] == local_ray.INLINE_BYTES
    # its workers compete for the CPU as the driver does, not at Ray's niceness 15
    assert report["worker_niceness"] == 0
    # Ray's own shutdown sends the monitor SIGTERM and waits out its second's grace; the
    # stop has killed it outright before Ray's shutdown begins, so no grace is waited
    assert report["monitor_at_shutdown"] == [-signal.SIGKILL], report


def test_a_ray_this_driver_did_not_start_is_left_running(ray_session):
    local_ray.start([from_mapping({"dataset": "gaussian", "n_users": 10})])  # joins it
    local_ray.stop()
    assert ray.is_initialized()
    assert ray.get(ray.put(1)) == 1


@pytest.mark.slow
def test_the_command_stops_its_ray_before_its_quick_exit(tmp_path):
    # The run's Ray session lives here, and its processes name it; short, for Ray's
    # socket paths (at most 107 bytes).
    ray_tmp = Path(tempfile.mkdtemp(prefix="perfed-", dir="/tmp"))
    result = subprocess.run(
        [
            *(sys.executable, "-m", "perfed_ray.cli", "run", "--quiet"),
            *("--out", str(tmp_path / "out"), "--set", "dataset=gaussian"),
            *("--set", "n_users=4", "--set", "fraction=0.5", "--set", "rounds=2"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "RAY_TMPDIR": str(ray_tmp),
            "RAY_ADDRESS": "",
            timeline.ENV: str(tmp_path / "timeline"),
        },
    )
    assert result.returncode == 0, result.stderr
    assert "Token authentication" not in result.stderr  # Ray's chatter: --verbose only
    assert any(ray_tmp.iterdir())  # it did start a Ray there
    left = subprocess.run(["pgrep", "-f", str(ray_tmp)], capture_output=True, text=True)
    assert left.stdout == "", f"Ray processes outlived the command: {left.stdout}"
    runs = pd.read_parquet(tmp_path / "out" / "runs")
    assert list(runs["status"]) == ["finished"]
    # every phase of the benchmark's split was marked, once each, in order
    began = timeline.read(tmp_path / "timeline")
    assert list(began) == list(timeline.PHASES)
    assert sorted(began.values()) == list(began.values())
    assert len((tmp_path / "timeline").read_text().splitlines()) == len(timeline.PHASES)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_the_commands_quick_exit_runs_every_exit_hook_keeps_its_status_and_skips_teardown(
    tmp_path,
):
    """An exit hook registered once the package is loaded (as Ray's, logging's and the
    command's own are) runs; the status is the command's; the interpreter's teardown,
    which would run the leftover object's finaliser, does not."""
    hook, teardown = tmp_path / "hook-ran", tmp_path / "teardown-ran"
    driver = (
        "import atexit, sys\n"
        "from perfed_ray.cli import entry\n"
        f"atexit.register(lambda: open({str(hook)!r}, 'w').write('yes'))\n"
        "class Left:\n"
        f"    def __del__(self, open=open): open({str(teardown)!r}, 'w').write('yes')\n"
        "left = Left()\n"
        "sys.argv = ['perfed-ray', 'run', '--set', 'rounds=0']\n"
        "entry()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", driver], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "rounds = 0" in result.stderr, result.stderr
    assert hook.read_text() == "yes"
    assert not teardown.exists()


def test_importing_the_package_alone_exits_as_python_does(tmp_path):
    """Unarmed (a notebook, `simulate`), the process tears down as usual: a finaliser runs."""
    teardown = tmp_path / "teardown-ran"
    driver = (
        "import sys, perfed_ray\n"
        "class Left:\n"
        f"    def __del__(self, open=open): open({str(teardown)!r}, 'w').write('yes')\n"
        "left = Left()\n"
        "sys.exit(3)\n"
    )
    result = subprocess.run([sys.executable, "-c", driver], capture_output=True, timeout=60)
    assert result.returncode == 3
    assert teardown.read_text() == "yes"
