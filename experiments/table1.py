"""Run the extended Table 1 grid (Fallah et al. 2020) and write its report.

    python experiments/table1.py --dry-run                 # what would run, how long
    python experiments/table1.py                           # the grid, then the report
    python experiments/table1.py --study --jobs 2          # also the CIFAR-10 study
    python experiments/table1.py mnist-tau10-alpha0.01     # one row only
    python experiments/table1.py --study-only              # the study alone

The grid: every row of Table 1 (experiments/configs/table1/*.yaml) times
FedAvg, Per-FedAvg (FO), (HF) and exact Per-FedAvg, times `--seeds` training
seeds; FedAvg again with `adapt_on: test` (the paper's FedAvg text, which
leaks test labels, reported separately); with `--study`, the two CIFAR-10
`alpha = 0.01` rows over `input_scale` (standardize, raw) for the paper's
three algorithms and HF with `hf_delta: normalized` for every input scale.

Each cell is one `perfed-ray run` (with `users_per_actor=auto`, the fastest
path on a small machine) into `--out`. A cell whose run already finished or
diverged there (the same configuration, every key that changes numbers) is
skipped; a stopped one is resumed from its checkpoint; so the script can be
stopped and started again over several sittings. Two of it may share a folder
only if they share no cells (say, one on the main grid's rows and one
`--study-only`): each plans its cells once, at its start. It ends with
`perfed-ray report OUT`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from perfed_ray import config as configuration
from perfed_ray.analysis import read_runs
from perfed_ray.data.datasets import paper_a
from perfed_ray.report import write_report
from perfed_ray.report.cells import MECHANICS
from perfed_ray.results.layout import CHECKPOINTS

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs" / "table1"
ALGORITHMS = ["fedavg", "perfedavg-fo", "perfedavg-hf", "perfedavg"]
STUDY_ROWS = ["cifar10-tau4-alpha0.01", "cifar10-tau4-alpha0.01-diff"]
STUDY_ALGORITHMS = ["fedavg", "perfedavg-fo", "perfedavg-hf"]
RUN_WITH = ["users_per_actor=auto"]  # execution only: not part of a cell's identity
# Seconds per local step (one user's tau steps cost tau times this, 10 users a round
# in parallel on 2 cores), from the 1000-round MNIST runs in experiments/results/README.md
# (2.7, 3.1, 10.8 minutes; exact, and methods not listed, assumed as HF); CIFAR-10's
# 3072 inputs make the MLP's first layer, most of its work, about 4 times MNIST's.
# Finished runs in the results folder replace these guesses (see `estimate`).
STEP_SECONDS = {
    "fedavg": 0.0162,
    "perfedavg-fo": 0.0186,
    "perfedavg-hf": 0.0648,
    "perfedavg": 0.0648,
}
DATASET_FACTOR = {"mnist": 1.0, "cifar10": 4.0}


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a row's configuration file and its overrides."""

    config: Path
    sets: tuple[str, ...]

    def cfg(self) -> configuration.RunConfig:
        return configuration.load(self.config, self.sets)

    def name(self) -> str:
        return self.config.stem + "".join(f" {s}" for s in self.sets)


def grid(
    configs: Path,
    seeds: int,
    study: bool,
    algorithms: Iterable[str],
    extra: Iterable[str] = (),
    only: Iterable[str] = (),
    main: bool = True,
) -> list[Cell]:
    """Every cell, main grid first (rows, algorithms, seeds), then the leaking FedAvg,
    then the study; `extra` overrides (e.g. rounds=40) apply to all of them; `only`
    names the rows to keep (all when empty); without `main`, the study alone."""
    extra, only = tuple(extra), set(only)
    rows = sorted(row for row in configs.glob("*.yaml") if not only or row.stem in only)
    algorithms = list(algorithms)
    cells = (
        [
            Cell(row, (f"algorithm={a}", f"seed={s}", *extra))
            for row in rows
            for a in algorithms
            for s in range(seeds)
        ]
        if main
        else []
    )
    if main and "fedavg" in algorithms:
        cells += [
            Cell(row, ("algorithm=fedavg", "adapt_on=test", f"seed={s}", *extra))
            for row in rows
            for s in range(seeds)
        ]
    if study:
        studied = [row for row in rows if row.stem in STUDY_ROWS]
        variants = [
            (scale, a, "fixed")
            for scale in ("standardize", "raw")
            for a in STUDY_ALGORITHMS
            if a in algorithms
        ]
        if "perfedavg-hf" in algorithms:
            variants += [
                (scale, "perfedavg-hf", "normalized") for scale in ("unit", "standardize", "raw")
            ]
        cells += [
            Cell(
                row,
                (f"algorithm={a}", f"input_scale={scale}", f"hf_delta={hf}", f"seed={s}", *extra),
            )
            for row in studied
            for scale, a, hf in variants
            for s in range(seeds)
        ]
    return cells


# `auto` values a run writes into its configuration as the number it resolved them to,
# a function of the other values (the noise multiplier: of the budget, delta, rounds and
# sampling): a cell leaving one `auto` matches a run by the others.
RESOLVED = ("privacy.noise_multiplier",)


def identity(cfg: configuration.RunConfig) -> dict[str, object]:
    """The configuration values that change a run's numbers (`auto` paper_a resolved;
    RESOLVED keys left `auto` out)."""
    values = {
        k: v
        for k, v in cfg.to_dict().items()
        if k not in MECHANICS and not (k in RESOLVED and v is None)
    }
    if values["paper_a"] is None:
        values["paper_a"] = paper_a(cfg.dataset)
    return values


def state(cell: Cell, runs: pd.DataFrame) -> tuple[str, str | None]:
    """('done', run id) if a run of the cell finished or diverged (it would diverge
    again), ('resume', run id) for the latest one that stopped otherwise, else
    ('todo', None)."""
    if runs.empty:
        return "todo", None
    match = pd.Series(True, index=runs.index)
    for key, value in identity(cell.cfg()).items():
        if key not in runs:  # a setting no run here has yet
            return "todo", None
        match &= runs[key].isna() if value is None else runs[key] == value
    mine = runs[match].sort_values("run_id")
    complete = mine[mine["status"].isin(["finished", "diverged"])]
    if not complete.empty:
        return "done", complete["run_id"].iloc[-1]
    if not mine.empty:
        return "resume", mine["run_id"].iloc[-1]
    return "todo", None


def timings(runs: pd.DataFrame) -> pd.DataFrame:
    """Finished runs' seconds per round, with what the price of a round depends on."""
    columns = ["dataset", "algorithm", "tau", "local_epochs", "batch_size"]
    done = runs[runs["status"] == "finished"] if not runs.empty else runs
    if done.empty:
        return pd.DataFrame(columns=[*columns, "per_round"])
    done = done.assign(**{c: None for c in columns if c not in done})  # older runs
    return done.assign(per_round=done["wall_seconds"] / done["rounds_done"])[
        [*columns, "per_round"]
    ]


def estimate(cell: Cell, measured: pd.DataFrame) -> float | None:
    """Seconds one cell will take: the median round of finished runs of its dataset,
    algorithm and local work (tau, or local epochs and batch size); else, for tau
    steps, their median local step times tau, which overprices a larger tau
    (evaluation and messaging cost a round the same whatever tau is), else the
    defaults above. None for local epochs no finished run has: a round's steps then
    depend on the users' sizes, which the configuration alone does not give."""
    cfg = cell.cfg()
    like = measured[(measured["dataset"] == cfg.dataset) & (measured["algorithm"] == cfg.algorithm)]
    if cfg.local_epochs is not None:
        same = like[
            (like["local_epochs"] == cfg.local_epochs) & (like["batch_size"] == cfg.batch_size)
        ]
        return float(same["per_round"].median()) * cfg.rounds if not same.empty else None
    like = like[like["local_epochs"].isna()]
    same_tau = like[like["tau"] == cfg.tau]
    if not same_tau.empty:
        return float(same_tau["per_round"].median()) * cfg.rounds
    if not like.empty:
        per_step = float((like["per_round"] / like["tau"]).median())
    else:
        per_step = STEP_SECONDS.get(cfg.algorithm, max(STEP_SECONDS.values()))
        per_step *= DATASET_FACTOR.get(cfg.dataset, 1.0)
    return per_step * cfg.rounds * cfg.tau


def forecast(cells: Iterable[Cell], measured: pd.DataFrame) -> str:
    """How long the cells will take one at a time, and how many cannot be priced."""
    seconds = [estimate(cell, measured) for cell in cells]
    priced = [s for s in seconds if s is not None]
    unknown = len(seconds) - len(priced)
    hours = f"about {sum(priced) / 3600:.1f} hours one at a time"
    if not unknown:
        return hours
    rest = f"{unknown} of unknown length (local epochs no finished run here has)"
    return f"{hours}, plus {rest}" if priced else rest


def plan(cells: Iterable[Cell], runs: pd.DataFrame, noun: str = "cells") -> list[Cell]:
    """Print each cell's state and the forecast of those to run, and return them: the
    plan the scripts built on this runner show (and stop at, with --dry-run)."""
    states = [(cell, *state(cell, runs)) for cell in cells]
    todo = [cell for cell, how, _ in states if how != "done"]
    for cell, how, run_id in states:
        print(f"{how:6} {cell.name()}" + (f" ({run_id})" if run_id else ""))
    print(f"{len(states)} {noun}, {len(todo)} to run: {forecast(todo, timings(runs))}")
    return todo


def command(cell: Cell, out: Path, how: str, run_id: str | None) -> list[str]:
    cli = [sys.executable, "-m", "perfed_ray.cli", "run"]
    if how == "resume":
        return [*cli, "--resume", str(out / CHECKPOINTS / f"run_id={run_id}"), "--quiet"]
    sets = [arg for pair in (*cell.sets, *RUN_WITH) for arg in ("--set", pair)]
    return [*cli, str(cell.config), *sets, "--out", str(out), "--quiet"]


def run_cells(cells: list[Cell], out: Path, jobs: int) -> int:
    """Run the cells, at most `jobs` side by side, each logging to out/logs/grid-N.txt;
    returns how many exited with an error (diverged runs included: status 1). A cell's
    state is read again as it starts, so one finished meanwhile (by another process
    sharing the folder) is skipped rather than resumed."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    waiting, running, failures = list(enumerate(cells)), [], 0
    while waiting or running:
        while waiting and len(running) < jobs:
            i, cell = waiting.pop(0)
            how, run_id = state(cell, read_runs(out))
            if how == "done":
                print(
                    f"skip  [{i + 1}/{len(cells)}] done meanwhile: {cell.name()} ({run_id})",
                    flush=True,
                )
                continue
            log = open(logs / f"grid-{time.strftime('%Y%m%d-%H%M%S')}-{i}.txt", "w")  # noqa: SIM115
            print(f"start [{i + 1}/{len(cells)}] {how}: {cell.name()} (log {log.name})", flush=True)
            process = subprocess.Popen(
                command(cell, out, how, run_id), stdout=log, stderr=subprocess.STDOUT
            )
            running.append((i, cell, process, log))
        time.sleep(1)
        for entry in [e for e in running if e[2].poll() is not None]:
            i, cell, process, log = entry
            log.close()
            running.remove(entry)
            failures += process.returncode != 0
            print(
                f"end   [{i + 1}/{len(cells)}] exit {process.returncode}: {cell.name()}", flush=True
            )
    return failures


def run_cells_in_process(cells: list[Cell], out: Path, jobs: int = 1) -> int:
    """`run_cells` with each cell's `perfed-ray run` called in this process, one after
    another (`jobs` is ignored), on one Ray: a grid of many short runs, whose fixed cost
    a process per cell (Python, torch and Ray started again) would dominate, and the
    tests of scripts built on the runner, on the session's Ray. Returns how many cells
    exited with an error; a cell's state is read again as it starts, as above."""
    from perfed_ray.cli import main as cli

    failures = 0
    for i, cell in enumerate(cells):
        how, run_id = state(cell, read_runs(out))
        if how == "done":
            continue
        print(f"start [{i + 1}/{len(cells)}] {how}: {cell.name()}", flush=True)
        code = cli(command(cell, out, how, run_id)[3:])  # after `python -m perfed_ray.cli`
        failures += code != 0
        print(f"end   [{i + 1}/{len(cells)}] exit {code}: {cell.name()}", flush=True)
    return failures


def grid_options(parser: argparse.ArgumentParser) -> None:
    """The options of every grid script that runs its cells in process and then writes
    its report (privacy_utility.py, async_time_to_accuracy.py)."""
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override for every cell"
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would run")
    parser.add_argument("--report-only", action="store_true", help="the report alone")
    parser.add_argument("--smoke", action="store_true", help="one seed of a tiny setting")


def run_grid(
    args: argparse.Namespace,
    cells: Callable[[], list[Cell]],
    report: Callable[[Path], list[Path]],
) -> int:
    """Such a script's body, after :func:`grid_options`: plan its cells (and stop there
    with --dry-run), run those to run in this process, then write its report."""
    if not args.report_only:
        todo = plan(cells(), read_runs(args.out))
        if args.dry_run:
            return 0
        failures = run_cells_in_process(todo, args.out)
        if failures:
            print(f"{failures} cells exited with an error (see {args.out}/logs)")
    for path in report(args.out):
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "rows",
        nargs="*",
        metavar="ROW",
        help="rows to run, e.g. mnist-tau10-alpha0.01 (default: all)",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "table1")
    parser.add_argument(
        "--configs",
        type=Path,
        default=CONFIGS,
        help="folder of row configurations (default: configs/table1)",
    )
    parser.add_argument("--seeds", type=int, default=3, help="training seeds 0..N-1")
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS, choices=ALGORITHMS)
    parser.add_argument(
        "--study", action="store_true", help="also the CIFAR-10 input_scale x hf_delta study"
    )
    parser.add_argument(
        "--study-only",
        action="store_true",
        help="the study's cells alone (e.g. beside a process running the "
        "main grid: two processes on one folder must not share cells)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override for every cell (part of its identity, e.g. rounds=40)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="cells run side by side")
    parser.add_argument("--dry-run", action="store_true", help="list what would run")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.rows) - {row.stem for row in args.configs.glob("*.yaml")})
    if unknown:
        raise SystemExit(f"error: no row configuration {unknown[0]}.yaml in {args.configs}")
    runs = read_runs(args.out)
    plan = [
        (cell, *state(cell, runs))
        for cell in grid(
            args.configs,
            args.seeds,
            args.study or args.study_only,
            args.algorithms,
            args.set,
            args.rows,
            main=not args.study_only,
        )
    ]
    if not plan:
        raise SystemExit(f"error: no row configurations (*.yaml) in {args.configs}")
    todo = [p for p in plan if p[1] != "done"]
    for cell, how, run_id in plan:
        print(f"{how:6} {cell.name()}" + (f" ({run_id})" if run_id else ""))
    print(
        f"{len(plan)} cells, {len(plan) - len(todo)} done, {len(todo)} to run: "
        f"{forecast((cell for cell, _, _ in todo), timings(runs))} on this machine's kind "
        f"(seconds per round measured from finished runs in {args.out} where it has some, "
        f"else assumed)"
    )
    if args.dry_run:
        return 0
    failures = run_cells([cell for cell, _, _ in todo], args.out, args.jobs)
    if failures:
        print(
            f"{failures} cells exited with an error (diverged or failed: see the report "
            f"and {args.out}/logs)"
        )
    for path in write_report(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
