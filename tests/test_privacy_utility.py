"""experiments/privacy_utility.py and perfed_ray/report/privacy.py: the privacy-utility
grid's smoke run, its runs, and a report whose cells are the runs' own accuracies."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
from conftest import experiment_script

from perfed_ray.analysis import read_runs

METHODS = ["fedavg", "perfedavg-hf", "local", "ditto", "fedrep"]  # the registry's order


def _rows(text: str, section: str) -> dict[str, list[str]]:
    """The table under `## section`: header and rows by their first cell."""
    lines = text.split(f"## {section}\n", 1)[1].strip("\n").split("\n\n")[0].splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {row[0]: row[1:] for row in cells if set(row[0]) != {"-"}}


@pytest.mark.slow
def test_the_smoke_grid_runs_every_method_and_budget_and_reports_them(
    ray_session, tmp_path, monkeypatch, capsys
):
    """Every method at epsilon 8 and without privacy, Local without privacy alone; the
    report's rows are the methods, its columns the budgets, each cell the mean over
    users of the final accuracy after one step, read here from the evals directly;
    Local's one reference repeated in each column; a second call runs nothing."""
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main sets its own
    out = tmp_path / "out"
    for script in experiment_script("privacy_utility"):
        assert script.main(["--smoke", "--out", str(out)]) == 0
        runs = read_runs(out)
        assert set(runs["status"]) == {"finished"}
        cells = sorted(zip(runs["algorithm"], runs["privacy"], strict=True))
        private = [m for m in METHODS if m != "local"]
        expected = [(m, p) for m in private for p in ("central", "none")] + [("local", "none")]
        assert cells == sorted(expected)
        assert set(runs.loc[runs["privacy"] == "central", "privacy.epsilon"]) == {8.0}
        evals = pd.read_parquet(out / "evals")
        final = evals[evals["final"]]
        report = (out / "report" / "privacy.md").read_text()
        assert (out / "report" / "privacy.png").stat().st_size > 1000
        for section, unseen in (("Seen users", False), ("Unseen users", True)):
            rows = _rows(report, section)
            assert list(rows) == ["method", *METHODS]
            assert rows["method"] == ["ε = 8", "no privacy"]
            for method in METHODS:
                for column, privacy in enumerate(("central", "none")):
                    kind = "none" if method == "local" else privacy
                    mine = final[
                        (final["algorithm"] == method)
                        & (final["privacy"] == kind)
                        & (final["unseen"] == unseen)
                    ]
                    accuracy = mine.groupby("user")["acc_after"].mean().mean()
                    assert rows[method][column] == f"{100 * accuracy:.2f}", (method, privacy)
            assert rows["local"][0] == rows["local"][1]
        capsys.readouterr()
        assert script.main(["--smoke", "--out", str(out), "--dry-run"]) == 0
        assert "9 cells, 0 to run" in capsys.readouterr().out
        (out / "report" / "privacy.md").unlink()
        assert script.main(["--out", str(out), "--report-only"]) == 0
        assert (out / "report" / "privacy.md").read_text() == report
        assert len(read_runs(out)) == 9  # nothing run again
