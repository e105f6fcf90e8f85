"""How a run shows itself to a person, from the command line and from Python alike: the
progress while it runs, and its summary table once it has ended."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import pandas as pd

from perfed_ray.analysis import TARGETS, VARIANT_KEYS
from perfed_ray.config import FIELDS
from perfed_ray.markdown import table as markdown_table

# The text line's (and the bar's) layout: where a round stands, how fast, how long to go.
_BAR = "round {n}/{total} [{bar:20}] {rate_noinv_fmt}, eta {remaining}{postfix}"


def _in_notebook() -> bool:
    """Whether this runs under a Jupyter kernel (where a progress widget, or a line
    redrawn in the cell's output, is what users expect)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in shell.config


class ProgressDisplay:
    """A progress bar (tqdm's) redrawn in place on a terminal and in a notebook; where
    the output is a log file or a pipe, where redrawing would leave a carriage return
    per round, one plain line at each evaluation and at the end."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() or _in_notebook()
        self.bar: Any = None  # tqdm's, made at the first round (a resumed run's total)
        self.last_printed: int | None = None

    def __call__(self, p: Any) -> None:  # p: runtime.rounds.Progress
        acc = "-" if p.accuracy is None else f"{100 * p.accuracy:.2f}% (round {p.accuracy_round})"
        if self.live:
            self._redraw(p, f"personalised acc {acc}")
        elif p.accuracy_round != self.last_printed or p.round == p.rounds:
            self.last_printed = p.accuracy_round
            eta = (p.rounds - p.round) / max(p.rounds_per_second, 1e-9)
            width = 20
            bar = "#" * int(width * p.round / p.rounds)
            line = (
                f"round {p.round}/{p.rounds} [{bar:<{width}}] "
                f"{p.rounds_per_second:.2f} rounds/s, eta {duration(eta)} | "
                f"personalised acc {acc}"
            )
            print(line, file=self.stream, flush=True)

    def _redraw(self, p: Any, postfix: str) -> None:
        if self.bar is None:
            from tqdm.auto import tqdm  # a widget in notebooks, text on a terminal

            self.bar = tqdm(
                total=p.rounds,
                initial=p.round - 1,
                file=self.stream,
                unit=" rounds",
                bar_format=_BAR,
                ascii=" #",
            )
        self.bar.set_postfix_str(postfix, refresh=False)
        self.bar.update(p.round - self.bar.n)
        if p.round == p.rounds:
            self.bar.close()


def duration(seconds: float) -> str:
    """`1h02m` or `3m05s`."""
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else (f"{seconds // 60}m{seconds % 60:02d}s")
    )


def _simulated(seconds: float) -> str:
    """Simulated seconds as `duration` shows them, or `4.2s` under a minute."""
    if pd.isna(seconds):
        return "-"
    return duration(seconds) if seconds >= 60 else f"{seconds:.1f}s"


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
    if (table.get("privacy", "none") != "none").any():
        # what each private run spent, at its privacy.delta
        shown["epsilon"] = [
            "-" if p == "none" or pd.isna(e) else f"{e:.3g}"
            for p, e in zip(table["privacy"], table["epsilon"], strict=True)
        ]
    if "accuracy" in table:
        shown["pers. acc (95% CI, draws)"] = [
            "-" if pd.isna(a) else f"{100 * a:.2f} ± {100 * h:.2f} ({int(d)})"
            for a, h, d in zip(table["accuracy"], table["ci95"], table["draws"], strict=True)
        ]
        shown["acc before adapt."] = [
            "-" if pd.isna(a) else f"{100 * a:.2f}" for a in table["acc_before"]
        ]
    if "sim_time" in table and table["sim_time"].notna().any():
        # the simulated clock: the time the run covered, and to reach each target accuracy
        shown["sim. time"] = [_simulated(t) for t in table["sim_time"]]
        for target in TARGETS:
            column = f"time_to_{100 * target:.0f}"
            shown[f"to {100 * target:.0f}%"] = [_simulated(t) for t in table[column]]
    cells = [[str(c) for c in shown.columns], *shown.astype(str).to_numpy().tolist()]
    if markdown:
        return markdown_table(cells[0], cells[1:])
    widths = [max(len(row[i]) for row in cells) for i in range(len(shown.columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


class SummaryTable(pd.DataFrame):
    """Rows of :func:`perfed_ray.analysis.summary` that print as `perfed-ray summary`
    does: every column, aligned, accuracies in %, instead of pandas' frame cut to the
    terminal's width. Still a DataFrame for everything else; what is selected from it
    is a plain one."""

    @property
    def _constructor(self) -> type[pd.DataFrame]:
        return pd.DataFrame

    def __repr__(self) -> str:
        return format_summary(self) if not self.empty else "(no runs)"

    __str__ = __repr__

    def _repr_html_(self) -> None:  # notebooks: show the text table too
        return None
