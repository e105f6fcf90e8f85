"""How the simulator's cost grows with the number of users, as the field benchmarks it.

    python experiments/bench/scale.py [--users 100 10000 100000 1000000] [--rounds 10]
    python experiments/bench/scale.py --smoke --out /tmp/bench   # CI: seconds
    python experiments/bench/scale.py --users 100000 1000000 \
        --privacy none poisson central local --full-eval-max 0

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
time), and peak resident memory of the driver and of all actors together (the
driver's high-water mark reset before each run, which shares the script's process, so
that a row's peak is its own run's). Writes OUT/scale.parquet (default
experiments/bench/results) and, for the default OUT, refreshes BENCHMARKS.md.

`--privacy` measures each n under each of the privacy settings given, to show that
differential privacy keeps memory flat in the population (issue 37): `none` as above,
`poisson` the same without privacy but with `sampling: poisson` (to tell the sampling's
cost from the mechanism's), `central` (DP-FedAvg with adaptive clipping) and `local`,
both with `sampling: poisson`
(each of the n users joins a round with probability 100 / n, the sampling the
accountant's amplification assumes) and epsilon 4 at delta 1e-7 over the run's rounds,
with a clipping bound of 0.01 (local DP's noise multiplier is about 8.7 here, and its
noise on every user's update would make the model diverge at the default bound 1).
Poisson sampling draws one uniform number per seen user each round on the driver (8
bytes a user, freed once the round's cohort is picked), the one cost of the DP path that
grows with n; the noise and the clipping are the size of the model and of the round's
users. A run with any privacy setting but `none` writes OUT/scale-privacy.parquet
instead (Synthetic only), leaving the plain table alone.
"""

from __future__ import annotations

import argparse
import contextlib
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
PRIVACY = ("none", "poisson", "central", "local")


def private(mechanism: str) -> dict:
    """The settings of a run under `mechanism` (`--privacy`): nothing for `none`, Poisson
    sampling alone for `poisson`."""
    if mechanism == "none":
        return {}
    if mechanism == "poisson":
        return {"sampling": "poisson"}
    return {
        "sampling": "poisson",
        "privacy": mechanism,
        "privacy.epsilon": 4.0,
        "privacy.delta": 1e-7,
        "privacy.clip": 0.01,  # local DP's noise, z * clip on every user's update, stays small
        "privacy.adaptive_clip": mechanism == "central",
    }


def reset_peak_memory() -> None:
    """Start this process's peak resident memory (VmHWM) afresh (Linux >= 4.0), so that
    the next run's driver peak is its own, not the largest of the runs before it."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def measure(values: dict, rounds: int, full_eval: bool) -> dict:
    """One run of `values`: its scale figures."""
    marks: dict[int, float] = {}
    reset_peak_memory()
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
        "privacy": values.get("privacy", "none"),
        "sampling": values.get("sampling", "uniform"),
        "seed": values.get("seed", 0),
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
    parser.add_argument("--privacy", nargs="+", choices=PRIVACY, default=["none"])
    parser.add_argument("--seed", type=int, default=0, help="the runs' seed")
    parser.add_argument("--smoke", action="store_true", help="100 users, 2 rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    plain = args.privacy == ["none"]
    mnist = MNIST_USERS if plain else ()
    if args.smoke:
        args.users, args.rounds, mnist = [100], 2, ()
    rows = []
    for n in args.users:
        generated = {"dataset": "synthetic", "partition": "natural", "fraction": 100 / n}
        full = n <= args.full_eval_max
        for mechanism in args.privacy:
            values = {**generated, "n_users": n, "seed": args.seed, **private(mechanism)}
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
    publish(rows, "scale" if plain else "scale-privacy", args.out)


if __name__ == "__main__":
    main()
