"""The package's layers, read from its import statements: imports point down only
(issue 38), the maths knows nothing of Ray, the rounds' order knows nothing of Ray,
and the transport knows nothing of the server's maths, of persistence or of fault
injection (issue 23, item 14)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "perfed_ray"


# Bottom to top: a module may import its own layer's and the layers below, never one
# above. Every module of the package is named here (a package name covers its
# modules), so a new one is placed deliberately.
LAYERS: list[tuple[str, ...]] = [
    # what every layer leans on
    (
        "errors",
        "seeding",
        "markdown",
        "timeline",
        "faults",
        "states",
        "yamlfile",
        "paper",
        "exiting",
        "privacy.accounting",  # pure maths on dp-accounting, below config's validation
    ),
    ("version",),
    ("registry", "settings"),
    ("config",),
    # the simulated population: devices and availability (NumPy and pandas alone)
    ("population",),
    # the maths, which knows nothing of Ray
    ("data",),
    ("algorithms", "optimizers", "dropout", "postprocess"),
    # differential privacy's mechanisms and their steps on users' updates
    ("privacy",),
    ("models",),
    ("engines",),
    ("clock", "strategy", "asynchronous", "learner"),
    # the results folder: its layout, writing and reading
    ("results",),
    # reading results: analysis consumes the results package, reports and displays it
    ("analysis",),
    ("report", "display"),
    # Ray: actors, placement, transport, checkpoints, the run's phases
    ("runtime",),
    # one run's life: its claim, its status, its end
    ("lifecycle",),
    # the ways in: the Python API, sweeps of it, the command line, the package's door
    ("api",),
    ("sweep",),
    ("cli", "__init__"),
]


def module_name(path: Path) -> str:
    """`perfed_ray/runtime/rounds.py` -> `runtime.rounds`; the package's own door,
    `perfed_ray/__init__.py`, -> `__init__`."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def layer(name: str) -> int:
    """The layer of a module of the package, by its name or its package's."""
    for level, names in enumerate(LAYERS):
        if any(name == n or name.startswith(n + ".") for n in names):
            return level
    raise AssertionError(f"perfed_ray.{name} is in no layer: add it to LAYERS in {__file__}")


def own_imports(module: Path) -> set[str]:
    """The package's modules `module` imports, by name: `from perfed_ray import config`
    and `from perfed_ray.config import CORE` give config; `import perfed_ray` and
    `from perfed_ray import simulate` give the package's door, __init__."""

    def resolved(dotted: str) -> str:
        parts = dotted.removeprefix("perfed_ray").lstrip(".").split(".")
        while (
            parts
            and parts[0]
            and not (
                PACKAGE.joinpath(*parts).with_suffix(".py").exists()
                or PACKAGE.joinpath(*parts).is_dir()
            )
        ):
            parts.pop()
        return ".".join(parts) if parts and parts[0] else "__init__"

    found = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {resolved(a.name) for a in node.names if a.name.split(".")[0] == "perfed_ray"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "perfed_ray":
            found |= {resolved(f"{node.module}.{a.name}") for a in node.names}
    return found


def test_imports_point_down_only():
    """Every import of the package's, at the top, inside a function or under
    TYPE_CHECKING, goes to the module's own layer or one below."""
    up = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        for imported in own_imports(path):
            if layer(imported) > layer(name):
                up.append(f"{name} (layer {layer(name)}) imports {imported} ({layer(imported)})")
    assert not up, "imports that climb:\n" + "\n".join(up)


def test_the_layer_check_catches_a_climb(tmp_path):
    """The check above reads a climb where one is: the results package importing the
    run's life is one."""
    written = tmp_path / "climb.py"
    written.write_text("def f():\n    from perfed_ray.lifecycle import RunLife\n")
    assert own_imports(written) == {"lifecycle"}
    assert layer("lifecycle") > layer("results.writer")
    assert layer("runtime.simulation") > layer("results.reader") > layer("config")


def test_no_package_module_is_over_500_lines():
    """Small modules with one job each (issue 38)."""
    long = {
        module_name(p): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert not long, f"modules over 500 lines: {long}"


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
