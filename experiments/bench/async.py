"""FedBuff on the simulated clock beside synchronous FedAvg: issue 43's two targets.

    python experiments/bench/async.py [--rounds 50] [--users 10000 100000] [--scale-rounds 10]
    python experiments/bench/async.py --parts scale     # one part alone
    python experiments/bench/async.py --smoke --out /tmp/bench   # CI: a tiny setting

Writes OUT/async.parquet (default experiments/bench/results), one row a run:

- `throughput`: the paper's MNIST workload (experiments/configs/table1/
  mnist-tau10-alpha0.01.yaml: the paper split over 50 users, 10 a round, tau 10, batch
  40, the MLP) with FedAvg for `--rounds` server steps: synchronous (`strategy:
  uniform`); FedBuff with concurrency = buffer_size = 10, the same users a step (equal
  devices, always online: FedBuff is then synchronous FedAvg, the same users and rows);
  and FedBuff with concurrency 30 and K 10, whose tasks overlap the steps.
  user-steps/s = aggregated updates * tau / the steps' wall seconds, over every step
  (a task is trained when it is dispatched, so with concurrency above K a step's
  call trains tasks that later steps aggregate: only the whole run's ratio is fair;
  the updates still in flight at the end were trained and are not counted). The
  target: FedBuff at no less than 0.7x the synchronous rate.
- `scale`: FedProx's Synthetic(1, 1) at each n of `--users`, lognormal devices (sigma
  1 for compute and bandwidth) and diurnal availability (a quarter of each day),
  FedBuff with concurrency 1,000 and K 100, beside synchronous FedAvg drawing 100
  online users a round, for `--scale-rounds` server steps. The driver's seconds per
  arrival: over the steps after the first, the median of the step's driver time
  outside the actors' calls (wall minus train seconds: the clock, the draws, the
  server's step and the rows) divided by its arrivals. Memory: the run's peak resident
  memory of the driver (its high-water mark reset before each run, which shares this
  process) and of all actors together. The target: both as flat in n as the
  synchronous rounds'.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from common import MNIST, RESULTS, save
from scale import reset_peak_memory

import perfed_ray
from perfed_ray.analysis import read_table

CONCURRENCY, BUFFER = 1000, 100  # the scale part's FedBuff; the synchronous runs draw K
PARTS = ["throughput", "scale"]


def measure(values: dict) -> dict:
    """One run of `values`: its steps' throughput, its driver's cost per arrival and
    its memory peaks."""
    reset_peak_memory()
    clock = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        perfed_ray.simulate(values, out, progress=False)
        wall = time.perf_counter() - clock
        every = read_table(out, "rounds").sort_values("round")
        run = read_table(out, "runs").iloc[0]
    steps = every.iloc[1:]  # the steady state: the first step's call compiles and warms up
    reported = steps["n_reported"].to_numpy()
    driver = (steps["wall_seconds"] - steps["train_seconds"]).to_numpy()
    return {
        "strategy": run["strategy"],
        "concurrency": values.get("fedbuff.concurrency"),
        "buffer_size": values.get("fedbuff.buffer_size"),
        "n_users": int(run["n_users"]),
        "steps": len(every),
        "arrivals_per_step": float(every["n_reported"].mean()),
        "user_steps_per_second": float(
            every["n_reported"].sum() * run["tau"] / every["wall_seconds"].sum()
        ),
        "seconds_per_step": float(steps["wall_seconds"].median()),
        "driver_seconds_per_arrival": float(np.median(driver / reported)),
        "sim_hours": float(every["sim_time"].max() / 3600),
        "driver_peak_gb": run["driver_peak_memory_bytes"] / 2**30,
        "actors_peak_gb": run["actors_peak_memory_bytes"] / 2**30,
        "startup_seconds": float(run["startup_seconds"]),
        "wall_seconds": wall,
    }


def fedbuff(concurrency: int, buffer: int) -> dict:
    return {
        "strategy": "fedbuff",
        "fedbuff.concurrency": concurrency,
        "fedbuff.buffer_size": buffer,
    }


def throughput(rounds: int) -> list[dict]:
    """The paper's MNIST workload, synchronous and under FedBuff, as the docstring says."""
    paper = {**yaml.safe_load(MNIST.read_text()), "algorithm": "fedavg", "rounds": rounds}
    paper |= {"eval_every": rounds, "final_eval_draws": 1}
    cohort = round(paper["fraction"] * paper["n_users"])
    rows = []
    for how in ({}, fedbuff(cohort, cohort), fedbuff(3 * cohort, cohort)):
        rows.append({"part": "throughput", "dataset": "mnist", **measure({**paper, **how})})
        print(rows[-1], flush=True)
    synchronous = rows[0]["user_steps_per_second"]
    for row in rows:
        row["ratio_to_synchronous"] = row["user_steps_per_second"] / synchronous
    return rows


def scale(users: list[int], rounds: int, concurrency: int, buffer: int) -> list[dict]:
    """Synthetic populations of each size, lognormal devices, diurnal availability."""
    rows = []
    for n in users:
        base = {
            "dataset": "synthetic",
            "partition": "natural",
            "n_users": n,
            "fraction": buffer / n,
            "algorithm": "fedavg",
            "rounds": rounds,
            "eval_every": rounds,
            "eval_users": 100,
            "final_eval_draws": 1,
            "sample_final_eval": True,
            "shard_cache_mb": 64,
            "devices": "lognormal",
            "devices.compute_sigma": 1.0,
            "devices.bandwidth_sigma": 1.0,
            "availability": "diurnal",
        }
        for how in ({}, fedbuff(concurrency, buffer)):
            rows.append({"part": "scale", "dataset": "synthetic", **measure({**base, **how})})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50, help="server steps of the MNIST runs")
    parser.add_argument("--users", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--scale-rounds", type=int, default=10)
    parser.add_argument("--parts", nargs="+", choices=("throughput", "scale"), default=PARTS)
    parser.add_argument("--smoke", action="store_true", help="3 MNIST steps, 300 users")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    concurrency, buffer = CONCURRENCY, BUFFER
    if args.smoke:
        args.rounds, args.users, args.scale_rounds = 3, [300], 3
        concurrency, buffer = 20, 5
    rows = []
    if "throughput" in args.parts:
        rows += throughput(args.rounds)
    if "scale" in args.parts:
        rows += scale(args.users, args.scale_rounds, concurrency, buffer)
    print(f"wrote {save(rows, 'async', args.out)}")


if __name__ == "__main__":
    main()
