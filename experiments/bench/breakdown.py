"""Where the time of a run and of its rounds goes, end to end: FedAvg and Per-FedAvg
(HF) on the paper's MNIST workload with the default configuration, as a user runs it.

    python experiments/bench/breakdown.py [--rounds 100] [--repeats 2]
    python experiments/bench/breakdown.py --smoke --out /tmp/bench   # CI: seconds

Each run is `perfed-ray run experiments/configs/table1/mnist-tau10-alpha0.01.yaml` in a
fresh process (evaluations only at round 0 and at the end, as throughput.py), timed
from the command to its exit; the split comes from the run's own tables. Per round
(median over rounds after the first, from the `rounds` table):

- `actors' work`: the slowest actor's own time in its training call (its users'
  batches, the engine, the weighted sum), `actor_seconds`;
- `transport`: the training calls out and back beyond that (the weights' object-store
  put, task dispatch, the sums' transfer, Ray's waiting), `train_seconds` - work;
- `server step`: from the sums to the next model, `server_seconds`;
- `driver`: the rest of the round (sampling, participation, its row), `wall_seconds`
  minus the above.

Per run: `process start`: Python, imports and `ray.init` up to the run's clock;
`start-up`: actors started and holding their shards (`startup_seconds`); `rounds`:
their sum; `evaluations, checkpoints, rows`: the rest of the run's clock
(`wall_seconds`); `exit`: Ray's shutdown and the summary after it.

The fixed cost (the whole run less its rounds) in the phases the run marks
(:mod:`perfed_ray.timeline`), each from the command's launch: `imports` (Python and
the command's modules), `validation` (the configuration, which imports torch with the
algorithm), `data` (reading and partitioning MNIST), `ray start`, `set-up` (the
driver's model, engine and files), `actors' start` (until every actor holds its
shards), `evaluations etc.` (the run's phase less its rounds), `finish` (the runs row,
the summary), `shutdown` (the local Ray stopped) and `exit` (the process gone).

    git worktree add /tmp/base f121008
    python experiments/bench/breakdown.py --baseline /tmp/base --repeats 6

compares the fixed cost of FedAvg's run in this checkout with another's (a `git
worktree` of an older commit), alternating ABBA; a checkout older than the timeline
gives its total only.

Writes OUT/breakdown.parquet (default experiments/bench/results) and, for the default
OUT, refreshes BENCHMARKS.md; with --baseline, OUT/breakdown-versus.parquet only.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd
from common import MNIST, RESULTS, phased_run, save
from report import publish

ALGORITHMS = ["fedavg", "perfedavg-hf"]
# The fixed cost's parts: (column, the phase it is, the phase after it), from the run's
# timeline; `evaluations etc.` is the rounds' phase less the rounds themselves.
FIXED = [
    ("fixed_imports", None, "cli"),
    ("fixed_validation", "cli", "data"),
    ("fixed_data", "data", "ray"),
    ("fixed_ray_start", "ray", "set-up"),
    ("fixed_setup", "set-up", "actors"),
    ("fixed_actors_start", "actors", "rounds"),
    ("fixed_evaluations", "rounds", "finish"),
    ("fixed_finish", "finish", "stop"),
    ("fixed_shutdown", "stop", "exit"),
    ("fixed_exit", "exit", "end"),
]


def fixed_parts(began: dict[str, float], rounds: float) -> dict[str, float]:
    """The fixed cost's parts (seconds, NaN where the run marked no such phase)."""
    parts = {}
    for column, phase, following in FIXED:
        start = 0.0 if phase is None else began.get(phase, math.nan)
        parts[column] = began.get(following, math.nan) - start
    parts["fixed_evaluations"] -= rounds
    return parts


def profiled_run(
    algorithm: str, rounds: int, sets: list[str], checkout: Path | None = None
) -> dict[str, float]:
    """One run in a fresh process, and where its time went (seconds)."""
    sets = [f"algorithm={algorithm}", f"rounds={rounds}", "eval_every=1000000", *sets]
    total, table, run, began = phased_run(MNIST, sets, checkout)
    steady = table.iloc[1:] if len(table) > 1 else table
    median = steady[["wall_seconds", "train_seconds", "actor_seconds", "server_seconds"]].median()
    rounds_sum = float(table["wall_seconds"].sum())
    return {
        "algorithm": algorithm,
        "rounds": rounds,
        "round_seconds": float(median["wall_seconds"]),
        "round_actor_work": float(median["actor_seconds"]),
        "round_transport": float(median["train_seconds"] - median["actor_seconds"]),
        "round_server_step": float(median["server_seconds"]),
        "round_driver": float(
            median["wall_seconds"] - median["train_seconds"] - median["server_seconds"]
        ),
        "run_seconds": total,
        "run_startup": float(run["startup_seconds"]),
        "run_rounds": rounds_sum,
        "run_evaluations_checkpoints_rows": float(
            run["wall_seconds"] - run["startup_seconds"] - rounds_sum
        ),
        "run_outside_clock": total - float(run["wall_seconds"]),
        "user_steps_per_second": steady["n_sampled"].median() * run["tau"] / median["wall_seconds"],
        "run_fixed": total - rounds_sum,
        **fixed_parts(began, rounds_sum),
    }


def versus(baseline: Path, rounds: int, repeats: int, sets: list[str], out: Path) -> None:
    """FedAvg's fixed cost in this checkout beside `baseline`'s, ABBA; prints medians."""
    rows = []
    pair = [("baseline", baseline), ("this", Path(__file__).resolve().parents[2])]
    for repeat in range(repeats):
        for name, checkout in pair if repeat % 2 == 0 else pair[::-1]:
            row = profiled_run("fedavg", rounds, sets, checkout)
            rows.append({**row, "checkout": name, "repeat": repeat})
            print(f"{name:8} run {row['run_seconds']:.1f} s, fixed {row['run_fixed']:.1f}")
    save(rows, "breakdown-versus", out)
    table = pd.DataFrame(rows)
    columns = ["run_seconds", "run_fixed", "run_rounds", *(c for c, _, _ in FIXED)]
    medians = table.groupby("checkout")[columns].median().T
    medians["ratio"] = medians["this"] / medians["baseline"]
    print(f"medians of {repeats} runs each (seconds):")
    print(medians.round(2).to_string())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a few rounds, for CI")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--baseline", type=Path, help="compare FedAvg's fixed cost with this checkout's"
    )
    args = parser.parse_args()
    sets = []
    if args.smoke:
        args.rounds, args.repeats = 3, 1
        sets = ["n_users=6", "fraction=0.5", "tau=2"]
    if args.baseline:
        versus(args.baseline, args.rounds, args.repeats, sets, args.out)
        return
    rows = []
    for repeat in range(args.repeats):  # alternating, so a noisy minute slows both
        for algorithm in ALGORITHMS if repeat % 2 == 0 else ALGORITHMS[::-1]:
            row = {**profiled_run(algorithm, args.rounds, sets), "repeat": repeat}
            rows.append(row)
            print(
                f"{algorithm:13} round {1000 * row['round_seconds']:6.1f} ms: work "
                f"{1000 * row['round_actor_work']:5.1f}, transport "
                f"{1000 * row['round_transport']:5.1f}, server "
                f"{1000 * row['round_server_step']:5.1f}, driver "
                f"{1000 * row['round_driver']:5.1f}; run {row['run_seconds']:.1f} s, fixed "
                f"{row['run_fixed']:.1f} s",
                flush=True,
            )
    publish(rows, "breakdown", args.out)


if __name__ == "__main__":
    main()
