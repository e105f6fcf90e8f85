"""`perfed-ray compare`: personalised methods side by side, for users that trained and
users that never did, after each number of personalisation steps.

For every finished run, the final evaluation's `acc_steps` (accuracy after 0, 1, ...,
`personalise_steps` steps of the method's own personalisation) are averaged over
draws and users, separately for seen users and for unseen ones (`unseen_users`); a
cell is the mean over training seeds with its 95% t interval over seeds. Runs form
one table per *setting*: every configuration value that is not the method, the seed,
a method's own knob or an execution mechanic, so runs are only ever compared with
runs of the same setting.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from perfed_ray.analysis import across_seeds
from perfed_ray.config.schema import FIELDS
from perfed_ray.errors import InputError
from perfed_ray.markdown import table
from perfed_ray.registry import ALGORITHMS
from perfed_ray.report.cells import MECHANICS
from perfed_ray.report.methods import is_method_key, method_label, value_text
from perfed_ray.results.layout import EVALS, REPORT
from perfed_ray.results.reader import read_runs, read_table

STEPS = (0, 1, 5)  # the columns: no personalisation, the paper's one step, five
# The shared protocol's keys: part of the setting where a table's runs agree on them,
# else of each method's label (a method run with its authors' step size, batch and
# number of rounds).
PROTOCOL_KEYS = ("tau", "beta", "batch_size", "rounds")
# Published figures beside ours, where a setting matches a method's own paper:
# {setting label: {method: (accuracy %, source)}}. pFedMe's: its personalised models'
# test accuracy in the authors' results file for this setting (CharlieDinh/pFedMe,
# results/Mnist_pFedMe_p_0.005_1_15_5u_20b_20_5_0.1_avg.h5, the mean of their 10 runs),
# averaged over its last 10 of 800 rounds; compare with "seen, 0 steps".
PUBLISHED: dict[str, dict[str, tuple[float, str]]] = {
    "mnist: partition=labels, input_scale=standardize, n_users=20, fraction=0.25, tau=20, "
    "rounds=800, alpha=0.005, beta=0.005, batch_size=20, model=logreg, eval_every=100, "
    "personalise_steps=5": {
        "pfedme (pfedme.personal_lr=0.1)": (94.51, "authors' results file, personal models"),
    },
}


def _setting_keys(runs: pd.DataFrame) -> list[str]:
    return [
        k
        for k in FIELDS
        if k in runs
        and k not in MECHANICS
        and k not in {"algorithm", "seed"}
        and not is_method_key(k)
        and k not in PROTOCOL_KEYS
    ]


def _label(values: pd.Series, keys: list[str]) -> str:
    """A setting named by its data set and the values that differ from the defaults."""
    unused = {"dataset"} | (set() if str(values["partition"]).startswith("paper") else {"paper_a"})
    shown = [
        f"{k}={value_text(values[k])}"
        for k in keys
        if k not in unused and not pd.isna(values[k]) and values[k] != FIELDS[k].default
    ]
    return f"{values['dataset']}: " + ", ".join(shown)


def annotated_runs(out: str | Path) -> pd.DataFrame:
    """The runs table with each run's setting and method."""
    runs = read_runs(out)
    if runs.empty:
        raise InputError(f"{out} holds no runs")
    keys = _setting_keys(runs)
    runs = runs.assign(setting=[_label(r, keys) for _, r in runs.iterrows()])
    settings, methods = [], []
    for _, group in runs.groupby("setting", sort=False):
        usual = {k: _usual(group[k]) for k in PROTOCOL_KEYS}
        fixed = {k: v for k, v in usual.items() if v is not None}  # the setting's own
        shared = [k for k in FIELDS if k in keys or k in fixed]
        setting = _label(pd.Series({**group.iloc[0], **fixed}), shared)
        for index, run in group.iterrows():
            own = [k for k in PROTOCOL_KEYS if k not in fixed or run[k] != fixed[k]]
            settings.append((index, setting))
            methods.append((index, method_label(run, own)))
    return runs.assign(setting=pd.Series(dict(settings)), method=pd.Series(dict(methods)))


def _usual(values: pd.Series) -> object | None:
    """The value most of a table's runs hold (the setting's), if one value is held by
    more runs than any other; a method run otherwise says its own in its label."""
    counts = values.value_counts(dropna=False)
    return counts.index[0] if len(counts) == 1 or counts.iloc[0] > counts.iloc[1] else None


def per_run(out: str | Path, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per finished run and user group (seen/unseen): the mean accuracy after
    each personalisation step at the final evaluation."""
    evals = read_table(out, EVALS)
    if evals.empty:
        raise InputError(f"{out} holds no evaluations")
    final = evals[evals["final"]]
    rows = []
    for run_id, frame in final.groupby("run_id", observed=True):
        run = runs.loc[runs["run_id"] == run_id].iloc[0]
        if run["status"] != "finished":
            continue
        steps = np.stack(frame["acc_steps"].to_numpy())
        for unseen in (False, True):
            pick = (frame["unseen"] == unseen).to_numpy()
            if pick.any():
                per_user = pd.DataFrame(steps[pick]).groupby(frame["user"].to_numpy()[pick]).mean()
                rows.append(
                    {
                        "run_id": run_id,
                        "setting": run["setting"],
                        "method": run["method"],
                        "seed": run["seed"],
                        "unseen": unseen,
                        "users": len(per_user),
                        **{f"acc_{k}": per_user[k].mean() for k in per_user.columns},
                    }
                )
    return pd.DataFrame(rows)


def per_step(table: pd.DataFrame) -> pd.DataFrame:
    """Per setting, method, user group and step: mean and 95% interval over seeds; a
    step some seed of the group did not score is left out."""
    group = ["setting", "method", "unseen"]
    scored = [f"acc_{k}" for k in STEPS if f"acc_{k}" in table]
    long = table.melt(group, scored, var_name="steps", value_name="accuracy")
    long["steps"] = long["steps"].str.removeprefix("acc_").astype(int)
    complete = long.groupby([*group, "steps"])["accuracy"].transform(lambda a: a.notna().all())
    return across_seeds(long[complete.astype(bool)], [*group, "steps"])


def in_registry_order(methods: set[str]) -> list[str]:
    """Methods (labels that start with an algorithm's name) in the algorithm registry's
    order, so every report lists them alike; unregistered ones last."""
    names = ALGORITHMS.names()
    return sorted(
        methods,
        key=lambda m: (names.index(m.split(" ")[0]) if m.split(" ")[0] in names else len(names), m),
    )


def comparison_markdown(out: str | Path) -> str:
    """The comparison report: one table per setting, the best mean of each column in
    bold, and which method wins where."""
    runs = annotated_runs(out)
    stats = per_step(per_run(out, runs))
    lines = [
        "# Personalised methods compared: seen and unseen users, 0, 1 and 5 steps",
        "",
        "Each cell: final personalised accuracy (%), the mean over users and "
        "personalisation draws, then over training seeds, ± the 95% t interval over "
        "seeds. *Seen*: users sampled for training; *unseen*: the `unseen_users` share "
        "that never trained, personalised from what each method gives a newcomer. "
        "Steps: 0 = the method's personal model as is (the global one for FedAvg and "
        "Per-FedAvg), 1 = docs/PROTOCOL.md's one step, 5 = five steps of the method's own "
        "personalisation. Bold: the best mean of its column.",
        "",
    ]
    for setting, frame in stats.groupby("setting"):
        columns = [
            (unseen, k)
            for unseen in (False, True)
            for k in STEPS
            if ((frame["unseen"] == unseen) & (frame["steps"] == k)).any()
        ]
        best = {
            c: frame[(frame["unseen"] == c[0]) & (frame["steps"] == c[1])]["accuracy"].max()
            for c in columns
        }
        published = PUBLISHED.get(setting, {})
        lines += [f"## {setting}", ""]
        header = [
            f"{'unseen' if u else 'seen'}, {k} step{'s' if k != 1 else ''}" for u, k in columns
        ]
        extra = ["published"] if published else []
        rows = []
        ran = set(runs.loc[runs["setting"] == setting, "method"])
        for method in in_registry_order(set(frame["method"]) | ran):
            texts = []
            for c in columns:
                cell = frame[
                    (frame["method"] == method)
                    & (frame["unseen"] == c[0])
                    & (frame["steps"] == c[1])
                ]
                if cell.empty:
                    texts.append("-")
                    continue
                a, h = cell["accuracy"].iloc[0], cell["ci95"].iloc[0]
                several = cell["seeds"].iloc[0] > 1
                text = f"{100 * a:.2f}" + (f" ± {100 * h:.2f}" if several else "")
                texts.append(f"**{text}**" if a == best[c] else text)
            if published:
                figure = published.get(method)
                texts.append(f"{figure[0]:.2f} ({figure[1]})" if figure else "-")
            seeds = (
                frame.loc[frame["method"] == method, "seeds"].max()
                if method in set(frame["method"])
                else 0
            )
            mine = runs[(runs["setting"] == setting) & (runs["method"] == method)]
            off = mine[mine["status"] != "finished"]["status"].value_counts()
            note = "".join(f", {n} {s}" for s, n in off.items())
            rows.append([f"{method}", *texts, f"{seeds}{note}"])
        lines += [table(["method", *header, *extra, "seeds"], rows), ""]
    return "\n".join(lines)


def write_comparison(out: str | Path, dest: str | Path | None = None) -> Path:
    """Write `comparison.md` into `dest` (default OUT/report) and return its path."""
    dest = Path(dest) if dest is not None else Path(out) / REPORT
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "comparison.md"
    path.write_text(comparison_markdown(out))
    return path
