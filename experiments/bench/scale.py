"""How the simulator's cost grows with the number of users, as the field benchmarks it.

    python experiments/bench/scale.py [--users 100 10000 100000 1000000] [--rounds 10]
    python experiments/bench/scale.py --smoke --out /tmp/bench   # CI: seconds

For each n: Synthetic(1, 1) with 100 users per round (fraction = 100 / n),
Per-FedAvg (HF), the MLP, batch 40, tau = 10, the default placement (one actor per core
here), engine (fused) and `shard_cache_mb: 64` per actor (sized as docs/guide/scale.md says:
a round's users of an actor, with room to spare); then MNIST split by `dirichlet`
(0.5) while its users still hold a batch each. Intermediate evaluations (rounds 0
and rounds / 2) score `eval_users: 100` users; the final one scores everyone once
(`final_eval_draws: 1`) up to `--full-eval-max` users, a sample of 100 above
(`sample_final_eval`: a full evaluation of a million users takes tens of minutes on
2 cores, which the table at smaller n shows). Records start-up (run start until
every actor is ready), seconds per round (median of the rounds table, evaluation
excluded), the time of the sampled evaluation at rounds / 2 and of the full one at
the end (the round's interval between progress reports minus its own rounds-table
time), and peak resident memory of the driver and of all actors together. Writes
OUT/scale.parquet (default experiments/bench/results) and, for the default OUT,
refreshes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import RESULTS
from report import publish

import perfed_ray
from perfed_ray.analysis import read_table
from perfed_ray.errors import DataError

MNIST_USERS = (100, 1000)
SHARD_CACHE_MB = 64


def measure(values: dict, rounds: int, full_eval: bool) -> dict:
    """One run of `values`: its scale figures."""
    marks: dict[int, float] = {}
    clock = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        perfed_ray.simulate(
            {
                **values,
                "algorithm": "perfedavg-hf",
                "rounds": rounds,
                "eval_every": max(1, rounds // 2),
                "eval_users": 100,
                "final_eval_draws": 1,
                "sample_final_eval": not full_eval,
                "shard_cache_mb": SHARD_CACHE_MB,
                "alpha": 0.01,
                "beta": 0.01,
            },
            out,
            progress=lambda p: marks.__setitem__(p.round, time.perf_counter()),
        )
        wall = time.perf_counter() - clock
        table, run = read_table(out, "rounds").set_index("round"), read_table(out, "runs").iloc[0]

    def evaluation(round_: int) -> float:
        return marks[round_] - marks[round_ - 1] - table.loc[round_, "wall_seconds"]

    return {
        "n_users": values["n_users"],
        "users_per_round": 100,
        "rounds": rounds,
        "n_actors": int(run["n_actors"]),
        "startup_seconds": float(run["startup_seconds"]),
        "seconds_per_round": float(table["wall_seconds"].median()),
        "sampled_eval_seconds": evaluation(max(1, rounds // 2)) if rounds >= 4 else None,
        "full_eval_seconds": evaluation(rounds) if full_eval else None,
        "driver_peak_gb": run["driver_peak_memory_bytes"] / 2**30,
        "actors_peak_gb": run["actors_peak_memory_bytes"] / 2**30,
        "wall_seconds": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, nargs="+", default=[100, 10_000, 100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--full-eval-max", type=int, default=100_000)
    parser.add_argument("--smoke", action="store_true", help="100 users, 2 rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    mnist = MNIST_USERS
    if args.smoke:
        args.users, args.rounds, mnist = [100], 2, ()
    rows = []
    for n in args.users:
        generated = {"dataset": "synthetic", "partition": "natural", "fraction": 100 / n}
        values = {**generated, "n_users": n}
        full = n <= args.full_eval_max
        rows.append({"dataset": "synthetic", **measure(values, args.rounds, full)})
        print(rows[-1], flush=True)
    for n in mnist:
        split = {"dataset": "mnist", "partition": "dirichlet", "fraction": 100 / n, "n_users": n}
        try:
            rows.append({"dataset": "mnist", **measure(split, args.rounds, True)})
        except DataError as err:  # its users no longer hold a batch each
            print(f"mnist, {n} users: {err}")
            continue
        print(rows[-1], flush=True)
    publish(rows, "scale", args.out)


if __name__ == "__main__":
    main()
