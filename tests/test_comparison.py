"""`perfed-ray compare` and experiments/comparison.py: personalised methods side by side,
seen against unseen users, after 0, 1 and 5 personalisation steps, from real runs."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import TINY, experiment_script, run_cells_here

import perfed_ray
from perfed_ray.analysis import mean_ci95, read_runs
from perfed_ray.cli import main
from perfed_ray.report.comparison import comparison_markdown
from perfed_ray.results.layout import CHECKPOINTS, TABLES, run_folder

COMPARED = {**TINY, "n_users": 8, "unseen_users": 0.25, "personalise_steps": 5}


@pytest.fixture(scope="module")
def compared(ray_session, tmp_path_factory):
    out = tmp_path_factory.mktemp("compared")
    for algorithm in ("fedavg", "fedrep"):
        for seed in (0, 1):
            perfed_ray.simulate({**COMPARED, "algorithm": algorithm, "seed": seed}, out)
    return out


def _cells(text: str, method: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"| {method} |"))
    return [c.strip().strip("*") for c in line.strip("|").split("|")][1:]


@pytest.mark.slow
def test_each_cell_is_the_mean_over_seeds_of_users_mean_accuracy_after_k_steps(compared):
    evals = pd.read_parquet(compared / "evals")
    final = evals[evals["final"]]
    text = comparison_markdown(compared)
    for method in ("fedavg", "fedrep"):
        cells = _cells(text, method)
        assert len(cells) == 7  # seen 0, 1, 5; unseen 0, 1, 5; seeds
        for column, (unseen, k) in enumerate((u, k) for u in (False, True) for k in (0, 1, 5)):
            mine = final[(final["algorithm"] == method) & (final["unseen"] == unseen)]
            per_seed = [
                frame.assign(acc=[a[k] for a in frame["acc_steps"]])
                .groupby("user")["acc"]
                .mean()
                .mean()
                for _, frame in mine.groupby("seed")
            ]
            mean, half = mean_ci95(np.array(per_seed))
            assert cells[column] == f"{100 * mean:.2f} ± {100 * half:.2f}"
        assert cells[-1] == "2"
    # each run scored its 2 unseen users (a quarter of 8) apart from its 6 seen ones
    users = final.groupby(["algorithm", "seed", "unseen"])["user"].nunique()
    assert users.unstack("unseen").values.tolist() == [[6, 2]] * 4


@pytest.mark.slow
def test_the_compare_command_writes_the_report(compared, tmp_path, capsys):
    assert main(["compare", str(compared), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "comparison.md").read_text() == comparison_markdown(compared)
    assert "comparison.md" in capsys.readouterr().out


@pytest.mark.slow
def test_the_comparison_script_runs_its_grid_and_reports(
    ray_session, tmp_path, monkeypatch, capsys
):
    """The smoke test: one tiny setting, one seed, two methods, each cell's `perfed-ray
    run` in this process on the session's Ray (a process per cell is table1's test).
    The runs written are the grid's cells, in the setting's configuration; the report is
    the comparison of exactly those runs; a second call finds its cells done and runs
    nothing; a protocol's overrides add their own runs beside the paper's."""
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main sets its own
    configs, out = tmp_path / "configs", tmp_path / "out"
    configs.mkdir()
    tiny = {k: v for k, v in COMPARED.items() if k != "users_per_actor"}
    (configs / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    for script in experiment_script("comparison"):
        monkeypatch.setattr(script, "run_cells", run_cells_here)
        args = ["--configs", str(configs), "--out", str(out), "--seeds", "1"]
        assert script.main([*args, "--methods", "local", "fedavg-ft"]) == 0
        runs = read_runs(out).sort_values("algorithm")
        assert runs["algorithm"].tolist() == ["fedavg-ft", "local"]
        assert set(runs["status"]) == {"finished"} and set(runs["seed"]) == {0}
        for key, value in tiny.items():
            assert set(runs[key]) == {value}, key
        report = (out / "report" / "comparison.md").read_text()
        assert report == comparison_markdown(out)
        assert [_cells(report, m)[-1] for m in ("local", "fedavg-ft")] == ["1", "1"]  # seeds
        capsys.readouterr()
        assert script.main([*args, "--methods", "local", "--dry-run"]) == 0
        printed = capsys.readouterr().out.splitlines()
        assert printed[0].startswith("done   ") and printed[1].startswith("1 cells, 0 to run")
        assert len(printed) == 2 and len(read_runs(out)) == 2  # nothing run
        protocols = tmp_path / "protocols"
        protocols.mkdir()
        (protocols / "mine.yaml").write_text("local:\n  trained_users: all\n")
        monkeypatch.setattr(script, "PROTOCOLS", protocols)
        assert script.main([*args, "--methods", "local", "--protocol", "mine"]) == 0
        after = read_runs(out)
        mine = after[~after["run_id"].isin(runs["run_id"])]
        assert mine["algorithm"].tolist() == ["local"] and mine["trained_users"].tolist() == ["all"]
        assert set(after["trained_users"]) == {"sampled", "all"}
        report = (out / "report" / "comparison.md").read_text()
        assert report == comparison_markdown(out)
        assert _cells(report, "local (trained_users=all)")[-1] == "1"


def _copy_run(out, to, **config) -> None:
    """Add the run of `out` with this configuration to the results folder `to` (each
    table, and the checkpoints, hold a folder a run): the module's run, not run again."""
    runs = read_runs(out)
    [run_id] = runs.loc[(runs[list(config)] == pd.Series(config)).all(axis=1), "run_id"]
    for table in (*TABLES, CHECKPOINTS):
        if (folder := run_folder(out, table, run_id)).exists():
            shutil.copytree(folder, run_folder(to, table, run_id))


@pytest.mark.slow
def test_a_method_run_with_its_own_step_size_shares_the_table_and_says_so(
    ray_session, compared, tmp_path
):
    from perfed_ray.report.cells import run_results
    from perfed_ray.report.comparison import annotated_runs

    _copy_run(compared, tmp_path, algorithm="fedavg", seed=0)  # {**COMPARED, fedavg}
    perfed_ray.simulate(
        {**COMPARED, "algorithm": "local", "beta": 0.01, "trained_users": "all"}, tmp_path
    )
    runs = annotated_runs(tmp_path).set_index("algorithm")
    assert runs["setting"].nunique() == 1 and "beta" not in runs["setting"].iloc[0]
    assert "tau=2" in runs["setting"].iloc[0]  # shared by the table's runs
    assert runs.loc["fedavg", "method"] == "fedavg (beta=0.001)"  # no usual step size
    assert runs.loc["local", "method"] == "local (beta=0.01, trained_users=all)"
    # Once most runs share a step size and rounds, they are the setting's, and only a
    # run that differs says so, with its own local work (epochs as configured: not 2.0).
    _copy_run(compared, tmp_path, algorithm="fedavg", seed=1)
    perfed_ray.simulate(
        {**COMPARED, "algorithm": "local", "local_epochs": 2, "rounds": 2},
        tmp_path,
    )
    runs = annotated_runs(tmp_path)
    [setting] = set(runs["setting"])
    assert "rounds=4" in setting and "beta" not in setting  # the usual ones; 0.001 the default
    assert set(runs["method"]) == {
        "fedavg",
        "local (beta=0.01, trained_users=all)",
        "local (rounds=2, local_epochs=2)",
    }
    # `perfed-ray report` names each run as compare does, less the protocol's keys.
    assert set(run_results(tmp_path)["method"]) == {
        "fedavg",
        "local (trained_users=all)",
        "local (local_epochs=2)",
    }


def test_the_authors_protocols_are_valid_configurations_of_every_setting():
    for script in experiment_script("comparison"):
        protocols = script.protocol("authors")
        assert {"fedrep", "pfedme", "local", "ditto"} <= set(protocols)
        cells = script.grid(script.CONFIGS, 1, list(protocols), (), set(), protocols)
        configs = [cell.cfg() for cell in cells]  # ConfigError if one does not fit
        fedrep = next(c for c in configs if c.algorithm == "fedrep")
        assert (
            fedrep.local_epochs == 11 and fedrep.settings_of("client_optimizer")["momentum"] == 0.5
        )
