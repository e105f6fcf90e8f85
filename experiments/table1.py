"""Run rows of Table 1 (Fallah et al. 2020) through the CLI and summarise them.

    python experiments/table1.py mnist-tau10-alpha0.01            # run, then summarise
    python experiments/table1.py --summary-only                   # summarise what is there

Each run is `perfed-ray run experiments/configs/table1/<row>.yaml --set
algorithm=<name>`; results go to `--out` (default experiments/results/table1)
and the summary, with the paper's figures beside ours, to
experiments/results/README.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

from perfed_ray.analysis import summary

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs" / "table1"
ALGORITHMS = ["fedavg", "perfedavg-fo", "perfedavg-hf"]

# Table 1 of the paper (accuracy after one local step, %), for comparison only.
PAPER = {
    ("mnist", "paper", 10, 0.01): (75.96, 78.00, 79.85),
    ("mnist", "paper", 4, 0.01): (60.18, 64.55, 70.94),
    ("cifar10", "paper", 10, 0.001): (40.49, 46.98, 50.44),
    ("cifar10", "paper", 4, 0.001): (38.38, 34.04, 43.73),
    ("cifar10", "paper", 4, 0.01): (35.97, 25.32, 46.32),
    ("cifar10", "paper-diff", 4, 0.01): (58.59, 37.71, 71.25),
}


def run_row(row: str, algorithms: list[str], out: Path, overrides: list[str]) -> None:
    config = CONFIGS / f"{row}.yaml"
    for algorithm in algorithms:
        sets = [arg for pair in [f"algorithm={algorithm}", *overrides] for arg in ("--set", pair)]
        command = ["perfed-ray", "run", str(config), *sets, "--out", str(out)]
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)


def summarise(out: Path) -> str:
    table = summary(out)
    if "accuracy" not in table:
        raise SystemExit(f"no finished evaluations under {out}: run some rows first")
    table = table.dropna(subset=["accuracy"])
    lines = [
        "# Table 1 reproductions",
        "",
        "Made by `python experiments/table1.py --summary-only` from the Parquet results in "
        f"`{out.relative_to(HERE.parent) if out.is_relative_to(HERE.parent) else out}/`; "
        "the runs themselves by `python experiments/table1.py ROW` (one "
        "`perfed-ray run experiments/configs/table1/ROW.yaml --set algorithm=...` per "
        "algorithm).",
        "",
        "Personalised accuracy = mean over all 50 users of the test accuracy after one SGD "
        "step (size alpha, a batch of 40 from the user's own training shard) from the final "
        "model. The interval is the 95% t interval over the independent draws of that "
        "adaptation batch (`draws`), for ONE training seed; it says nothing about "
        "seed-to-seed variation. The paper's figures are quoted from its Table 1.",
        "",
        "| dataset | partition | tau | alpha | algorithm | seed | rounds | accuracy % (95% CI) "
        "| draws | before adapt. % | paper % | wall (start-up) | actors | host |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    table = table.sort_values(["dataset", "partition", "tau", "alpha", "algorithm", "seed"],
                              ascending=[False, True, False, True, True, True])
    for _, r in table.iterrows():
        paper = PAPER.get((r["dataset"], r["partition"], int(r["tau"]), float(r["alpha"])))
        ref = (f"{paper[ALGORITHMS.index(r['algorithm'])]:.2f}"
               if paper and r["algorithm"] in ALGORITHMS else "-")
        lines.append(
            f"| {r['dataset']} | {r['partition']} | {r['tau']} | {r['alpha']:g} | "
            f"{r['algorithm']} | {r['seed']} | {r['round']:.0f}/{r['rounds']} "
            f"({r['status']}) | {100 * r['accuracy']:.2f} ± {100 * r['ci95']:.2f} | "
            f"{r['draws']} | {100 * r['acc_before']:.2f} | {ref} | "
            f"{r['wall_seconds'] / 60:.1f} min ({r['startup_seconds']:.0f} s) | "
            f"{r['n_actors']}{', vmap' if r['batch_users'] else ''} | {r['hostname']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help="rows to run: names of configs/table1/*.yaml")
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "table1")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra override for every run (e.g. users_per_actor=25)")
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args()
    if not args.summary_only:
        for row in args.rows:
            run_row(row, args.algorithms, args.out, args.set)
    pd.set_option("display.width", 200)
    (HERE / "results" / "README.md").write_text(summarise(args.out.resolve()))
    print((HERE / "results" / "README.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
