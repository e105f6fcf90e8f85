"""The privacy guide's worked run (docs/guide/privacy.md, "A worked run"), and the same
command without its three `privacy` settings, each timed from the command to its exit.

    python experiments/privacy/worked.py                        # about 5 minutes
    python experiments/privacy/worked.py --smoke --out /tmp/w   # tests: 200 users, 4 rounds

Per-FedAvg (HF) among 10,000 Synthetic(1, 1) users, each joining a round with
probability 0.01, 100 rounds, scored on 1,000 sampled users; private: central DP at
epsilon 4, delta 1e-5 (the default), PLD accountant. The two runs draw the same
cohorts (Poisson sampling's draws are the seed's). Each is `perfed-ray run` in a fresh
process, as the guide prints it. Writes worked.parquet (a row per run: the seconds,
its start-up and median round, the calibrated noise multiplier, the epsilon its last
round reports, the final accuracy) and worked.md, whose figures the guide quotes, to
--out (default experiments/results/privacy-worked).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bench"))
from common import machine, run_cli  # noqa: E402  (experiments/bench/common.py)

from perfed_ray.analysis import read_table, summary  # noqa: E402
from perfed_ray.markdown import table  # noqa: E402

OUT = HERE.parent / "results" / "privacy-worked"
# The guide's command, `--set` by `--set` (tests/test_docs.py holds them equal).
SETTINGS = [
    "dataset=synthetic",
    "partition=natural",
    "n_users=10000",
    "fraction=0.01",
    "sampling=poisson",
    "rounds=100",
    "eval_every=50",
    "eval_users=1000",
    "final_eval_draws=1",
    "sample_final_eval=true",
    "alpha=0.01",
    "beta=0.01",
    "privacy=central",
    "privacy.epsilon=4",
    "privacy.accountant=pld",
]
SMOKE = ["n_users=200", "fraction=0.1", "rounds=4", "eval_every=2", "eval_users=50"]
COMMAND = "python experiments/privacy/worked.py"


def one_run(sets: list[str], private: bool) -> dict:
    """`perfed-ray run` with `sets`, and what the guide quotes of it."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "results"
        seconds = run_cli(None, sets, out)
        run = read_table(out, "runs").iloc[0]
        rounds = read_table(out, "rounds").sort_values("round")
        accuracy = summary(out)["accuracy"].iloc[0]
    return {
        "privacy": "central" if private else "none",
        "seconds": seconds,
        "startup_seconds": float(run["startup_seconds"]),
        "median_round_seconds": float(rounds["wall_seconds"].median()),
        "noise_multiplier": float(run["privacy.noise_multiplier"]) if private else None,
        "epsilon": float(rounds["epsilon"].iloc[-1]) if private else None,
        "final_accuracy": float(accuracy),
    }


def markdown(rows: pd.DataFrame, command: str) -> str:
    m = machine()
    shown = [
        (
            r.privacy,
            f"{r.seconds:.0f} s",
            f"{r.startup_seconds:.1f} s",
            f"{r.median_round_seconds:.2f} s",
            "-" if pd.isna(r.noise_multiplier) else f"{r.noise_multiplier:.4f}",
            "-" if pd.isna(r.epsilon) else f"{r.epsilon:.5f}",
            f"{100 * r.final_accuracy:.2f}%",
        )
        for r in rows.itertuples()
    ]
    header = (
        "privacy",
        "command to exit",
        "start-up",
        "median round",
        "noise multiplier",
        "epsilon spent",
        "final accuracy",
    )
    return "\n".join(
        [
            "# The privacy guide's worked run",
            "",
            f"    {command}",
            "",
            "docs/guide/privacy.md's command, and the same without `privacy`, "
            "`privacy.epsilon` and `privacy.accountant`; each a fresh `perfed-ray run`, "
            "timed from the command to its exit. Final accuracy: after one personalisation "
            "step, on the final evaluation's sampled users.",
            "",
            table(header, shown),
            "",
            f"Machine: {m['cpu']}, {m['cores']} cores, GPU {m['gpu']}; Python {m['python']}, "
            f"torch {m['torch']}, Ray {m['ray']}.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="200 users, 4 rounds")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    private = SETTINGS + (SMOKE if args.smoke else [])
    plain = [s for s in private if not s.startswith("privacy")]
    rows = pd.DataFrame([one_run(private, True), one_run(plain, False)])
    args.out.mkdir(parents=True, exist_ok=True)
    rows.assign(**machine()).to_parquet(args.out / "worked.parquet", index=False)
    command = COMMAND + (" --smoke" if args.smoke else "")
    text = markdown(rows, command)
    (args.out / "worked.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
