"""Every benchmark script runs, in a tiny setting, so none rots between measurements."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "experiments" / "bench"


def _smoke(script: str, out: Path, *more: str) -> tuple[pd.DataFrame, str]:
    """Run a benchmark script's smoke setting into `out`; the rows it wrote, what it printed."""
    done = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), "--smoke", "--out", str(out), *more],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return pd.read_parquet(out / f"{script}.parquet"), done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "kinds"),
    [
        ("throughput", {"gemm", "engine"}),
        ("scale", None),
        ("convolutions", None),
        ("spans", None),
    ],
)
def test_benchmark_script_runs_and_writes_its_parquet(tmp_path, script, kinds):
    rows, _ = _smoke(script, tmp_path)
    assert len(rows) and {"cpu", "cores", "torch", "ray"} <= set(rows.columns)
    if kinds:
        assert set(rows["kind"]) == kinds
        engines = rows[rows["kind"] == "engine"]
        assert (engines["user_steps_per_second"] > 0).all()
        assert {"loop, 1 thread", "fused, 1 thread", "ray fused"} <= set(engines["mode"])
    else:
        assert rows["seconds_per_round"].iloc[0] > 0


@pytest.mark.slow
def test_the_step_overhead_script_times_every_mode_on_one_thread(tmp_path):
    rows, _ = _smoke("step_overhead", tmp_path)
    engines = {"before", "torch.func", "new memory", "NCHW"}
    modes = {"plain", "plain, ours", "engine", "gather", "engine, actor"}
    assert modes | {f"engine, {e}" for e in engines} == set(rows["mode"])
    assert (rows["ms_per_step"] > 0).all() and (rows["torch_threads"] == 1).all()
    actor = rows.set_index("mode").loc["engine, actor"]
    assert actor["niceness"] == 0 and actor["omp_num_threads"] == "1"
    assert (tmp_path / "step_overhead.md").read_text().count("| simple_cnn |") == len(rows)


@pytest.mark.slow
def test_the_gpu_benchmark_measures_every_mode_on_whatever_device_there_is(tmp_path):
    rows, _ = _smoke("gpu", tmp_path)
    assert set(rows["device"]) == {"cuda" if torch.cuda.is_available() else "cpu"}
    mnist, cnn = rows[rows["kind"] == "mnist"], rows[rows["kind"] == "cnn"]
    assert {"loop, one process", "fused, one process", "ray fused, default placement"} == set(
        mnist["mode"]
    )
    assert (mnist["user_steps_per_second"] > 0).all() and set(mnist["users_per_round"]) == {4, 10}
    assert {"sequential", "vmap", "grouped"} == set(cnn["mode"])
    assert cnn.groupby("algorithm")["chosen"].sum().eq(1).all()  # auto picks one engine


@pytest.mark.slow
def test_the_breakdown_splits_each_round_into_parts_that_add_up(tmp_path):
    rows, _ = _smoke("breakdown", tmp_path)
    assert set(rows["algorithm"]) == {"fedavg", "perfedavg-hf"}
    parts = ["round_actor_work", "round_transport", "round_server_step", "round_driver"]
    assert (rows[["round_actor_work", "round_transport", "round_server_step"]] > 0).all().all()
    assert np.allclose(rows[parts].sum(axis=1), rows["round_seconds"])
    runs = ["run_outside_clock", "run_startup", "run_rounds"]
    assert (rows[runs] > 0).all().all() and (rows[runs].sum(axis=1) < rows["run_seconds"]).all()
    # the fixed cost's parts, from the run's timeline, add up to the run less its rounds
    fixed = [c for c in rows.columns if c.startswith("fixed_")]
    assert len(fixed) == 10 and (rows[fixed] >= 0).all().all()
    assert np.allclose(rows[fixed].sum(axis=1), rows["run_fixed"])
    assert np.allclose(rows["run_fixed"] + rows["run_rounds"], rows["run_seconds"])


@pytest.mark.slow
def test_the_breakdown_compares_the_fixed_cost_of_two_checkouts(tmp_path):
    """Its smoke test: this checkout against itself, one short run each."""
    repo = BENCH.parents[1]
    args = ["--smoke", "--baseline", str(repo), "--repeats", "1", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, str(BENCH / "breakdown.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pd.read_parquet(tmp_path / "breakdown-versus.parquet")
    assert sorted(rows["checkout"]) == ["baseline", "this"]
    assert rows["fixed_ray_start"].notna().all() and (rows["run_fixed"] > 0).all()
    assert "ratio" in done.stdout and "fixed_actors_start" in done.stdout


@pytest.mark.slow
def test_the_side_by_side_script_compares_two_checkouts(tmp_path):
    """Its smoke test: this checkout against itself, one short measurement each."""
    repo = BENCH.parents[1]
    args = ["--baseline", str(repo), "--repeats", "1", "--calls", "2", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, str(BENCH / "versus.py"), *args, "--algorithms", "fedavg"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pd.read_parquet(tmp_path / "versus.parquet")
    assert set(rows["checkout"]) == {"baseline", "this"} and (rows["speed"] > 0).all()
    assert "ratio" in done.stdout


@pytest.mark.slow
def test_flower_side_by_side_runs_both_and_writes_the_ratios(tmp_path):
    """Its smoke test: 2 rounds of 10 users on each side, where Flower's own interpreter
    is installed (never in perfed-ray's environment: CI has none, and skips)."""
    sys.path.insert(0, str(BENCH))
    from flower import flower_python

    python = flower_python()
    if python is None or not python.exists():
        pytest.skip(
            "no Flower interpreter: set $PERFED_FLOWER_PYTHON or make /work/flower-env "
            "(experiments/bench/flower.py's docstring says how)"
        )
    rows, printed = _smoke("flower", tmp_path)
    rows = rows.set_index("tool")
    assert set(rows.index) == {"perfed-ray", "flower"}
    assert (rows["rounds"] == 2).all() and (rows["users_per_round"] == 2).all()
    assert (rows["round_seconds_median"] > 0).all() and (rows["whole_seconds"] > 0).all()
    # Both sides trained the same model on the same data: MNIST's 10 classes start near
    # ln 10 = 2.30 and two rounds of small steps leave both there, not diverged.
    assert np.allclose(rows["final_train_loss"], 2.3, atol=0.3)
    assert rows.loc["flower", "flwr"]
    assert "per_round" in printed and "whole_run" in printed


@pytest.mark.slow
@pytest.mark.parametrize(
    "workload",
    [
        "mnist",
        "cifar10",
    ],
)
def test_pfl_side_by_side_runs_both_sides_of_each_workload(tmp_path, workload):
    """Its smoke test: 2 rounds of a few users on each side, where pfl's own interpreter
    is installed (never in perfed-ray's environment: CI has none, and skips)."""
    sys.path.insert(0, str(BENCH))
    from pfl import pfl_python

    python = pfl_python()
    if python is None or not python.exists():
        pytest.skip(
            "no pfl-research interpreter: set $PERFED_PFL_PYTHON or make /work/pfl-env "
            "(experiments/bench/pfl.py's docstring says how)"
        )
    rows, printed = _smoke("pfl", tmp_path, "--workloads", workload)
    rows = rows.set_index("tool")
    assert set(rows.index) == {"perfed-ray", "pfl"} and set(rows["workload"]) == {workload}
    cohort = {"mnist": 2, "cifar10": 4}[workload]  # pfl.py's SMOKE settings
    assert (rows["rounds"] == 2).all() and (rows["users_per_round"] == cohort).all()
    assert (rows["round_seconds_median"] > 0).all() and (rows["whole_seconds"] > 0).all()
    # Both sides trained the same model from the same w_0 on the same users: 10 classes
    # start near ln 10 = 2.30 and two rounds leave both there, not diverged.
    assert np.allclose(rows["final_test_loss"], 2.3, atol=0.3)
    assert rows.loc["pfl", "pfl"]
    assert "per_round" in printed and "whole_process" in printed
