"""Each method in the cheapest setting its own paper reports, run as its authors ran it,
beside the paper's figure (issue 24): the reproduction table.

    python experiments/reproduction.py --dry-run           # what would run, how long
    python experiments/reproduction.py                     # every entry, then the table
    python experiments/reproduction.py pfedme-mnist-mlr    # one entry only
    python experiments/reproduction.py --report-only       # the table from the results
    python experiments/reproduction.py --paired fedrep-cifar10-100x2 local-cifar10-100x2

An entry is a configuration file in experiments/configs/reproduction/ (its runs are
tagged with the entry's name) and its facts in published.yaml beside them: the paper's
figure and table, the scoring rule its authors' code uses, where the authors' own code
ran here (a Parquet file of its runs' figures), and how our setting differs. Every
entry runs for `--seeds` training seeds with the table1 runner (skipped when done,
resumed when stopped) into `--out`/runs; the table, `--out`/reproduction.md, is written
from the Parquet files alone; the authors' code's records sit in `--out`/authors. Each
run is scored by the authors' rule (correct answers over all users' test samples, at
the round(s) the entry's `rule` names, RULES below, and at the final one) and by this
project's (the unweighted mean over users at the final evaluation, before and after
one personalisation step). `--paired A B` sets two entries' runs of the same seed (so
the same users) side by side user by user: A's accuracy minus B's, each averaged over
the last 10 evaluations, as FedRep's authors average their rounds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from table1 import Cell, plan, run_cells

from perfed_ray.analysis import (
    best_round,
    mean_ci95,
    paired_by_user,
    pooled_accuracy,
    read_runs,
    read_table,
)
from perfed_ray.yamlfile import read as read_yaml

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs" / "reproduction"
OUT = HERE / "results" / "reproduction"
PUBLISHED = "published.yaml"
# An entry's `rule`: which round(s) its authors' code reports, as a column of `scores`.
RULES = {
    "best round": "best_accuracy",
    "last 10 rounds": "last10_accuracy",
    "final round": "final_accuracy",
}


def entries(configs: Path, only: set[str]) -> dict[str, dict[str, Any]]:
    """Entry name -> its facts (published.yaml), for the entries that have a config."""
    facts = read_yaml(configs / PUBLISHED, "reproduction facts") or {}
    names = sorted(p.stem for p in configs.glob("*.yaml") if p.name != PUBLISHED)
    missing = [n for n in names if n not in facts]
    if missing:
        raise SystemExit(f"error: {configs / PUBLISHED} has no entry for {missing}")
    return {n: facts[n] for n in names if not only or n in only}


def cells(configs: Path, names: list[str], seeds: int, extra: tuple[str, ...]) -> list[Cell]:
    return [
        Cell(configs / f"{name}.yaml", (f"tag={name}", f"seed={s}", *extra))
        for name in names
        for s in range(seeds)
    ]


def _cell(values: np.ndarray) -> str:
    if len(values) == 0:
        return "not run"
    mean, half = mean_ci95(100 * np.asarray(values))
    return f"{mean:.2f} ± {half:.2f}" if len(values) > 1 else f"{mean:.2f} (one seed)"


def scores(out: Path) -> pd.DataFrame:
    """One row per finished run: the authors' rule (pooled, best and final round) and
    this project's (mean over users at the final evaluation, 0 and 1 steps)."""
    runs = read_runs(out / "runs")
    evals = read_table(out / "runs", "evals")
    if runs.empty or evals.empty:
        return pd.DataFrame()
    done = runs[runs["status"] == "finished"][["run_id", "tag", "seed"]]
    evals = evals[evals["run_id"].isin(done["run_id"])]
    pooled = best_round(pooled_accuracy(evals))
    final = evals[evals["final"]]
    ours = final.groupby("run_id", observed=True).agg(
        mean_0=("acc_steps", lambda s: float(np.mean([a[0] for a in s]))),
        mean_1=("acc_steps", lambda s: float(np.mean([a[1] if len(a) > 1 else np.nan for a in s]))),
    )
    return done.merge(pooled, on="run_id").merge(ours.reset_index(), on="run_id")


def authors_code(path: Path, model: str) -> str:
    """The authors' own code's figure here: the mean ± 95% interval over its runs of the
    `best_accuracy` column (their rule, in %) of the rows of `model`, from the Parquet
    file they were recorded in (experiments/reproduction/pfedme_authors.py writes it)."""
    if not path.is_file():
        return "not run"
    runs = pd.read_parquet(path)
    runs = runs[runs["model"] == model]
    return f"{_cell(runs['best_accuracy'].to_numpy() / 100)} ({len(runs)} runs)"


def table(out: Path, facts: dict[str, dict[str, Any]]) -> str:
    scored = scores(out)
    lines = [
        "# Reproductions: each method in its own paper's setting, as its authors ran it",
        "",
        "Accuracies in %, mean ± 95% t interval over training seeds. *Authors' rule*:",
        "correct answers over all users' test samples together, at the best evaluation",
        "round (pFedMe's code), averaged over the last ten (FedRep's) or at the final",
        "round (FedProx's and APFL's code keep no best), as the entry's authors' code",
        "reports, and at the final one. *Ours*: PROTOCOL.md's",
        "unweighted mean over users at the final evaluation, of the method's personal",
        "model as it stands (0 steps) and after one personalisation step.",
        "",
        "| entry | method | paper (where) | paper | authors' code here | ours, authors' rule "
        "| ours, authors' rule, final | ours, mean over users, 0 / 1 step | seeds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, fact in facts.items():
        mine = scored[scored["tag"] == name] if not scored.empty else scored
        count = len(mine)
        rule = fact.get("rule", "best round")
        best = mine[RULES[rule]].to_numpy() if count else np.array([])
        last = mine["final_accuracy"].to_numpy() if count else np.array([])
        zero = mine["mean_0"].to_numpy() if count else np.array([])
        one = mine["mean_1"].to_numpy() if count else np.array([])
        code = (
            authors_code(out / fact["authors_code"], fact["authors_model"])
            if fact.get("authors_code")
            else "not run"
        )
        lines.append(
            f"| {name} | {fact['method']} | {fact['paper']} | {fact['published']} | {code} | "
            f"{_cell(best)} ({rule}) | {_cell(last)} | {_cell(zero)} / {_cell(one)} | {count} |"
        )
    lines += ["", "## How each setting differs from the paper's, and why", ""]
    for name, fact in facts.items():
        lines += [f"**{name}** ({fact['method']}). {' '.join(str(fact['notes']).split())}", ""]
    return "\n".join(lines)


def write_table(out: Path, facts: dict[str, dict[str, Any]]) -> Path:
    path = out / "reproduction.md"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(table(out, facts) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entries", nargs="*", metavar="ENTRY", help="e.g. pfedme-mnist-mlr")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--configs", type=Path, default=CONFIGS)
    parser.add_argument("--seeds", type=int, default=3, help="training seeds 0..N-1")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run"
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side")
    parser.add_argument("--dry-run", action="store_true", help="list what would run")
    parser.add_argument("--report-only", action="store_true", help="write the table alone")
    parser.add_argument(
        "--paired", nargs=2, metavar=("A", "B"), help="entry A minus entry B, user by user"
    )
    args = parser.parse_args(argv)
    if args.paired:
        runs, evals = read_runs(args.out / "runs"), read_table(args.out / "runs", "evals")
        try:
            gaps = paired_by_user(runs, evals, *args.paired)
        except ValueError as error:
            raise SystemExit(f"error: {error}") from None
        if gaps.empty:
            raise SystemExit(f"error: no seed with both {' and '.join(args.paired)} finished")
        for row in gaps.itertuples():
            print(
                f"{args.paired[0]} minus {args.paired[1]}, seed {row.seed}: "
                f"{row.difference:+.2f} ± {row.interval:.2f} points per user (95% over "
                f"{row.users} users); ahead for {row.ahead}, behind for {row.behind}"
            )
        return 0
    facts = entries(args.configs, set(args.entries))
    if set(args.entries) - set(facts):
        raise SystemExit(f"error: no entries {sorted(set(args.entries) - set(facts))}")
    if not args.report_only:
        grid = cells(args.configs, list(facts), args.seeds, tuple(args.set))
        todo = plan(grid, read_runs(args.out / "runs"), "runs")
        if args.dry_run:
            return 0
        failures = run_cells(todo, args.out / "runs", args.jobs)
        if failures:
            print(f"{failures} runs exited with an error (see {args.out}/runs/logs)")
    print(f"wrote {write_table(args.out, entries(args.configs, set()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
