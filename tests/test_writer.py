"""The Parquet writer: one file per table and run, appended to, cut back on resume."""

from __future__ import annotations

import pandas as pd

from perfed_ray.config import RunConfig
from perfed_ray.results.writer import RunWriter


def _round(k: int) -> dict[str, object]:
    return {"round": k, "users": [k], "n_sampled": 1, "n_reported": 1, "train_loss": 0.5,
            "wall_seconds": 0.1, "bytes_sent": 8, "bytes_received": 8}


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
