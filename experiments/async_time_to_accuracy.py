"""Time to accuracy on the simulated clock (issue 43): synchronous rounds, over-commitment,
FedBuff and FedAsync, and personalised methods synchronous and under FedBuff.

    python experiments/async_time_to_accuracy.py --dry-run      # what would run, how long
    python experiments/async_time_to_accuracy.py                # the grid, then the report
    python experiments/async_time_to_accuracy.py --report-only  # the report from what is there
    python experiments/async_time_to_accuracy.py --smoke --out /tmp/a  # a tiny grid, for CI

The setting is experiments/configs/async/mnist.yaml (MNIST, Dirichlet 0.3 over 1,000
users, lognormal devices of sigma 1, diurnal availability, 20 users a synchronous
round). The grid, times `--seeds` seeds:

- FedAvg: synchronous; with `overcommit: 1.3` (26 users drawn, the first 20 to arrive
  kept); FedBuff (concurrency 60, K = 20: three cohorts in flight, a step every 20
  arrivals, FedBuff's 1/sqrt(1 + s) weights); FedAsync (concurrency 20, alpha 0.6, the
  polynomial staleness weight), whose every arrival is a server step, so it runs K times
  the steps (and evaluates K times more rarely in steps) to train on as many updates;
- Per-FedAvg (HF) and Ditto, synchronous and under FedBuff.

Every run is scored after personalisation, as every method is (PROTOCOL.md: one step
of size alpha for Per-FedAvg and FedAvg, each method's own for Ditto), on 10% of the
users every 10 (FedAsync: 200) steps and on everyone at the end. The cells are run,
skipped when done and resumed when stopped as table1.py runs its own, all in this
process on one Ray. The report (OUT/report/async.md and async.png): for each method and
strategy, the simulated hours to reach 80% and 90% mean personalised accuracy (the
first evaluation at or above it; the seeds that never do are counted), the final
accuracy, and accuracy against simulated hours.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from table1 import Cell, grid_options, run_grid

from perfed_ray.analysis import read_runs, read_table
from perfed_ray.markdown import table

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "configs" / "async" / "mnist.yaml"
COHORT = 20  # the configuration's users a synchronous round: FedBuff's K
TARGETS = (0.8, 0.9)
STRATEGIES = {
    "synchronous": (),
    "overcommit 1.3": ("overcommit=1.3",),
    "FedBuff": (
        "strategy=fedbuff",
        f"fedbuff.concurrency={3 * COHORT}",
        f"fedbuff.buffer_size={COHORT}",
    ),
    "FedAsync": ("strategy=fedasync", f"fedasync.concurrency={COHORT}", "fedasync.alpha=0.6"),
}
GRID = [
    *(("fedavg", s) for s in STRATEGIES),
    *((m, s) for m in ("perfedavg-hf", "ditto") for s in ("synchronous", "FedBuff")),
]
# --smoke: every cell, one seed, a few gaussian users for a few steps (no data files)
SMOKE = (
    "dataset=gaussian",
    "partition=iid",
    "n_users=80",
    "fraction=0.25",  # 20 users a round, as the real grid's
    "rounds=3",
    "eval_every=1",
    "tau=2",
    "eval_users=all",
)


def cells(config: Path, seeds: int, extra: tuple[str, ...]) -> list[Cell]:
    """Seed by seed, the grid's cells; FedAsync's steps and evaluation interval are K
    times the configuration's, so that it trains on as many updates."""
    base = Cell(config, extra).cfg()
    out = []
    for seed in range(seeds):
        for method, strategy in GRID:
            sets = (f"algorithm={method}", *STRATEGIES[strategy], f"seed={seed}", *extra)
            if strategy == "FedAsync":
                sets += (f"rounds={base.rounds * COHORT}", f"eval_every={base.eval_every * COHORT}")
            out.append(Cell(config, sets))
    return out


def strategy_of(run: pd.Series) -> str:
    """The grid's name for a run's strategy."""
    if run["strategy"] == "fedbuff":
        return "FedBuff"
    if run["strategy"] == "fedasync":
        return "FedAsync"
    return "synchronous" if run["overcommit"] == 1 else f"overcommit {run['overcommit']:g}"


def curves(out: Path) -> pd.DataFrame:
    """Each finished run's accuracy after personalisation at each evaluation (the mean
    over users of each user's mean over draws) against simulated hours."""
    runs = read_runs(out)
    runs = runs[runs["status"] == "finished"].set_index("run_id")
    evals = read_table(out, "evals")
    evals = evals[evals["run_id"].isin(runs.index) & ~evals["unseen"]]
    per_user = evals.groupby(["run_id", "final", "round", "user"], as_index=False).agg(
        acc=("acc_after", "mean"), sim_time=("sim_time", "first")
    )
    points = per_user.groupby(["run_id", "final", "round"], as_index=False).agg(
        accuracy=("acc", "mean"), sim_time=("sim_time", "first")
    )
    points["hours"] = points["sim_time"] / 3600
    points["method"] = runs.loc[points["run_id"], "algorithm"].to_numpy()
    points["strategy"] = [strategy_of(runs.loc[r]) for r in points["run_id"]]
    points["seed"] = runs.loc[points["run_id"], "seed"].to_numpy()
    return points.sort_values(["run_id", "final", "round"])


def hours_to(points: pd.DataFrame, target: float) -> float | None:
    """Simulated hours of a run's first evaluation at or above `target`, None if none."""
    reached = points[points["accuracy"] >= target]
    return float(reached["hours"].min()) if len(reached) else None


def summary(points: pd.DataFrame) -> pd.DataFrame:
    """One row per method and strategy, in the grid's order: hours to each target
    (mean over the seeds that reach it, and how many of them do) and final accuracy."""
    rows = []
    for method, strategy in GRID:
        mine = points[(points["method"] == method) & (points["strategy"] == strategy)]
        runs = [run for _, run in mine.groupby("run_id")]
        if not runs:
            continue
        row = {"method": method, "strategy": strategy, "seeds": len(runs)}
        for target in TARGETS:
            reached = [h for h in (hours_to(r, target) for r in runs) if h is not None]
            mean = f"{sum(reached) / len(reached):.1f}" if reached else "-"
            row[f"hours to {target:.0%}"] = f"{mean} ({len(reached)}/{len(runs)})"
        finals = [float(r.loc[r["final"], "accuracy"].iloc[0]) for r in runs]
        row["final accuracy (%)"] = f"{100 * sum(finals) / len(finals):.2f}"
        row["final hours"] = f"{sum(float(r['hours'].max()) for r in runs) / len(runs):.1f}"
        rows.append(row)
    return pd.DataFrame(rows)


def write(out: Path) -> list[Path]:
    """The report's table and plot under OUT/report."""
    points = curves(out)
    folder = out / "report"
    folder.mkdir(parents=True, exist_ok=True)
    frame = summary(points)
    text = (
        "# Time to accuracy on the simulated clock\n\n"
        "Made by `python experiments/async_time_to_accuracy.py`. Hours are simulated; "
        "accuracy is the mean over users after personalisation; in brackets, the seeds "
        "that reached the target.\n\n" + table(frame.columns, frame.itertuples(index=False))
    )
    report = folder / "async.md"
    report.write_text(text + "\n")
    figure, axes = plt.subplots(figsize=(8, 5))
    for (method, strategy), mine in points[~points["final"]].groupby(["method", "strategy"]):
        mean = mine.groupby("round")[["hours", "accuracy"]].mean()
        axes.plot(mean["hours"], 100 * mean["accuracy"], label=f"{method}, {strategy}")
    axes.set_xlabel("simulated hours")
    axes.set_ylabel("personalised accuracy (%), mean over seeds")
    axes.legend(fontsize="small")
    plot = folder / "async.png"
    figure.savefig(plot, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return [report, plot]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "async")
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    grid_options(parser)
    args = parser.parse_args(argv)
    extra = (*(SMOKE if args.smoke else ()), *args.set)
    seeds = 1 if args.smoke else args.seeds
    return run_grid(args, lambda: cells(args.config, seeds, extra), write)


if __name__ == "__main__":
    sys.exit(main())
