"""The documents a newcomer reads first: everything they point to is in the repository,
and the install lines fit a machine without a GPU."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_the_protocol_is_in_the_repository_and_nothing_points_outside_it():
    protocol = REPO / "docs" / "PROTOCOL.md"
    assert "[docs/PROTOCOL.md](docs/PROTOCOL.md)" in README
    text = protocol.read_text()
    for fact in ("a_test = floor(a * N_test / N_train)", "adapt_on: test", "beta = 0.001"):
        assert fact in text
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links and all((REPO / link).exists() for link in links if "://" not in link)
    for path in [REPO / "README.md", *REPO.glob("tests/*.py"), *REPO.glob("perfed_ray/**/*.py")]:
        if path.name != "test_docs.py":
            assert "../shared" not in path.read_text(), path


def test_the_readme_gives_the_cpu_only_torch_install_beside_the_default():
    quick = README.split("## Quick start")[1].split("## Python API")[0]
    assert 'pip install -e ".[test]"' in quick
    assert "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu" in quick
    assert "## Getting the data" in README or "### Getting the data" in README
