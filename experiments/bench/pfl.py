"""FedAvg on pfl-research's simulator beside perfed-ray, two workloads, side by side.

    python3 -m venv /work/pfl-env                            # pfl's own environment,
    /work/pfl-env/bin/pip install 'pfl[pytorch]==0.6.0'      # never perfed-ray's
    python experiments/bench/pfl.py [--pairs 2] [--rounds N] [--workloads cifar10 mnist]
    python experiments/bench/pfl.py --smoke --out /tmp/bench   # tests: 2 rounds, few users

`--set KEY=VALUE` adds perfed-ray settings to both workloads (pfl's flags are read from
the same configuration, so a shared setting such as batch_size moves both sides).

Workloads, the same hyper-parameters on both sides:

- `cifar10`: pfl-research's own CIFAR-10 benchmark (benchmarks/image_classification,
  configs/baseline.yaml with pytorch/train.py; perfed-ray's settings in
  pfl-cifar10.yaml beside this script): 1,000 IID users of 50 training images, 50 a
  round, FedAvg with one local epoch of SGD in batches of 10 at 0.1, the server's SGD
  at 1.0 on the users' unweighted mean update (which makes the new model that mean),
  their `simple_cnn` (perfed-ray's `simple_cnn`), evaluation every 10 rounds. Theirs
  runs 1,500 rounds; here 12, as the issue measured (`--rounds`): a round's seconds
  do not depend on how many there are, and the whole process's grow with them.
- `mnist`: the paper's FedAvg round, what flower.py runs against Flower (its perfed-ray
  side and its export are reused): the MLP (80, 60, ELU), 50 users of the paper's
  split, 10 a round, tau = 10 SGD steps on batches of 40 at beta, the plain mean; on
  pfl `local_num_steps = 10`. perfed-ray keeps its defaults (scores every user at round
  0, every 20 rounds and at the end with 10 adaptation draws); pfl scores the model on
  the same users' test samples before training, every 20 rounds and at the end.

Both sides start from perfed-ray's w_0 and their users hold the same samples: this
script exports perfed-ray's partition (the same seed) to a temporary .npz that
`pfl_side.py`, run in pfl's interpreter, reads (CIFAR-10 as sample numbers into
cifar10.npz and perfed-ray's per-channel scaling; MNIST as scaled samples); pfl never
imports perfed-ray, nor perfed-ray pfl. perfed-ray runs with its default execution (one
Ray actor per core, its `auto` engine), pfl with its `SimulatedBackend` in one process
(their benchmark's single-process setting; torch's threads, one per core, or
`--pfl-threads`: on a machine busy with other work, torch's two threads waiting on
each other took several times one thread's time here, so there measure both).

Where the workloads differ (what perfed-ray cannot say as theirs, or does besides):

- Cohorts: pfl's `random` user sampler (their benchmark's) draws each member uniformly
  and with replacement, so a cohort may hold a user twice; perfed-ray samples without.
- IID users: theirs are consecutive slices of a random permutation; perfed-ray's `iid`
  gives every user the same class mix (5 images of each class). Both sides use
  perfed-ray's users here.
- Local data order: pfl walks a user's samples in their stored order (one epoch of 5
  batches on CIFAR-10; on MNIST the samples are shuffled each time the user is drawn,
  then the first 10 batches); perfed-ray shuffles its epochs and draws tau batches
  at random.
- Dropout: pfl's masks come from torch's global generator, perfed-ray's from the run's
  keyed streams, so the two trainings agree in distribution, not step by step.
- Evaluation: pfl's central evaluation scores the global model on all users' test
  samples (their `CentralEvaluationCallback`, batches of 10,000), plus each cohort
  member's training data before and after its local epoch in every 10th round (their
  `evaluation_frequency`); perfed-ray scores every user's test shard (the same 10,000
  CIFAR-10 images, 10 per user) before and after one personalisation step (its
  minimum: `personalise_steps` >= 1), which pfl does not do, and checkpoints every
  20 rounds. pfl's scoring of cohort members is inside its every 10th round (the
  median round leaves it out); the rest is in the whole process only.

Timing: per round, perfed-ray's `rounds` table (`wall_seconds`: sampling, sending,
training, aggregating), pfl's own callbacks (from the end of one round's callbacks to
the start of the next's: sampling, local training, weighting, aggregation, the server's
step; central evaluation, a callback, is outside); the median leaves out each run's
first round (start-up). Whole process: from starting it (`perfed-ray run` on the CLI;
`pfl_side.py`) to its exit: Python, imports, reading and splitting (or scaling) the
data, Ray's start for perfed-ray, the evaluations.

Runs alternate, perfed-ray then pfl, `--pairs` times per workload (ABAB), so a busy
machine slows both alike. As a check that both sides compute the same thing, each
records the final model's mean loss and accuracy on all users' test samples (from the
same w_0 and data, they should agree to the noise of different sampling). Prints per
workload and pair both sides' seconds and pfl's / perfed-ray's ratios; writes
OUT/pfl.parquet (default experiments/bench/results) and, for the default OUT,
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
from common import HERE, MNIST, RESULTS, run_cli, side_run
from flower import export_users
from report import pfl_ratios, publish

from perfed_ray.analysis import read_table
from perfed_ray.config import RunConfig, load
from perfed_ray.models import initial_model
from perfed_ray.runtime import simulation

DEFAULT_PFL = Path("/work/pfl-env/bin/python")
CIFAR10 = HERE / "pfl-cifar10.yaml"
WORKLOADS = {  # perfed-ray's configuration and settings, pfl_side.py's model, rounds
    "cifar10": (CIFAR10, [], "simple_cnn", 12),  # the whole process: 12 rounds
    "mnist": (MNIST, ["algorithm=fedavg"], "mlp", 100),  # the paper's 100-round process
}
SMOKE = {  # 2 rounds of a few users each, perfed-ray scoring 4 users of CIFAR-10's 1,000
    "cifar10": ["fraction=0.004", "eval_users=4", "sample_final_eval=true"],
    "mnist": ["n_users=10"],
}


def pfl_python() -> Path | None:
    """pfl's interpreter: $PERFED_PFL_PYTHON, else /work/pfl-env's if there."""
    named = os.environ.get("PERFED_PFL_PYTHON")
    if named:
        return Path(named)
    return DEFAULT_PFL if DEFAULT_PFL.exists() else None


def export_indices(cfg: RunConfig, path: Path) -> None:
    """The users as sample numbers into the data set's file, the input scaling and w_0,
    in the layout pfl_side.py reads (an image data set read from a .npz)."""
    prepared = simulation.prepare(cfg)
    root = Path(prepared.cfg.data_root)
    data_file = next(
        p for p in (root / "cifar10.npz", root / "cifar10" / "cifar10.npz") if p.exists()
    )
    state = initial_model(prepared.cfg, prepared.source([])).state_dict()
    arrays = {f"w:{k}": v.numpy() for k, v in state.items()}
    arrays |= {"data_file": np.asarray(str(data_file))}
    arrays |= {"offset": prepared.scaling.offset, "divisor": prepared.scaling.divisor}
    for user in prepared.users:
        arrays[f"train{user.user}"], arrays[f"test{user.user}"] = user.train, user.test
    np.savez(path, **arrays)


def perfed_ray_run(config: Path, sets: list[str]) -> dict:
    """One `perfed-ray run`: its seconds, where its whole run's went, and its final
    model's loss and accuracy on every user's test shard."""
    with tempfile.TemporaryDirectory() as out:
        seconds = run_cli(config, sets, out)
        rounds = read_table(out, "rounds").sort_values("round")
        run = read_table(out, "runs").iloc[0]
        evals = read_table(out, "evals")
    final = evals[evals["final"] & (evals["draw"] == 0)]
    weights = final["n_test"] / final["n_test"].sum()
    return {
        "whole_seconds": seconds,
        "round_seconds": rounds["wall_seconds"].tolist(),
        "final_test_loss": float((final["loss_before"] * weights).sum()),
        "final_test_accuracy": float((final["acc_before"] * weights).sum()),
        "actors_start_seconds": float(run["startup_seconds"]),
        "run_seconds": float(run["wall_seconds"]),
        "engine": str(run["engine"]),
    }


def pfl_run(
    python: Path, cfg: RunConfig, model: str, users: Path, threads: int | None = None
) -> dict:
    """One pfl run in its own interpreter (-P: the pfl package, not this folder's pfl.py),
    with `threads` torch threads if given."""
    local = {"--epochs": cfg.local_epochs} if cfg.local_epochs else {"--steps": cfg.tau}
    args = {
        "--users": users,
        "--model": model,
        "--rounds": cfg.rounds,
        "--cohort": cfg.users_per_round,
        **local,
        "--batch-size": cfg.batch_size,
        "--lr": cfg.beta,
        "--eval-every": cfg.eval_every,
        "--seed": cfg.seed,
        **({"--threads": threads} if threads else {}),
    }
    return side_run("pfl", [str(python), "-P", str(HERE / "pfl_side.py")], args)


def row(workload: str, pair: int, tool: str, cfg: RunConfig, run: dict) -> dict:
    per_round = np.asarray(run.pop("round_seconds"))
    steady = per_round[1:] if len(per_round) > 1 else per_round
    return {
        "workload": workload,
        "pair": pair,
        "tool": tool,
        "rounds": cfg.rounds,
        "n_users": cfg.n_users,
        "users_per_round": cfg.users_per_round,
        "model": cfg.model,
        "round_seconds_median": float(np.median(steady)),
        "round_seconds_mean": float(per_round.mean()),
        "first_round_seconds": float(per_round[0]),
        **run,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pfl-python", type=Path, default=pfl_python())
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--rounds", type=int, help="every workload's (default: its own)")
    parser.add_argument(
        "--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS)
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="more perfed-ray settings"
    )
    parser.add_argument(
        "--pfl-threads", type=int, help="pfl's torch threads (default: torch's, one per core)"
    )
    parser.add_argument("--smoke", action="store_true", help="2 rounds of a few users, 1 pair")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.pfl_python is None or not args.pfl_python.exists():
        parser.error(
            f"no pfl interpreter ({args.pfl_python or DEFAULT_PFL}): make one as the "
            "docstring says, or name it with --pfl-python or $PERFED_PFL_PYTHON"
        )
    if args.smoke:
        args.rounds, args.pairs = 2, 1
    rows = []
    for workload in args.workloads:
        config, sets, model, rounds = WORKLOADS[workload]
        rounds = args.rounds or rounds
        sets = [*sets, f"rounds={rounds}", *(SMOKE[workload] if args.smoke else []), *args.set]
        cfg = load(config, sets)
        with tempfile.TemporaryDirectory() as folder:
            users = Path(folder) / "users.npz"
            if workload == "mnist":
                export_users(cfg, users, test=True)
            else:
                export_indices(cfg, users)
            for pair in range(args.pairs):
                rows.append(row(workload, pair, "perfed-ray", cfg, perfed_ray_run(config, sets)))
                print(rows[-1], flush=True)
                rows.append(
                    row(
                        workload,
                        pair,
                        "pfl",
                        cfg,
                        pfl_run(args.pfl_python, cfg, model, users, args.pfl_threads),
                    )
                )
                print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    shown = ["round_seconds_median", "whole_seconds", "final_test_loss"]
    print(
        table.pivot(index=["workload", "pair"], columns="tool", values=shown).round(3).to_string()
    )
    print("pfl's seconds / perfed-ray's:")
    print(pfl_ratios(table).round(2).to_string())
    publish(rows, "pfl", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
