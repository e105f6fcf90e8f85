"""The package's layers, read from its import statements: the maths knows nothing of
Ray, the rounds' order knows nothing of Ray, and the transport knows nothing of the
server's maths, of persistence or of fault injection (issue 23, item 14)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "perfed_ray"


def imports(module: Path) -> set[str]:
    """Every module `module` imports, as dotted names (`from a import b` gives a and a.b)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def modules(*parts: str) -> list[Path]:
    path = PACKAGE.joinpath(*parts)
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


@pytest.mark.parametrize(
    "module",
    [
        *modules("algorithms"),
        *modules("engines"),
        *modules("optimizers"),
        *modules("learner.py"),
        *modules("strategy.py"),
        *modules("postprocess.py"),
        *modules("runtime", "rounds.py"),
    ],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_the_maths_and_the_rounds_order_do_not_import_ray(module: Path) -> None:
    ray = {name for name in imports(module) if name == "ray" or name.startswith("ray.")}
    assert not ray, f"{module.name} imports {sorted(ray)}"


def test_the_coordinator_is_transport_only() -> None:
    used = imports(PACKAGE / "runtime" / "coordinator.py")
    for concern in (
        "perfed_ray.faults",  # fault injection: the pool and the files
        "perfed_ray.results",  # rows: Rounds and the writer
        "perfed_ray.runtime.checkpoint",  # checkpoints: Rounds and the store
        "perfed_ray.strategy",  # who takes part and the server's maths: Rounds asks it
    ):
        assert not {n for n in used if n.startswith(concern)}, f"the coordinator uses {concern}"
    assert "ray" in used  # ... and is where the rounds touch Ray


def test_the_rounds_loop_injects_no_faults() -> None:
    assert not {n for n in imports(PACKAGE / "runtime" / "rounds.py") if "faults" in n}


def test_the_rounds_and_the_maths_load_no_ray_even_indirectly():
    """Not only their own imports: nothing they import loads Ray (the coordinator is
    handed to the rounds, never imported by them)."""
    code = (
        "import sys, perfed_ray.runtime.rounds, perfed_ray.learner, perfed_ray.strategy, "
        "perfed_ray.engines; print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
