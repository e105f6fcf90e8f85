"""What a newcomer meets first: the command's version and help, and the Python API
showing a run as the command line does (progress while it runs, a readable summary)."""

from __future__ import annotations

import pytest
from conftest import TINY

import perfed_ray
from perfed_ray.cli import main


def test_version_and_the_whole_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"perfed-ray {perfed_ray.__version__}\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    assert "list\nconfiguration keys." in shown  # the first sentence whole, not cut
    assert "Exit status: 0 success; 2 bad input" in shown and "--version" in shown


@pytest.mark.slow  # about 5-7 s: a whole run in a process of its own
def test_simulate_shows_progress_unless_told_not_to_and_prints_a_readable_summary(
    ray_session, tmp_path, capsys
):
    result = perfed_ray.simulate(TINY, tmp_path / "shown")
    progress = capsys.readouterr().err
    assert f"round {TINY['rounds']}/{TINY['rounds']} [" in progress and "rounds/s" in progress
    perfed_ray.simulate(TINY, tmp_path / "quiet", progress=False)
    assert "rounds/s" not in capsys.readouterr().err
    summary = result.summary()
    text = str(summary)
    header, row = text.splitlines()
    assert header.split()[:4] == ["run_id", "dataset", "partition", "algorithm"]
    assert row.startswith(result.run_id) and "finished" in row and "..." not in text
    assert repr(summary) == text and summary["status"].tolist() == ["finished"]
