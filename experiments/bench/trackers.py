"""What the trackers cost a run: the paper's FedAvg on MNIST with `report_to` off, each
of TensorBoard, MLflow and W&B alone, and all three, side by side in one invocation.

    python experiments/bench/trackers.py [--rounds 200] [--repeats 8]
    python experiments/bench/trackers.py --modes off tensorboard,mlflow,wandb \
        --niceness 19 0 --repeats 24        # the trackers' priority, lowest and the run's
    python experiments/bench/trackers.py --mlflow-uri http://127.0.0.1:5000 \
        --modes off mlflow tensorboard,mlflow,wandb   # MLflow on a tracking server
    python experiments/bench/trackers.py --modes off tensorboard,mlflow,wandb \
        --report-every 1 10        # every round's row to the trackers, every tenth's
    python experiments/bench/trackers.py --smoke --out /tmp/bench   # CI: seconds

Workload: experiments/configs/table1/mnist-tau10-alpha0.01.yaml with `algorithm:
fedavg` and its own evaluations and checkpoints (every 20 rounds), on the local Ray
with the default placement, the driver in this process (throughput.py's way); MLflow
writes to a local file store and W&B offline, both in a temporary folder, TensorBoard
into the run's results folder. Runs alternate within each repeat.

The trackers are fed between rounds, when rows are written (each evaluation and
checkpoint), in a process of their own that the driver only hands the rows to, at
the lowest priority (`--niceness` sets another, to compare); a round's own
`wall_seconds` never holds them. `driver` is the time the driver spends handing rows
over, per round, but for the first rows' wait for the trackers' start (`waited`,
once a run); `process` the CPU time of the trackers' process and of what it started
(W&B's service) per round, read from /proc over the run's middle rounds (Linux), and
`cpu share of a round` that against the run's median round: what the trackers take
from the machine, wherever they find it. `start` is the CPU time their start took
(imports, tracker runs opened), once a run; the driver keeps the trackers' process
from one run to the next, as it does its actors, so a run after the first starts
with the libraries loaded.
What they cost the run is its slowdown against the `off` run of the same repeat:
`mean round` (the rounds' own clock, which the trackers slow where they take an
actor's core) and `rounds' phase` (the run's clock from the first round to the end,
per round: evaluations, checkpoints, rows and the wait for the trackers at the end
in it), each as the median over the repeats with its 95% interval (order statistics:
no assumption about the machine's noise). `end` is the driver's wait for the
trackers' summary and close at the run's end, paid once a run.

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
# The feed's methods timed in the driver, and what each is a part of.
PARTS = {"__call__": "driver", "_end": "end"}


class Timed:
    """What feeding the trackers costs the driver: its seconds in the feed's calls
    while the run goes, its wait at the end (the summary and the trackers closed, which
    the run's final row waits for), and, from the feed, the first rows' wait for the
    trackers' start and the CPU time that start took in their process."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS.values(), 0.0)
        self.real = {m: getattr(feed.TrackerFeed, m) for m in PARTS}
        self.feed = None

    def __enter__(self) -> Timed:
        for method, part in PARTS.items():
            setattr(feed.TrackerFeed, method, self._timed(self.real[method], part))
        return self

    def _timed(self, real, part: str):
        def timed(feeding, *args, **kwargs):
            self.feed = feeding
            began = time.perf_counter()
            try:
                return real(feeding, *args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - began

        return timed

    def __exit__(self, *exc: object) -> None:
        self.start_cpu = self.feed.start_cpu if self.feed else 0.0
        # the first rows' wait for the trackers' start, a cost of the run's, not a round's
        self.waited = self.feed.waited if self.feed else 0.0
        self.seconds["driver"] -= self.waited
        for method, real in self.real.items():
            setattr(feed.TrackerFeed, method, real)


def _tree_cpu(root: int) -> float:
    """CPU seconds so far of process `root` and every live process under it (Linux's
    /proc): the trackers' process with its threads, and what it started (W&B's
    service)."""
    tick, parent, cpu = os.sysconf("SC_CLK_TCK"), {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended meanwhile
                continue
            fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, ...
            parent[int(entry.name)] = int(fields[1])
            cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, up in parent.items() if up in tree} - tree
        tree, grew = tree | more, bool(more)
    return sum(cpu.get(pid, 0.0) for pid in tree)


class Steady:
    """The trackers' process tree's CPU time over the rounds between `first` and
    `last`, sampled at those rounds' progress: the run's rows are written every 20
    rounds, and sampled mid-way between writes, the window holds whole writes' work
    (as long as the trackers take less than half a write's rounds to catch up)."""

    def __init__(self, timed: Timed, first: int, last: int) -> None:
        self.timed, self.first, self.last, self.cpu = timed, first, last, {}

    def __call__(self, progress) -> None:
        if progress.round in (self.first, self.last) and self.timed.feed is not None:
            self.cpu[progress.round] = _tree_cpu(self.timed.feed.process.pid)

    @property
    def per_round(self) -> float:
        if len(self.cpu) < 2:  # no trackers, or a run too short for a window
            return 0.0
        return (self.cpu[self.last] - self.cpu[self.first]) / (self.last - self.first)


def measure(
    mode: str, niceness: int, every: int, rounds: int, sets: list[str], folder: Path
) -> dict[str, float]:
    """One run with `report_to` as `mode` says, its trackers' process at `niceness`,
    sent every `every`-th round's row, and what they cost."""
    trackers = [] if mode == "off" else mode.split(",")
    feed.LOWEST = niceness
    cfg = load(MNIST, [*sets, "algorithm=fedavg", f"rounds={rounds}", f"report_every={every}"])
    cfg = revise(cfg, report_to=trackers)
    with tempfile.TemporaryDirectory(dir=folder) as out:
        with Timed() as timed:
            # mid-way between writes, from the third on: the trackers' first calls
            # (their libraries' lazy imports) are their start's, not a round's
            half = cfg.eval_every // 2
            window = Steady(timed, 3 * cfg.eval_every + half, rounds - half)
            simulate(cfg, out, progress=window)
        table, run = read_table(out, "rounds"), read_table(out, "runs").iloc[0]
        assert read_table(out, "events").empty, "a tracker failed"
    steady = table.sort_values("round")["wall_seconds"].iloc[1:]
    round_seconds = float(steady.median())
    # the driver's final call waits for the end: count it there, not as the driver's
    driver = timed.seconds["driver"] - timed.seconds["end"]
    return {
        "mode": mode,
        "rounds": rounds,
        "niceness": niceness,
        "report_every": every,
        "round_seconds": round_seconds,
        "mean_round_seconds": float(steady.mean()),
        "rounds_phase_per_round": float(run["wall_seconds"] - run["startup_seconds"]) / rounds,
        "driver_seconds_per_round": driver / rounds,
        "tracker_start_cpu_seconds": timed.start_cpu,
        "start_wait_seconds": timed.waited,
        "steady_from": window.first,
        "steady_to": window.last,
        "steady_cpu_seconds_per_round": window.per_round,
        "steady_cpu_share_of_round": window.per_round / round_seconds,
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
    parser.add_argument(
        "--niceness",
        nargs="+",
        type=int,
        default=[feed.LOWEST],
        help="run each tracker mode with the trackers' process at each of these "
        "(default: the feed's own, the lowest priority; 0: the run's)",
    )
    parser.add_argument(
        "--report-every",
        nargs="+",
        type=int,
        default=[1],
        help="run each tracker mode sending the trackers every this many rounds' rows, "
        "for each of these (`report_every`; default: every round)",
    )
    args = parser.parse_args()
    runs = [
        (mode, niceness, every)
        for mode in MODES
        if mode in args.modes
        for niceness in ([feed.LOWEST] if mode == "off" else args.niceness)
        for every in ([1] if mode == "off" else args.report_every)
    ]
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
            for mode, niceness, every in runs if repeat % 2 == 0 else runs[::-1]:
                row = {
                    **measure(mode, niceness, every, args.rounds, sets, Path(folder)),
                    "repeat": repeat,
                    "mlflow_store": urlparse(store).scheme,  # file, http ...
                }
                rows.append(row)
                print(
                    f"{mode:26} nice {niceness:2} every {every:2} round "
                    f"{1000 * row['round_seconds']:6.1f} ms "
                    f"(mean {1000 * row['mean_round_seconds']:6.1f}), driver "
                    f"{1000 * row['driver_seconds_per_round']:5.2f} ms a round, trackers' "
                    f"process {1000 * row['steady_cpu_seconds_per_round']:5.2f} ms CPU a round "
                    f"({100 * row['steady_cpu_share_of_round']:.2f}%), start "
                    f"{row['tracker_start_cpu_seconds']:.2f} s CPU (waited "
                    f"{row['start_wait_seconds']:.2f} s), end "
                    f"{row['tracker_end_seconds']:.2f} s",
                    flush=True,
                )
    local = urlparse(store).scheme == "file"
    publish(rows, "trackers" if local else "trackers-server", args.out)


if __name__ == "__main__":
    main()
