"""The documents a newcomer reads: a short README that points into the docs site, every
link of both landing on a file (and heading) that exists, the install lines that fit a
machine without a GPU, the generated configuration reference equal to the settings, the
speed figures quoted as measured, and the guide's own code examples running as printed."""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

import pytest
import yaml
from conftest import TINY

import perfed_ray
from perfed_ray.config import ConfigError, from_mapping, reference_text
from perfed_ray.registry import REGISTRIES
from perfed_ray.runtime.checkpoint import RunStore

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = (REPO / "README.md").read_text()
PAGES = sorted(DOCS.rglob("*.md"))
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
    for path in [REPO / "README.md", REPO / "cluster" / "README.md", *PAGES]:
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


def test_the_site_build_regenerates_a_stale_keys_block_and_says_so(caplog):
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    stale = "intro\n<!-- keys:begin -->\n| key |\n<!-- keys:end -->\nafter\n"
    with caplog.at_level(logging.WARNING):
        built = hooks._keys_block(stale, "x.md")
    table = reference_text(markdown=True)
    assert built == f"intro\n<!-- keys:begin -->\n{table}\n<!-- keys:end -->\nafter\n"
    assert "stale" in caplog.text
    caplog.clear()
    assert hooks._keys_block(built, "x.md") == built and not caplog.text


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
    plain = ray_session.get(actor.train.remote(w0, users, 1, per_user=True))
    w = w0.astype(np.float64)
    norms = [np.linalg.norm(plain.per_user[u] - w) for u in users]
    clip = min(norms) / 2  # the bound clips every user's update, far below DPMean's 1.0
    values["privacy.clip"] = clip
    cfg = from_mapping(values)
    strategy = REGISTRIES["strategy"].load(cfg.strategy)(cfg)
    chain = strategy.postprocess_users(1, strategy.init(template))
    got = ray_session.get(actor.train.remote(w0, users, 1, per_user=True, postprocess=chain))
    ray_session.kill(actor)
    for u in users:
        assert np.linalg.norm(got.per_user[u] - w) <= clip * (1 + 1e-6)
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
