"""Learning curves: personalised accuracy against round, against training time and
against simulated time.

As the paper's Appendix I figures: every method of a Table 1 row in one
figure, here the mean over seeds with its 95% t band (no band for one seed).
Training time is the cumulative `wall_seconds` of the rounds (training only, the
evaluations excluded), so methods are compared at equal computation; simulated time
(`sim_time`, results with the simulated clock only) is what the users' devices would
have taken, where synchronous rounds and asynchronous servers differ.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from perfed_ray.analysis import mean_ci95


def run_curves(evals: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """Per run and evaluated round: the accuracy after adaptation (mean over users and
    draws) and the training seconds spent up to that round."""
    by = evals.groupby(["run_id", "round"])
    acc = by["acc_after"].mean().rename("accuracy")
    if "sim_time" in evals:
        acc = pd.concat([acc, by["sim_time"].first()], axis=1)
    ordered = rounds.sort_values(["run_id", "round"])
    seconds = ordered.assign(seconds=ordered.groupby("run_id")["wall_seconds"].cumsum())
    curves = acc.reset_index().merge(
        seconds[["run_id", "round", "seconds"]], on=["run_id", "round"], how="left"
    )
    curves.loc[curves["round"] == 0, "seconds"] = 0.0
    return curves


def _mean_band(curves: pd.DataFrame) -> pd.DataFrame:
    """Mean over runs (seeds) per round, with the 95% half-width and mean seconds."""
    rows = []
    for round_, frame in curves.groupby("round"):
        acc, half = mean_ci95(frame["accuracy"].to_numpy())
        rows.append(
            {
                "round": round_,
                "accuracy": acc,
                "half": half,
                "seconds": frame["seconds"].mean(),
                "sim_time": frame["sim_time"].mean() if "sim_time" in frame else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def band(mean: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The 95% band in percent, within [0, 100]: a t interval over few seeds can reach
    past what an accuracy can be, and a band drawn there would claim it."""
    return tuple((100 * (mean["accuracy"] + sign * mean["half"])).clip(0, 100) for sign in (-1, 1))


def plot(curves_by_method: dict[str, pd.DataFrame], title: str, path: Path) -> None:
    """One PNG, a line per method, a panel against round, one against training seconds
    and, where the results have the simulated clock, one against simulated hours."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    means = {m: _mean_band(c) for m, c in curves_by_method.items()}
    simulated = any(mean["sim_time"].notna().any() for mean in means.values())
    xs = ("round", "seconds", "sim_hours") if simulated else ("round", "seconds")
    fig, axes = plt.subplots(1, len(xs), figsize=(5.5 * len(xs), 4), sharey=True)
    for method, curves in curves_by_method.items():
        mean = means[method].assign(sim_hours=means[method]["sim_time"] / 3600)
        seeds = curves["run_id"].nunique()
        for ax, x in zip(axes, xs, strict=True):
            (line,) = ax.plot(
                mean[x],
                100 * mean["accuracy"],
                label=f"{method} ({seeds} seed{'s' if seeds > 1 else ''})",
            )
            ax.fill_between(
                mean[x],
                *band(mean),
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
            )
    axes[0].set_xlabel("round")
    axes[1].set_xlabel("training seconds (cumulative, evaluations excluded)")
    if simulated:
        axes[2].set_xlabel("simulated hours (the users' devices and availability)")
    axes[0].set_ylabel("personalised accuracy % (mean over users)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
