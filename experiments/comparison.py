"""Run the comparison of personalised methods (issue 15) and write its report.

    python experiments/comparison.py --dry-run          # what would run, how long
    python experiments/comparison.py                    # every setting, then the report
    python experiments/comparison.py mnist-tau10        # one setting only

    python experiments/comparison.py --protocol authors # each method as its authors ran it

The grid: every setting in experiments/configs/comparison/*.yaml (the MNIST Table 1
row tau = 10; CIFAR-10 split by Dirichlet(0.3) over 100 users), times the methods
below, times `--seeds` training seeds. By default every method runs the Per-FedAvg
paper's protocol (tau single-batch SGD steps at the setting's step size, sampled users
training, a plain mean); `--protocol NAME` adds each method's overrides from
experiments/configs/protocols/NAME.yaml (`authors`: its authors' local epochs,
optimiser, step size, who trains and how users are drawn), and the report shows both
protocols' rows in one table, the method's label saying how it was run. Every
setting keeps 20% of its users unseen and scores the personalisation curve to 5
steps. The cells are run, skipped when done and resumed when stopped exactly as
`table1.py` runs its own (its runner is reused), into `--out`; the script ends with
`perfed-ray compare OUT`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from table1 import Cell, plan, run_cells

from perfed_ray.analysis import read_runs
from perfed_ray.config import flatten
from perfed_ray.report.comparison import write_comparison
from perfed_ray.yamlfile import read as read_yaml

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs" / "comparison"
PROTOCOLS = HERE / "configs" / "protocols"
METHODS = [
    "fedavg",
    "fedavg-ft",
    "perfedavg-fo",
    "perfedavg-hf",
    "perfedavg",
    "pfedme",
    "ditto",
    "fedrep",
    "local",
]


def protocol(name: str | None) -> dict[str, tuple[str, ...]]:
    """Each method's `key=value` overrides under the protocol `name` (none: the paper's)."""
    if name is None:
        return {}
    path = PROTOCOLS / f"{name}.yaml"
    methods = read_yaml(path, "protocol file") or {}
    return {
        method: tuple(f"{k}={v}" for k, v in flatten(values or {}).items())
        for method, values in methods.items()
    }


def grid(
    configs: Path,
    seeds: int,
    methods: list[str],
    extra: tuple[str, ...],
    only: set[str],
    overrides: dict[str, tuple[str, ...]] | None = None,
):
    rows = sorted(row for row in configs.glob("*.yaml") if not only or row.stem in only)
    overrides = overrides or {}
    return [
        Cell(row, (f"algorithm={m}", *overrides.get(m, ()), f"seed={s}", *extra))
        for row in rows
        for s in range(seeds)
        for m in methods
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="*", metavar="SETTING", help="e.g. mnist-tau10")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "comparison")
    parser.add_argument("--configs", type=Path, default=CONFIGS)
    parser.add_argument("--seeds", type=int, default=3, help="training seeds 0..N-1")
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override for every cell"
    )
    parser.add_argument(
        "--protocol", help="each method's overrides from configs/protocols/NAME.yaml"
    )
    parser.add_argument("--jobs", type=int, default=1, help="cells run side by side")
    parser.add_argument("--dry-run", action="store_true", help="list what would run")
    args = parser.parse_args(argv)
    known = {row.stem for row in args.configs.glob("*.yaml")}
    if not known or set(args.settings) - known:
        raise SystemExit(
            f"error: settings {sorted(set(args.settings) - known)} not in {args.configs}"
        )
    cells = grid(
        args.configs,
        args.seeds,
        args.methods,
        tuple(args.set),
        set(args.settings),
        protocol(args.protocol),
    )
    todo = plan(cells, read_runs(args.out))
    if args.dry_run:
        return 0
    failures = run_cells(todo, args.out, args.jobs)
    if failures:
        print(f"{failures} cells exited with an error (see {args.out}/logs)")
    print(f"wrote {write_comparison(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
