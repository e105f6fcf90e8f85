"""What the trackers cost a run: the paper's FedAvg on MNIST with `report_to` off, each
of TensorBoard, MLflow and W&B alone, and all three, side by side in one invocation.

    python experiments/bench/trackers.py [--rounds 200] [--repeats 8]
    python experiments/bench/trackers.py --mlflow-uri http://127.0.0.1:5000 \
        --modes off mlflow tensorboard,mlflow,wandb   # MLflow on a tracking server
    python experiments/bench/trackers.py --smoke --out /tmp/bench   # CI: seconds

Workload: experiments/configs/table1/mnist-tau10-alpha0.01.yaml with `algorithm:
fedavg` and its own evaluations and checkpoints (every 20 rounds), on the local Ray
with the default placement, the driver in this process (throughput.py's way); MLflow
writes to a local file store and W&B offline, both in a temporary folder, TensorBoard
into the run's results folder. Modes alternate within each repeat.

The trackers are fed between rounds, when rows are written (each evaluation and
checkpoint), in a thread of their own that the driver only hands the rows to; a
round's own `wall_seconds` never holds them. What they cost is timed where they run
(their feed's calls, timed from outside): `driver` is the time the driver spends
handing rows over, `thread` the trackers' own work in their thread, both summed
over the run and shared out over its rounds; `share of a round` is both together
against the median round of the same run, the most they could slow a round if none
of their work overlapped the actors' (the target: at most 2%). The thread's time is
its clock time, which on a busy machine is mostly waiting for a core behind the
actors; `cpu share of a round` counts its CPU time instead (`time.thread_time`): what
the trackers take from the machine, the bound that holds when it is busy. The run's
real slowdown, `rounds' phase per round` against the `off` run of the same repeat,
is what the trackers add end to end, noise and all. Their start
(libraries imported, tracker runs opened) and end (the summary, the runs closed) are
a cost per run, reported apart. `rounds' phase per round` is the run's clock from
the first round to the end (evaluations, checkpoints and rows in it) per round, the
whole picture, which on a shared machine moves by more than the trackers' share.

`--mlflow-uri` sends MLflow's runs to that tracking server (or store) instead, the
setting the tracking guide recommends: the client's cost is then a request a write
(`log_batch`), the server's work another process's (start one from MLflow's own
environment, never perfed-ray's: `mlflow server --backend-store-uri
sqlite:///mlflow.db`).

Writes OUT/trackers.parquet (with a server's `--mlflow-uri`, OUT/trackers-server.parquet;
default OUT experiments/bench/results) and, for the default OUT, refreshes
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

from common import MNIST, RESULTS
from report import publish

from perfed_ray.api import simulate
from perfed_ray.config import load, revise
from perfed_ray.results.reader import read_table
from perfed_ray.tracking import feed

MODES = ["off", "tensorboard", "mlflow", "wandb", "tensorboard,mlflow,wandb"]
# The feed's methods timed, and what each is a part of.
PARTS = {"__init__": "start", "__call__": "driver", "_take": "thread", "_end": "end"}


class Timed:
    """Seconds spent feeding the trackers: their start, the driver's calls into the
    feed while the run goes, the feed's work in its thread, and the end (the summary
    and the trackers closed, which the run's final row waits for)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS.values(), 0.0)
        self.cpu = dict.fromkeys(PARTS.values(), 0.0)  # the calling thread's CPU time
        self.real = {m: getattr(feed.TrackerFeed, m) for m in PARTS}

    def __enter__(self) -> Timed:
        for method, part in PARTS.items():
            setattr(feed.TrackerFeed, method, self._timed(self.real[method], part))
        return self

    def _timed(self, real, part: str):
        def timed(*args, **kwargs):
            began, cpu = time.perf_counter(), time.thread_time()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - began
                self.cpu[part] += time.thread_time() - cpu

        return timed

    def __exit__(self, *exc: object) -> None:
        for method, real in self.real.items():
            setattr(feed.TrackerFeed, method, real)


def measure(mode: str, rounds: int, sets: list[str], folder: Path) -> dict[str, float]:
    """One run with `report_to` as `mode` says, and what its trackers cost."""
    trackers = [] if mode == "off" else mode.split(",")
    cfg = load(MNIST, [*sets, "algorithm=fedavg", f"rounds={rounds}"])
    cfg = revise(cfg, report_to=trackers)
    with tempfile.TemporaryDirectory(dir=folder) as out, Timed() as timed:
        simulate(cfg, out, progress=False)
        table, run = read_table(out, "rounds"), read_table(out, "runs").iloc[0]
        assert read_table(out, "events").empty, "a tracker failed"
    steady = table.sort_values("round")["wall_seconds"].iloc[1:]
    round_seconds = float(steady.median())
    # the driver's final call waits for the end: count it there, not as the driver's
    driver = timed.seconds["driver"] - timed.seconds["end"]
    return {
        "mode": mode,
        "rounds": rounds,
        "round_seconds": round_seconds,
        "rounds_phase_per_round": float(run["wall_seconds"] - run["startup_seconds"]) / rounds,
        "driver_seconds_per_round": driver / rounds,
        "thread_seconds_per_round": timed.seconds["thread"] / rounds,
        "thread_cpu_seconds_per_round": timed.cpu["thread"] / rounds,
        "share_of_round": (driver + timed.seconds["thread"]) / rounds / round_seconds,
        "cpu_share_of_round": (driver + timed.cpu["thread"]) / rounds / round_seconds,
        "tracker_start_seconds": timed.seconds["start"],
        "tracker_end_seconds": timed.seconds["end"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="a few rounds, for CI")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--mlflow-uri", help="MLflow's tracking server (default: a file store)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=MODES)
    args = parser.parse_args()
    modes = [m for m in MODES if m in args.modes]
    sets = []
    if args.smoke:
        args.rounds, args.repeats = 4, 1
        sets = ["n_users=6", "fraction=0.5", "tau=2", "eval_every=2", "checkpoint_every=2"]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        store = args.mlflow_uri or (Path(folder) / "mlruns").as_uri()
        os.environ["MLFLOW_TRACKING_URI"] = store
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3's opt-in to file stores
        os.environ["WANDB_MODE"], os.environ["WANDB_DIR"] = "offline", folder
        for repeat in range(args.repeats):  # alternating, so a noisy minute slows every mode
            for mode in modes if repeat % 2 == 0 else modes[::-1]:
                row = {
                    **measure(mode, args.rounds, sets, Path(folder)),
                    "repeat": repeat,
                    "mlflow_store": urlparse(store).scheme,  # file, http ...
                }
                rows.append(row)
                print(
                    f"{mode:26} round {1000 * row['round_seconds']:6.1f} ms, trackers "
                    f"{1000 * row['driver_seconds_per_round']:5.2f} + "
                    f"{1000 * row['thread_seconds_per_round']:5.2f} ms a round "
                    f"({100 * row['share_of_round']:.2f}%; its CPU "
                    f"{100 * row['cpu_share_of_round']:.2f}%), start "
                    f"{row['tracker_start_seconds']:.2f} s, end {row['tracker_end_seconds']:.2f} s",
                    flush=True,
                )
    local = urlparse(store).scheme == "file"
    publish(rows, "trackers" if local else "trackers-server", args.out)


if __name__ == "__main__":
    main()
