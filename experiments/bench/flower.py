"""FedAvg on Flower's simulation engine beside perfed-ray, the same workload, side by side.

    python3 -m venv /work/flower-env                      # Flower's own environment,
    /work/flower-env/bin/pip install "flwr[simulation]" torch   # never perfed-ray's
    python experiments/bench/flower.py [--pairs 2] [--rounds 100] [--flower-python PATH]
    python experiments/bench/flower.py --smoke --out /tmp/bench   # tests: 2 rounds, 10 users

Workload: the paper's MNIST FedAvg (experiments/configs/table1/mnist-tau10-alpha0.01.yaml
with `algorithm=fedavg`): the MLP (80, 60, ELU), 50 users of the paper's split, 10 users
a round, tau = 10 steps of plain SGD on batches of 40 at the config's step size (beta),
the server's model the plain mean of the users'. Both sides start from the same w_0 and
their users hold the same samples: this script exports perfed-ray's partition (same seed)
and initial model to a temporary .npz that `flower_side.py`, run in Flower's
interpreter, reads; Flower never imports perfed-ray, nor perfed-ray Flower.

Each side runs on a local Ray with 2 CPUs' worth of actors: perfed-ray with its default
configuration (one actor per core, `fused` engine), Flower's Ray backend with
`client_resources = {num_cpus: 1}`, so 2 ClientApp actors. Per round both sample the
users, send them the model, train and aggregate; neither evaluates inside a round.
Flower does no evaluation at all (`fraction_evaluate = 0`, no server-side one);
perfed-ray keeps its defaults: every user scored at round 0 and every 20 rounds, 10
adaptation draws each at the end, and a checkpoint with each. Per-round seconds: perfed-
ray's `rounds` table (`wall_seconds`), Flower's strategy hooks (configure_train to the
end of aggregate_train); both exclude evaluations. Whole run: from starting the process
(`perfed-ray run` on the CLI; `flower_side.py`) to its exit, so Python, Ray and data
start-up are in it (Flower reads its already partitioned users from the .npz; perfed-ray
reads MNIST and splits it), and perfed-ray's evaluations and checkpoints.

The runs alternate, perfed-ray then Flower, `--pairs` times (ABAB), so that a busy
machine slows both alike. Prints per pair and tool the median and mean seconds per
round and the whole run's seconds, with Flower's / perfed-ray's ratios; records too
where perfed-ray's whole run went (its runs row: `actors_start_seconds`, and
`run_seconds` from Ray up to the last checkpoint) and each side's last training loss
(a check that both trained alike); writes
OUT/flower.parquet (default experiments/bench/results) and, for the default OUT,
refreshes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from common import HERE, MNIST, RESULTS, side_run, timed_run
from report import flower_ratios, publish

from perfed_ray.config import RunConfig, load
from perfed_ray.models import initial_model
from perfed_ray.runtime import simulation

DEFAULT_FLOWER = Path("/work/flower-env/bin/python")
SMOKE_USERS = 10


def flower_python() -> Path | None:
    """Flower's interpreter: $PERFED_FLOWER_PYTHON, else /work/flower-env's if there."""
    named = os.environ.get("PERFED_FLOWER_PYTHON")
    if named:
        return Path(named)
    return DEFAULT_FLOWER if DEFAULT_FLOWER.exists() else None


def export_users(cfg: RunConfig, path: Path, test: bool = False) -> None:
    """The users' training samples (as perfed-ray's actors make them: same partition,
    same input scaling) and w_0, in the layout flower_side.py reads; with `test`, their
    test samples too (`tx<u>`, `ty<u>`), which pfl_side.py scores the model on."""
    prepared = simulation.prepare(cfg)
    users = list(range(cfg.n_users))
    shards = prepared.source(users).shards(users, torch.device("cpu"), prepared.data)
    arrays = {
        f"w:{k}": v.numpy() for k, v in initial_model(cfg, prepared.source([])).state_dict().items()
    }
    for u, shard in shards.items():
        arrays[f"x{u}"], arrays[f"y{u}"] = shard.x_train.numpy(), shard.y_train.numpy()
        if test:
            arrays[f"tx{u}"], arrays[f"ty{u}"] = shard.x_test.numpy(), shard.y_test.numpy()
    np.savez(path, **arrays)


def perfed_ray_run(sets: list[str]) -> dict:
    """One `perfed-ray run`, and where its whole run's seconds went."""
    seconds, rounds, run = timed_run(MNIST, sets)
    return {
        "whole_seconds": seconds,
        "round_seconds": rounds["wall_seconds"].tolist(),
        "final_train_loss": float(rounds["train_loss"].iloc[-1]),
        "actors_start_seconds": float(run["startup_seconds"]),
        "run_seconds": float(run["wall_seconds"]),
    }


def flower_run(python: Path, cfg: RunConfig, data: Path) -> dict:
    """One Flower run in its own interpreter."""
    args = {
        "--data": data,
        "--rounds": cfg.rounds,
        "--users-per-round": cfg.users_per_round,
        "--tau": cfg.tau,
        "--batch-size": cfg.batch_size,
        "--lr": cfg.beta,
    }
    return side_run("Flower", [str(python), str(HERE / "flower_side.py")], args)


def row(pair: int, tool: str, cfg: RunConfig, run: dict) -> dict:
    per_round = np.asarray(run.pop("round_seconds"))
    return {
        "pair": pair,
        "tool": tool,
        "rounds": cfg.rounds,
        "n_users": cfg.n_users,
        "users_per_round": cfg.users_per_round,
        "round_seconds_median": float(np.median(per_round)),
        "round_seconds_mean": float(per_round.mean()),
        "first_round_seconds": float(per_round[0]),
        **run,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flower-python", type=Path, default=flower_python())
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--smoke", action="store_true", help=f"2 rounds, {SMOKE_USERS} users")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.flower_python is None or not args.flower_python.exists():
        parser.error(
            f"no Flower interpreter ({args.flower_python or DEFAULT_FLOWER}): make one as "
            "the docstring says, or name it with --flower-python or $PERFED_FLOWER_PYTHON"
        )
    sets = ["algorithm=fedavg", f"rounds={args.rounds}"]
    if args.smoke:
        sets, args.pairs = ["algorithm=fedavg", "rounds=2", f"n_users={SMOKE_USERS}"], 1
    cfg = load(MNIST, sets)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "users.npz"
        export_users(cfg, data)
        for pair in range(args.pairs):
            rows.append(row(pair, "perfed-ray", cfg, perfed_ray_run(sets)))
            print(rows[-1], flush=True)
            rows.append(row(pair, "flower", cfg, flower_run(args.flower_python, cfg, data)))
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    shown = ["round_seconds_median", "round_seconds_mean", "whole_seconds"]
    print(table.pivot(index="pair", columns="tool", values=shown).round(3).to_string())
    print("Flower's seconds / perfed-ray's:")
    print(flower_ratios(table).round(2).to_string())
    publish(rows, "flower", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
