"""How the simulator's cost grows with the number of users: Synthetic(1, 1).

    python experiments/bench/scale.py [--users 100 1000 10000] [--rounds 10]
    python experiments/bench/scale.py --smoke --out /tmp/bench   # CI: seconds

For each n: 100 users per round (fraction = 100 / n), Per-FedAvg (HF), MLP,
batch 40, tau = 10, the default placement (one actor per core here) and engine
(fused); evaluation only at round 0 and at the end. Records start-up time
(run start until every actor holds its users), seconds per round (median),
and peak resident memory of the driver and of all actors together. Writes
OUT/scale.parquet (default experiments/bench/results) and, for the default OUT,
refreshes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import RESULTS, save
from report import write_report

from perfed_ray.analysis import read_table
from perfed_ray.config import from_mapping
from perfed_ray.runtime import simulation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, nargs="+", default=[100, 1000, 10_000])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--algorithm", default="perfedavg-hf")
    parser.add_argument("--smoke", action="store_true", help="100 users, 2 rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.smoke:
        args.users, args.rounds = [100], 2
    rows = []
    for n in args.users:
        cfg = from_mapping(
            {
                "dataset": "synthetic",
                "partition": "natural",
                "n_users": n,
                "fraction": 100 / n,
                "algorithm": args.algorithm,
                "rounds": args.rounds,
                "eval_every": 10**6,
                "alpha": 0.01,
                "beta": 0.01,
                "final_eval_draws": 1,
                "users_per_actor": "auto",
            }
        )
        with tempfile.TemporaryDirectory() as out:
            clock = time.perf_counter()
            simulation.run(simulation.prepare(cfg), out)
            wall = time.perf_counter() - clock
            rounds, runs = read_table(out, "rounds"), read_table(out, "runs")
        run = runs.iloc[0]
        rows.append(
            {
                "n_users": n,
                "users_per_round": cfg.users_per_round,
                "algorithm": args.algorithm,
                "rounds": args.rounds,
                "n_actors": int(run["n_actors"]),
                "startup_seconds": float(run["startup_seconds"]),
                "seconds_per_round": float(rounds["wall_seconds"].median()),
                "driver_peak_gb": run["driver_peak_memory_bytes"] / 2**30,
                "actors_peak_gb": run["actors_peak_memory_bytes"] / 2**30,
                "wall_seconds": wall,
            }
        )
        print(rows[-1], flush=True)
    save(rows, "scale", args.out)
    if args.out == RESULTS:
        write_report()


if __name__ == "__main__":
    main()
