"""Which runs make which cell of the extended Table 1, and each cell's statistics.

A run belongs to a *section* by how its configuration differs from the
protocol's (the defaults): `main` (no difference: Table 1 itself), `leaking`
(only `adapt_on: test`, the paper's FedAvg text), `study` (only `input_scale`,
or HF with `hf_delta: normalized`) and one `other: ...` section per other
combination, so no run is ever mixed into a cell it does not belong to.
Within a section a cell is (row, input scale, method) and holds one run per
seed: finished runs give accuracies, diverged and unfinished ones are counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perfed_ray.analysis import final_accuracy, mean_ci95, per_draw_accuracy
from perfed_ray.config.schema import FIELDS
from perfed_ray.data.datasets import paper_a
from perfed_ray.paper import ROW_KEYS
from perfed_ray.report.methods import method_label
from perfed_ray.results.layout import EVALS
from perfed_ray.results.reader import read_runs, read_table

# Keys that change how a run is executed, never its numbers.
MECHANICS = frozenset(
    {
        "data_root",
        "download",
        "data_transport",
        "users_per_actor",
        "balance_rounds",
        "engine",
        "compile",
        "num_cpus_per_actor",
        "num_gpus_per_actor",
        "checkpoint_every",
        "shard_cache_mb",
        "actor_retries",
        "tag",
    }
)
NORMALIZED_HF = method_label(pd.Series({"algorithm": "perfedavg-hf", "hf_delta": "normalized"}))
METHODS = ("fedavg", "perfedavg-fo", "perfedavg-hf", NORMALIZED_HF, "perfedavg")
TABLE_KEYS = ["section", *ROW_KEYS, "input_scale"]


def differences(run: pd.Series) -> dict[str, object]:
    """Configuration values of a run that differ from the protocol's, besides its row,
    algorithm and seed (HF's `delta` and `hf_delta` only count for HF; `hf_delta` is
    part of the method)."""
    ignored = {*ROW_KEYS, "algorithm", "seed", "hf_delta", *MECHANICS}
    if run["algorithm"] != "perfedavg-hf":
        ignored.add("delta")
    out = {}
    for name, f in FIELDS.items():
        if name in ignored:
            continue
        default = paper_a(run["dataset"]) if name == "paper_a" else f.default
        if default is not None and run[name] != default:
            out[name] = run[name]
    return out


def section_of(run: pd.Series) -> str:
    diffs = differences(run)
    if not diffs:
        return "study" if method_label(run) == NORMALIZED_HF else "main"
    if diffs == {"adapt_on": "test"}:
        return "leaking"
    if set(diffs) == {"input_scale"}:
        return "study"
    return "other: " + ", ".join(f"{k} = {v}" for k, v in sorted(diffs.items()))


def run_results(out: str | Path) -> pd.DataFrame:
    """One row per run: its configuration, status, section and method, and for finished
    runs the final accuracy (mean over draws), the per-draw accuracies and the
    per-group accuracies before and after adaptation."""
    runs = read_runs(out)
    if runs.empty:
        return runs
    runs["section"] = runs.apply(section_of, axis=1)
    runs["method"] = runs.apply(method_label, axis=1)
    evals = read_table(out, EVALS)
    if evals.empty:
        return runs.assign(accuracy=np.nan, draws=None)
    accuracy = final_accuracy(evals)[["run_id", "accuracy"]]
    draws = per_draw_accuracy(evals).groupby("run_id")["accuracy"].agg(list).rename("draws")
    final = evals[evals["final"]]
    groups = final.groupby(["run_id", "group"])[["acc_before", "acc_after"]].mean().unstack()
    groups.columns = [f"{metric}_{group}" for metric, group in groups.columns]
    return (
        runs.merge(accuracy, on="run_id", how="left")
        .merge(draws, on="run_id", how="left")
        .merge(groups, on="run_id", how="left")
    )


def finished(runs: pd.DataFrame) -> pd.DataFrame:
    """Finished runs that have a final evaluation, the latest per cell and seed (a cell
    run twice by mistake counts once)."""
    done = runs[(runs["status"] == "finished") & runs["accuracy"].notna()]
    return done.sort_values("run_id").groupby([*TABLE_KEYS, "method", "seed"], dropna=False).tail(1)


@dataclass
class Cell:
    """The runs of one cell: accuracies of finished seeds, their final evaluation's
    per-draw accuracies pooled, the rounds where runs diverged, runs a sweep's scheduler
    stopped early (they did worse than others: never averaged, never unfinished), and
    runs that stopped otherwise (interrupted, failed, or still running)."""

    accuracies: list[float] = field(default_factory=list)
    draws: list[float] = field(default_factory=list)
    diverged_rounds: list[int] = field(default_factory=list)
    stopped: int = 0
    unfinished: int = 0

    def text(self, paper: float | None) -> str:
        """'mean ± seeds-CI [± draws-CI], n seeds', the paper's figure and the difference,
        diverged and unfinished runs counted; 'not run' for an empty cell."""
        parts = []
        if self.accuracies:
            acc, half = mean_ci95(np.asarray(self.accuracies))
            _, pooled = mean_ci95(np.asarray(self.draws))
            n = len(self.accuracies)
            seeds = f"± {100 * half:.2f}" if n > 1 else "± n/a"  # no interval from 1 seed
            parts.append(
                f"{100 * acc:.2f} {seeds} [± {100 * pooled:.2f}], {n} seed{'s' if n > 1 else ''}"
            )
            if paper is not None:
                parts.append(f"paper {paper:.2f} ({100 * acc - paper:+.2f})")
        elif paper is not None:
            parts.append(f"paper {paper:.2f}")
        if self.diverged_rounds:
            where = ", ".join(str(r) for r in sorted(self.diverged_rounds))
            parts.append(f"**{len(self.diverged_rounds)} diverged** (round {where})")
        if self.stopped:
            parts.append(f"{self.stopped} stopped early")
        if self.unfinished:
            parts.append(f"{self.unfinished} unfinished")
        if not self.accuracies and not self.diverged_rounds:
            parts.insert(0, "not run")
        return "<br>".join(parts)


def cells(runs: pd.DataFrame) -> dict[tuple, Cell]:
    """Every cell that has runs, keyed by (*TABLE_KEYS, method)."""
    out: dict[tuple, Cell] = {}
    for _, run in finished(runs).iterrows():
        cell = out.setdefault(_key(run), Cell())
        cell.accuracies.append(run["accuracy"])
        cell.draws.extend(run["draws"])
    for _, run in runs[runs["status"] != "finished"].iterrows():
        cell = out.setdefault(_key(run), Cell())
        if run["status"] == "diverged":
            cell.diverged_rounds.append(int(run["rounds_done"]) + 1)
        elif run["status"] == "stopped":
            cell.stopped += 1
        else:
            cell.unfinished += 1
    return out


def _key(run: pd.Series) -> tuple:
    return (*(run[k] for k in TABLE_KEYS), run["method"])


def ordered_methods(present: Iterable[str]) -> list[str]:
    present = set(present)
    return [m for m in METHODS if m in present] + sorted(present - set(METHODS))
