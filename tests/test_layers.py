"""The package's layers, read from its import statements: imports point down only
(issue 38), the maths knows nothing of Ray, the rounds' order knows nothing of Ray,
and the transport knows nothing of the server's maths, of persistence or of fault
injection (issue 23, item 14)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from perfed_ray import registry

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
    ("registry",),
    ("config",),
    # the simulated population: devices and availability (NumPy and pandas alone)
    ("population",),
    # the maths, which knows nothing of Ray
    ("data",),
    # arithmetic on parameter trees, which the optimisers and the methods share; then
    # the optimisers, which the methods take
    ("algorithms.tree",),
    ("optimizers",),
    ("algorithms", "masks", "postprocess"),
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
    # trackers, fed what the results writer wrote (TensorBoard, MLflow, W&B)
    ("tracking",),
    # Ray: actors, placement, transport, checkpoints, the run's phases
    ("runtime",),
    # one run's life: its claim, its status, its end
    ("lifecycle",),
    # the ways in: the Python API, sweeps of it, the command line, the package's door
    ("api",),
    ("sweep",),
    ("cli", "clidocs", "__init__"),
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


def own_imports(module: Path, name: str | None = None) -> set[str]:
    """The package's modules `module` (named `name` in the package, by default from its
    path) imports, by name: `from perfed_ray import config` and `from perfed_ray.config
    import CORE` give config; `import perfed_ray` and `from perfed_ray import simulate`
    give the package's door, __init__; relative imports (`from . import pool`, `from
    .pool import ActorPool`) are read from the module's own package."""
    name = module_name(module) if name is None else name
    here = [] if name == "__init__" else name.split(".")
    package = here if module.name == "__init__.py" else here[:-1]

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
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1] + ([node.module] if node.module else [])
            found |= {resolved(".".join(["perfed_ray", *base, a.name])) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "perfed_ray":
            found |= {resolved(f"{node.module}.{a.name}") for a in node.names}
    return found


# The configuration's validation asks each component a run names about its settings and
# needs, through the registries (which is why config imports none of them): a room whose
# registry look-ups stand for no import.
VALIDATES = ("config",)


def registry_loads(module: Path) -> set[str]:
    """The package's modules `module` imports through a registry: `ALGORITHMS.load(name)`
    or `REGISTRIES["algorithm"].load(name)` imports any of the registry's built-ins, as
    `from perfed_ray.algorithms.fedavg import FedAvg` would (a look-up by a key only
    known when it runs, `REGISTRIES[key]`, any registry's)."""
    by_name = {n: r for n, r in vars(registry).items() if isinstance(r, registry.Registry)}
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "load":
            continue
        held = node.func.value
        named = held.attr if isinstance(held, ast.Attribute) else getattr(held, "id", None)
        if named in by_name:
            chosen = [by_name[named]]
        elif isinstance(held, ast.Subscript) and getattr(held.value, "id", "") == "REGISTRIES":
            key = held.slice
            chosen = (
                [registry.REGISTRIES[key.value]]
                if isinstance(key, ast.Constant)
                else list(registry.REGISTRIES.values())
            )
        else:
            continue
        for r in chosen:
            found |= {p.partition(":")[0].removeprefix("perfed_ray.") for p in r.builtins.values()}
    return found


def test_imports_point_down_only():
    """Every import of the package's, at the top, inside a function or under
    TYPE_CHECKING, relative or through a registry, goes to the module's own layer or
    one below."""
    up = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        loaded = set() if name.split(".")[0] in VALIDATES else registry_loads(path)
        for imported in own_imports(path) | loaded:
            if layer(imported) > layer(name):
                up.append(f"{name} (layer {layer(name)}) imports {imported} ({layer(imported)})")
    assert not up, "imports that climb:\n" + "\n".join(up)


def test_the_layer_check_catches_a_climb(tmp_path):
    """The check above reads a climb where one is: the results package importing the
    run's life is one."""
    written = tmp_path / "climb.py"
    written.write_text("def f():\n    from perfed_ray.lifecycle import RunLife\n")
    assert own_imports(written, "results.writer") == {"lifecycle"}
    assert layer("lifecycle") > layer("results.writer")
    assert layer("runtime.simulation") > layer("results.reader") > layer("config")


def test_the_layer_check_reads_relative_imports_and_registry_loads(tmp_path):
    """A climb written as a relative import, or as a registry's look-up, is one too."""
    written = tmp_path / "climb.py"
    written.write_text("from . import layout\nfrom ..runtime import pool\nfrom .. import api\n")
    assert own_imports(written, "results.writer") == {"results.layout", "runtime.pool", "api"}
    door = tmp_path / "__init__.py"
    door.write_text("from .load import from_mapping\nfrom . import schema\n")
    assert own_imports(door, "config") == {"config.load", "config.schema"}
    written.write_text("def f(name):\n    return registry.STRATEGIES.load(name)\n")
    assert registry_loads(written) == {"strategy", "asynchronous"} and layer("strategy") > layer(
        "data"
    )
    written.write_text("def f(key, name):\n    return REGISTRIES[key].load(name)\n")
    assert {"strategy", "engines.vmap", "data.datasets"} <= registry_loads(written)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of `graph` (module -> the modules it imports): each strongly
    connected set of more than one module, by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while not members or members[-1] != node:
                members.append(stack.pop())
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other_in_a_circle():
    """Inside a room (config, runtime) as across rooms: a circle of imports, even one
    under TYPE_CHECKING or inside a function, is two modules that are one job."""
    graph = {module_name(p): own_imports(p) - {module_name(p)} for p in PACKAGE.rglob("*.py")}
    assert not cycles(graph), f"imports in a circle: {cycles(graph)}"


def room(name: str) -> str:
    """The entry of LAYERS a module belongs to (`algorithms.tree`, `algorithms`, `cli`)."""
    return max(
        (n for names in LAYERS for n in names if name == n or name.startswith(n + ".")), key=len
    )


def test_no_rooms_of_one_layer_import_each_other_in_a_circle():
    """Rooms side by side in a layer may use each other one way only (the methods took
    the client optimisers, which took the methods' tree arithmetic: issue 44)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        loaded = set() if name.split(".")[0] in VALIDATES else registry_loads(path)
        graph.setdefault(room(name), set()).update(
            room(m) for m in own_imports(path) | loaded if room(m) != room(name)
        )
    assert not cycles(graph), f"rooms in a circle: {cycles(graph)}"


def test_the_circle_check_finds_a_circle_and_only_circles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


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


def test_the_repository_root_holds_no_scratch_configuration():
    """Run configurations live beside the experiment that uses them; a YAML file at the
    root is a scratch one left behind (issue 44, item 10)."""
    root = PACKAGE.parent
    assert sorted(p.name for p in root.glob("*.y*ml")) == ["mkdocs.yml"]


def test_the_module_map_names_every_module_and_package():
    """The development guide's map is where a newcomer finds a module's job: each of the
    package's own modules and sub-packages is on it, by the name it has now."""
    guide = (PACKAGE.parent / "docs" / "guide" / "development.md").read_text(encoding="utf-8")
    drawn = guide.split("perfed_ray/\n", 1)[1].split("```", 1)[0]
    named = set(re.findall(r"[\w.]+\.py|\w+/", drawn))
    top = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    top |= {p.name + "/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert not top - named, f"not on the map: {sorted(top - named)}"


def test_no_two_modules_of_a_package_are_named_one_letter_apart():
    """Names one letter apart (actor.py and actors.py) read as one module and are two jobs."""
    close = []
    for folder in {p.parent for p in PACKAGE.rglob("*.py")}:
        names = sorted(p.stem for p in folder.glob("*.py"))
        for i, a in enumerate(names):
            close += [(a, b) for b in names[i + 1 :] if _one_edit(a, b)]
    assert not close, f"modules named one letter apart: {close}"


def _one_edit(a: str, b: str) -> bool:
    """Whether `b` is `a` with one letter added, removed or changed."""
    if len(a) > len(b):
        a, b = b, a
    if len(b) - len(a) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    return any(a == b[:i] + b[i + 1 :] for i in range(len(b)))


def test_every_field_an_actor_sends_the_driver_is_read_there():
    """What an actor's answer carries and the coordinator never reads is dead weight in
    every round's transport (issue 44 found a count and per-user models no one read)."""
    from dataclasses import fields

    from perfed_ray.runtime.messages import UpdateSum

    tree = ast.parse((PACKAGE / "runtime" / "coordinator.py").read_text(encoding="utf-8"))
    read = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not {f.name for f in fields(UpdateSum)} - read
