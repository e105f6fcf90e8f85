"""`dataset: leaf`, `partition: natural`: users' own files, LEAF JSON or one .npz per user,
loaded with exactly the files' users and samples."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from perfed_ray.cli import main
from perfed_ray.config import ConfigError, from_mapping
from perfed_ray.data import DataError, input_scaling, load_dataset, materialise, partition
from perfed_ray.data.batches import draw
from perfed_ray.data.userfiles import SHAPES

CPU = torch.device("cpu")
LEAF_USERS = {"u_b": (30, 10), "u_a": (25, 8), "u_c": (40, 12)}  # name: (train, test)


def _samples(rng: np.random.Generator, n: int, features: int) -> dict[str, list]:
    """LEAF's per-user record: float features, integer labels (as the generators write)."""
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = rng.integers(0, 4, size=n)
    return {"x": x.tolist(), "y": [float(v) for v in y]}


def write_leaf(folder: Path, users: dict = LEAF_USERS, features: int = 5) -> dict:
    """A LEAF folder: train/ and test/ of two .json files each, users split between them
    out of name order; returns {split: {user: samples}} as written."""
    rng = np.random.default_rng(0)
    written: dict[str, dict] = {"train": {}, "test": {}}
    for split, which in (("train", 0), ("test", 1)):
        (folder / split).mkdir(parents=True)
        for part, names in enumerate((list(users)[:1], list(users)[1:])):
            data = {n: _samples(rng, users[n][which], features) for n in names}
            written[split].update(data)
            content = {
                "users": names,
                "num_samples": [users[n][which] for n in names],
                "user_data": data,
            }
            (folder / split / f"part_{part}.json").write_text(json.dumps(content))
    return written


def leaf_config(folder: Path, **changes) -> dict:
    return {
        "dataset": "leaf",
        "partition": "natural",
        "data_folder": str(folder),
        "n_users": 3,
        "fraction": 0.5,
        "batch_size": 5,
        "model": "logreg",
        **changes,
    }


def test_a_leaf_folder_gives_exactly_its_users_and_samples(tmp_path):
    written = write_leaf(tmp_path / "leaf")
    # data_folder relative to data_root
    data = load_dataset("leaf", str(tmp_path), False, 0, "leaf")
    cfg = from_mapping(leaf_config(tmp_path / "leaf"))
    users = partition(cfg, data)
    assert [own.name for own in data.users] == ["u_a", "u_b", "u_c"]
    assert data.input_shape == (1, 1, 5) and data.x_train.dtype == np.float32
    scaling = input_scaling(data, "unit")
    for idx, own in zip(users, data.users, strict=True):
        shard = materialise(data, idx, CPU, scaling)
        for split, x, y in (
            ("train", shard.x_train, shard.y_train),
            ("test", shard.x_test, shard.y_test),
        ):
            expected = written[split][own.name]
            assert torch.equal(x, torch.tensor(expected["x"], dtype=torch.float32))
            assert y.tolist() == [int(v) for v in expected["y"]]
        assert (len(idx.train), len(idx.test)) == LEAF_USERS[own.name]
    assert data.n_classes == 1 + max(max(u["y"]) for s in written.values() for u in s.values())


def test_a_folder_of_one_npz_per_user(tmp_path):
    rng = np.random.default_rng(1)
    sizes = {"alice": (22, 6), "bob": (31, 7)}
    for name, (n_train, n_test) in sizes.items():
        np.savez(
            tmp_path / f"{name}.npz",
            x_train=rng.normal(size=(n_train, 28, 28)),
            y_train=rng.integers(0, 10, n_train),
            x_test=rng.normal(size=(n_test, 28, 28)),
            y_test=rng.integers(0, 10, n_test),
        )
    data = load_dataset("leaf", None, False, 0, str(tmp_path))
    assert data.input_shape == (1, 28, 28)
    users = partition(from_mapping(leaf_config(tmp_path, n_users=2, model="cnn")), data)
    for idx, own in zip(users, data.users, strict=True):
        with np.load(tmp_path / f"{own.name}.npz") as f:
            shard = materialise(data, idx, CPU, input_scaling(data, "unit"))
            assert torch.equal(
                shard.x_train, torch.from_numpy(f["x_train"].reshape(-1, 784)).float()
            )
            assert torch.equal(shard.y_test, torch.from_numpy(f["y_test"]))


def test_input_shapes_are_inferred_from_the_number_of_features():
    assert SHAPES[784] == (1, 28, 28) and SHAPES[3072] == (3, 32, 32)


def test_n_users_must_fit_the_folders_users_and_a_small_user_fills_its_batches(tmp_path):
    write_leaf(tmp_path)
    data = load_dataset("leaf", None, False, 0, str(tmp_path))
    with pytest.raises(DataError, match="the folder holds 3 users: set n_users: 3"):
        partition(from_mapping(leaf_config(tmp_path, n_users=4)), data)
    users = partition(from_mapping(leaf_config(tmp_path, batch_size=26)), data)
    assert len(users[0].train) == 25  # its own users are kept, small as they are
    batch = draw(25, 60, torch.Generator().manual_seed(0))
    counts = torch.bincount(batch, minlength=25)
    assert len(batch) == 60 and counts.min() >= 2 and counts.max() <= 3  # all, then more
    unchanged = torch.randperm(25, generator=torch.Generator().manual_seed(0))[:10]
    assert torch.equal(draw(25, 10, torch.Generator().manual_seed(0)), unchanged)


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda f: (f / "test" / "part_0.json").unlink(), "no test samples for user 'u_b'"),
        (
            lambda f: (f / "train" / "part_1.json").write_text("{not json"),
            "is not a LEAF data file",
        ),
        (lambda f: (f / "test" / "part_1.json").write_text('{"users": []}'), "is not a LEAF"),
        (
            lambda f: (f / "train" / "part_0.json").write_text(
                json.dumps({"user_data": {"u_b": {"x": [[1.0]], "y": [0.5]}}})
            ),
            "y must hold class numbers",
        ),
        (
            lambda f: (f / "train" / "part_0.json").write_text(
                json.dumps({"user_data": {"u_b": {"x": [[1.0], [2.0]], "y": [1]}}})
            ),
            "one row of features per label",
        ),
    ],
    ids=["user-missing-from-test", "not-json", "no-user-data", "float-label", "rows"],
)
def test_bad_files_are_one_clear_data_error(tmp_path, spoil, message):
    write_leaf(tmp_path)
    spoil(tmp_path)
    with pytest.raises(DataError, match=message):
        load_dataset("leaf", None, False, 0, str(tmp_path))


def test_a_missing_folder_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="is not a folder: set data_folder"):
        load_dataset("leaf", None, False, 0, str(tmp_path / "nothing"))
    with pytest.raises(DataError, match="holds neither train/ and test/"):
        load_dataset("leaf", None, False, 0, str(tmp_path))


def test_leaf_configuration_rules(tmp_path):
    with pytest.raises(ConfigError, match="set data_folder"):
        from_mapping({"dataset": "leaf", "partition": "natural"})
    with pytest.raises(ConfigError, match="need partition: natural"):
        from_mapping({"dataset": "leaf", "data_folder": "x"})
    with pytest.raises(ConfigError, match="has real-valued features: use input_scale: unit"):
        from_mapping(leaf_config(tmp_path, input_scale="standardize-pixel"))


def test_the_cli_says_what_is_wrong_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main sets its own
    write_leaf(tmp_path)
    (tmp_path / "test" / "part_0.json").unlink()
    sets = [f"{k}={v}" for k, v in leaf_config(tmp_path).items()]
    args = [
        "run",
        "--quiet",
        "--out",
        str(tmp_path / "out"),
        *(a for s in sets for a in ("--set", s)),
    ]
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {tmp_path}: no test samples for user 'u_b': every user needs both "
        f"training and test samples"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["object_store", "data_root"])
def test_a_simulation_on_a_leaf_folder(ray_session, tmp_path, transport):
    """The driver shares one copy, or each actor reads the folder itself."""
    from perfed_ray.api import simulate

    users = {f"user{i}": (60 + 10 * i, 20) for i in range(4)}
    write_leaf(tmp_path / "leaf", users, features=16)
    cfg = from_mapping(
        leaf_config(
            tmp_path / "leaf",
            n_users=4,
            fraction=0.5,
            rounds=3,
            tau=2,
            eval_every=3,
            final_eval_draws=1,
            users_per_actor=4,
            model="mlp",
            algorithm="fedavg",
            data_transport=transport,
        )
    )
    simulate(cfg, tmp_path / "out", progress=False)
    runs = pd.read_parquet(tmp_path / "out" / "runs")
    assert runs["status"].tolist() == ["finished"] and runs["dataset"].tolist() == ["leaf"]
    final = pd.read_parquet(tmp_path / "out" / "evals").query("final").sort_values("user")
    assert final["n_train"].tolist() == [users[n][0] for n in sorted(users)]
    assert final["n_test"].tolist() == [20] * 4
    assert final["acc_after"].between(0, 1).all()
