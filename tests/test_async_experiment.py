"""experiments/async_time_to_accuracy.py: the time-to-accuracy grid's smoke run, its
runs, and a report whose figures are the runs' own evaluations."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
from conftest import experiment_script

from perfed_ray.analysis import read_runs


@pytest.mark.slow
def test_the_smoke_grid_runs_every_cell_and_reports_minutes_to_accuracy(
    ray_session, tmp_path, monkeypatch
):
    """Every method and strategy of the grid runs once; FedAsync takes K times the
    steps; the report's final accuracies and minutes are read here from the evals and
    rounds directly; a second call runs nothing."""
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main sets its own
    out = tmp_path / "out"
    for script in experiment_script("async_time_to_accuracy"):
        assert script.main(["--smoke", "--out", str(out)]) == 0
        runs = read_runs(out).set_index("run_id")
        assert set(runs["status"]) == {"finished"}
        cells = sorted(zip(runs["algorithm"], runs["strategy"], runs["overcommit"], strict=True))
        assert cells == sorted(
            [
                ("fedavg", "uniform", 1.0),
                ("fedavg", "uniform", 1.3),
                ("fedavg", "fedbuff", 1.0),
                ("fedavg", "fedasync", 1.0),
                ("perfedavg-hf", "uniform", 1.0),
                ("perfedavg-hf", "fedbuff", 1.0),
                ("ditto", "uniform", 1.0),
                ("ditto", "fedbuff", 1.0),
            ]
        )
        steps = runs.set_index("strategy")["rounds"]
        assert steps["fedasync"] == 20 * 3 and (runs["rounds"] != 60).sum() == 7
        report = (out / "report" / "async.md").read_text()
        assert (out / "report" / "async.png").stat().st_size > 1000
        evals = pd.read_parquet(out / "evals")
        final = evals[evals["final"] & ~evals["unseen"]]
        lines = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line
                 for line in report.splitlines() if line.startswith("|")}  # fmt: skip
        for run_id, run in runs.iterrows():
            mine = final[final["run_id"] == run_id]
            accuracy = mine.groupby("user")["acc_after"].mean().mean()
            strategy = script.strategy_of(run)
            cells = lines[(run["algorithm"], strategy)].strip("|").split("|")
            assert cells[-2].strip() == f"{100 * accuracy:.2f}", (run["algorithm"], strategy)
            assert float(cells[-1]) == pytest.approx(mine["sim_time"].max() / 60, abs=0.006)
        assert script.main(["--smoke", "--out", str(out)]) == 0
        assert len(read_runs(out)) == len(runs)  # everything was done: nothing ran again
