"""experiments/table1.py: the grid it plans, which cells it skips, its dry run."""

from __future__ import annotations

import pytest
import yaml
from conftest import DIVERGES, TINY, experiment_script

from perfed_ray.analysis import read_runs


@pytest.fixture(scope="module")
def table1():
    yield from experiment_script("table1")


@pytest.mark.slow
def test_finished_and_diverged_cells_are_skipped_and_the_rest_planned(
    table1, tiny_results, tmp_path
):
    row = {k: v for k, v in TINY.items() if k != "users_per_actor"}  # how, not what, it runs
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(row))
    diverges = {k: v for k, v in DIVERGES.items() if k not in ("users_per_actor", "algorithm")}
    (tmp_path / "diverges.yaml").write_text(yaml.safe_dump(diverges))
    runs = read_runs(tiny_results)
    cells = table1.grid(tmp_path, 3, False, ["fedavg", "perfedavg-hf"])
    states = {cell.name(): table1.state(cell, runs)[0] for cell in cells}
    assert len(cells) == 2 * (2 * 3 + 3)  # rows x (algorithms x seeds + leaking FedAvg)
    for algorithm in ("fedavg", "perfedavg-hf"):
        for seed, expected in ((0, "done"), (1, "done"), (2, "todo")):
            assert states[f"tiny algorithm={algorithm} seed={seed}"] == expected
    assert states["diverges algorithm=perfedavg-hf seed=0"] == "done"  # would diverge again
    assert states["diverges algorithm=fedavg seed=0"] == "todo"
    assert states["tiny algorithm=fedavg adapt_on=test seed=0"] == "todo"
    scaled = [
        table1.Cell(
            tmp_path / "tiny.yaml", ("algorithm=perfedavg-hf", "seed=0", f"input_scale={s}")
        )
        for s in ("standardize", "raw")
    ]
    assert [table1.state(c, runs)[0] for c in scaled] == ["done", "todo"]
    # users_per_actor=auto is how the cell runs; the measured speed prices the rest.
    todo = next(c for c in cells if c.name() == "tiny algorithm=fedavg seed=2")
    assert "users_per_actor=auto" in table1.command(todo, tiny_results, "todo", None)
    measured = table1.timings(runs)
    assert table1.estimate(todo, measured) < 60
    # A round is priced from runs with the same tau, else per local step.
    like = measured[(measured["algorithm"] == "fedavg") & (measured["dataset"] == "gaussian")]
    assert set(like["tau"]) == {TINY["tau"]}
    assert table1.estimate(todo, measured) == pytest.approx(
        like["per_round"].median() * TINY["rounds"]
    )
    other_tau = table1.Cell(todo.config, (*todo.sets, "tau=6"))
    assert table1.estimate(other_tau, measured) == pytest.approx(
        (like["per_round"] / like["tau"]).median() * 6 * TINY["rounds"]
    )
    # Local epochs are priced only from runs with the same epochs and batch size: their
    # steps depend on the users' sizes; tau runs do not price them, nor they tau runs.
    epochs = table1.Cell(todo.config, (*todo.sets, "local_epochs=2"))
    assert table1.estimate(epochs, measured) is None
    assert "plus 1 of unknown length" in table1.forecast([todo, epochs], measured)
    as_epochs = measured.assign(local_epochs=2)
    assert table1.estimate(epochs, as_epochs) == pytest.approx(
        like["per_round"].median() * TINY["rounds"]
    )
    assert table1.estimate(todo, as_epochs) == pytest.approx(
        table1.STEP_SECONDS["fedavg"] * TINY["rounds"] * TINY["tau"]
    )


def test_dry_run_lists_the_whole_grid_with_the_study(table1, tmp_path, capsys):
    assert table1.main(["--dry-run", "--study", "--out", str(tmp_path / "none")]) == 0
    lines = capsys.readouterr().out.splitlines()
    # 6 rows x 4 algorithms x 3 seeds, 6 x 3 leaking FedAvg, the study:
    # 2 rows x (2 scales x 3 algorithms + 3 scales x normalized HF) x 3 seeds.
    assert lines[-1].startswith("144 cells, 0 done, 144 to run: about ")
    assert sum(line.startswith("todo") for line in lines) == 144
    assert (
        "todo   cifar10-tau4-alpha0.01-diff algorithm=perfedavg-hf input_scale=raw "
        "hf_delta=normalized seed=2" in lines
    )
    assert not (tmp_path / "none").exists()  # a dry run writes nothing
    assert table1.main(["--dry-run", "--study-only", "--out", str(tmp_path / "none")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("54 cells, 0 done, 54 to run")
    assert all("input_scale=" in line for line in lines[:-1])


def test_named_rows_restrict_the_grid_and_unknown_rows_are_refused(table1, tmp_path, capsys):
    out = str(tmp_path / "none")
    assert table1.main(["mnist-tau10-alpha0.01", "--dry-run", "--out", out]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("15 cells, 0 done, 15 to run")  # 4 x 3 + 3 leaking FedAvg
    assert all("mnist-tau10-alpha0.01" in line for line in lines[:-1])
    with pytest.raises(SystemExit, match=r"no row configuration mnist-tau3\.yaml"):
        table1.main(["mnist-tau3", "--dry-run", "--out", out])


@pytest.mark.slow
def test_a_cell_finished_meanwhile_is_skipped_when_its_turn_comes(table1, tmp_path, capsys):
    # The same cell planned twice stands for two processes sharing the folder: by the
    # second's turn the first has finished it, and it must not be resumed or rerun.
    row = {k: v for k, v in TINY.items() if k != "users_per_actor"}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(row))
    [cell] = table1.grid(tmp_path, 1, False, ["perfedavg-fo"])[:1]
    out = tmp_path / "results"
    assert table1.run_cells([cell, cell], out, jobs=1) == 0
    printed = capsys.readouterr().out
    assert "start [1/2] todo: tiny algorithm=perfedavg-fo seed=0" in printed
    assert "skip  [2/2] done meanwhile: tiny algorithm=perfedavg-fo seed=0" in printed
    assert list(read_runs(out)["status"]) == ["finished"]
