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
strategy, the simulated minutes to reach 80% and 90% mean personalised accuracy (the
first evaluation at or above it; the seeds that never do are counted), the final
accuracy, and accuracy against simulated hours.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from table1 import Cell, grid_options, run_grid

from perfed_ray.analysis import TARGETS, read_runs, read_table, summary
from perfed_ray.markdown import table
from perfed_ray.report.curves import plot as plot_curves
from perfed_ray.report.curves import run_curves

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "configs" / "async" / "mnist.yaml"
COHORT = 20  # the configuration's users a synchronous round: FedBuff's K
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


def finished(out: Path) -> pd.DataFrame:
    """The finished runs with their summaries (perfed_ray.analysis.summary: final
    accuracy, simulated seconds covered and to each target) and their grid cell."""
    runs = read_runs(out)
    runs = runs[runs["status"] == "finished"]
    figures = ["run_id", "accuracy", "sim_time", *(f"time_to_{100 * t:.0f}" for t in TARGETS)]
    runs = runs.merge(summary(out)[figures], on="run_id")
    return runs.assign(cell=[(r["algorithm"], strategy_of(r)) for _, r in runs.iterrows()])


def table_of(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per method and strategy, in the grid's order: simulated minutes to each
    target (the mean over the seeds that reach it, and how many of them do), final
    accuracy and the simulated minutes the runs covered, means over seeds."""
    rows = []
    for method, strategy in GRID:
        mine = runs[runs["cell"] == (method, strategy)]
        if mine.empty:
            continue
        row = {"method": method, "strategy": strategy, "seeds": len(mine)}
        for target in TARGETS:
            # minutes: this setting's runs cover minutes of simulated time, not hours
            minutes = mine[f"time_to_{100 * target:.0f}"].dropna() / 60
            mean = f"{minutes.mean():.2f}" if len(minutes) else "-"
            row[f"minutes to {target:.0%}"] = f"{mean} ({len(minutes)}/{len(mine)})"
        row["final accuracy (%)"] = f"{100 * mine['accuracy'].mean():.2f}"
        row["final minutes"] = f"{mine['sim_time'].mean() / 60:.2f}"
        rows.append(row)
    return pd.DataFrame(rows)


def write(out: Path) -> list[Path]:
    """The report's table (OUT/report/async.md) and its curves against round, training
    seconds and simulated hours (OUT/report/async.png, perfed_ray.report.curves')."""
    folder = out / "report"
    folder.mkdir(parents=True, exist_ok=True)
    runs = finished(out)
    frame = table_of(runs)
    report = folder / "async.md"
    report.write_text(
        "# Time to accuracy on the simulated clock\n\n"
        "Made by `python experiments/async_time_to_accuracy.py`. Minutes are simulated; "
        "accuracy is the mean over users after personalisation; in brackets, the seeds "
        "that reached the target.\n\n" + table(frame.columns, frame.itertuples(index=False)) + "\n"
    )
    evals, rounds = read_table(out, "evals"), read_table(out, "rounds")
    curves = {}
    for method, strategy in GRID:
        ids = runs.loc[runs["cell"] == (method, strategy), "run_id"]
        if len(ids):
            mine = evals[evals["run_id"].isin(ids) & ~evals["final"]]
            curves[f"{method}, {strategy}"] = run_curves(mine, rounds[rounds["run_id"].isin(ids)])
    plot = folder / "async.png"
    plot_curves(curves, f"time to accuracy ({CONFIG.name})", plot)
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
