"""User-steps per second on the paper's MNIST workload, three ways.

    python experiments/bench/throughput.py [--rounds 20] [--algorithms ...]

Workload: MLP (80, 60), batch 40, tau = 10, n = 50 users (paper split), 10
users per round. For each algorithm:

- `loop`: a plain single-process PyTorch loop over the sampled users (the
  same LocalLearner, no Ray), default torch threads;
- `actor-per-user`: perfed-ray with one user per actor (50 actors);
- `packed-batched`: perfed-ray with users_per_actor auto (one actor per core)
  training its sampled users together with vmap.

User-steps per second = users per round x tau / seconds per round (median over
rounds; start-up and evaluation excluded). Writes results/throughput.parquet
and refreshes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
from common import save
from report import write_report

from perfed_ray.config import from_mapping
from perfed_ray.data import materialise
from perfed_ray.learner import LocalLearner
from perfed_ray.models import FlatParams, build_model
from perfed_ray.runtime import simulation
from perfed_ray.runtime.coordinator import sample_users

ALGORITHMS = ["fedavg", "perfedavg-fo", "perfedavg-hf", "perfedavg"]


def plain_loop(cfg, prepared) -> list[float]:
    """Seconds per round of a single-process loop over the sampled users."""
    model = build_model(cfg.model, prepared.data.input_shape, prepared.data.n_classes)
    learner = LocalLearner(cfg, model)
    shards = [materialise(prepared.data, u, torch.device("cpu"), prepared.scaling)
              for u in prepared.users]
    weights = simulation.initial_weights(cfg, prepared.source([]))
    flat = FlatParams({k: v.detach() for k, v in model.named_parameters()})
    seconds = []
    for round_ in range(1, cfg.rounds + 1):
        start = time.perf_counter()
        users = sample_users(cfg.seed, round_, cfg.n_users, cfg.users_per_round)
        params = flat.unflatten(weights)
        new = [flat.flatten(learner.train(params, shards[u], round_)[0]) for u in users]
        weights = np.mean(new, axis=0, dtype=np.float32)
        seconds.append(time.perf_counter() - start)
    return seconds


def on_ray(cfg, prepared) -> tuple[list[float], dict]:
    """Seconds per round of a perfed-ray run, and its runs row."""
    from perfed_ray.analysis import read_table

    with tempfile.TemporaryDirectory() as out:
        simulation.run(simulation.Prepared(cfg, prepared.data, prepared.users), out)
        rounds, runs = read_table(out, "rounds"), read_table(out, "runs")
    return rounds["wall_seconds"].tolist(), runs.iloc[0].to_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    args = parser.parse_args()
    rows = []
    for algorithm in args.algorithms:
        base = from_mapping({"dataset": "mnist", "algorithm": algorithm,
                             "rounds": args.rounds, "eval_every": 10**6,
                             "final_eval_draws": 1})
        prepared = simulation.prepare(base)
        modes = {"loop": None,
                 "actor-per-user": {"users_per_actor": 1, "batch_users": False},
                 "packed-batched": {"users_per_actor": "auto", "batch_users": True}}
        for mode, changes in modes.items():
            if changes is None:
                seconds, run = plain_loop(prepared.cfg, prepared), {}
            else:
                seconds, run = on_ray(prepared.cfg.replace(**changes), prepared)
            per_round = float(np.median(seconds))
            steps = base.users_per_round * base.tau
            rows.append({"algorithm": algorithm, "mode": mode, "rounds": len(seconds),
                         "users_per_round": base.users_per_round, "tau": base.tau,
                         "seconds_per_round": per_round,
                         "user_steps_per_second": steps / per_round,
                         "n_actors": run.get("n_actors", 0),
                         "startup_seconds": run.get("startup_seconds", 0.0),
                         "torch_threads": torch.get_num_threads()})
            print(f"{algorithm:13} {mode:15} {steps / per_round:8.1f} user-steps/s "
                  f"({per_round:.3f} s/round)", flush=True)
    save(rows, "throughput")
    write_report()


if __name__ == "__main__":
    main()
