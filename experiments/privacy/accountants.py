"""perfed-ray's noise multipliers beside pfl-research's, for the same (epsilon, delta,
sampling rate, rounds), both accountants (issue 37, item 9).

    python experiments/privacy/accountants.py            # the grid below, about 2 minutes
    python experiments/privacy/accountants.py --smoke --out /tmp/acct   # tests: 2 cases

pfl's side runs in pfl's own interpreter ($PERFED_PFL_PYTHON or /work/pfl-env, as
experiments/bench/pfl.py finds it) through pfl_side.py: its `RDPPrivacyAccountant` and
`PLDPrivacyAccountant` with their defaults (Poisson sampling, add-or-remove one; RDP on
dp-accounting's default orders; PLD at a discretisation interval of 1e-4, bisection to
delta within 0.1%). Ours is `perfed_ray.privacy.accounting.noise_multiplier` for a
central plan with Poisson sampling at the same rate. Writes accountants.parquet and
accountants.md (ours, pfl's, relative difference; our accountant's seconds, also in
accountant_seconds.parquet) into --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from perfed_ray.privacy.accounting import Plan, epsilons, noise_multiplier

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bench"))
from pfl import pfl_python  # noqa: E402  (experiments/bench/pfl.py)

# dp-accounting logs each RDP order it cannot evaluate and leaves out (at q = 0.1 and
# z near 1, orders 1.1-1.6, hundreds of lines a calibration); epsilon stays an upper bound.
OUT = HERE.parent / "results" / "privacy-accountants"  # not privacy/: a results folder
POPULATION = 10_000  # the rate is what both accountants see; q * population users a round
GRID = {"epsilon": [1, 2, 4, 8], "delta": [1e-5], "q": [0.01, 0.1], "rounds": [100, 1000]}
# Two budgets, the rate and rounds of a small grid cell: the test of both accountants
# against pfl's (tests/test_accounting.py) is this smoke's.
SMOKE = {"epsilon": [1, 8], "delta": [1e-5], "q": [0.01], "rounds": [100]}
COMMAND = "python experiments/privacy/accountants.py"


def cases(grid: dict[str, list]) -> list[dict]:
    """Every (accountant, epsilon, delta, q, rounds) of the grid."""
    keys = ["accountant", *grid]
    values = itertools.product(["rdp", "pld"], *grid.values())
    return [dict(zip(keys, v, strict=True)) for v in values]


def ours(case: dict) -> float:
    plan = Plan(
        "central", "poisson", POPULATION, case["q"] * POPULATION, case["delta"], case["accountant"]
    )
    return noise_multiplier(plan, case["epsilon"], case["rounds"])


def timings(rounds: int = 1000) -> pd.DataFrame:
    """Our accountant's seconds, each accountant: `epsilons` for rounds 1..`rounds` and
    `noise_multiplier` for epsilon 2 after `rounds` (q = 0.01, delta 1e-5)."""
    rows = []
    for accountant in ("rdp", "pld"):
        plan = Plan("central", "poisson", POPULATION, 0.01 * POPULATION, 1e-5, accountant)
        start = time.perf_counter()
        z = noise_multiplier(plan, 2.0, rounds)
        calibration = time.perf_counter() - start
        start = time.perf_counter()
        epsilons(plan, z, rounds)
        seconds = time.perf_counter() - start
        rows.append((accountant, rounds, z, seconds, calibration, os.getloadavg()[0]))
    columns = ["accountant", "rounds", "noise_multiplier", "epsilons_s", "calibration_s", "load"]
    return pd.DataFrame(rows, columns=columns)


def theirs(python: Path, todo: list[dict]) -> list[float]:
    """pfl's noise multipliers for `todo`, from its interpreter."""
    done = subprocess.run(
        [str(python), str(HERE / "pfl_side.py")],
        input=json.dumps(todo),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def compare(python: Path, grid: dict[str, list]) -> pd.DataFrame:
    todo = cases(grid)
    rows = pd.DataFrame(todo)
    start = time.perf_counter()
    rows["ours"] = [ours(c) for c in todo]
    ours_seconds = time.perf_counter() - start
    start = time.perf_counter()
    rows["pfl"] = theirs(python, todo)
    print(f"ours {ours_seconds:.1f} s, pfl's {time.perf_counter() - start:.1f} s", flush=True)
    rows["relative_difference"] = rows["ours"] / rows["pfl"] - 1
    return rows


def markdown(rows: pd.DataFrame, seconds: pd.DataFrame, command: str) -> str:
    lines = [
        "# Noise multipliers: perfed-ray's accountant beside pfl-research's",
        "",
        f"    {command}",
        "",
        "Central DP, Poisson sampling at rate q, add-or-remove one user; the noise "
        "multiplier each calibrates for (epsilon, delta) after `rounds` rounds.",
        "",
        "| accountant | epsilon | delta | q | rounds | ours | pfl | ours / pfl - 1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows.itertuples():
        lines.append(
            f"| {r.accountant} | {r.epsilon:g} | {r.delta:g} | {r.q:g} | {r.rounds} | "
            f"{r.ours:.4f} | {r.pfl:.4f} | {r.relative_difference:+.3%} |"
        )
    worst = rows["relative_difference"].abs().groupby(rows["accountant"]).max()
    largest = ", ".join(f"{a} {v:.3%}" for a, v in worst.items())
    lines += [
        "",
        f"Largest |ours / pfl - 1|: {largest}",
        "",
        "Our accountant's seconds (q = 0.01, delta 1e-5, epsilon 2), one process on a "
        "shared 2-core VM whose 1-minute load average is beside:",
        "",
        "| accountant | rounds | noise multiplier | epsilons, every round | calibration | load |",
        "|---|---|---|---|---|---|",
    ]
    for r in seconds.itertuples():
        lines.append(
            f"| {r.accountant} | {r.rounds} | {r.noise_multiplier:.4f} | {r.epsilons_s:.2f} s | "
            f"{r.calibration_s:.2f} s | {r.load:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two cases per accountant")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--pfl-python", type=Path, default=pfl_python())
    args = parser.parse_args(argv)
    if args.pfl_python is None or not args.pfl_python.exists():
        raise SystemExit("no pfl interpreter: see experiments/bench/pfl.py's docstring")
    rows = compare(args.pfl_python, SMOKE if args.smoke else GRID)
    seconds = timings(10 if args.smoke else 1000)
    args.out.mkdir(parents=True, exist_ok=True)
    rows.to_parquet(args.out / "accountants.parquet", index=False)
    seconds.to_parquet(args.out / "accountant_seconds.parquet", index=False)
    command = COMMAND + (" --smoke" if args.smoke else "")
    (args.out / "accountants.md").write_text(markdown(rows, seconds, command))
    print(markdown(rows, seconds, command))


if __name__ == "__main__":
    main()
