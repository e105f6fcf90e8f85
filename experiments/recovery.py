"""Kill a real MNIST run with SIGKILL from outside, resume it, and compare its tables
with those of the same run left alone.

    python experiments/recovery.py [--rounds 200] [--kill-after 60] [--algorithm fedavg]

Both runs are `perfed-ray run experiments/configs/table1/mnist-tau10-alpha0.01.yaml`
with `users_per_actor=auto` and the given rounds; the second is sent SIGKILL
(no clean-up of any kind) `--kill-after` seconds after it started, then continued
with `perfed-ray run --resume`. Writes Parquet under `--out` and a summary to
`--out`/README.md.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from perfed_ray.analysis import OUTCOME, outcome, read_table
from perfed_ray.runtime.checkpoint import RunStore, locate

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "configs" / "table1" / "mnist-tau10-alpha0.01.yaml"


def command(args: argparse.Namespace, out: Path) -> list[str]:
    sets = [f"rounds={args.rounds}", f"algorithm={args.algorithm}", "users_per_actor=auto"]
    return [
        "perfed-ray",
        "run",
        str(CONFIG),
        "--quiet",
        "--out",
        str(out),
        *[a for s in sets for a in ("--set", s)],
    ]


def timed(cmd: list[str]) -> float:
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--kill-after", type=float, default=60.0)
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "recovery")
    args = parser.parse_args()
    if args.out.exists() and any(args.out.iterdir()):
        raise SystemExit(f"{args.out} is not empty: remove it or give another --out")
    reference, killed = args.out / "uninterrupted", args.out / "killed-and-resumed"

    seconds_alone = timed(command(args, reference))
    cmd = command(args, killed)
    print("$", " ".join(cmd), f"  # SIGKILL after {args.kill_after:g} s", flush=True)
    driver = subprocess.Popen(cmd)
    time.sleep(args.kill_after)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    runs = read_table(killed, "runs")
    [run_dir] = (killed / "checkpoints").iterdir()
    saved = RunStore(*locate(run_dir)).load()
    checkpoint_round = saved.round if saved else "none (before the first)"
    status_after_kill = runs["status"].iloc[0]
    seconds_resume = timed(["perfed-ray", "run", "--resume", str(run_dir), "--quiet"])

    want, got = outcome(reference), outcome(killed)
    lines = [
        "# Recovery: SIGKILL from outside, then --resume",
        "",
        f"Made by `python experiments/recovery.py --rounds {args.rounds} --kill-after "
        f"{args.kill_after:g} --algorithm {args.algorithm}`: the MNIST Table 1 row "
        f"(tau = 10, alpha = 0.01, {args.rounds} rounds, `users_per_actor=auto`), once left "
        f"alone, once killed with SIGKILL {args.kill_after:g} s after its start and resumed.",
        "",
        f"- After the kill the `runs` row said `{status_after_kill}`; the last checkpoint "
        f"was after round {checkpoint_round}, and `--resume` replayed the rounds from there.",
        f"- Wall time: {seconds_alone:.0f} s alone; {args.kill_after:g} s + "
        f"{seconds_resume:.0f} s killed and resumed (each includes Ray's start).",
        "",
        "| table | rows (alone) | rows (resumed) | identical, except wall_seconds |",
        "| --- | --- | --- | --- |",
    ]
    for name in OUTCOME:
        same = want[name].equals(got[name])
        lines.append(
            f"| {name} | {len(want[name])} | {len(got[name])} | {'yes' if same else 'NO'} |"
        )
    final = read_table(killed, "runs")[["status", "rounds_done", "resumes"]].iloc[0]
    lines += [
        "",
        f"Resumed run: status `{final['status']}`, {final['rounds_done']} rounds, "
        f"{final['resumes']} resume.",
    ]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not all(want[n].equals(got[n]) for n in OUTCOME):
        sys.exit(1)


if __name__ == "__main__":
    main()
