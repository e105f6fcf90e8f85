"""The privacy-utility report (issue 37 item 8): personalised accuracy of seen and
unseen users against the privacy budget epsilon, one row per method.

Each run's final evaluation is read as the comparison reads it (`per_run`: accuracy
after each personalisation step, averaged over draws and users, seen and unseen
apart); a cell is the mean over training seeds with its 95% t interval. A run's
column is the budget it was given (`privacy.epsilon`), or "none" for `privacy: none`.
A method that cannot be private (Local shares nothing, and refuses `privacy: central`)
runs once per seed without privacy and is shown in every column as that same
reference. The epsilon the accountant reports spent after the last round (the rounds
table's `epsilon`) is shown beside the budgets, so the calibration is checked, not
assumed.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from perfed_ray.analysis import across_seeds
from perfed_ray.errors import InputError
from perfed_ray.markdown import table
from perfed_ray.report.comparison import in_registry_order, per_run
from perfed_ray.report.curves import band
from perfed_ray.results.layout import REPORT, ROUNDS
from perfed_ray.results.reader import read_runs, read_table

NONE = "none"  # the column of runs without privacy
CLIP = "clip"  # central privacy's clipping without noise (z = 0, epsilon infinite)
SHARED_NOTHING = {"local"}  # methods with nothing to privatise: one reference row


def budget(run: pd.Series) -> str:
    """A run's column: its epsilon budget, `clip` for clipping without noise, or `none`
    without privacy."""
    if run.get("privacy", NONE) == NONE:
        return NONE
    if pd.isna(run["privacy.epsilon"]) and run["privacy.noise_multiplier"] == 0:
        return CLIP
    return f"{float(run['privacy.epsilon']):g}"


def _columns(budgets: set[str]) -> list[str]:
    """Budgets in increasing epsilon, then clipping alone, then no privacy."""
    last = {CLIP: (1, 0.0), NONE: (2, 0.0)}
    return sorted(budgets, key=lambda b: last[b] if b in last else (0, float(b)))


def per_run_accuracy(out: str | Path, steps: int) -> pd.DataFrame:
    """One row per finished run and user group: method, budget, seed, unseen and the
    accuracy after `steps` personalisation steps (`acc`)."""
    runs = read_runs(out)
    if runs.empty:
        raise InputError(f"{out} holds no runs")
    runs = runs.assign(setting="", method=runs["algorithm"], budget=runs.apply(budget, axis=1))
    table_ = per_run(out, runs)
    column = f"acc_{steps}"
    if column not in table_:
        raise InputError(f"{out}'s runs score no accuracy after {steps} personalisation steps")
    return table_.merge(runs[["run_id", "budget"]], on="run_id")[
        ["method", "budget", "seed", "unseen", column]
    ].rename(columns={column: "acc"})


def with_references(rows: pd.DataFrame) -> pd.DataFrame:
    """Per method, budget and user group: mean accuracy and 95% half-width over seeds;
    a method in SHARED_NOTHING repeated in every budget's column."""
    stats = across_seeds(rows, ["method", "budget", "unseen"], "acc")
    budgets = [*_columns(set(stats["budget"]) - {NONE}), NONE]  # every column there is
    reference = stats[stats["method"].isin(SHARED_NOTHING)]
    private = stats[~stats["method"].isin(SHARED_NOTHING)]
    repeated = [reference.assign(budget=b) for b in budgets]
    return pd.concat([private, *repeated], ignore_index=True)


def spent(out: str | Path) -> pd.DataFrame:
    """Per budget: the largest epsilon the accountant reports spent after a run's last
    round over the runs given that budget (`spent`), and the noise multiplier z they
    ran with (`z`, the largest: one value per budget unless delta or the rounds
    differ)."""
    runs = read_runs(out)
    rounds = read_table(out, ROUNDS)
    if rounds.empty or "epsilon" not in rounds:
        return pd.DataFrame(columns=["budget", "spent", "z"])
    runs = runs.assign(
        budget=runs.apply(budget, axis=1),
        z=runs.get("privacy.noise_multiplier", pd.Series(float("nan"), index=runs.index)),
    )
    last = rounds.sort_values("round").groupby("run_id", observed=True).tail(1)
    last = last[["run_id", "epsilon"]].merge(runs[["run_id", "budget", "z"]], on="run_id")
    return (
        last.groupby("budget")
        .agg(spent=("epsilon", "max"), z=("z", "max"))
        .reset_index()[["budget", "spent", "z"]]
    )


def timing(out: str | Path) -> pd.DataFrame:
    """Per method: runs, the median seconds of a round, and the median and total seconds
    of a run (its own `wall_seconds`: set-up and evaluations included, the process's
    start not)."""
    runs = read_runs(out)
    rounds = read_table(out, ROUNDS)
    per_round = rounds.groupby("algorithm", observed=True)["wall_seconds"].median()
    done = runs[runs["status"] == "finished"].groupby("algorithm")["wall_seconds"]
    return pd.DataFrame(
        {
            "runs": done.size(),
            "per_round": per_round,
            "per_run": done.median(),
            "total": done.sum(),
        }
    ).dropna()


def _cell(stats: pd.DataFrame, method: str, budget_: str, unseen: bool) -> str:
    cell = stats[
        (stats["method"] == method) & (stats["budget"] == budget_) & (stats["unseen"] == unseen)
    ]
    if cell.empty:
        return "-"
    mean, half, seeds = cell[["accuracy", "ci95", "seeds"]].iloc[0]
    return f"{100 * mean:.2f}" + (f" ± {100 * half:.2f}" if seeds > 1 else "")


def privacy_markdown(out: str | Path, steps: int = 1) -> str:
    """The report: for seen and for unseen users, a table of methods against budgets,
    after `steps` personalisation steps and before any (0 steps: the global model of
    FedAvg and Per-FedAvg, the personal ones of the others), so that what personalising
    recovers of what privacy costs can be read off."""
    stats = with_references(per_run_accuracy(out, steps))
    budgets = _columns(set(stats["budget"]))
    methods = in_registry_order(set(stats["method"]))
    names = {NONE: "no privacy", CLIP: "clip only (z = 0)"}
    header = [names.get(b, f"ε = {b}") for b in budgets]
    used = {row.budget: row for row in spent(out).itertuples(index=False)}
    spent_row = [
        (f"{used[b].spent:.3g}" if b in used else "-")
        + (f" (z = {used[b].z:.3g})" if b in used and not pd.isna(used[b].z) else "")
        for b in budgets
    ]
    seeds = int(stats["seeds"].max())
    lines = [
        "# Privacy against utility: personalised accuracy by privacy budget",
        "",
        f"Each cell: final accuracy (%) after {steps} personalisation step"
        f"{'s' if steps != 1 else ''} (`acc_after`), the mean over users and draws, then "
        f"over training seeds (up to {seeds}), ± the 95% t interval over seeds. Columns: "
        "the budget ε of central user-level DP at the run's privacy.delta; clip only, "
        "its clipping without noise (what clipping alone costs); no privacy. "
        "*Seen*: users sampled for training; *unseen*: users never trained, "
        "personalised from what each method gives a newcomer. "
        + (
            "Local shares nothing with the server, so it runs without privacy and its "
            "row repeats that one reference in every column."
            if SHARED_NOTHING & set(methods)
            else ""
        ),
        "",
        "ε spent after the last round (the accountant's, largest over runs) and the "
        "noise multiplier z: "
        + ", ".join(f"{h}: {s}" for h, s in zip(header, spent_row, strict=True)),
        "",
    ]
    before = with_references(per_run_accuracy(out, 0))  # the models as they are
    for frame, suffix in ((stats, ""), (before, ", before personalisation (0 steps)")):
        for unseen in (False, True):
            rows = [[m, *(_cell(frame, m, b, unseen) for b in budgets)] for m in methods]
            title = f"## {'Unseen' if unseen else 'Seen'} users{suffix}"
            lines += [title, "", table(["method", *header], rows), ""]
    times = timing(out)
    lines += [
        "## Time",
        "",
        "Seconds on this machine (shared: other work ran beside the grid), from the "
        "runs' own clocks: a round's median, a run's median and all runs' total.",
        "",
        table(
            ["method", "runs", "s per round", "s per run", "s in all"],
            [
                [m, int(t.runs), f"{t.per_round:.2f}", f"{t.per_run:.0f}", f"{t.total:.0f}"]
                for m, t in times.loc[in_registry_order(set(times.index))].iterrows()
            ],
        ),
        "",
    ]
    return "\n".join(lines)


def plot_privacy(out: str | Path, path: Path, steps: int = 1) -> None:
    """Accuracy against epsilon, a line per method, seen and unseen side by side; no
    privacy (and clipping alone) drawn at the right end of the axis, past the largest
    budget."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    stats = with_references(per_run_accuracy(out, steps))
    budgets = _columns(set(stats["budget"]))
    x = {b: i for i, b in enumerate(budgets)}
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, unseen in zip(axes, (False, True), strict=True):
        for method in in_registry_order(set(stats["method"])):
            mine = stats[(stats["method"] == method) & (stats["unseen"] == unseen)]
            mine = mine.assign(x=mine["budget"].map(x)).sort_values("x")
            low, high = band(mine.rename(columns={"ci95": "half"}))  # within [0, 100]
            ax.errorbar(
                mine["x"],
                100 * mine["accuracy"],
                yerr=[100 * mine["accuracy"] - low, high - 100 * mine["accuracy"]],
                label=method,
                marker="o",
                capsize=3,
                linestyle="--" if method in SHARED_NOTHING else "-",
            )
        names = {NONE: "none", CLIP: "clip"}
        ax.set_xticks(range(len(budgets)), [names.get(b, b) for b in budgets])
        ax.set_xlabel("ε (δ fixed); clip: clipping alone; none: no privacy")
        ax.set_title(f"{'unseen' if unseen else 'seen'} users", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"accuracy % after {steps} step{'s' if steps != 1 else ''}")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_privacy(out: str | Path, dest: str | Path | None = None) -> list[Path]:
    """Write `privacy.md` and `privacy.png` into `dest` (default OUT/report)."""
    dest = Path(dest) if dest is not None else Path(out) / REPORT
    dest.mkdir(parents=True, exist_ok=True)
    text, figure = dest / "privacy.md", dest / "privacy.png"
    text.write_text(privacy_markdown(out))
    plot_privacy(out, figure)
    return [text, figure]
