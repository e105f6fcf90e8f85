"""A researcher's own algorithm, in a module outside the package: named by dotted path
or by an entry point, shipped to the actors through Ray's runtime_env, run with the
fused and vmap engines, checkpointed with its per-user state and resumed exactly,
and rolled back when an actor holding per-user state dies."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import killed_mid_round

import perfed_ray
from perfed_ray.analysis import OUTCOME, outcome
from perfed_ray.config import ConfigError, from_mapping
from perfed_ray.registry import ALGORITHMS

REPO = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"
STATEFUL = "momentum:PersistentMomentum"
TINY = {
    "dataset": "gaussian",
    "n_users": 6,
    "fraction": 0.5,
    "rounds": 6,
    "tau": 5,
    "eval_every": 2,
    "checkpoint_every": 2,
    "final_eval_draws": 2,
    "beta": 0.2,
    "users_per_actor": 3,
}


def guide_example() -> str:
    """The module of the guide's "Adding a method", as printed there."""
    guide = (REPO / "docs/guide/adding-a-method.md").read_text()
    return re.search(r"<!-- plugin:begin -->\n```python\n(.*?)```", guide, re.S).group(1)


@pytest.fixture
def on_path(monkeypatch, tmp_path):
    """The driver imports the plug-ins from here; the actors only get them shipped."""
    (tmp_path / "reptile_fl.py").write_text(guide_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(PLUGINS))
    return tmp_path


@pytest.mark.slow
def test_the_guide_example_is_short_and_runs_on_actors_with_fused_and_vmap(ray_session, on_path):
    assert len(guide_example().splitlines()) < 40
    tables = {}
    for engine in ("fused", "vmap"):
        result = perfed_ray.simulate(
            {**TINY, "algorithm": "reptile_fl:Reptile", "reptile": {"epsilon": 0.8}},
            on_path / engine,
            engine=engine,
        )
        assert result.table("runs")["status"].tolist() == ["finished"]
        assert result.table("evals")["reptile.epsilon"].eq(0.8).all()  # its own column
        assert result.run_id.split("-")[2:4] == ["reptile_fl", "Reptile"]  # a plain folder
        assert set(result.table("runs")["engine"]) == {engine}
        tables[engine] = result.table("evals").sort_values(["round", "user", "draw"])
    pd.testing.assert_series_equal(
        tables["fused"]["loss_after"].reset_index(drop=True),
        tables["vmap"]["loss_after"].reset_index(drop=True),
        rtol=1e-4,
    )
    acc = tables["fused"].groupby("round")["acc_after"].mean()
    assert acc[6] > acc[0] + 0.1  # it learns


def test_a_plugin_declares_validates_and_reads_its_own_settings(on_path):
    reptile = from_mapping({"algorithm": "reptile_fl:Reptile", "reptile.epsilon": 0.2})
    assert reptile.settings_of("algorithm") == {"epsilon": 0.2}
    assert from_mapping({"algorithm": "reptile_fl:Reptile"}).to_dict()["reptile.epsilon"] == 0.5
    with pytest.raises(ConfigError, match=r"reptile.epsilon = 2.0 is out of range"):
        from_mapping({"algorithm": "reptile_fl:Reptile", "reptile": {"epsilon": 2}})
    with pytest.raises(ConfigError, match=r"did you mean 'reptile.epsilon'"):
        from_mapping({"algorithm": "reptile_fl:Reptile", "reptile.epsilom": 0.2})


def test_unknown_names_and_bad_paths_are_one_line_errors(on_path):
    with pytest.raises(ConfigError, match=r"algorithm = 'reptlie' is not allowed.*package"):
        from_mapping({"algorithm": "reptlie"})
    with pytest.raises(ConfigError, match=r"cannot import 'nowhere'"):
        from_mapping({"algorithm": "nowhere:Reptile"})
    with pytest.raises(ConfigError, match=r"module 'reptile_fl' has no 'Reptil'"):
        from_mapping({"algorithm": "reptile_fl:Reptil"})
    with pytest.raises(ConfigError, match=r"not a subclass of perfed_ray.algorithms.base.Algo"):
        from_mapping({"algorithm": "reptile_fl:tree_map"})  # a function, not a method
    with pytest.raises(ConfigError, match=r"not a subclass of torch.nn.Module"):
        from_mapping({"model": "reptile_fl:Reptile"})


def test_an_entry_point_registers_a_name(on_path, monkeypatch):
    """Installed after the registry last looked (entry points are kept until a folder
    on the import path changes), it is found all the same."""
    assert "reptile" not in ALGORITHMS.names()
    dist = on_path / "reptile_fl-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: reptile-fl\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[perfed_ray.algorithms]\nreptile = reptile_fl:Reptile\n"
    )
    assert "reptile" in ALGORITHMS.names()
    assert from_mapping({"algorithm": "reptile"}).algorithm == "reptile"
    assert ALGORITHMS.load("reptile").__name__ == "Reptile"


@pytest.fixture(scope="module")
def stateful_reference(ray_session, tmp_path_factory) -> dict[str, pd.DataFrame]:
    sys.path.insert(0, str(PLUGINS))
    out = tmp_path_factory.mktemp("stateful")
    perfed_ray.simulate({**TINY, "algorithm": STATEFUL, "engine": "fused"}, out)
    sys.path.remove(str(PLUGINS))
    return outcome(out)


def _assert_same(out: Path, expected: dict[str, pd.DataFrame]) -> None:
    got = outcome(out)
    if not got["events"].empty:  # the roll-back's record is the only event
        assert set(got["events"]["kind"]) == {"actor-died"}
        got["events"] = expected["events"]
    for name in OUTCOME:
        pd.testing.assert_frame_equal(got[name], expected[name], check_exact=True, obj=name)


@pytest.mark.slow
def test_per_user_state_is_checkpointed_and_resumed_exactly(
    ray_session, stateful_reference, tmp_path, monkeypatch
):
    values = {**TINY, "algorithm": STATEFUL, "engine": "fused"}
    out, run_dir, saved = killed_mid_round(ray_session, values, tmp_path, PLUGINS)
    assert saved.round == 4 and saved.states  # momentum buffers of the users trained so far
    assert set(saved.states) <= set(range(6)) and len(saved.states) >= 3
    monkeypatch.syspath_prepend(str(PLUGINS))  # in this process: only the kill needs its own
    perfed_ray.simulate(resume=run_dir)
    _assert_same(out, stateful_reference)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "settings"),
    [
        (STATEFUL, {}),
        ("local", {}),
        ("ditto", {}),
        pytest.param(  # w_0 made again by the new actor
            "ditto", {"ditto": {"personal_start": "initial"}}, id="ditto-initial"
        ),
        ("pfedme", {}),
        ("fedrep", {}),
        pytest.param("fedrep", {"fedrep": {"head_start": "initial"}}, id="fedrep-initial"),
    ],
)
def test_an_actor_dying_with_per_user_state_rolls_back_to_the_checkpoint(
    ray_session, tmp_path, monkeypatch, algorithm, settings
):
    monkeypatch.syspath_prepend(str(PLUGINS))
    values = {**TINY, "algorithm": algorithm, "engine": "fused", **settings}
    perfed_ray.simulate(values, tmp_path / "reference")
    monkeypatch.setenv("PERFED_FAULT", "actor@3")  # actor 0 SIGKILLs itself in round 3
    perfed_ray.simulate(values, tmp_path / "rolled")
    _assert_same(tmp_path / "rolled", outcome(tmp_path / "reference"))
    died = pd.read_parquet(tmp_path / "rolled" / "events").query("kind == 'actor-died'")
    assert died[["round", "actor"]].values.tolist() == [[3, 0]]
    assert "rolled back to the checkpoint of round 2" in died["detail"].iloc[0]
