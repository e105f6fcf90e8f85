"""What every benchmark records: the machine and versions, and where results go."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import ray
import torch

from perfed_ray.engines.auto import cpu_name

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MNIST = HERE.parents[1] / "experiments" / "configs" / "table1" / "mnist-tau10-alpha0.01.yaml"


def machine() -> dict[str, object]:
    """The facts a reader needs to compare figures across machines."""
    return {
        "hostname": socket.gethostname(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
    }


def save(rows: list[dict], name: str, out: Path = RESULTS) -> Path:
    """Write one benchmark's rows (with the machine) to <out>/<name>.parquet."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.parquet"
    pd.DataFrame([{**machine(), **row} for row in rows]).to_parquet(path, index=False)
    return path


def run_cli(
    config: Path | None,
    sets: list[str],
    out: Path | str,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
) -> float:
    """Seconds from starting `perfed-ray run` to its exit, in a fresh process (Python,
    Ray and the data started and stopped inside, evaluations and checkpoints included);
    its results go to `out`."""
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "perfed_ray.cli",
            "run",
            *([str(config)] if config else []),
            *[a for s in sets for a in ("--set", s)],
            "--out",
            str(out),
            "--quiet",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
    )
    return time.perf_counter() - start


def timed_run(config: Path, sets: list[str]) -> tuple[float, pd.DataFrame, pd.Series]:
    """:func:`run_cli`'s seconds, the run's rounds table (each round's `wall_seconds`)
    and its runs row (`startup_seconds`, and `wall_seconds` from Ray up to the last
    checkpoint)."""
    seconds, rounds, run, _ = phased_run(config, sets)
    return seconds, rounds, run


def phased_run(
    config: Path, sets: list[str], checkout: Path | None = None
) -> tuple[float, pd.DataFrame, pd.Series, dict[str, float]]:
    """:func:`timed_run`, and when each of the run's phases began, in seconds from the
    command (:mod:`perfed_ray.timeline`; `end`: the process gone), with the package of
    `checkout` (default: the one this Python imports). A checkout older than the
    timeline marks no phases: only `end`."""
    from perfed_ray.analysis import read_table
    from perfed_ray.timeline import read as read_timeline

    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as folder:
        out, timeline = Path(folder) / "results", Path(folder) / "timeline.txt"
        env["PERFED_TIMELINE"] = str(timeline)
        launched = time.time()
        # `-m` puts the folder it runs in first on the path
        seconds = run_cli(config, sets, out, env, cwd=folder if checkout else None)
        marked = read_timeline(timeline) if timeline.exists() else {}
        began = {phase: at - launched for phase, at in marked.items()}
        began["end"] = seconds
        rounds = read_table(out, "rounds").sort_values("round")
        return seconds, rounds, read_table(out, "runs").iloc[0], began


def side_run(name: str, command: list[str], args: dict[str, object]) -> dict:
    """One run of another framework's half of a side-by-side benchmark (`command` in its
    own interpreter, `args` its flags, `--out` added): seconds from its start to its exit
    (`whole_seconds`) and the JSON it wrote to --out. Its log goes to a file shown when it
    fails."""
    with tempfile.TemporaryDirectory() as folder:
        out, log = Path(folder) / "side.json", Path(folder) / "side.log"
        command = [*command, *(str(a) for pair in {**args, "--out": out}.items() for a in pair)]
        start = time.perf_counter()
        with log.open("w") as sink:
            done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, check=False)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{name}'s run failed:\n{log.read_text()[-3000:]}")
        return {"whole_seconds": seconds, **json.loads(out.read_text())}
