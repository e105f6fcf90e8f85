"""How a run shows itself to a person, from the command line and from Python alike: the
progress line while it runs, and its summary table once it has ended."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import pandas as pd


class ProgressDisplay:
    """One status line, redrawn in place on a terminal, printed at evaluations otherwise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last_printed: int | None = None

    def __call__(self, p: Any) -> None:  # p: runtime.rounds.Progress
        eta = (p.rounds - p.round) / max(p.rounds_per_second, 1e-9)
        acc = "-" if p.accuracy is None else f"{100 * p.accuracy:.2f}% (round {p.accuracy_round})"
        width = 20
        bar = "#" * int(width * p.round / p.rounds)
        line = (
            f"round {p.round}/{p.rounds} [{bar:<{width}}] "
            f"{p.rounds_per_second:.2f} rounds/s, eta {duration(eta)} | "
            f"personalised acc {acc}"
        )
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if p.round == p.rounds else ""))
            self.stream.flush()
        elif p.accuracy_round != self.last_printed or p.round == p.rounds:
            self.last_printed = p.accuracy_round
            print(line, file=self.stream, flush=True)


def duration(seconds: float) -> str:
    """`1h02m` or `3m05s`."""
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else (f"{seconds // 60}m{seconds % 60:02d}s")
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
        from perfed_ray.analysis import format_summary

        return format_summary(self) if not self.empty else "(no runs)"

    __str__ = __repr__

    def _repr_html_(self) -> None:  # notebooks: show the text table too
        return None
