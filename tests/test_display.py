"""The progress display: a bar redrawn in place on a terminal, plain lines in a log."""

from __future__ import annotations

import io

from perfed_ray.display import ProgressDisplay
from perfed_ray.runtime.rounds import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _show(stream: io.StringIO) -> str:
    display = ProgressDisplay(stream)
    for r in range(1, 6):
        evaluated = r >= 3
        display(Progress(r, 5, 2.0, 0.5 if evaluated else None, 3 if evaluated else None))
    return stream.getvalue()


def test_a_log_gets_one_plain_line_at_each_evaluation_and_at_the_end():
    lines = _show(io.StringIO()).splitlines()
    assert "\r" not in "".join(lines)
    assert [line.split(" [")[0] for line in lines] == ["round 3/5", "round 5/5"]
    assert lines[-1].endswith("personalised acc 50.00% (round 3)")


def test_a_terminal_gets_a_bar_redrawn_in_place_and_closed_at_the_last_round():
    shown = _show(Terminal())
    assert shown.startswith("\r") and shown.endswith("\n") and shown.count("\n") == 1
    last = shown.rstrip("\n").split("\r")[-1]
    assert last.startswith("round 5/5 [####################]")
    assert last.endswith("personalised acc 50.00% (round 3)")
