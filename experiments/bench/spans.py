"""Rounds in spans: Local training on the paper's MNIST workload, its rounds sent to the
actors in spans (about a second's worth in one call to each actor, the default for a
method whose server's model never moves) against one call a round, with FedAvg, whose
local work is the same arithmetic but must wait for each round's model, beside them.

    python experiments/bench/spans.py [--rounds 100] [--repeats 3]
    python experiments/bench/spans.py --smoke --out /tmp/bench   # CI: seconds

Workload: experiments/configs/table1/mnist-tau10-alpha0.01.yaml (MLP 80-60, batch 40,
tau = 10, 10 of 50 users a round), evaluations at round 0 and the end only, on the
local Ray with the default placement, the driver in this process (throughput.py's
`on_ray`); one call a round is the same run with `rounds.SPAN_SECONDS = 0`. Per run,
the median of its rounds' seconds (a span's rounds share its time evenly), the first
round dropped; modes alternate within each repeat. User-steps per second = users per
round x tau / that median.

Writes OUT/spans.parquet (default experiments/bench/results) and, for the default OUT,
refreshes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import MNIST, RESULTS
from report import publish
from throughput import on_ray

from perfed_ray.config import load
from perfed_ray.runtime import rounds, simulation

MODES = [  # (algorithm, mode, seconds a span: None keeps the default)
    ("local", "spans", None),
    ("local", "one call a round", 0.0),
    ("fedavg", "one call a round", None),
]


def measure(algorithm: str, span_seconds: float | None, runs: int, sets: list[str]) -> float:
    """Median seconds a round of one run of `algorithm` (one call a round if 0)."""
    prepared = simulation.prepare(load(MNIST, [*sets, f"algorithm={algorithm}"]))
    default = rounds.SPAN_SECONDS
    rounds.SPAN_SECONDS = default if span_seconds is None else span_seconds
    try:
        seconds, _ = on_ray(prepared.cfg, None, False, runs)
    finally:
        rounds.SPAN_SECONDS = default
    return float(np.median(seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a few rounds, for CI")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sets = ["eval_every=1000000", "final_eval_draws=1"]
    if args.smoke:
        args.rounds, args.repeats = 4, 1
        sets += ["n_users=6", "fraction=0.5", "tau=2", "checkpoint_every=2"]
    rows = []
    for repeat in range(args.repeats):  # alternating, so a noisy minute slows every mode
        for algorithm, mode, span_seconds in MODES if repeat % 2 == 0 else MODES[::-1]:
            per_round = measure(algorithm, span_seconds, args.rounds, sets)
            cfg = load(MNIST, sets)
            rate = cfg.users_per_round * cfg.tau / per_round
            rows.append(
                {
                    "algorithm": algorithm,
                    "mode": mode,
                    "repeat": repeat,
                    "rounds": args.rounds,
                    "seconds_per_round": per_round,
                    "user_steps_per_second": rate,
                }
            )
            print(
                f"{algorithm:7} {mode:17} {1000 * per_round:6.1f} ms a round, "
                f"{rate:7,.0f} user-steps/s",
                flush=True,
            )
    publish(rows, "spans", args.out)


if __name__ == "__main__":
    main()
