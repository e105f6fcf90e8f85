"""Every figure on a page comes from one place: a measured figure (seconds, ratios,
rates, sizes, accuracies) on a user-facing page stands inside a block that names its
source, `<!-- figures from PATH -->...<!-- /figures -->`, and the source has it (the
benchmarks page, a results page, a results table's summary); outside such blocks, a
page holds no figure but the few listed here as settings. The tutorial's figures are
checked by running the tutorial (tests/test_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    REPO / "README.md",
    REPO / "CONTRIBUTING.md",
    REPO / "cluster" / "README.md",
    *sorted((REPO / "docs").rglob("*.md")),
]
# a number with a unit of time, speed, size or share: what a measurement reads like
FIGURE = re.compile(
    r"(?<![\w.])\d[\d,.]*(?:-\d[\d,.]*)?\s?"
    r"(?:ms|s|min|minutes|seconds|hours?|x|%|user-steps/s|GFLOP/s|GB|MB|kB|KB)(?![\w/])"
)
QUOTED = re.compile(r"<!-- figures from (\S+) -->(.*?)<!-- /figures -->", re.S)
# blocks checked elsewhere: generated from the code, or the tutorial's own run
CHECKED = re.compile(r"<!-- (keys|cli|columns|tutorial-figures):begin -->.*?<!-- \1:end -->", re.S)
NOT_MEASURED = {"95%", "0-100%"}  # the intervals' level, the accuracy scale
SETTINGS = {  # figures that are settings or definitions, not measurements
    ("docs/guide/data.md", "80%"),  # FedProx's generator keeps 80% of samples to train
    ("docs/guide/experiments.md", "20%"),  # the comparison's unseen users
    ("docs/guide/sweeps.md", "20%"),  # validation: 0.2, what the setting holds out
    ("README.md", "15 minutes"),  # the tutorial's length: a reader's estimate
    ("docs/index.md", "15 minutes"),
    ("docs/tutorial.md", "15 minutes"),
    ("cluster/README.md", "100 GB"),  # the AWS configuration's disks
    # the devices' default, the summary's accuracy targets, 1,024 against 1,000 bytes
    ("docs/guide/simulated-time.md", "5 ms"),
    ("docs/guide/simulated-time.md", "80%"),
    ("docs/guide/simulated-time.md", "90%"),
    ("docs/guide/simulated-time.md", "2.4%"),
    # Ray's health checks and the pool's placement bound: settings, not measurements
    ("docs/guide/troubleshooting.md", "3 s"),
    ("docs/guide/troubleshooting.md", "120 s"),
    ("docs/guide/troubleshooting.md", "60 s"),
    ("docs/guide/troubleshooting.md", "60 seconds"),
}


def _prose(text: str) -> str:
    """A page without its code blocks and its checked blocks."""
    return CHECKED.sub("", re.sub(r"```.*?```", "", text, flags=re.S))


def figures(text: str) -> list[str]:
    return [m.group(0) for m in FIGURE.finditer(text)]


def in_source(figure: str, origin: str) -> bool:
    """The figure as the source writes it, or its number there with the unit in a
    column's header (a table of user-steps/s holds bare numbers)."""
    number = re.match(r"[\d,.]+(?:-[\d,.]+)?", figure).group(0)
    return figure in origin or re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d.,])", origin)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_figure_on_a_page_is_quoted_from_its_source(path):
    name = path.relative_to(REPO).as_posix()
    text = _prose(path.read_text())
    for source, quoted in QUOTED.findall(text):
        origin = (REPO / source).read_text()
        for figure in figures(quoted):
            assert in_source(figure, origin), f"{name}: {figure!r} is not in {source}"
    loose = [
        f
        for f in figures(QUOTED.sub("", text))
        if f not in NOT_MEASURED and (name, f) not in SETTINGS
    ]
    assert not loose, f"{name}: figures without a source: {loose}"


def test_a_figure_not_in_its_source_and_one_without_a_source_are_caught():
    wrong = "<!-- figures from experiments/bench/BENCHMARKS.md -->took 61.5 s<!-- /figures -->"
    ((source, quoted),) = QUOTED.findall(wrong)
    assert figures(quoted) == ["61.5 s"]
    assert not in_source("61.5 s", (REPO / source).read_text())
    assert in_source("108,237 user-steps/s", (REPO / source).read_text())  # a table's cell
    assert figures(_prose("a round took 2.70x as long, and 30 rounds ran")) == ["2.70x"]
    assert figures(_prose("```\n45 s\n```\n8x8 images, 1000 rounds")) == []


def test_the_readme_quotes_the_first_runs_time_and_the_speed_table_from_benchmarks():
    readme = (REPO / "README.md").read_text()
    speed = readme.split("## Speed")[1].split("\n## ")[0]
    ((source, quoted),) = QUOTED.findall(speed)
    assert source == "experiments/bench/BENCHMARKS.md"
    assert "| quick start (1000 rounds of HF), command to summary < 120 s |" in quoted
    first = readme.split("## A first run")[1].split("\n## ")[0]
    loose = [
        f for f in figures(first) if f not in NOT_MEASURED and ("README.md", f) not in SETTINGS
    ]
    assert not loose, "the first run's time is the speed table's"
