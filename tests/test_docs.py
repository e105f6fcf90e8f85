"""The documents a newcomer reads: a short README that points into the docs site, every
link of both landing on a file (and heading) that exists, the install lines that fit a
machine without a GPU, the generated configuration reference equal to the settings, the
speed figures quoted as measured, and the guide's own code examples running as printed."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import logging
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import TINY, each_users_model, session_address

import perfed_ray
from perfed_ray import cli
from perfed_ray.config import ConfigError, from_mapping, legacy_keys, reference_text
from perfed_ray.registry import ALGORITHMS, REGISTRIES
from perfed_ray.results.schema import EXIT_CODES, MEANINGS, SCHEMAS
from perfed_ray.runtime.checkpoint import RunStore

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = (REPO / "README.md").read_text()
PAGES = sorted(DOCS.rglob("*.md"))
RESULTS = sorted((REPO / "experiments" / "results").glob("*/README.md"))
ROOT = [REPO / name for name in ("CONTRIBUTING.md", "CHANGELOG.md")]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CPU_TORCH = "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu"


def page(path: str) -> str:
    return (DOCS / path).read_text()


def block(text: str, name: str) -> str:
    """The text between `<!-- name:begin -->` and `<!-- name:end -->`."""
    return re.search(rf"<!-- {name}:begin -->\n(.*?)\n<!-- {name}:end -->", text, re.S).group(1)


def code(text: str, name: str) -> str:
    """The Python code block between the markers."""
    return re.search(r"```python\n(.*?)```", block(text, name), re.S).group(1)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and MkDocs' toc both make it for plain headings."""
    kept = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # no comments in code
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_is_short_and_links_the_protocol_and_the_site():
    assert len(README.splitlines()) <= 200
    assert "[docs/PROTOCOL.md](docs/PROTOCOL.md)" in README
    linked = set(LINK.findall(README))
    for guide in ("running", "sweeps", "methods", "scale", "results", "troubleshooting"):
        assert f"docs/guide/{guide}.md" in linked
    assert {"docs/reference/configuration.md", "docs/reference/api.md"} <= linked
    text = (DOCS / "PROTOCOL.md").read_text()
    for fact in ("a_test = floor(a * N_test / N_train)", "adapt_on: test", "beta = 0.001"):
        assert fact in text


def test_every_relative_link_lands_on_a_file_and_heading_that_exist():
    checked = 0
    for path in [REPO / "README.md", REPO / "cluster" / "README.md", *RESULTS, *PAGES]:
        for link in LINK.findall(path.read_text()):
            if "://" in link or link.startswith("mailto:"):
                continue
            target, _, anchor = link.partition("#")
            where = (path.parent / target).resolve() if target else path
            assert where.exists(), f"{path.relative_to(REPO)}: {link}"
            if anchor and where.suffix == ".md":
                assert anchor in anchors(where), f"{path.relative_to(REPO)}: {link}"
            checked += 1
    assert checked > 50


def test_every_page_is_in_the_sites_navigation():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text().replace("!!", ""))["nav"]

    def leaves(entries):
        for entry in entries:
            for value in entry.values():
                yield from leaves(value) if isinstance(value, list) else [value]

    listed = set(leaves(nav))
    assert listed == {p.relative_to(DOCS).as_posix() for p in PAGES}
    assert "PROTOCOL.md" in listed


def test_a_component_of_the_wrong_kind_is_pointed_at_the_page_on_writing_one():
    guides = {r.key: r.guide for r in REGISTRIES.values() if r.guide}
    assert {"algorithm", "model", "strategy", "server_optimizer"} <= set(guides)
    for guide in guides.values():
        assert (REPO / guide).is_file(), guide
    with pytest.raises(ConfigError, match=r"Strategy: see docs/guide/adding-a-strategy\.md$"):
        from_mapping({"strategy": "perfed_ray.models:MLP"})


def test_nothing_points_at_the_project_machines_data():
    code = [*REPO.glob("tests/*.py"), *REPO.glob("perfed_ray/**/*.py")]
    for path in [REPO / "README.md", *PAGES, *code]:
        if path.name != "test_docs.py":
            assert "../shared" not in path.read_text(), path


@pytest.mark.parametrize("text", [README, page("index.md")], ids=["README", "docs/index.md"])
def test_the_install_gives_the_cpu_only_torch_line_before_the_package(text):
    install = text.split("## Install")[1].split("\n## ")[0]
    default = 'pip install -e ".[test]"'
    assert f"{CPU_TORCH}\n{default}" in install
    assert f"```bash\n{default}\n```" in install  # and alone, for a machine with a GPU
    assert "perfed-ray run experiments/configs/table1/mnist-tau10-alpha0.01.yaml" in text
    assert (REPO / "experiments/configs/table1/mnist-tau10-alpha0.01.yaml").is_file()
    assert "## Getting the data" in page("guide/data.md")


def test_the_configuration_reference_is_the_settings_table():
    table = block(page("reference/configuration.md"), "keys")
    assert table == reference_text(markdown=True), "regenerate: perfed-ray keys --markdown"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


@pytest.mark.parametrize(
    ("name", "path"),
    [("cli", "reference/cli.md"), ("columns", "reference/results.md")],
)
def test_the_generated_references_are_the_codes_own(name, path):
    assert block(page(path), name) == _hooks().GENERATED[name](), "regenerate: python docs/hooks.py"


def test_the_site_build_regenerates_a_stale_generated_block_and_says_so(caplog):
    hooks = _hooks()
    stale = "intro\n<!-- keys:begin -->\n| key |\n<!-- keys:end -->\nafter\n"
    with caplog.at_level(logging.WARNING):
        built = hooks.generated_blocks(stale, "x.md")
    table = reference_text(markdown=True)
    assert built == f"intro\n<!-- keys:begin -->\n{table}\n<!-- keys:end -->\nafter\n"
    assert "stale" in caplog.text and "python docs/hooks.py" in caplog.text
    caplog.clear()
    assert hooks.generated_blocks(built, "x.md") == built and not caplog.text
    own = "<!-- epsilon:begin -->\nmine\n<!-- epsilon:end -->"  # a page's own block stays
    assert hooks.generated_blocks(own, "x.md") == own


def test_the_cli_reference_has_every_command_flag_and_exit_status():
    text = page("reference/cli.md")
    top = cli.parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        assert f"### `perfed-ray {name}`" in text
        section = text.split(f"### `perfed-ray {name}`")[1].split("\n### ")[0]
        for action in command._actions:
            for flag in action.option_strings:
                assert flag in section or flag in ("-h", "--help"), (name, flag)
        assert "Exit status: 0" in section, name
    run = text.split("### `perfed-ray run`")[1].split("\n### ")[0]
    for code in {*EXIT_CODES.values(), 2}:
        assert f" {code} " in run.split("Exit status:")[1], code
    assert "--version" in text


def test_every_results_column_says_what_it_holds():
    for table, schema in SCHEMAS.items():
        meanings = MEANINGS[table]
        for column in schema.names:
            assert meanings.get(column, "").strip(), f"{table}.{column}: no meaning in schema.py"
    columns = page("reference/results.md")
    assert "`epsilon`" in columns and "`train_seconds`" in columns and "`server_seconds`" in columns


def test_an_included_readme_is_in_the_site_with_its_links_from_the_page():
    here = DOCS / "guide"
    text = _hooks().included("<!-- include ../../cluster/README.md -->\n", here)
    assert text.startswith("# Running perfed-ray on a Ray cluster")
    assert "](../../cluster/local.sh)" in text  # was (local.sh), beside the README
    assert "](sweeps.md)" in text  # was (../docs/guide/sweeps.md)
    assert "](#security)" in text  # a heading of the same page stays


def test_the_site_has_the_four_kinds_of_page():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text().replace("!!", ""))["nav"]
    kinds = [next(iter(entry)) for entry in nav]
    assert kinds == ["Home", "Tutorial", "How-to guides", "Reference", "Explanation"]
    listed = str(nav)
    for path in (
        "guide/cluster.md",
        "reference/cli.md",
        "reference/results.md",
        "reference/glossary.md",
        "explanation/concepts.md",
    ):
        assert path in listed, path


def test_every_page_naming_the_methods_that_keep_user_state_names_them_all():
    """pFedMe, Ditto, FedRep, Local and APFL keep a state per user (their classes make
    one); a paragraph about per-user state that names some of them names them all."""
    base = ALGORITHMS.load("fedavg").__mro__[-2]  # Algorithm
    stateful = set()
    for name in ALGORITHMS.names():
        cls = ALGORITHMS.load(name)
        if cls.init_user_state is not base.init_user_state:
            stateful.add({"PFedMe": "pFedMe"}.get(cls.__name__, cls.__name__))
    assert stateful == {"pFedMe", "Ditto", "FedRep", "Local", "APFL"}
    checked = 0
    for path in [REPO / "README.md", *PAGES]:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for paragraph in re.split(r"\n\s*\n|\n(?=\s*[-*|] )", text):  # paragraphs, items
            named = {m for m in stateful if re.search(rf"\b{m}\b", paragraph)}
            about = re.search(r"per-user state|state per user|keeps? (?:a )?state", paragraph)
            if about and len(named) >= 3:
                assert named == stateful, (path.name, sorted(stateful - named), paragraph)
                checked += 1
    assert checked >= 3


SHAPE = (
    "What ran",
    "Hardware",
    "Time",
    "Command",
    "Expected result",
    "Where it differs from the paper",
    "Environment",
)


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.parent.name)
def test_every_results_page_has_the_one_shape(path):
    """What ran, on what, how long, the command, what to expect, where it differs from
    the paper, and how to make the same environment: first, in that order."""
    card = path.read_text().split("## At a glance\n\n")[1].split("\n\n")[0]
    rows = re.findall(r"^\| \*\*(.+?)\*\* \| (.+) \|$", card, re.M)
    assert tuple(k for k, _ in rows) == SHAPE
    assert all(v.strip() for _, v in rows)
    assert "pip install" in dict(rows)["Environment"]


def test_the_projects_basics_are_there_and_agree():
    license = (REPO / "LICENSE").read_text()
    assert "Apache License" in license and "Version 2.0, January 2004" in license
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '\nlicense = "Apache-2.0"\nlicense-files = ["LICENSE"]\n' in pyproject
    version = re.search(r'^version = "(.+)"$', pyproject, re.M).group(1)
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["version"] == version
    assert {"message", "title", "authors"} <= set(cff) and cff["license"] == "Apache-2.0"
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"## [{version}]" in changelog and "## [0.1.0]" in changelog
    policy = changelog.split("## Versioning")[1].split("## [Unreleased]")[0]
    assert "perfed_ray/config/legacy.py" in policy
    aliases = set(re.findall(r"`(\w+_\w+)`", policy))  # the old keys it says still read
    assert len(aliases) >= 3 and aliases <= set(legacy_keys()), aliases - set(legacy_keys())
    assert legacy_keys()["ditto_lambda"] == "ditto.lambda" and "`ditto.lambda`" in policy
    contributing = (REPO / "CONTRIBUTING.md").read_text()
    for fact in (
        '-m "not slow"',
        "ruff format --check",
        "mkdocs build --strict",
        "python experiments/bench/report.py",
        "python docs/hooks.py",
    ):
        assert fact in contributing, fact
    assert yaml.safe_load((REPO / "mkdocs.yml").read_text().replace("!!", ""))["repo_url"]


def test_user_facing_pages_name_no_machine_paths_issues_or_neighbours():
    pages = [
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        REPO / "cluster/README.md",
        *PAGES,
        REPO / "experiments/bench/BENCHMARKS.md",
    ]
    for path in pages:
        text = path.read_text()
        for stale in ("/work/", "shared/tools", "(issue", "issue 3", "other sessions"):
            assert stale not in text, (path.relative_to(REPO), stale)
        assert not re.search(r"\blent\b", text), path.relative_to(REPO)  # "no GPU lent"


def test_the_readmes_speed_figures_are_the_benchmarks_own():
    bench = (REPO / "experiments/bench/BENCHMARKS.md").read_text().splitlines()
    speed = README.split("## Speed")[1].split("\n## ")[0]
    rows = [line for line in speed.splitlines() if line.startswith("| ") and "---" not in line]
    quoted = [row for row in rows if row != "| target | measured | met |"]
    assert quoted and all(row in bench for row in quoted)
    assert sum("Flower" in row for row in quoted) == 2
    assert sum("pfl-research" in row for row in quoted) == 4
    assert "[experiments/bench/BENCHMARKS.md](experiments/bench/BENCHMARKS.md)" in speed


@pytest.mark.slow  # about 10 s: a whole run on the shared Ray
def test_the_guides_model_and_strategy_run_as_printed(ray_session, tmp_path, monkeypatch):
    (tmp_path / "wide_mlp.py").write_text(code(page("guide/adding-a-model.md"), "model"))
    (tmp_path / "dp_mean.py").write_text(code(page("guide/adding-a-strategy.md"), "strategy"))
    monkeypatch.syspath_prepend(str(tmp_path))
    result = perfed_ray.simulate(
        {**TINY, "model": "wide_mlp:WideMLP", "strategy": "dp_mean:DPMean"},
        tmp_path / "out",
        progress=False,
    )
    runs = result.table("runs")
    assert runs["status"].tolist() == ["finished"]
    assert runs["engine"].tolist() == ["fused"]  # its fused_layers() was taken
    assert runs["strategy"].tolist() == ["dp_mean:DPMean"]
    saved = RunStore(tmp_path / "out", result.run_id).load()  # its own state, checkpointed
    assert saved.server.extra["rounds"].tolist() == [float(TINY["rounds"])]


@pytest.mark.slow  # real actors and a whole private run on the shared Ray
def test_the_guides_strategy_keeps_central_privacy_on(ray_session, tmp_path, monkeypatch):
    """The guide's DPMean under privacy: central adds its steps to the mechanism's: on
    a real actor every user's contribution to the sum is within privacy.clip, set below
    every user's update (the example's own clip, 1.0, would leave them whole), and in a
    run the adaptive bound moves and is checkpointed beside the strategy's own state."""
    import numpy as np

    from perfed_ray.models import initial_model, params_of
    from perfed_ray.privacy.mechanisms import CLIP
    from perfed_ray.runtime import simulation
    from perfed_ray.runtime.placement import Placement

    (tmp_path / "dp_mean.py").write_text(code(page("guide/adding-a-strategy.md"), "strategy"))
    monkeypatch.syspath_prepend(str(tmp_path))
    values = {
        **TINY,
        "strategy": "dp_mean:DPMean",
        "privacy": "central",
        "privacy.noise_multiplier": 0.5,
        "privacy.adaptive_clip": True,
        "privacy.count_noise": 1.0,
        "checkpoint_every": TINY["rounds"],
    }
    cfg = from_mapping(values)
    prepared = simulation.prepare(cfg)
    template = params_of(initial_model(cfg, prepared.source([])))
    actor = simulation.actor_factory(prepared, Placement([range(4)], 1.0, 0.0))(0, 0)
    w0 = REGISTRIES["strategy"].load(cfg.strategy)(cfg).init(template).weights
    users = [0, 1, 2, 3]
    plain = each_users_model(ray_session, actor, w0, users, 1)
    w = w0.astype(np.float64)
    norms = [np.linalg.norm(plain[u] - w) for u in users]
    clip = min(norms) / 2  # the bound clips every user's update, far below DPMean's 1.0
    values["privacy.clip"] = clip
    cfg = from_mapping(values)
    strategy = REGISTRIES["strategy"].load(cfg.strategy)(cfg)
    chain = strategy.postprocess_users(1, strategy.init(template))
    got = each_users_model(ray_session, actor, w0, users, 1, postprocess=chain)
    ray_session.kill(actor)
    for u in users:
        assert np.linalg.norm(got[u] - w) <= clip * (1 + 1e-6)
    result = perfed_ray.simulate(values, tmp_path / "out", progress=False)
    saved = RunStore(tmp_path / "out", result.run_id).load()
    assert saved.server.extra["rounds"].tolist() == [float(TINY["rounds"])]
    assert saved.server.privacy[CLIP][0] != clip  # adaptive clipping moved it


@pytest.mark.slow  # a private run on the shared Ray
def test_the_privacy_pages_epsilon_example_reads_what_the_accountant_spent(
    ray_session, tmp_path, monkeypatch, capsys
):
    from perfed_ray.privacy import accounting

    values = {**TINY, "sampling": "poisson", "privacy": "central", "privacy.epsilon": 8.0}
    perfed_ray.simulate(values, tmp_path / "results", progress=False)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(code(page("guide/privacy.md"), "epsilon"), scope)
    z = scope["runs"]["privacy.noise_multiplier"].iloc[0]
    plan = accounting.Plan("central", "poisson", 4, 2.0, 1e-5, "rdp")  # q = 0.5 of 4 users
    assert z == accounting.noise_multiplier(plan, 8.0, TINY["rounds"])
    spent = accounting.epsilon(plan, z, TINY["rounds"])
    assert scope["spent"].tolist() == [pytest.approx(spent, rel=1e-12)] and spent <= 8.0
    printed = capsys.readouterr().out
    assert "privacy.noise_multiplier" in printed and "epsilon" in printed


def _run_as_printed(text: str, scope: dict) -> list[str]:
    """Run a page's code blocks in order, as a reader would: each `perfed-ray ...`
    command of a bash block through the command's own entry (`cli.main`, in this
    process, on the test session's Ray), each Python block in one namespace. Returns
    the commands run."""
    ran = []
    for language, body in re.findall(r"```(bash|python)\n(.*?)```", text, re.S):
        if language == "python":
            exec(body, scope)
            continue
        for line in body.replace("\\\n", " ").splitlines():
            if line.startswith("pip install") or line.startswith("python -c"):
                continue  # the install, done; a check of the machine's torch
            words = shlex.split(line, comments=True)
            assert words[0] == "perfed-ray", line
            assert cli.main(words[1:]) == 0, line
            ran.append(line)
    return ran


@pytest.fixture
def reader(tmp_path, monkeypatch):
    """A reader's folder: the repository's experiments/ beside it (the pages' paths),
    matplotlib without a display."""
    (tmp_path / "experiments").symlink_to(REPO / "experiments")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return tmp_path


@pytest.mark.slow  # two 30-round MNIST runs and the reading of their tables
def test_the_tutorial_runs_as_printed_and_says_what_it_finds(ray_session, reader):
    text = page("tutorial.md")
    scope: dict = {}
    ran = _run_as_printed(text, scope)
    assert len(ran) == 3 and all("tutorial/mnist.yaml" in r or "summary" in r for r in ran)
    assert (reader / "accuracy.png").stat().st_size > 10_000
    final = scope["final"]
    before = final.groupby("algorithm", observed=True)["acc_before"].mean()
    after = scope["headline"].groupby(level="algorithm").mean()
    measured = [before["perfedavg-hf"], before["fedavg"], after["perfedavg-hf"], after["fedavg"]]
    quoted = [int(f) for f in re.findall(r"(\d+)%", block(text, "tutorial-figures"))]
    assert len(quoted) == 4
    for figure, value in zip(quoted, measured, strict=True):
        assert abs(figure - 100 * value) <= 1.5, (quoted, measured)


@pytest.mark.slow  # a 10-round run of the page's own data set and partition
def test_the_own_data_page_runs_as_printed(ray_session, reader):
    text = page("guide/own-data.md")
    (reader / "my_data.py").write_text(code(text, "own-data"))
    ran = _run_as_printed(text.replace(block(text, "own-data"), ""), {})
    assert len(ran) == 1
    runs = pd.read_parquet(reader / "results" / "runs")
    assert runs[["dataset", "partition", "status"]].values.tolist() == [
        ["my_data:MY_DIGITS", "my_data:two_classes", "finished"]
    ]
    evals = pd.read_parquet(reader / "results" / "evals")
    assert evals["n_train"].eq(100).all() and evals["n_test"].eq(20).all()


@pytest.mark.slow  # a run's start on the shared Ray (a whole run where there is a GPU)
def test_the_gpu_pages_commands_run_as_printed(ray_session, reader, capsys):
    """Where there is no GPU (CI), the run asking for a GPU share stops with status 2 and
    the line the page quotes; on a GPU machine it runs."""
    text = page("guide/gpu.md")
    commands = re.findall(r"```bash\n(.*?)```", text, re.S)
    check, run = commands
    shown = subprocess.run(shlex.split(check), capture_output=True, text=True, check=True)
    assert shown.stdout.split() == [str(torch.cuda.is_available()), str(torch.cuda.device_count())]
    words = shlex.split(run)
    assert words[0] == "perfed-ray"
    if torch.cuda.is_available():
        assert cli.main(words[1:]) == 0
        return
    assert cli.main(words[1:]) == 2
    said = capsys.readouterr().err
    quoted = re.search(r"`(each actor asks for .*?) \.\.\.`", text, re.S).group(1)
    assert " ".join(quoted.split()) in said


def test_the_results_and_gpu_pages_read_a_results_folder_as_printed(tiny_results, reader, capsys):
    (reader / "results").symlink_to(tiny_results)
    for path, name in (("guide/results.md", "pandas"), ("guide/gpu.md", "gpu-actors")):
        exec(code(page(path), name), {})
    shown = capsys.readouterr().out
    assert "acc_after" in shown and "cpu" in shown and "wall_seconds" in shown


# The site's how-to pages, as its navigation lists them.
HOW_TOS = re.findall(
    r"^      - [^:\n]+: (guide/\S+\.md)$",
    (REPO / "mkdocs.yml").read_text().split("  - How-to guides:")[1].split("\n  - ")[0],
    re.M,
)


def _commands(text: str) -> list[list[str]]:
    """A page's `perfed-ray` commands, as words, from its shell blocks."""
    found = []
    for body in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in body.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "perfed-ray":
                found.append(words)
    return found


def _save_plugins(text: str, commands: list[list[str]], folder: Path) -> None:
    """Each `module:Name` a command names, saved as module.py from the page's Python
    block that defines Name, as the page tells its reader to."""
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    for words in commands:
        for module, name in re.findall(r"=\[?(\w+):(\w+)", " ".join(words)):
            defines = re.compile(rf"^((class|def) {name}\b|{name} = )", re.M)
            (folder / f"{module}.py").write_text(next(b for b in blocks if defines.search(b)))


def test_every_how_to_command_and_configuration_checks_as_printed(reader, capsys):
    """Every `perfed-ray` command of a how-to page parses with the command's own parser;
    each new run and sweep among them is checked as printed (`--dry-run`: its
    configuration, its data and its results folder), the page's own plug-ins saved as
    the page says; every YAML block loads, a sweep file beside the repository's
    configurations and a configuration's lines as a run's; the core-key examples read
    their key. (Runs of the pages' examples: the tutorial's, own-data's, the GPU page's
    and the plug-ins' tests.)"""
    from perfed_ray.sweep import spec

    assert {"guide/running.md", "guide/sweeps.md", "guide/tracking.md"} <= set(HOW_TOS)
    checked, parsed = [], 0
    for path in HOW_TOS:
        text = page(path)
        commands = _commands(text)
        _save_plugins(text, commands, reader)
        for words in commands:
            args = cli.parser().parse_args(words[1:])  # argparse exits 2 on a stale flag
            parsed += 1
            ran = path == "guide/own-data.md"  # its data made and its run run: above
            if args.command in ("run", "sweep") and not args.resume and not ran:
                assert cli.main([*words[1:], "--dry-run"]) == 0, (path, words)
                checked.append(args.command)
        for body in re.findall(r"```yaml\n(.*?)```", text, re.S):
            values = yaml.safe_load(body)
            if "grid" in values:
                sweeps = reader / "sweeps"
                sweeps.mkdir(exist_ok=True)
                (reader / "configs").symlink_to(REPO / "experiments" / "configs")
                (sweeps / "page.yaml").write_text(body)
                assert spec.load(str(sweeps / "page.yaml"), [], []).trials
            else:
                from_mapping(values)
    assert checked.count("run") >= 9 and checked.count("sweep") == 1 and parsed > 12
    cfg = from_mapping({"batch_size": 25})
    for path, name in (
        ("guide/adding-a-method.md", "Mine"),
        ("guide/adding-a-strategy.md", "ByBatch"),
    ):
        scope: dict = {}
        exec(
            next(
                b
                for b in re.findall(r"```python\n(.*?)```", page(path), re.S)
                if f"class {name}(" in b
            ),
            scope,
        )
        assert scope[name](cfg).hparams.batch_size == 25
    assert "dry run:" in capsys.readouterr().out


@pytest.mark.slow  # 20 rounds of MNIST on the shared Ray
def test_the_running_pages_python_runs_as_printed(ray_session, reader, capsys):
    text = page("guide/running.md")
    [example] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "simulate(" in b]
    scope: dict = {}
    exec(example, scope)
    assert scope["result"].summary()["status"].tolist() == ["finished"]
    assert scope["evals"]["round"].max() == 20 and "acc_after" in capsys.readouterr().out


@pytest.mark.slow  # two 4-round runs, each its own perfed-ray process on the session's Ray
def test_the_privacy_pages_worked_run_is_its_scripts_and_the_script_runs(
    ray_session, tmp_path, monkeypatch
):
    """The privacy guide's worked command is experiments/privacy/worked.py's, whose
    summary the page quotes (tests/test_docs_figures.py); its smoke runs both sides."""
    script = REPO / "experiments" / "privacy" / "worked.py"
    monkeypatch.setattr(sys, "path", [*sys.path])  # the bench folder it adds, gone after
    spec = importlib.util.spec_from_file_location("worked", script)
    worked = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worked)
    [words] = _commands(page("guide/privacy.md"))
    sets = [value for flag, value in itertools.pairwise(words) if flag == "--set"]
    assert sets == worked.SETTINGS
    monkeypatch.setenv("RAY_ADDRESS", session_address(ray_session))  # its runs' processes
    worked.main(["--smoke", "--out", str(tmp_path)])
    rows = pd.read_parquet(tmp_path / "worked.parquet").set_index("privacy")
    assert rows.index.tolist() == ["central", "none"]
    assert 3.9 < rows.loc["central", "epsilon"] <= 4 and rows.loc["central", "noise_multiplier"] > 0
    assert pd.isna(rows.loc["none", "epsilon"]) and (rows["final_accuracy"].between(0, 1)).all()
    summary = (tmp_path / "worked.md").read_text()
    assert f"{rows.loc['central', 'noise_multiplier']:.4f}" in summary
