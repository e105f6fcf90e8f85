"""The reproduction script's smoke test: one tiny entry run through its grid, its
table written from the Parquet files, and the authors' code's figure beside it."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
import yaml

from tests.conftest import TINY, experiment_script, run_cells_here

FACTS = {
    "tiny-local": {
        "method": "local",
        "paper": "nobody's, Table 0",
        "published": 99.0,
        "authors_code": "authors/tiny.parquet",
        "authors_model": "theirs",
        "notes": "a smoke test's entry",
        "rule": "last 10 rounds",
    }
}


def _hand_scores(out) -> dict[str, tuple[float, float, float]]:
    """Per run, from its evaluation rows read back from Parquet with plain loops: the
    pooled accuracy (correct answers over test samples, summed over users, averaged over
    draws) at its best and at its last evaluation round, and the mean over users of the
    final evaluation's accuracy before any personalisation step."""
    evals = pd.read_parquet(out / "runs" / "evals")
    scores = {}
    for run_id, run in evals.groupby("run_id", observed=True):
        curve = {}
        for round_, at in run.groupby("round"):
            draws = [
                sum(a[0] * n for a, n in zip(d["acc_steps"], d["n_test"], strict=True))
                / d["n_test"].sum()
                for _, d in at.groupby("draw")
            ]
            curve[round_] = sum(draws) / len(draws)
        final_rows = run[run["final"]]
        mean_0 = sum(a[0] for a in final_rows["acc_steps"]) / len(final_rows)
        scores[str(run_id)] = (max(curve.values()), curve[max(curve)], mean_0)
    return scores


@pytest.mark.slow
def test_the_reproduction_script_runs_its_entries_and_writes_the_table(
    ray_session, tmp_path, monkeypatch
):
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main sets its own
    configs, out = tmp_path / "configs", tmp_path / "out"
    configs.mkdir()
    tiny = {k: v for k, v in TINY.items() if k != "users_per_actor"}
    (configs / "tiny-local.yaml").write_text(
        yaml.safe_dump(
            {**tiny, "algorithm": "local", "trained_users": "all", "personalise_steps": 2}
        )
    )
    (configs / "published.yaml").write_text(yaml.safe_dump(FACTS))
    (out / "authors").mkdir(parents=True)
    pd.DataFrame(
        {"model": ["theirs", "theirs", "other"], "best_accuracy": [50.0, 70.0, 10.0]}
    ).to_parquet(out / "authors" / "tiny.parquet")
    for script in experiment_script("reproduction"):
        monkeypatch.setattr(script, "run_cells", run_cells_here)
        args = ["--configs", str(configs), "--out", str(out), "--seeds", "2"]
        assert script.main(args) == 0
        table = (out / "reproduction.md").read_text()
        row = next(line for line in table.splitlines() if line.startswith("| tiny-local |"))
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[3] == "99.0" and cells[4] == "60.00 ± 127.06 (2 runs)"
        assert cells[-1] == "2" and "not run" not in row
        assert cells[5].endswith("(last 10 rounds)")
        scored = script.scores(out).set_index("run_id")
        assert sorted(scored.index) == sorted(_hand_scores(out)), "one row per finished run"
        for run_id, (best, final, mean_0) in _hand_scores(out).items():
            assert scored.loc[run_id, "best_accuracy"] == pytest.approx(best)
            assert scored.loc[run_id, "final_accuracy"] == pytest.approx(final)
            assert scored.loc[run_id, "mean_0"] == pytest.approx(mean_0)
        assert "a smoke test's entry" in table
        assert script.main([*args, "--dry-run"]) == 0  # now done


def test_every_committed_experiment_configuration_is_valid():
    """Every configuration file under experiments/configs reads and validates (a stale
    key or value fails here, not hours into a run), and every reproduction entry has
    its facts."""
    from pathlib import Path

    from perfed_ray.config import load

    root = Path(__file__).parents[1] / "experiments" / "configs"
    paths = [p for p in sorted(root.rglob("*.yaml")) if p.parent.name not in {"protocols"}]
    paths = [p for p in paths if p.name != "published.yaml"]
    assert len(paths) > 10
    for path in paths:
        load(path)
    facts = yaml.safe_load((root / "reproduction" / "published.yaml").read_text())
    assert {p.stem for p in (root / "reproduction").glob("*.yaml")} - {"published"} <= set(facts)


def test_each_scoring_rule_names_a_column_of_best_round_and_fills_its_cell(monkeypatch):
    """Every entry's `rule` is one the script knows, each rule reads a column that
    analysis.best_round writes, and the table's "authors' rule" cell shows that column
    (here the final round's, FedProx's and APFL's code keeping no best round)."""
    from pathlib import Path

    from perfed_ray.analysis import best_round

    pooled = pd.DataFrame(
        {"run_id": ["r"] * 3, "round": [0, 1, 2], "pooled_accuracy": [0.2, 0.9, 0.5]}
    )
    columns = set(best_round(pooled).columns)
    root = Path(__file__).parents[1] / "experiments" / "configs" / "reproduction"
    facts = yaml.safe_load((root / "published.yaml").read_text())
    scored = best_round(pooled).assign(tag="x", seed=0, mean_0=0.5, mean_1=0.6)
    for script in experiment_script("reproduction"):
        assert set(script.RULES.values()) <= columns
        assert {f.get("rule", "best round") for f in facts.values()} <= set(script.RULES)
        monkeypatch.setattr(script, "scores", lambda out: scored)
        fact = {"method": "m", "paper": "p", "published": "-", "notes": "n"}
        row = script.table(Path("unused"), {"x": {**fact, "rule": "final round"}}).splitlines()
        cells = [c.strip() for c in next(r for r in row if r.startswith("| x |")).split("|")]
        assert cells[6].startswith("50.00") and cells[6].endswith("(final round)")
        assert "(one seed)" in cells[6] and "±" not in cells[6]  # one run: no interval
        assert cells[7].startswith("50.00")
