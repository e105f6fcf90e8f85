"""Write BENCHMARKS.md from the benchmark Parquet files, with the targets beside them.

    python experiments/bench/report.py
"""

from __future__ import annotations

import pandas as pd
from common import HERE, RESULTS

TARGETS = """Targets (issue "Thousands of users"): on 2 cores packed + batched Per-FedAvg (HF) at
4x or more the user-steps per second of the single-process loop; seconds per round at
n = 10,000 within 1.2x of n = 100; start-up for 10,000 users under 60 s; all processes
together under 6 GB; on one GPU 100,000 user-steps per second for HF."""


def _markdown(frame: pd.DataFrame) -> str:
    cells = [list(map(str, frame.columns))]
    cells += [[f"{v:.3g}" if isinstance(v, float) else str(v) for v in row]
              for row in frame.itertuples(index=False)]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    lines.insert(1, "|" + "|".join(" --- " for _ in frame.columns) + "|")
    return "\n".join(lines)


def _machine(frame: pd.DataFrame) -> str:
    m = frame.iloc[0]
    return (f"Machine: {m['cpu']}, {m['cores']} cores, GPU {m['gpu']}; Python {m['python']}, "
            f"torch {m['torch']}, Ray {m['ray']}.")


def throughput_section() -> list[str]:
    path = RESULTS / "throughput.parquet"
    if not path.exists():
        return ["## Throughput", "", "Not run yet: `python experiments/bench/throughput.py`."]
    frame = pd.read_parquet(path)
    table = frame.pivot(index="algorithm", columns="mode", values="user_steps_per_second")
    table["packed-batched / loop"] = table["packed-batched"] / table["loop"]
    table = table.reset_index()[["algorithm", "loop", "actor-per-user", "packed-batched",
                                 "packed-batched / loop"]]
    return ["## Throughput: user-steps per second, MNIST workload", "",
            "`python experiments/bench/throughput.py` (MLP 80-60, batch 40, tau = 10, "
            f"10 users per round, median over {frame['rounds'].iloc[0]} rounds, start-up and "
            "evaluation excluded).", "", _machine(frame), "", _markdown(table)]


def scale_section() -> list[str]:
    path = RESULTS / "scale.parquet"
    if not path.exists():
        return ["## Scale", "", "Not run yet: `python experiments/bench/scale.py`."]
    frame = pd.read_parquet(path)
    cols = ["n_users", "users_per_round", "n_actors", "startup_seconds", "seconds_per_round",
            "driver_peak_gb", "actors_peak_gb", "wall_seconds"]
    frame = frame.copy()
    base = frame.loc[frame["n_users"].idxmin(), "seconds_per_round"]
    frame["round_time_vs_smallest"] = frame["seconds_per_round"] / base
    frame["all_processes_gb"] = frame["driver_peak_gb"] + frame["actors_peak_gb"]
    return ["## Scale: Synthetic(1, 1), 100 users per round", "",
            "`python experiments/bench/scale.py` (Per-FedAvg (HF), MLP, batch 40, tau = 10, "
            "users_per_actor auto, batched training).", "", _machine(frame), "",
            _markdown(frame[[*cols, "round_time_vs_smallest", "all_processes_gb"]])]


GPU = """## GPU

Not measured yet: the session that wrote these benchmarks had no GPU machine. On
one, the same two commands measure it (actors then ask for an equal fraction of
the GPUs each: `num_gpus_per_actor: auto`), and the machine line names the GPU."""


def write_report() -> None:
    lines = ["# Benchmarks", "", "Made by `python experiments/bench/report.py` from "
             "`experiments/bench/results/*.parquet`; each section names the command that "
             "measured it. Figures are from the machine named in each section.", "", TARGETS,
             "", *throughput_section(), "", *scale_section(), "", GPU, ""]
    (HERE / "BENCHMARKS.md").write_text("\n".join(lines))


if __name__ == "__main__":
    write_report()
