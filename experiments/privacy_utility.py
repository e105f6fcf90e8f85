"""Run the privacy-utility grid (issue 37 item 8) and write its report.

    python experiments/privacy_utility.py --dry-run     # what would run, how long
    python experiments/privacy_utility.py               # the grid, then the report
    python experiments/privacy_utility.py --report-only # the report from what is there
    python experiments/privacy_utility.py --smoke --out /tmp/p  # a tiny grid, for CI

The grid: the setting in experiments/configs/privacy/mnist.yaml (the paper's MNIST
split over 880 users, 10% never trained, central user-level DP with Poisson sampling
and adaptive clipping), times the methods below, times the budgets (epsilon 1, 2, 4, 8
at the setting's privacy.delta; `clip`, the same clipping without noise, which
separates what clipping costs from what noise costs; and no privacy), times `--seeds`
training seeds.
Local shares nothing and refuses central privacy: it runs once per seed without
privacy, the report's reference in every column. The cells are run, skipped when done
and resumed when stopped as `table1.py` runs its own (its runner is reused), into
`--out`, all in this process on one Ray (`run_cells_in_process`: a process per cell
cost 50-60 s of start-up each on this shared 2-core machine, more than a cell's
rounds); the script ends with the report (perfed_ray/report/privacy.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from table1 import Cell, grid_options, run_grid

from perfed_ray.report.privacy import write_privacy

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "configs" / "privacy" / "mnist.yaml"
METHODS = ["fedavg", "perfedavg-hf", "fedrep", "ditto"]
REFERENCE = "local"  # shares nothing: one run per seed without privacy
BUDGETS = ["1", "2", "4", "8", "clip", "none"]  # see `budget`
# --smoke: every method at one budget and without privacy, one seed, on a few synthetic
# users for two rounds at larger steps, so that the models move (no data files needed;
# the paper split's MNIST sizes do not apply to the gaussian data, and a cohort of 6 is
# too small for adaptive clipping's noisy count at any useful budget).
SMOKE_BUDGETS = ["8", "none"]
SMOKE = (
    "dataset=gaussian",
    "partition=iid",
    "n_users=12",
    "fraction=0.5",
    "rounds=2",
    "tau=2",
    "batch_size=10",
    "alpha=0.05",
    "beta=0.05",
    "final_eval_draws=1",
    "privacy.delta=0.01",
    "privacy.adaptive_clip=false",
)


def budget(name: str) -> tuple[str, ...]:
    """A budget's overrides: an epsilon, `clip` (clipping without noise, z = 0: what
    clipping alone costs) or `none` (no privacy)."""
    if name == "none":
        return ("privacy=none",)
    if name == "clip":
        return ("privacy=central", "privacy.epsilon=none", "privacy.noise_multiplier=0")
    return ("privacy=central", f"privacy.epsilon={float(name):g}")


def grid(
    config: Path, seeds: int, methods: list[str], budgets: list[str], extra: tuple[str, ...]
) -> list[Cell]:
    """Seed by seed (so a stopped grid has whole seeds), every budget of every method,
    then the reference (with the budget `none` only: it is a run without privacy)."""
    cells = []
    for s in range(seeds):
        cells += [
            Cell(config, (f"algorithm={m}", *budget(b), f"seed={s}", *extra))
            for b in budgets
            for m in methods
        ]
        if "none" in budgets:
            reference = (f"algorithm={REFERENCE}", "privacy=none", f"seed={s}", *extra)
            cells.append(Cell(config, reference))
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "privacy")
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--seeds", type=int, default=3, help="training seeds 0..N-1")
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument(
        "--budgets", nargs="+", default=BUDGETS, help="epsilons, clip (z = 0) or none"
    )
    grid_options(parser)
    args = parser.parse_args(argv)
    extra = (*(SMOKE if args.smoke else ()), *args.set)
    seeds = 1 if args.smoke else args.seeds
    budgets = SMOKE_BUDGETS if args.smoke else args.budgets
    return run_grid(
        args, lambda: grid(args.config, seeds, args.methods, budgets, extra), write_privacy
    )


if __name__ == "__main__":
    sys.exit(main())
