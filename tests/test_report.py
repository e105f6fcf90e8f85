"""`perfed-ray report`: the extended Table 1, curves and groups from real tiny runs' Parquet."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from perfed_ray.analysis import across_seeds
from perfed_ray.cli import main
from perfed_ray.config import RunConfig, revise
from perfed_ray.report import LEGEND, table1_markdown, write_report
from perfed_ray.report.cells import Cell, section_of
from perfed_ray.report.comparison import per_step
from perfed_ray.report.curves import band
from perfed_ray.report.methods import method_label

T_975_1 = 12.706204736174698  # Student t, 97.5%, one degree of freedom (two seeds)
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tiny_results, tmp_path_factory):
    dest = tmp_path_factory.mktemp("report")
    return write_report(tiny_results, dest), dest


def _final(tiny_results, algorithm, input_scale="unit"):
    evals = pd.read_parquet(tiny_results / "evals")
    return evals[
        evals["final"]
        & (evals["algorithm"] == algorithm)
        & (evals["input_scale"] == input_scale)
        & (evals["beta"] == 0.001)
    ]


def _row(text: str, label: str, section: str) -> list[str]:
    """The cells of the table row `label` in the section whose title contains `section`."""
    part = next(s for s in text.split("## ") if section in s)
    line = next(x for x in part.splitlines() if x.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")][1:]


@pytest.mark.slow
def test_table1_cells_are_means_over_seeds_with_both_intervals(tiny_results, report):
    _, dest = report
    text = (dest / "table1.md").read_text()
    final = _final(tiny_results, "fedavg")
    per_run = final.groupby(["seed", "draw"])["acc_after"].mean()
    seeds = per_run.groupby("seed").mean()
    mean, half = seeds.mean(), T_975_1 * seeds.std(ddof=1) / math.sqrt(2)
    # Settings other than the protocol's: a table of their own, the methods that ran,
    # no paper figure.
    fedavg, hf = _row(text, "gaussian, tau=2, alpha=0.01", "fraction = 0.5, n_users = 4")
    assert fedavg.startswith(f"{100 * mean:.2f} ± {100 * half:.2f} [± ")
    assert fedavg.endswith(", 2 seeds") and hf.endswith(", 2 seeds")
    # None of these runs is on a Table 1 row: the report is of these runs' settings alone,
    # not Table 1's six rows marked "not run".
    assert text.startswith("# Final personalised accuracy of the runs, by setting")
    assert "Table 1 (protocol" not in text and "not run" not in text.split(LEGEND)[1]
    assert "leaks test labels" not in text


@pytest.mark.slow
def test_diverged_run_is_counted_never_averaged(report):
    _, dest = report
    text = (dest / "table1.md").read_text()
    assert _row(text, "gaussian, tau=5, alpha=0.05", "beta = 2.0") == ["**1 diverged** (round 2)"]
    [standardized] = _row(
        text, "gaussian, tau=2, alpha=0.01, input standardize", "input_scale = standardize"
    )
    assert standardized.endswith("1 seed") and "± n/a" in standardized


@pytest.mark.slow
def test_learning_curves_are_pngs_one_per_row_with_finished_runs(report):
    written, dest = report
    pngs = sorted((dest / "curves").glob("*.png"))
    assert len(pngs) == 2  # the unit and the standardized row; the diverged row has none
    assert set(pngs) <= set(written)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+\.png", png.name) for png in pngs), pngs
    for png in pngs:
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 10_000


def test_plotted_bands_stay_within_0_and_100_percent():
    mean = pd.DataFrame({"accuracy": [0.02, 0.5, 0.98], "half": [0.1, 0.1, 0.1]})
    low, high = band(mean)
    assert low.tolist() == pytest.approx([0.0, 40.0, 88.0])
    assert high.tolist() == pytest.approx([12.0, 60.0, 100.0])


@pytest.mark.slow
def test_groups_table_has_before_and_after_per_group(tiny_results, report):
    _, dest = report
    text = (dest / "groups.md").read_text()
    final = _final(tiny_results, "perfedavg-hf")
    by_seed = final.groupby(["seed", "group"])["acc_after"].mean().unstack()
    line = next(x for x in text.splitlines() if "| perfedavg-hf | 2 |" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[5] == f"{100 * by_seed['A'].mean():.2f}"
    assert cells[7] == f"{100 * by_seed['B'].mean():.2f}"


@pytest.mark.slow
def test_report_command_and_its_errors(tiny_results, tmp_path, capsys):
    assert main(["report", str(tiny_results), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "table1.md").is_file() and (tmp_path / "rep" / "runs.md").is_file()
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert main(["report", str(tmp_path / "missing")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == [
        f"error: no runs under '{tmp_path / 'empty'}': expected "
        f"{tmp_path / 'empty'}/runs/run_id=*/",
        f"error: results folder '{tmp_path / 'missing'}' does not exist",
    ]


def _run(**values) -> pd.Series:
    values = {"paper_a": 196, **values}
    cfg = revise(RunConfig(), **values)
    return pd.Series(cfg.to_dict())


@pytest.mark.parametrize(
    ("values", "section"),
    [
        ({}, "main"),
        ({"algorithm": "fedavg", "hf_delta": "normalized"}, "main"),  # no HF: hf_delta moot
        ({"algorithm": "fedavg", "adapt_on": "test"}, "leaking"),
        ({"input_scale": "raw"}, "study"),
        ({"hf_delta": "normalized"}, "study"),
        ({"rounds": 40, "users_per_actor": None, "tag": "x"}, "other: rounds = 40"),
        ({"algorithm": "fedavg", "delta": 0.1}, "main"),
        ({"delta": 0.1}, "other: delta = 0.1"),
    ],
)
def test_sections_keep_variants_out_of_table1(values, section):
    assert section_of(_run(**values)) == section


def test_a_cell_with_finished_and_diverged_seeds():
    cell = Cell([0.5, 0.7], [0.5, 0.5, 0.7, 0.7], diverged_rounds=[3], unfinished=1)
    assert cell.text(55.0) == (
        f"60.00 ± {100 * T_975_1 * math.sqrt(0.02) / math.sqrt(2):.2f} "
        "[± 18.37], 2 seeds<br>paper 55.00 (+5.00)<br>"
        "**1 diverged** (round 3)<br>1 unfinished"
    )
    assert Cell().text(None) == "not run"


@pytest.mark.slow
def test_every_run_is_listed_with_the_variant_it_ran(report):
    _, dest = report
    lines = (dest / "runs.md").read_text().splitlines()
    hf = [line for line in lines if "| perfedavg-hf | 2 | 0.01 |" in line]
    assert len(hf) == 3  # seeds 0 and 1 on the protocol's inputs, seed 0 standardized
    assert sum("| 0.01 | - |" in line for line in hf) == 2
    assert sum("| 0.01 | input_scale=standardize | 0 |" in line for line in hf) == 1


def test_the_study_shows_the_protocol_runs_beside_hf_with_normalized_delta():
    """The protocol's runs (main section) and HF with delta / ||g|| on the same inputs
    (study section) fill one study row, not two half-empty ones."""
    row = {"dataset": "cifar10", "paper_a": 68, "tau": 4, "alpha": 0.01}
    runs = pd.DataFrame(
        [
            {
                **_run(**row, **values),
                "run_id": f"r{i}",
                "status": "finished",
                "accuracy": accuracy,
                "draws": [accuracy],
                "rounds_done": 1000,
            }
            for i, (values, accuracy) in enumerate(
                [
                    ({"algorithm": "fedavg"}, 0.6),
                    ({"algorithm": "perfedavg-hf", "hf_delta": "normalized"}, 0.5),
                    ({"algorithm": "perfedavg-hf", "input_scale": "standardize"}, 0.4),
                ]
            )
        ]
    )
    runs["section"] = runs.apply(section_of, axis=1)
    runs["method"] = runs.apply(method_label, axis=1)
    text = table1_markdown(runs)
    study = text.split("## Study")[1]
    assert [line.split(" |")[0] for line in study.splitlines() if line.startswith("| CIFAR")] == [
        "| CIFAR-10, tau=4, alpha=0.01, input unit (protocol)",
        "| CIFAR-10, tau=4, alpha=0.01, input standardize",
    ]
    fedavg, hf, normalized = _row(
        text, "CIFAR-10, tau=4, alpha=0.01, input unit (protocol)", "Study"
    )
    assert fedavg.startswith("60.00 ± n/a") and normalized.startswith("50.00 ± n/a")
    assert hf == "not run<br>paper 46.32"
    # A run on a Table 1 row makes it Table 1's report: all six rows, run or not.
    assert text.startswith("# Extended Table 1 (Fallah et al. 2020), reproduced")
    assert _row(text, "MNIST, tau=10, alpha=0.01", "Table 1 (protocol") == [
        "not run<br>paper 75.96",
        "not run<br>paper 78.00",
        "not run<br>paper 79.85",
        "not run",
    ]
    assert "leaks test labels" in text


def test_pooled_accuracy_counts_users_by_their_test_samples_and_finds_the_best_round():
    from perfed_ray.analysis import best_round, pooled_accuracy

    evals = pd.DataFrame(
        {
            "run_id": ["r"] * 6,
            "round": [1, 1, 2, 2, 2, 2],
            "draw": [0, 0, 0, 0, 1, 1],
            "user": [0, 1, 0, 1, 0, 1],
            "n_test": [10, 30, 10, 30, 10, 30],
            "acc_steps": [[1.0], [0.5], [0.0], [1.0], [1.0], [1.0]],
        }
    )
    pooled = pooled_accuracy(evals).set_index("round")["pooled_accuracy"]
    assert pooled[1] == pytest.approx((10 + 15) / 40)  # not (1.0 + 0.5) / 2
    assert pooled[2] == pytest.approx((30 / 40 + 1.0) / 2)  # draws averaged
    best = best_round(pooled_accuracy(evals)).iloc[0]
    assert best["best_round"] == 2 and best["final_accuracy"] == best["best_accuracy"]


def test_paired_differences_are_per_user_over_the_last_ten_evaluations_of_each_seed():
    """A minus B per user, over the last 10 evaluation rounds and the draws, of the
    personal model as it stands (acc_steps[0]); a seed only one entry finished is left
    out, and entries on other users are refused."""
    from perfed_ray.analysis import paired_by_user

    runs = pd.DataFrame(
        {
            "run_id": ["a0", "b0", "a1", "b1"],
            "tag": ["A", "B", "A", "B"],
            "seed": [0, 0, 1, 1],
            "status": ["finished", "finished", "finished", "interrupted"],
            "dataset": "mnist",
            "n_users": 3,
        }
    )
    mine = {"a0": [0.9, 0.7, 0.5], "b0": [0.8, 0.7, 0.7]}  # users 0, 1, 2 in rounds 3-12
    rows = [
        {
            "run_id": run,
            "round": r,
            "user": u,
            "draw": d,
            # rounds 1-2 are outside the last ten; draws differ by -+0.02 around the level
            "acc_steps": [0.0 if r <= 2 else level + (0.02 if d else -0.02), 1.0],
        }
        for run in ("a0", "b0", "a1", "b1")
        for r in range(1, 13)
        for u, level in enumerate(mine.get(run, [0.1, 0.1, 0.1]))
        for d in (0, 1)
    ]
    gaps = paired_by_user(runs, pd.DataFrame(rows), "A", "B")
    [row] = gaps.to_dict("records")
    assert row["seed"] == 0 and row["users"] == 3
    assert row["difference"] == pytest.approx(100 * (0.1 + 0.0 - 0.2) / 3)
    assert (row["ahead"], row["behind"]) == (1, 1)
    # the half-width of the 95% t interval of the users' gaps 10, 0 and -20 points:
    # t(0.975, 2 degrees of freedom) = 4.3027 (a t table) times their standard error,
    # sqrt(((40/3)**2 + (10/3)**2 + (50/3)**2) / 2 / 3) = sqrt(700 / 9)
    assert row["interval"] == pytest.approx(4.302653 * (700 / 9) ** 0.5)
    # Entries whose users differ are not paired user by user.
    other = runs.assign(n_users=[3, 5, 3, 5])
    with pytest.raises(ValueError, match="n_users: 3, 5"):
        paired_by_user(other, pd.DataFrame(rows), "A", "B")


def test_across_seeds_is_the_t_interval_of_each_configurations_seeds():
    """The one summary over seeds that every report uses, against the closed form: the
    mean, and t(0.975, n - 1) s / sqrt(n); a key left unset (NaN) is a configuration."""
    final = pd.DataFrame(
        {"algorithm": ["a", "a", "a", "b"], "tau": [1.0, 1.0, 1.0, math.nan]}
        | {"accuracy": [0.5, 0.7, 0.9, 0.4]}
    )
    got = across_seeds(final, ["algorithm", "tau"]).set_index("algorithm")
    s = math.sqrt(((0.5 - 0.7) ** 2 + (0.9 - 0.7) ** 2) / 2)
    t_975_2 = 4.302652729911275  # Student t, 97.5%, two degrees of freedom
    assert got.loc["a", "accuracy"] == pytest.approx(0.7)
    assert got.loc["a", "ci95"] == pytest.approx(t_975_2 * s / math.sqrt(3))
    assert got.loc["a", "seeds"] == 3
    assert got.loc["b"].tolist()[1:] == [1, 0.4, 0.0]  # one seed: no interval
    assert math.isnan(got.loc["b", "tau"])


def test_a_step_one_seed_did_not_score_is_left_out_of_its_group_only():
    rows = pd.DataFrame(
        {
            "setting": ["s"] * 4,
            "method": ["m", "m", "n", "n"],
            "unseen": [False] * 4,
            "acc_0": [0.1, 0.3, 0.5, 0.5],
            "acc_1": [0.2, 0.4, 0.6, math.nan],
        }
    )
    got = per_step(rows)
    assert got[["method", "steps"]].values.tolist() == [["m", 0], ["m", 1], ["n", 0]]
    assert got["accuracy"].tolist() == pytest.approx([0.2, 0.3, 0.5])
    assert got["ci95"].iloc[0] == pytest.approx(T_975_1 * math.sqrt(0.02) / math.sqrt(2))
