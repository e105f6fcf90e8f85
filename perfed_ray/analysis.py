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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfed_ray.results.layout import EVALS, EVENTS, ROUNDS, TASKS
from perfed_ray.results.reader import read_runs, read_table

# read_table and read_runs are the results package's; a notebook's analysis starts here.

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


def mean_ci95(values: np.ndarray) -> tuple[float, float]:
    """Mean and half-width of its 95% t interval (0 for a single value)."""
    # Student's t quantile itself (scipy.special): scipy.stats, whose t.ppf calls it,
    # takes four times as long to import, and every run's summary pays for the import.
    from scipy.special import stdtrit

    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float(values.mean()), 0.0
    half = stdtrit(len(values) - 1, 0.975) * values.std(ddof=1) / math.sqrt(len(values))
    return float(values.mean()), float(half)


OUTCOME = {
    ROUNDS: ["round"],
    EVALS: ["round", "user", "draw"],
    EVENTS: ["round", "kind"],
    TASKS: ["task"],
}
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


def evaluation_accuracy(evals: Mapping[str, Any]) -> dict[str, float]:
    """One evaluation's rows (one round: a frame, or its columns as arrays) in
    PROTOCOL.md's figures: the mean over users of the accuracy after adaptation with
    its 95% interval over adaptation draws (`acc_after_ci95`: 0 with one draw), the
    mean before adaptation, and both for the users seen and unseen in training where
    the run keeps unseen users. What a tracker shows of an evaluation as it happens,
    in the trackers' process at every evaluation: numpy, a tenth of pandas' groupby;
    :func:`final_accuracy` reads the same figures back for the final one."""
    draw, unseen = np.asarray(evals["draw"]), np.asarray(evals["unseen"], dtype=bool)
    after = np.asarray(evals["acc_after"], dtype=float)
    before = np.asarray(evals["acc_before"], dtype=float)
    _, index = np.unique(draw, return_inverse=True)
    acc, half = mean_ci95(np.bincount(index, weights=after) / np.bincount(index))
    figures = {"acc_after": acc, "acc_after_ci95": half, "acc_before": before.mean()}
    if unseen.any():
        for name, users in (("seen", ~unseen), ("unseen", unseen)):
            figures[f"acc_after_{name}"] = after[users].mean()
            figures[f"acc_before_{name}"] = before[users].mean()
    return {k: float(v) for k, v in figures.items()}


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
                "sim_time": frame["sim_time"].max() if "sim_time" in frame else np.nan,
                **{
                    f"acc_group_{g}": v
                    for g, v in frame.groupby("group")["acc_after"].mean().items()
                },
            }
        )
    return pd.DataFrame(rows)


def time_to_accuracy(evals: pd.DataFrame, target: float) -> pd.Series:
    """Per run: the simulated seconds (`sim_time`) of the first evaluation whose mean
    personalised accuracy over users and draws reaches `target` (NaN: never, or results
    written before the simulated clock), for time-to-accuracy comparisons of servers
    whose steps take different simulated times (synchronous rounds, FedBuff)."""
    if "sim_time" not in evals:
        return pd.Series(dtype=float)
    curve = evals.groupby(["run_id", "round"], observed=True).agg(
        accuracy=("acc_after", "mean"), sim_time=("sim_time", "first")
    )
    reached = curve[curve["accuracy"] >= target].reset_index()
    return reached.groupby("run_id", observed=True)["sim_time"].min()


# Accuracies whose simulated time to reach the summary shows.
TARGETS = (0.8, 0.9)

# Keys whose non-default values mark a variant of the protocol, shown beside each run.
VARIANT_KEYS = ["input_scale", "hf_delta", "adapt_on"]


def summary(out: str | Path, run_id: str | None = None) -> pd.DataFrame:
    """One row per run (or for one run): configuration, status, wall time, final
    accuracy, the simulated seconds the run covered and those it took to reach each of
    TARGETS (`time_to_80` ...). Core columns alone: no component is imported for it.
    """
    runs = read_runs(out, run_id, settings=False)
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
        "privacy",
        "epsilon",
        "n_actors",
        "engine",
        "hostname",
    ]
    table = runs[cols]
    evals = read_table(out, EVALS, run_id)
    if not evals.empty:
        acc = final_accuracy(evals)
        if not acc.empty:
            table = table.merge(
                acc[["run_id", "round", "accuracy", "ci95", "draws", "acc_before", "sim_time"]],
                on="run_id",
                how="left",
            )
            for target in TARGETS:
                reached = time_to_accuracy(evals, target).rename(f"time_to_{100 * target:.0f}")
                table = table.merge(reached, left_on="run_id", right_index=True, how="left")
    return table.sort_values("run_id").reset_index(drop=True)


def across_seeds(
    final: pd.DataFrame, keys: Sequence[str] = CONFIG_KEYS, value: str = "accuracy"
) -> pd.DataFrame:
    """Per configuration (its `keys`): the mean of `value` over its rows, one per training
    seed, and the 95% t interval's half-width (`accuracy`, `ci95`, `seeds`). Every report
    summarises seeds through this one function, so a table and its figure agree."""
    rows = []
    for key, frame in final.groupby(list(keys), dropna=False):
        acc, half = mean_ci95(frame[value].to_numpy())
        rows.append(
            {
                **dict(zip(keys, key, strict=True)),
                "seeds": len(frame),
                "accuracy": acc,
                "ci95": half,
            }
        )
    return pd.DataFrame(rows)
