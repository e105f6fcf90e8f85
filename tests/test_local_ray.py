"""The local Ray a run starts for itself is stopped quickly and completely at exit; a Ray
someone else started is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import ray

from perfed_ray.config import from_mapping
from perfed_ray.runtime import local_ray

# A driver that starts its own Ray, stops it as a run's exit does, and reports what was
# left of the node's processes and how long the stop took.
DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    import ray
    from perfed_ray.config import from_mapping
    from perfed_ray.runtime import local_ray

    local_ray.start([from_mapping({"dataset": "gaussian", "n_users": 10})])
    node = ray._private.worker._global_node
    processes = [(kind, info.process) for kind, infos in node.all_processes.items()
                 for info in infos]
    began = time.perf_counter()
    local_ray.stop()
    print(json.dumps({
        "seconds": time.perf_counter() - began,
        "initialized": ray.is_initialized(),
        "kinds": sorted({kind for kind, _ in processes}),
        "alive": [kind for kind, p in processes if p.poll() is None],
    }))
    """
)


def test_a_runs_own_ray_is_stopped_whole_without_the_monitors_grace():
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
    # Ray's own shutdown gives the monitor its full second's grace (SIGTERM, which it
    # waits out); the others stop within milliseconds each.
    assert report["seconds"] < 1.0, report


def test_a_ray_this_driver_did_not_start_is_left_running(ray_session):
    local_ray.start([from_mapping({"dataset": "gaussian", "n_users": 10})])  # joins it
    local_ray.stop()
    assert ray.is_initialized()
    assert ray.get(ray.put(1)) == 1
