"""Every benchmark script runs, in a tiny setting, so none rots between measurements."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

BENCH = Path(__file__).resolve().parents[1] / "experiments" / "bench"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "kinds"),
    [("throughput", {"gemm", "engine"}), ("scale", None), ("convolutions", None)],
)
def test_benchmark_script_runs_and_writes_its_parquet(tmp_path, script, kinds):
    done = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pd.read_parquet(tmp_path / f"{script}.parquet")
    assert len(rows) and {"cpu", "cores", "torch", "ray"} <= set(rows.columns)
    if kinds:
        assert set(rows["kind"]) == kinds
        engines = rows[rows["kind"] == "engine"]
        assert (engines["user_steps_per_second"] > 0).all()
        assert {"loop, 1 thread", "fused, 1 thread", "ray fused"} <= set(engines["mode"])
    else:
        assert rows["seconds_per_round"].iloc[0] > 0


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
