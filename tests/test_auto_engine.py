"""`engine: auto` by measurement: the choice (never an engine measured slower than the
per-user loop), its cache on disk, and its place in the run's record, which a resumed
run follows whatever the cache says by then."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import perfed_ray
from perfed_ray.config import from_mapping, revise
from perfed_ray.engines import auto
from perfed_ray.engines.auto import Workload, candidates, choose, fastest
from perfed_ray.models import build_model
from perfed_ray.registry import ENGINES

CIFAR = (3, 32, 32)
WORK = Workload(CIFAR, 10, users=2, threads=1, device="cpu")


@pytest.fixture
def quick(monkeypatch):
    """One timed turn of the engines, not a second and a half of them."""
    monkeypatch.setattr(auto, "BUDGET", 0.0)
    monkeypatch.setattr(auto, "MIN_TURNS", 1)


def _cnn(name: str = "cnn"):
    cfg = from_mapping({"model": name, "dataset": "cifar10", "batch_size": 4})
    return cfg, build_model(name, CIFAR, 10, seed=0)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        ({"sequential": 1.0, "vmap": 1.7, "grouped": 1.5}, "sequential"),  # CNN on CPU
        ({"sequential": 1.0, "vmap": 0.5, "grouped": 0.2}, "grouped"),
        ({"sequential": 1.0, "vmap": 0.8, "grouped": 1.2}, "vmap"),
        ({"sequential": 1.0, "vmap": 0.95, "grouped": 1.2}, "sequential"),  # within noise
        ({"sequential": 1.0, "vmap": 1.0}, "sequential"),
    ],
)
def test_auto_keeps_the_fastest_and_never_one_measured_slower_than_sequential(seconds, expected):
    chosen = fastest(seconds)
    assert chosen == expected
    assert seconds[chosen] <= seconds["sequential"]


@pytest.mark.parametrize("name", ["cnn", "lenet"])
def test_auto_picks_an_engine_that_exists_and_applies(name, quick, tmp_path):
    cfg, model = _cnn(name)
    assert candidates(model) == ["sequential", "vmap", "grouped"]
    engine = choose(cfg, model, WORK, tmp_path / "engines.json")
    assert engine in candidates(model) and engine in ENGINES.names()


def test_a_linear_chain_is_fused_without_a_measurement(tmp_path):
    cfg = from_mapping({"model": "mlp"})
    model = build_model("mlp", (1, 28, 28), 10)
    assert choose(cfg, model, WORK, tmp_path / "engines.json") == "fused"
    assert not (tmp_path / "engines.json").exists()


def test_the_cache_is_written_then_reused_without_measuring_again(quick, tmp_path):
    cfg, model = _cnn()
    path = tmp_path / "cache" / "engines.json"
    first = choose(cfg, model, WORK, path)
    [(key, entry)] = json.loads(path.read_text()).items()
    assert entry["engine"] == first and set(entry["seconds"]) == set(candidates(model))
    assert entry["workload"]["model"] == "perfed_ray.models.CNN"
    # Another candidate written in its place answers: read, not measured (a measurement
    # would have rewritten the entry, its timings and its time).
    other = next(e for e in candidates(model) if e != first)
    entries = {key: {**entry, "engine": other}}
    path.write_text(json.dumps(entries))
    assert choose(cfg, model, WORK, path) == other
    assert json.loads(path.read_text()) == entries
    # Another workload (another algorithm) is measured on its own.
    choose(revise(cfg, algorithm="fedavg"), model, WORK, path)
    assert len(json.loads(path.read_text())) == 2


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", ""])
def test_a_corrupt_cache_is_measured_over_and_rewritten(quick, tmp_path, content):
    cfg, model = _cnn()
    path = tmp_path / "engines.json"
    path.write_text(content)
    assert choose(cfg, model, WORK, path) in candidates(model)
    assert len(json.loads(path.read_text())) == 1


def test_a_cached_engine_that_no_longer_applies_is_measured_again(quick, tmp_path):
    cfg, model = _cnn()
    path = tmp_path / "engines.json"
    choose(cfg, model, WORK, path)
    [(key, entry)] = json.loads(path.read_text()).items()
    path.write_text(json.dumps({key: {**entry, "engine": "fused"}}))
    assert choose(cfg, model, WORK, path) in candidates(model)
    assert json.loads(path.read_text())[key]["engine"] != "fused"


def _interrupt_after_round_3(progress) -> None:
    if progress.round == 3:
        raise KeyboardInterrupt


@pytest.mark.slow
def test_the_resolved_engine_is_recorded_and_a_resumed_run_keeps_it(
    ray_session, quick, tmp_path, monkeypatch
):
    """The run measures once and records the engine in run.json; when the cache says
    otherwise by the time the run is resumed, the resumed run still runs the recorded
    engine, to the numbers of an uninterrupted run with that engine named."""
    cache = tmp_path / "engines.json"
    monkeypatch.setenv(auto.CACHE_ENV, str(cache))
    values = {
        "dataset": "mnist",
        "model": "cnn",
        "n_users": 4,
        "fraction": 0.5,
        "rounds": 5,
        "tau": 2,
        "batch_size": 8,
        "checkpoint_every": 2,
        "eval_every": 5,
        "final_eval_draws": 1,
        "users_per_actor": 4,
        "algorithm": "fedavg",
    }
    with pytest.raises(KeyboardInterrupt):
        perfed_ray.simulate(values, tmp_path / "auto", progress=_interrupt_after_round_3)
    [run_dir] = (tmp_path / "auto" / "checkpoints").iterdir()
    recorded = json.loads((run_dir / "run.json").read_text())["config"]["engine"]
    [(key, entry)] = json.loads(cache.read_text()).items()
    assert recorded == entry["engine"] and recorded in candidates(
        build_model("cnn", (1, 28, 28), 10)
    )
    other = next(e for e in entry["seconds"] if e != recorded)
    cache.write_text(json.dumps({key: {**entry, "engine": other}}))

    perfed_ray.simulate(resume=run_dir)
    assert json.loads((run_dir / "run.json").read_text())["config"]["engine"] == recorded
    runs = pd.read_parquet(tmp_path / "auto" / "runs")
    assert set(runs["engine"]) == {recorded} and set(runs["status"]) == {"finished"}

    perfed_ray.simulate({**values, "engine": recorded}, tmp_path / "named")
    rounds = [
        pd.read_parquet(tmp_path / out / "rounds").sort_values("round") for out in ("auto", "named")
    ]
    assert len(rounds[0]) == 5
    assert rounds[0]["train_loss"].tolist() == rounds[1]["train_loss"].tolist()


@pytest.mark.slow
def test_the_choice_for_gpu_actors_runs_in_a_ray_task(ray_session, tmp_path):
    """What a task holding an actor's GPU share runs (here on CPU: no GPU is lent to
    the tests), its cache where the task runs."""
    from perfed_ray.runtime import hosts
    from perfed_ray.runtime.execution import _choose_on_gpu

    hosts.release()  # the CPU the task asks for, from earlier runs' idle hosts

    cfg, model = _cnn()
    cache = tmp_path / "engines.json"
    task = ray_session.remote(_choose_on_gpu).options(
        num_cpus=1, runtime_env={"env_vars": {auto.CACHE_ENV: str(cache)}}
    )
    engine = ray_session.get(task.remote(cfg, model, WORK, {}))
    assert engine in candidates(model)
    [entry] = json.loads(cache.read_text()).values()
    assert entry["engine"] == engine and entry["workload"]["device"] == auto.cpu_name()


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        ({"tau": 3}, (3, False)),  # tau steps, no counts: all users take tau
        ({"local_epochs": 11, "fedrep": {"head_epochs": 10, "body_epochs": 1}}, (11, True)),
        ({"tau": 50}, (auto.MEASURED_STEPS, False)),
    ],
)
def test_auto_times_a_round_shaped_as_the_real_one(sets, expected, quick, monkeypatch, tmp_path):
    """FedRep's authors' rounds in epochs: the batched engines mask steps by the users'
    counts, and a round mixes head and body steps, which cost differently one user at a
    time; timing one unmasked head step chose vmap where whole rounds ran 1.5 times
    slower with it than one user at a time."""
    seen = []
    make = auto.make_engine

    def recording(name, *args):
        engine = make(name, *args)
        run = engine.run

        def recorded(server, x, y, states, steps=None, masks=None):
            seen.append((x.shape[1], steps))
            return run(server, x, y, states, steps, masks)

        engine.run = recorded
        return engine

    monkeypatch.setattr(auto, "make_engine", recording)
    cfg = from_mapping(
        {"model": "lenet", "dataset": "cifar10", "batch_size": 2, "algorithm": "fedrep", **sets}
    )
    model = build_model("lenet", CIFAR, 10, seed=0)
    choose(cfg, model, WORK, tmp_path / "engines.json")
    steps, counted = expected
    assert {length for length, _ in seen} == {steps}
    for _, counts in seen:
        assert (counts is not None) == counted
        assert counts is None or counts.tolist() == [steps] * len(counts)
    [entry] = json.loads((tmp_path / "engines.json").read_text()).values()
    assert entry["workload"]["measured_steps"] == steps


def test_auto_times_every_engine_in_several_turns_however_short_its_budget(monkeypatch):
    """A turn each was all a second and a half allowed a slow method (Per-FedAvg HF on
    the CNN: 5.6 s a turn of the three engines, BENCHMARKS.md); one sample of a shared
    machine's noise then chose. Each engine now runs MIN_TURNS timed rounds (after its
    warm-up) with no budget at all."""
    monkeypatch.setattr(auto, "BUDGET", 0.0)
    rounds = []
    make = auto.make_engine

    def counting(name, *args):
        engine = make(name, *args)
        run = engine.run

        def counted(server, x, *rest):
            rounds.append((name, len(x)))
            return run(server, x, *rest)

        engine.run = counted
        return engine

    monkeypatch.setattr(auto, "make_engine", counting)
    cfg = from_mapping({"model": "cnn", "dataset": "cifar10", "batch_size": 2, "tau": 1})
    seconds = auto.measure(cfg, build_model("cnn", CIFAR, 10, seed=0), WORK)
    assert set(seconds) == set(candidates(build_model("cnn", CIFAR, 10)))
    for name in seconds:
        timed = [users for engine, users in rounds if engine == name]
        assert timed == [1] + [WORK.users] * auto.MIN_TURNS  # warm-up, then the turns
