"""Reading results back: final personalised accuracy with 95% intervals.

PROTOCOL.md's headline figure is the unweighted mean over users of the
accuracy after one adaptation step. At the final evaluation each user is
adapted with several independent batches (draws); the interval here is
over those draws (a t interval on the per-draw means), which measures the
noise of the adaptation step, not of training. Intervals across training
seeds come from :func:`across_seeds`.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from perfed_ray.config import FIELDS, legacy_keys, registered_settings
from perfed_ray.errors import UnreadableFile, first_line
from perfed_ray.results.writer import table_schema

CONFIG_KEYS = [
    "dataset",
    "partition",
    "algorithm",
    "tau",
    "alpha",
    "beta",
    "n_users",
    "fraction",
    "rounds",
]

# FedRep's authors' figure: the mean of a run's last this many evaluations.
LAST_ROUNDS = 10


def t_quantile(p: float, df: int) -> float:
    """Student-t quantile for p in (0.5, 1), by bisection on a numerically integrated CDF."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:
        t = np.linspace(0.0, x, 4001)
        pdf = np.exp(log_norm - (df + 1) / 2 * np.log1p(t * t / df))
        return 0.5 + float(np.sum((pdf[1:] + pdf[:-1]) / 2) * (t[1] - t[0]))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def mean_ci95(values: np.ndarray) -> tuple[float, float]:
    """Mean and half-width of its 95% t interval (0 for a single value)."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float(values.mean()), 0.0
    half = t_quantile(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return float(values.mean()), float(half)


def _skip(path: Path, why: str) -> None:
    # One place of warning: each file is warned of once per process, however often read.
    warnings.warn(f"skipped {path}: {why}", UnreadableFile, stacklevel=1)


def _readable(folder: Path, run_id: str | None) -> list[tuple[Path, pa.Schema]]:
    """The Parquet files of a table's run folders (one run's with `run_id`) and their
    schemas. A file that is not a table's, or cannot be read (corrupt, truncated), is
    skipped with one warning naming it, so that one bad file does not hide every run;
    hidden files (writes in progress) are skipped silently."""
    runs = sorted(folder.iterdir()) if run_id is None else [folder / f"run_id={run_id}"]
    paths = [
        path
        for entry in runs
        if not entry.name.startswith(".")
        for path in (
            sorted(entry.iterdir())
            if entry.is_dir() and entry.name.startswith("run_id=")
            else [entry]
        )
    ]
    files = []
    for path in paths:
        if path.name.startswith(".") or not path.exists():
            continue
        if path.is_dir() or not path.parent.name.startswith("run_id=") or path.suffix != ".parquet":
            _skip(path, f"not a results file ({folder}/run_id=<id>/*.parquet)")
            continue
        try:
            files.append((path, pq.read_schema(path)))
        except (OSError, pa.ArrowException) as err:
            _skip(path, f"not a readable Parquet file ({first_line(err)})")
    return files


def read_table(out: str | Path, table: str, run_id: str | None = None) -> pd.DataFrame:
    """One results table across every run under `out` (empty if there is none yet).

    Reads with the current schema joined with every file's own (components' settings
    are columns of their runs alone), so files written before a column existed read
    back with nulls there instead of hiding the column. Files that cannot be read are
    skipped, each with one warning (:class:`~perfed_ray.errors.UnreadableFile`).
    """
    folder = Path(out) / table
    files = _readable(folder, run_id) if folder.is_dir() else []
    if not files:
        return pd.DataFrame()
    schema = pa.unify_schemas(
        [table_schema(table), *(s for _, s in files)], promote_options="permissive"
    )
    data = ds.dataset(
        [str(f) for f, _ in files],
        schema=schema,
        format="parquet",
        partitioning="hive",
        partition_base_dir=str(folder),
    )
    return data.to_table().to_pandas()


def read_runs(out: str | Path, run_id: str | None = None) -> pd.DataFrame:
    """The runs table with configuration values that older results lack (a key added
    later reads back as null) filled in with the key's default, which is what those
    runs used."""
    runs = read_table(out, "runs", run_id)
    for name, f in FIELDS.items():
        if name in runs and f.default is not None and runs[name].isna().any():
            runs[name] = runs[name].fillna(f.default)
    # Runs from before components declared their settings kept them in flat columns
    # (`pfedme_lr`): they are read as the setting of the run's own method.
    for old, dotted in legacy_keys().items():
        if old in runs:
            mine = runs["algorithm"] == dotted.partition(".")[0]
            values = runs[old].where(mine)
            runs[dotted] = runs[dotted].fillna(values) if dotted in runs else values
            runs = runs.drop(columns=old)
    # A setting a component declared later reads back, for that component's runs, as
    # its default (what they ran with), so a finished run still matches its config.
    for dotted, (key, component, setting) in registered_settings().items():
        if key not in runs or setting.default is None:
            continue
        mine = runs[key] == component
        if not mine.any():
            continue
        if dotted not in runs:
            runs[dotted] = pd.Series([None] * len(runs), index=runs.index, dtype=object)
        runs.loc[mine & runs[dotted].isna(), dotted] = setting.default
    return runs


OUTCOME = {"rounds": ["round"], "evals": ["round", "user", "draw"], "events": ["round", "kind"]}
# How long it took, how the weights travelled (a span of rounds sends them once, and
# where spans end follows the time rounds take) and the run's name: not results.
MEASURED = [
    "wall_seconds",
    "train_seconds",
    "actor_seconds",
    "server_seconds",
    "bytes_sent",
    "run_id",
]


def outcome(out: str | Path) -> dict[str, pd.DataFrame]:
    """What a run computed (its rounds, evals and events) without what may differ
    between two runs of one configuration (timings, the run's name), rows in a fixed
    order: a run resumed after a crash must compare equal to one left alone."""
    tables = {}
    for name, keys in OUTCOME.items():
        table = read_table(out, name)
        if not table.empty:
            table = table.drop(columns=MEASURED, errors="ignore")
            table = table.sort_values(keys, kind="stable").reset_index(drop=True)
        tables[name] = table
    return tables


def per_draw_accuracy(evals: pd.DataFrame) -> pd.DataFrame:
    """Per run and adaptation draw of the final evaluation: the mean over users of the
    accuracy after adaptation (PROTOCOL.md's headline figure, once per draw)."""
    final = evals[evals["final"]]
    return (
        final.groupby(["run_id", "draw"], observed=True)["acc_after"]
        .mean()
        .rename("accuracy")
        .reset_index()
    )


def pooled_accuracy(evals: pd.DataFrame, steps: int = 0) -> pd.DataFrame:
    """Per run and evaluation round, the scoring rule of pFedMe's authors (and of LEAF's
    and FedProx's code): correct answers summed over all evaluated users' test samples,
    divided by the number of those samples, for the personal model after `steps`
    personalisation steps (0: the method's personal model as it stands), averaged over
    adaptation draws. Unlike PROTOCOL.md's unweighted mean over users, a user counts in
    proportion to its test shard."""
    frame = evals.assign(
        correct=[a[steps] * n for a, n in zip(evals["acc_steps"], evals["n_test"], strict=True)]
    )
    per_draw = frame.groupby(["run_id", "round", "draw"], observed=True)[["correct", "n_test"]]
    sums = per_draw.sum()
    pooled = (sums["correct"] / sums["n_test"]).groupby(["run_id", "round"]).mean()
    return pooled.rename("pooled_accuracy").reset_index()


def best_round(pooled: pd.DataFrame) -> pd.DataFrame:
    """Per run, the best pooled accuracy over its evaluation rounds and that round (what
    pFedMe's authors report: the maximum of the per-round curve), beside the final one
    (FedProx's and APFL's code keep no best: the last round they print) and the mean of
    the last ten evaluations (what FedRep's authors report)."""
    rows = []
    for run_id, frame in pooled.groupby("run_id", observed=True):
        frame = frame.sort_values("round")
        best = frame.loc[frame["pooled_accuracy"].idxmax()]
        rows.append(
            {
                "run_id": run_id,
                "best_accuracy": float(best["pooled_accuracy"]),
                "best_round": int(best["round"]),
                "final_accuracy": float(frame["pooled_accuracy"].iloc[-1]),
                "last10_accuracy": float(frame["pooled_accuracy"].iloc[-LAST_ROUNDS:].mean()),
            }
        )
    return pd.DataFrame(rows)


# What makes a run's users: two runs of a seed hold the same users only where these agree.
USER_KEYS = (
    "dataset",
    "partition",
    "paper_a",
    "synthetic_alpha",
    "synthetic_beta",
    "dirichlet_alpha",
    "labels_per_user",
    "n_users",
)


def paired_by_user(
    runs: pd.DataFrame,
    evals: pd.DataFrame,
    first: str,
    second: str,
    by: str = "tag",
    last: int = LAST_ROUNDS,
) -> pd.DataFrame:
    """Two settings compared user by user, per seed both finished: each user's accuracy
    (its personal model as it stands, mean over draws and over the last `last`
    evaluations, FedRep's authors' window) under `first` minus under `second`, in
    points: the mean over users with its 95% t interval, and how many users are ahead
    and behind. Pairing by user removes the spread between users that a difference of
    two means carries. `by` is the runs' column that names the settings. A seed draws
    the same users for both only if the runs make their users alike (USER_KEYS);
    ValueError if not."""
    done = runs[(runs["status"] == "finished") & runs[by].isin([first, second])]
    made = done[[k for k in USER_KEYS if k in done]].drop_duplicates()
    if len(made) > 1:
        differ = [k for k in made if made[k].nunique(dropna=False) > 1]
        raise ValueError(
            f"{first} and {second} are not run on the same users ("
            + "; ".join(f"{k}: {', '.join(map(str, made[k].unique()))}" for k in differ)
            + ")"
        )
    evals = evals[evals["run_id"].isin(done["run_id"])]
    first_kept = evals.groupby("run_id", observed=True)["round"].transform(
        lambda rounds: np.sort(rounds.unique())[-last:][0]
    )
    recent = evals[evals["round"] >= first_kept]
    wide = (
        recent.assign(acc=[a[0] for a in recent["acc_steps"]])
        .groupby(["run_id", "user"], observed=True)["acc"]
        .mean()
        .reset_index()
        .merge(done[["run_id", by, "seed"]], on="run_id")
        .pivot_table(index=["seed", "user"], columns=by, values="acc")
        .reindex(columns=[first, second])
        .dropna()  # a seed only one of them finished
    )
    rows = []
    for seed, users in wide.groupby(level="seed"):
        gap = 100 * (users[first] - users[second]).to_numpy()
        mean, half = mean_ci95(gap)
        rows.append(
            {
                "seed": seed,
                "users": len(gap),
                "difference": mean,
                "interval": half,
                "ahead": int((gap > 0).sum()),
                "behind": int((gap < 0).sum()),
            }
        )
    return pd.DataFrame(rows)


def final_accuracy(evals: pd.DataFrame) -> pd.DataFrame:
    """Per run: mean personalised accuracy over users at the final evaluation, with
    its 95% interval over adaptation draws, and the accuracy before adaptation."""
    final = evals[evals["final"]]
    draws = per_draw_accuracy(evals)
    rows = []
    for run_id, frame in final.groupby("run_id", observed=True):
        per_draw = draws.loc[draws["run_id"] == run_id, "accuracy"].to_numpy()
        acc, half = mean_ci95(per_draw)
        first = frame.iloc[0]
        rows.append(
            {
                "run_id": run_id,
                **{k: first[k] for k in CONFIG_KEYS},
                "seed": first["seed"],
                "round": int(frame["round"].max()),
                "accuracy": acc,
                "ci95": half,
                "draws": len(per_draw),
                "acc_before": frame["acc_before"].mean(),
                **{
                    f"acc_group_{g}": v
                    for g, v in frame.groupby("group")["acc_after"].mean().items()
                },
            }
        )
    return pd.DataFrame(rows)


# Keys whose non-default values mark a variant of the protocol, shown beside each run.
VARIANT_KEYS = ["input_scale", "hf_delta", "adapt_on"]


def summary(out: str | Path, run_id: str | None = None) -> pd.DataFrame:
    """One row per run (or for one run): configuration, status, wall time, final accuracy."""
    runs = read_runs(out, run_id)
    if runs.empty:
        return runs
    cols = [
        "run_id",
        "dataset",
        "partition",
        "algorithm",
        "tau",
        "alpha",
        *VARIANT_KEYS,
        "seed",
        "status",
        "rounds_done",
        "rounds",
        "wall_seconds",
        "startup_seconds",
        "n_actors",
        "engine",
        "hostname",
    ]
    table = runs[cols]
    evals = read_table(out, "evals", run_id)
    if not evals.empty:
        acc = final_accuracy(evals)
        if not acc.empty:
            table = table.merge(
                acc[["run_id", "round", "accuracy", "ci95", "draws", "acc_before"]],
                on="run_id",
                how="left",
            )
    return table.sort_values("run_id").reset_index(drop=True)


def across_seeds(final: pd.DataFrame) -> pd.DataFrame:
    """Mean and 95% interval over training seeds of each configuration's final accuracy."""
    rows = []
    for key, frame in final.groupby(CONFIG_KEYS, dropna=False):
        acc, half = mean_ci95(frame["accuracy"].to_numpy())
        rows.append(
            {
                **dict(zip(CONFIG_KEYS, key, strict=True)),
                "seeds": len(frame),
                "accuracy": acc,
                "ci95": half,
            }
        )
    return pd.DataFrame(rows)


def format_summary(table: pd.DataFrame, markdown: bool = False) -> str:
    """The summary as aligned text (terminal) or a Markdown table, accuracies in %."""
    shown = pd.DataFrame(
        {
            "run_id": table["run_id"],
            "dataset": table["dataset"],
            "partition": table["partition"],
            "algorithm": table["algorithm"],
            "tau": table["tau"],
            "alpha": table["alpha"],
            "variant": [
                ", ".join(f"{k}={row[k]}" for k in VARIANT_KEYS if row[k] != FIELDS[k].default)
                or "-"
                for _, row in table.iterrows()
            ],
            "seed": table["seed"],
            "status": table["status"],
            "rounds": [
                f"{d}/{r}" for d, r in zip(table["rounds_done"], table["rounds"], strict=True)
            ],
            "wall": [f"{w:.0f} s" if pd.notna(w) else "-" for w in table["wall_seconds"]],
        }
    )
    if "accuracy" in table:
        shown["pers. acc (95% CI, draws)"] = [
            "-" if pd.isna(a) else f"{100 * a:.2f} ± {100 * h:.2f} ({int(d)})"
            for a, h, d in zip(table["accuracy"], table["ci95"], table["draws"], strict=True)
        ]
        shown["acc before adapt."] = [
            "-" if pd.isna(a) else f"{100 * a:.2f}" for a in table["acc_before"]
        ]
    cells = [[str(c) for c in shown.columns], *shown.astype(str).to_numpy().tolist()]
    if markdown:
        lines = ["| " + " | ".join(row) + " |" for row in cells]
        lines.insert(1, "|" + "|".join(" --- " for _ in shown.columns) + "|")
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in cells) for i in range(len(shown.columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )
