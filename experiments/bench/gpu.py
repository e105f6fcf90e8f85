"""User-steps per second on a GPU: the MNIST workload with many users a round, in one
process and on perfed-ray with fractional-GPU actors, and the CIFAR-10 CNN's engines.

    python experiments/bench/gpu.py [--rounds 20] [--users 10 100 1000] [--actors 16 4 1]
    python experiments/bench/gpu.py --smoke --out /tmp/bench   # CI: on the CPU, seconds

MNIST workload: the paper's MLP (80, 60), batch 40, tau = 10
(experiments/configs/table1/mnist-tau10-alpha0.01.yaml), MNIST split iid over n = 1000
users, U of them a round. The paper's split cannot make 1000 users (it gives each user
fixed counts of its classes), and 100,000 user-steps a second is 10,000 users' rounds a
second: ten users a round cannot keep a GPU busy. Per algorithm (FedAvg, HF):

- `loop, one process` (U <= 10): the round's users one after another on the GPU (the
  `sequential` engine, no Ray);
- `fused, one process`: the round's users in one call of the fused engine on the GPU,
  no Ray (`in_process` of throughput.py);
- `ray fused, default placement` (U = the largest): perfed-ray itself on a local Ray,
  rounds end to end, with both actor requests `auto` (one actor a core, at most four a
  GPU); `ray fused, A actors a GPU`: the same with `num_gpus_per_actor` = 1 / A.

Where NVIDIA's MPS daemon runs (its pipe folder, $CUDA_MPS_PIPE_DIRECTORY or
/tmp/nvidia-mps, exists), processes share the GPU at once instead of in turns; the
rows say so (`mps`) and go to gpu-mps.parquet instead. `--ray-only` measures only the
Ray modes (for a second invocation under MPS).

The CIFAR-10 CNN (batch 40, tau = 4, the table-1 configuration): a round of U users'
local steps under each engine `auto` times (sequential, vmap, grouped), on random
inputs of CIFAR-10's shape (an engine's speed depends on shapes, not values; the data
set is not on the GPU machine), U = 4 (what `auto` measures when it chooses) and more,
and the engine it would choose from those timings.

User-steps per second = U x tau / seconds per round (median over rounds, the first
dropped). Writes OUT/gpu.parquet (default experiments/bench/results) and, for the
default OUT, refreshes BENCHMARKS.md. On a machine without a GPU it measures the CPU
(the smoke test's purpose), and says so in its `device` column.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import torch
from common import MNIST, RESULTS
from report import publish
from throughput import in_process, on_ray

from perfed_ray.config import load, revise
from perfed_ray.engines import auto
from perfed_ray.models import build_model
from perfed_ray.runtime import simulation

CIFAR = MNIST.parent / "cifar10-tau4-alpha0.01.yaml"
ALGORITHMS = ["fedavg", "perfedavg-hf"]
IN_PROCESS = {"sequential": "loop, one process", "fused": "fused, one process"}  # modes
LOOP_USERS = 10  # at most: the loop runs users one by one, so its rate does not move with U


def mnist_rows(args: argparse.Namespace, device: str) -> list[dict]:
    """The MNIST workload's modes, each a row: in one process for every U, on Ray for the
    largest."""
    rows = []
    n = max(args.users)
    sets = ["partition=iid", f"n_users={n}", "eval_every=1000000", "final_eval_draws=1"]
    if args.smoke:
        sets.append("tau=2")
    for algorithm in ALGORITHMS:
        prepared = simulation.prepare(load(MNIST, [*sets, f"algorithm={algorithm}"]))
        for users in [] if args.ray_only else args.users:
            cfg = revise(prepared.cfg, fraction=users / n)
            for engine in ["sequential", "fused"] if users <= LOOP_USERS else ["fused"]:
                seconds = in_process(cfg, prepared, engine, False, 1, args.rounds, device)
                rows.append(row(algorithm, IN_PROCESS[engine], cfg, seconds))
        cfg = revise(prepared.cfg, fraction=1.0)
        seconds, _ = on_ray(cfg, "fused", False, args.rounds)
        rows.append(row(algorithm, "ray fused, default placement", cfg, seconds))
        for actors in args.actors:
            share = {"num_gpus_per_actor": 1 / actors}
            seconds, _ = on_ray(cfg, "fused", False, args.rounds, **share)
            rows.append(
                row(algorithm, f"ray fused, {actors} actor{'s' * (actors > 1)} a GPU", cfg, seconds)
            )
    return rows


def row(algorithm: str, mode: str, cfg, seconds: list[float]) -> dict:
    """One measurement as a row (and a line on the terminal)."""
    per_round = float(np.median(seconds))
    rate = cfg.users_per_round * cfg.tau / per_round
    print(
        f"{algorithm:13} {mode:26} U = {cfg.users_per_round:5}: "
        f"{rate:10,.0f} user-steps/s ({per_round * 1000:.1f} ms a round)",
        flush=True,
    )
    return {
        "kind": "mnist",
        "algorithm": algorithm,
        "mode": mode,
        "users_per_round": cfg.users_per_round,
        "tau": cfg.tau,
        "rounds": len(seconds),
        "seconds_per_round": per_round,
        "user_steps_per_second": rate,
    }


def cnn_rows(args: argparse.Namespace, device: str) -> list[dict]:
    """Each engine's round of U users of the CNN, as auto times it, and its choice."""
    rows = []
    for algorithm in ALGORITHMS:
        cfg = load(CIFAR, [f"algorithm={algorithm}", "model=cnn"])
        model = build_model("cnn", (3, 32, 32), 10, seed=0)
        for users in args.cnn_users:
            work = auto.Workload((3, 32, 32), 10, users, 1, device)
            seconds = auto.measure(cfg, model, work, most=users)
            chosen = auto.fastest(seconds)
            timings = ", ".join(f"{e} {s * 1000:.1f} ms" for e, s in seconds.items())
            print(f"cnn {algorithm:13} U = {users:3}: {timings}; auto: {chosen}", flush=True)
            rows += [
                {
                    "kind": "cnn",
                    "algorithm": algorithm,
                    "mode": engine,
                    "users_per_round": users,
                    "tau": cfg.tau,
                    "seconds_per_round": s,
                    "user_steps_per_second": users * cfg.tau / s,
                    "chosen": engine == chosen,
                }
                for engine, s in seconds.items()
            ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--users", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--actors", type=int, nargs="+", default=[16, 8, 4, 1])
    parser.add_argument("--cnn-users", type=int, nargs="+", default=[4, 10, 50])
    parser.add_argument("--ray-only", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="2 rounds, 10 users, tau 2")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.users, args.actors, args.cnn_users = 2, [4, 10], [], [2]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mps = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")).exists()
    rows = mnist_rows(args, device) + ([] if args.ray_only else cnn_rows(args, device))
    rows = [{**r, "device": device, "mps": mps} for r in rows]
    publish(rows, "gpu-mps" if mps else "gpu", args.out)


if __name__ == "__main__":
    main()
