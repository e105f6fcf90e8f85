"""FedAvg on pfl-research's simulator beside perfed-ray, two workloads, side by side.

    python3 -m venv /work/pfl-env                            # pfl's own environment,
    /work/pfl-env/bin/pip install 'pfl[pytorch]==0.6.0'      # never perfed-ray's
    python experiments/bench/pfl.py [--pairs 2] [--rounds N] [--workloads cifar10 mnist]
    python experiments/bench/pfl.py --smoke --out /tmp/bench   # tests: 2 rounds, few users
    python experiments/bench/pfl.py --workloads cifar10-dp --pairs 1 --seeds 0 \
        --pfl-threads 1 --append     # and at once the same with --seeds 1

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
- `cifar10-dp`: the same with central differential privacy, their baseline.yaml's
  `central_privacy_mechanism: gaussian_moments_accountant` with its delta (1e-6) and
  clipping bound (0.4), on both sides at the same epsilon (8), rounds (30) and
  population (the 1,000 users): pfl calibrates z with its PLD accountant at sampling
  probability cohort / population (pfl_side.py's docstring), perfed-ray with
  `privacy: central` under `sampling: poisson` and `privacy.accountant: pld`, the
  same accounting. Results go to OUT/pfl-dp.parquet and OUT/pfl-dp.md (what differs
  between the two setups is listed there, `DP_DIFFERENCES`), not to BENCHMARKS.md.
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
  perfed-ray's users here, each user's images exported in a random order (perfed-ray
  stores them sorted, so by class, and pfl walking them in that order trained on
  batches of one or two classes).
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
refreshes BENCHMARKS.md. `--seeds` runs each workload at each seed (partition, w_0,
sampling and noise), `--pairs` times.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from common import HERE, MNIST, RESULTS, run_cli, save, side_run
from flower import export_users
from report import _machine, _markdown, pfl_ratios, publish

from perfed_ray.analysis import read_table
from perfed_ray.config import RunConfig, load
from perfed_ray.models import initial_model
from perfed_ray.privacy import accounting
from perfed_ray.runtime import simulation

DEFAULT_PFL = Path("/work/pfl-env/bin/python")
CIFAR10 = HERE / "pfl-cifar10.yaml"
# Their baseline.yaml's central DP (delta, clipping bound) at an epsilon both learn at,
# accounted as pfl does: Poisson sampling at cohort / population, PLD.
PRIVATE = [
    "privacy=central",
    "privacy.epsilon=8",
    "privacy.delta=1e-6",
    "privacy.clip=0.4",
    "sampling=poisson",
    "privacy.accountant=pld",
]
WORKLOADS = {  # perfed-ray's configuration and settings, pfl_side.py's model, rounds
    "cifar10": (CIFAR10, [], "simple_cnn", 12),  # the whole process: 12 rounds
    "cifar10-dp": (CIFAR10, PRIVATE, "simple_cnn", 30),  # a few minutes a side on 2 cores
    "mnist": (MNIST, ["algorithm=fedavg"], "mlp", 100),  # the paper's 100-round process
}
SMOKE = {  # 2 rounds of a few users each, perfed-ray scoring 4 users of CIFAR-10's 1,000
    "cifar10": ["fraction=0.004", "eval_users=4", "sample_final_eval=true"],
    "cifar10-dp": ["fraction=0.004", "eval_users=4", "sample_final_eval=true"],
    "mnist": ["n_users=10"],
}


DP_WORKLOAD = "cifar10-dp"
# Their baseline.yaml's published DP run, for the summary's reference noise: epsilon 2
# over 1,500 rounds, accounted for 1,000 users a round of train.py's population of 1e6
# (noise_cohort_size), the noise scaled to the 50 simulated by 50 / 1,000.
PUBLISHED = {"epsilon": 2.0, "rounds": 1500, "population": 10**6, "noise_cohort": 1000}
DP_DIFFERENCES = """\
- Cohorts: pfl's `random` user sampler draws exactly 50 users a round, each uniformly
  and with replacement (a user may be in a cohort twice, and then counts twice), while
  its accountant assumes Poisson sampling at q = cohort / population = 0.05, which
  neither describes: its epsilon is that of the Poisson mechanism it does not run.
  perfed-ray samples as it accounts (`sampling: poisson`: each user joins with
  probability 0.05, so cohorts vary around 50) and divides the noised sum by the
  expected 50 (DP-FedAvg's fixed denominator); pfl divides by its 50. perfed-ray's
  fixed-size cohorts (`sampling: uniform`, without replacement) would be accounted by
  RDP under replace-one (sensitivity 2 clip): the noise multiplier in the last table.
- Accountant: both dp-accounting's PLD, pessimistic, connect-the-dots, add-or-remove
  one user; pfl discretises at 1e-4 and bisects z to a relative 1e-3, perfed-ray
  discretises at 1e-3 and brackets z to a relative 1e-5 (their largest relative
  difference is under the runs' table).
- Noise scale: their baseline.yaml's `noise_cohort_size: 1000` with train.py's
  `population=1e6` accounts a cohort of 1,000 drawn from a million (q = 0.001) and
  multiplies the noise by 50 / 1,000: the noise of a deployment they do not simulate
  (on the mean, the last table's ratio less than these runs'), and no guarantee for
  these 1,000 users. Both sides here account the run as simulated: population 1,000,
  noise cohort = cohort (noise_scale 1).
- Budget and length: epsilon 8 over 30 rounds, not their 2 over 1,500: 30 rounds to
  fit two sides and two seeds into the CPU time at hand; epsilon 8, no other measured,
  as an epsilon at which a 30-round run learns at all.
- Noise draws: pfl's from torch's generator seeded by its central context, perfed-ray's
  from the run's keyed streams; the same deviation, z * clip on the sum of every
  parameter (both clip the whole update's L2 norm, the model's change in the round).
- Everything the non-private workload differs in (pfl.py's docstring: data order in
  an epoch, dropout's masks, evaluation) differs here too.
"""


def pfl_python() -> Path | None:
    """pfl's interpreter: $PERFED_PFL_PYTHON, else /work/pfl-env's if there."""
    named = os.environ.get("PERFED_PFL_PYTHON")
    if named:
        return Path(named)
    return DEFAULT_PFL if DEFAULT_PFL.exists() else None


def export_indices(cfg: RunConfig, path: Path) -> None:
    """The users as sample numbers into the data set's file, the input scaling and w_0,
    in the layout pfl_side.py reads (an image data set read from a .npz). Each user's
    training samples in a random order (seeded), as their slices of a permutation:
    perfed-ray's are sorted, which pfl's in-order epochs would walk class by class."""
    prepared = simulation.prepare(cfg)
    root = Path(prepared.cfg.data_root)
    data_file = next(
        p for p in (root / "cifar10.npz", root / "cifar10" / "cifar10.npz") if p.exists()
    )
    state = initial_model(prepared.cfg, prepared.source([])).state_dict()
    arrays = {f"w:{k}": v.numpy() for k, v in state.items()}
    arrays |= {"data_file": np.asarray(str(data_file))}
    arrays |= {"offset": prepared.scaling.offset, "divisor": prepared.scaling.divisor}
    order = np.random.default_rng(cfg.seed)
    for user in prepared.users:
        arrays[f"train{user.user}"] = order.permutation(user.train)
        arrays[f"test{user.user}"] = user.test
    np.savez(path, **arrays)


def perfed_ray_run(config: Path, sets: list[str]) -> dict:
    """One `perfed-ray run`: its seconds, where its whole run's went, its final model's
    loss and accuracy on every user's test shard, and with DP the noise multiplier it
    calibrated and the epsilon it spent."""
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
        "noise_multiplier": run.get("privacy.noise_multiplier"),
        "epsilon": float(rounds["epsilon"].iloc[-1]),
    }


def pfl_run(
    python: Path, cfg: RunConfig, model: str, users: Path, threads: int | None = None
) -> dict:
    """One pfl run in its own interpreter (-P: the pfl package, not this folder's pfl.py),
    with `threads` torch threads if given."""
    local = {"--epochs": cfg.local_epochs} if cfg.local_epochs else {"--steps": cfg.tau}
    private = cfg.section("privacy") if cfg.privacy == "central" else {}
    privacy = {f"--{key}": private[key] for key in ("epsilon", "delta", "clip") if key in private}
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
        **privacy,
    }
    return side_run("pfl", [str(python), "-P", str(HERE / "pfl_side.py")], args)


def row(workload: str, pair: int, tool: str, cfg: RunConfig, run: dict) -> dict:
    per_round = np.asarray(run.pop("round_seconds"))
    steady = per_round[1:] if len(per_round) > 1 else per_round
    return {
        "workload": workload,
        "pair": pair,
        "seed": cfg.seed,
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


def reference_noise(cfg: RunConfig) -> pd.DataFrame:
    """Noise multipliers the summary sets beside the runs': perfed-ray's fixed-size
    cohorts at the run's budget, and their published baseline (PUBLISHED)."""
    private = cfg.section("privacy")
    cohort, delta = cfg.users_per_round, private["delta"]
    fixed = accounting.Plan("central", "fixed", cfg.n_users, cohort, delta, "rdp")
    published = accounting.Plan(
        "central", "poisson", PUBLISHED["population"], PUBLISHED["noise_cohort"], delta, "pld"
    )
    z = accounting.noise_multiplier(published, PUBLISHED["epsilon"], PUBLISHED["rounds"])
    scale = cohort / PUBLISHED["noise_cohort"]
    rows = [
        (
            "perfed-ray, sampling: uniform (fixed, RDP, replace-one)",
            private["epsilon"],
            cfg.rounds,
            fixed.q,
            accounting.noise_multiplier(fixed, private["epsilon"], cfg.rounds),
            1.0,
        ),
        (
            "their published baseline (population 1e6, noise_cohort_size 1000)",
            PUBLISHED["epsilon"],
            PUBLISHED["rounds"],
            published.q,
            z,
            scale,
        ),
    ]
    columns = ["setting", "epsilon", "rounds", "q", "noise_multiplier", "noise_scale"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["deviation_on_mean"] = (
        frame["noise_multiplier"] * frame["noise_scale"] * private["clip"] / cohort
    )
    return frame


def digits(frame: pd.DataFrame, columns: list[str], fmt: str = ".5g") -> pd.DataFrame:
    """`columns` as text to more digits than a table's three: noise multipliers that
    agree to the accountants' tolerance show it."""
    return frame.assign(**{c: [format(v, fmt) for v in frame[c]] for c in columns})


def dp_summary(table: pd.DataFrame, cfg: RunConfig, command: list[str]) -> str:
    """pfl-dp.md: the commands that made it, the settings, each run's noise multiplier, epsilon,
    accuracy and seconds, the mean per tool, the reference noise and what differs."""
    private = cfg.section("privacy")
    clip, cohort = private["clip"], cfg.users_per_round
    cols = [
        "seed",
        "tool",
        "noise_multiplier",
        "epsilon",
        "final_test_accuracy",
        "final_test_loss",
        "round_seconds_median",
        "whole_seconds",
        "calibration_seconds",  # pfl's accountant's bisection (perfed-ray's is in its run)
    ]
    runs = table[cols].sort_values(["seed", "tool"])
    runs = runs.assign(deviation_on_mean=runs["noise_multiplier"] * clip / cohort)
    z = table.groupby("tool")["noise_multiplier"]
    ends = (z.max()["pfl"] / z.min()["perfed-ray"], z.min()["pfl"] / z.max()["perfed-ray"])
    apart = max(abs(end - 1) for end in ends)
    reference = reference_noise(cfg)
    less = runs["deviation_on_mean"].mean() / reference["deviation_on_mean"].iloc[-1]
    per_tool = table.groupby("tool")["final_test_accuracy"]
    means = pd.DataFrame(
        {
            "accuracy_mean": per_tool.mean(),
            "accuracy_std": per_tool.std(),
            "loss_mean": table.groupby("tool")["final_test_loss"].mean(),
            "runs": per_tool.count(),
        }
    ).reset_index()
    return "\n".join(
        [
            "# pfl-research's CIFAR-10 central-DP benchmark, small, on both sides",
            "",
            *[f"    {line}" for line in command],
            "",
            f"{cfg.n_users} IID users of CIFAR-10's training images, {cohort} a round, "
            f"{cfg.rounds} rounds of FedAvg (pfl-cifar10.yaml); central DP at epsilon "
            f"{private['epsilon']:g}, delta {private['delta']:g}, clip {clip:g}: perfed-ray "
            "`privacy: central`, `sampling: poisson`, `privacy.accountant: pld`; pfl their "
            f"`gaussian_moments_accountant` at population {cfg.n_users}, noise_cohort_size "
            f"{cohort}. `deviation_on_mean`: the noise's standard deviation per parameter "
            "on the released mean update. For pfl, `epsilon` is its accountant's target; "
            f"for perfed-ray, what its rounds table says it spent. {_machine(table)} The "
            "seconds are a shared machine's, runs with --append side by side: not a speed "
            "comparison (BENCHMARKS.md's pfl section is).",
            "",
            _markdown(digits(runs, ["noise_multiplier", "deviation_on_mean"])),
            "",
            f"The two sides' noise multipliers differ by {apart:.2g} of perfed-ray's at most.",
            "",
            "Final accuracy of the central model on the 10,000 test images, per tool:",
            "",
            _markdown(means),
            "",
            "Reference noise multipliers (perfed-ray's accountant):",
            "",
            _markdown(digits(reference, ["q", "noise_multiplier", "deviation_on_mean"])),
            "",
            f"Their published setting puts {less:.3g} times less noise on the mean update "
            "than these runs.",
            "",
            "What differs between the two setups:",
            "",
            DP_DIFFERENCES,
        ]
    )


def commands(out: Path) -> list[str]:
    """The commands on top of OUT/pfl-dp.md: its indented lines after the title."""
    lines = (out / "pfl-dp.md").read_text().splitlines()[2:]
    return [line.strip() for line in lines[: lines.index("")]]


def summarise(out: Path, command: list[str], cfg: RunConfig | None = None) -> None:
    """Write and print OUT/pfl-dp.md from OUT/pfl-dp.parquet; `cfg`, the runs'
    configuration, by default the workload's at the runs' rounds (not --set's)."""
    table = pd.read_parquet(out / "pfl-dp.parquet")
    rounds = f"rounds={int(table['rounds'].iloc[0])}"
    summary = dp_summary(table, cfg or load(CIFAR10, [*PRIVATE, rounds]), command)
    (out / "pfl-dp.md").write_text(summary)
    print(summary)


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
    parser.add_argument(
        "--seeds", type=int, nargs="+", help="run each workload at each (default: its own)"
    )
    parser.add_argument("--smoke", action="store_true", help="2 rounds of a few users, 1 pair")
    parser.add_argument(
        "--summary-only",
        action="store_true",
        help="rewrite OUT/pfl-dp.md from OUT/pfl-dp.parquet, keeping the commands on its top",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="add cifar10-dp's runs to OUT/pfl-dp.parquet's (runs in parallel, one a seed)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.pfl_python is None or not args.pfl_python.exists():
        parser.error(
            f"no pfl interpreter ({args.pfl_python or DEFAULT_PFL}): make one as the "
            "docstring says, or name it with --pfl-python or $PERFED_PFL_PYTHON"
        )
    if args.summary_only:
        summarise(args.out, commands(args.out))
        return 0
    if args.smoke:
        args.rounds, args.pairs = 2, 1
    rows, made = [], {}  # the runs; each workload's configuration (its last seed's)
    for workload in args.workloads:
        config, sets, model, rounds = WORKLOADS[workload]
        rounds = args.rounds or rounds
        sets = [*sets, f"rounds={rounds}", *(SMOKE[workload] if args.smoke else []), *args.set]
        pair = 0  # numbered on across seeds: (workload, pair) names one pair of runs
        for seed in args.seeds or [None]:
            seeded = [*sets, *([f"seed={seed}"] if seed is not None else [])]
            cfg = made[workload] = load(config, seeded)
            with tempfile.TemporaryDirectory() as folder:
                users = Path(folder) / "users.npz"
                if workload == "mnist":
                    export_users(cfg, users, test=True)
                else:
                    export_indices(cfg, users)
                for _ in range(args.pairs):
                    ours = perfed_ray_run(config, seeded)
                    rows.append(row(workload, pair, "perfed-ray", cfg, ours))
                    print(rows[-1], flush=True)
                    theirs = pfl_run(args.pfl_python, cfg, model, users, args.pfl_threads)
                    rows.append(row(workload, pair, "pfl", cfg, theirs))
                    print(rows[-1], flush=True)
                    pair += 1
    table = pd.DataFrame(rows)
    shown = ["round_seconds_median", "whole_seconds", "final_test_loss"]
    print(
        table.pivot(index=["workload", "pair"], columns="tool", values=shown).round(3).to_string()
    )
    print("pfl's seconds / perfed-ray's:")
    print(pfl_ratios(table).round(2).to_string())
    private = table["workload"] == DP_WORKLOAD
    if (~private).any():
        publish([r for r in rows if r["workload"] != DP_WORKLOAD], "pfl", args.out)
    if private.any():
        mine = [r for r in rows if r["workload"] == DP_WORKLOAD]
        before = args.out / "pfl-dp.parquet"
        earlier = args.append and before.exists()
        previous = pd.read_parquet(before).to_dict("records") if earlier else []
        save([*previous, *mine], "pfl-dp", args.out)
        script = Path(sys.argv[0]).resolve()
        shown = script.relative_to(HERE.parents[1]) if script.is_relative_to(HERE) else script
        command = " ".join(["python", str(shown), *sys.argv[1:]])
        summarise(args.out, [*(commands(args.out) if earlier else []), command], made[DP_WORKLOAD])
    return 0


if __name__ == "__main__":
    sys.exit(main())
