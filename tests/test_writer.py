"""The Parquet writer: one file per table and run, appended to, cut back on resume."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from perfed_ray.config import RunConfig
from perfed_ray.errors import ConfigError
from perfed_ray.results.writer import RunWriter
from perfed_ray.runtime.checkpoint import RunStore


def _round(k: int) -> dict[str, object]:
    return {
        "round": k,
        "users": [k],
        "n_sampled": 1,
        "n_reported": 1,
        "train_loss": 0.5,
        "wall_seconds": 0.1,
        "bytes_sent": 8,
        "bytes_received": 8,
    }


def test_flushes_append_to_one_file_and_resume_cuts_back_to_the_checkpoint(tmp_path):
    writer = RunWriter(tmp_path, "r1", RunConfig(dataset="synthetic", seed=7))
    for chunk in ([1, 2], [3], [4, 5]):
        writer.add("rounds", [_round(k) for k in chunk])
        writer.flush()
    folder = tmp_path / "rounds" / "run_id=r1"
    assert [p.name for p in folder.iterdir()] == ["part-0.parquet"]
    rounds = pd.read_parquet(tmp_path / "rounds")
    assert rounds["round"].tolist() == [1, 2, 3, 4, 5] and (rounds["seed"] == 7).all()
    assert writer.rows["rounds"] == 5

    (folder / ".part-0.parquet.tmp").write_bytes(b"half a file")  # an interrupted write
    again = RunWriter(tmp_path, "r1", RunConfig(dataset="synthetic", seed=7))
    again.resume({"rounds": 3})
    assert [p.name for p in folder.iterdir()] == ["part-0.parquet"]
    assert pd.read_parquet(tmp_path / "rounds")["round"].tolist() == [1, 2, 3]
    again.add("rounds", [_round(4)])
    again.flush()
    assert pd.read_parquet(tmp_path / "rounds")["round"].tolist() == [1, 2, 3, 4]

    RunWriter(tmp_path, "r1", RunConfig(dataset="synthetic")).resume({})
    assert list(folder.iterdir()) == []


def test_a_checkpoint_that_counts_part_files_is_refused_before_anything_is_deleted(tmp_path):
    store = RunStore(tmp_path, "old")
    store.folder.mkdir(parents=True)
    meta = json.dumps({"round": 20, "parts": {"rounds": 2}, "wall_seconds": 1.0, "accuracy": None})
    with open(store.folder / "checkpoint.npz", "wb") as file:
        np.savez(file, weights=np.zeros(3), meta=np.array(meta))
    with pytest.raises(ConfigError, match="older than one results file per table"):
        store.load()
