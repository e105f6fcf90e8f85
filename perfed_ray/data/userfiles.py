"""Data sets that come already split by user, read from a folder (`dataset: leaf`).

Many papers' data are made by a generator that decides each user's samples itself
and writes them split by user, so the users the authors trained are only to be had
from those files: LEAF's JSON layout (Caldas et al. 2018; FEMNIST, and the generators
of pFedMe, FedProx and Ditto), a `train/` and a `test/` folder of .json files holding
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``;
or one .npz file per user (named after it) holding x_train, y_train, x_test and y_test.

The users are exactly the files' users, in the order of their sorted names (the order
of LEAF's and pFedMe's own readers), so user u of a run is `users[u].name` of the
loaded data set. Their samples are concatenated into one data set, shared by the
actors as one copy like MNIST, and each user is its index ranges into it
(:func:`perfed_ray.data.partition.natural`).

Features are kept as the files give them, as float32: such generators have scaled
them already (pFedMe's standardises every pixel), so only `input_scale: unit` is
allowed and it leaves float features as they are (:mod:`perfed_ray.data.scaling`).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from perfed_ray.data.datasets import DataArrays, Dataset, OwnUser
from perfed_ray.errors import DataError

Samples = tuple[np.ndarray, np.ndarray]  # float32 [n, features], int64 [n]
SHAPES = {784: (1, 28, 28), 3072: (3, 32, 32)}  # MNIST-like and CIFAR-like images


def user_samples(x: Any, y: Any, where: str) -> Samples:
    """One user's features (a row per sample, flattened) and integer labels, or a
    DataError saying what is wrong with them."""
    try:
        features = np.asarray(x, dtype=np.float32)
        labels = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise DataError(f"{where}: x and y must be numbers ({err})") from None
    if labels.ndim == 1 and not len(labels):
        raise DataError(f"{where}: no samples; every user needs training and test samples")
    if labels.ndim != 1 or features.ndim < 2 or len(features) != len(labels):
        raise DataError(
            f"{where}: x must hold one row of features per label of y; it has shape "
            f"{features.shape} for y of shape {labels.shape}"
        )
    if not np.all(np.isfinite(features)):
        raise DataError(f"{where}: x holds NaN or infinite values")
    if np.any(labels < 0) or np.any(labels != np.round(labels)):
        raise DataError(f"{where}: y must hold class numbers 0, 1, 2, ...")
    return features.reshape(len(features), -1), labels.astype(np.int64)


def read_leaf_split(folder: Path) -> dict[str, Samples]:
    """Every user of the .json files of one LEAF split folder (train/ or test/)."""
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        raise DataError(
            f"{folder} holds no .json files: a LEAF data folder has train/ and test/ "
            f"folders of .json files"
        )
    users: dict[str, Samples] = {}
    for path in files:
        try:
            with path.open() as f:
                user_data = json.load(f)["user_data"]
            items = list(user_data.items())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise DataError(
                f"{path} is not a LEAF data file ({type(err).__name__}: {err}): it "
                f'must hold {{"user_data": {{user: {{"x": [...], "y": [...]}}}}}}'
            ) from None
        for name, samples in items:
            if name in users:
                raise DataError(f"{path}: user {name!r} is also in another file of {folder}")
            if not isinstance(samples, dict) or not {"x", "y"} <= samples.keys():
                raise DataError(f'{path}: user {name!r} must hold "x" and "y"')
            users[name] = user_samples(samples["x"], samples["y"], f"{path}, user {name!r}")
    return users


def read_user_npz(folder: Path) -> tuple[dict[str, Samples], dict[str, Samples]]:
    """(train, test) of a folder of .npz files, one per user, named after it."""
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise DataError(
            f"{folder} holds neither train/ and test/ folders of LEAF .json files nor "
            f".npz files (one per user, with x_train, y_train, x_test, y_test)"
        )
    train, test = {}, {}
    for path in files:
        try:
            with np.load(path) as f:
                arrays = {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as err:
            raise DataError(
                f"{path} is not a user's .npz ({type(err).__name__}: {err}): it must hold "
                f"x_train, y_train, x_test and y_test"
            ) from None
        train[path.stem] = user_samples(arrays["x_train"], arrays["y_train"], f"{path} (train)")
        test[path.stem] = user_samples(arrays["x_test"], arrays["y_test"], f"{path} (test)")
    return train, test


def _concatenate(split: dict[str, Samples], names: list[str]) -> tuple[np.ndarray, ...]:
    """The users' samples end to end, in `names` order, and where each user starts."""
    x = np.concatenate([split[n][0] for n in names])
    y = np.concatenate([split[n][1] for n in names])
    starts = np.concatenate([[0], np.cumsum([len(split[n][1]) for n in names])])
    return x, y, starts


def load_user_files(folder: Path, download: bool, seed: int) -> DataArrays:
    """The users of a LEAF folder (train/ and test/ of .json) or of one .npz per user."""
    if not folder.is_dir():
        raise DataError(
            f"data_folder {folder} is not a folder: set data_folder to the folder "
            f"of the users' files (absolute, or relative to data_root)"
        )
    if (folder / "train").is_dir() or (folder / "test").is_dir():
        train, test = read_leaf_split(folder / "train"), read_leaf_split(folder / "test")
    else:
        train, test = read_user_npz(folder)
    for have, other, lack in ((train, test, "test"), (test, train, "training")):
        missing = sorted(set(have) - set(other))
        if missing:
            more = " ..." if len(missing) > 3 else ""
            raise DataError(
                f"{folder}: no {lack} samples for user {', '.join(map(repr, missing[:3]))}"
                f"{more}: every user needs both training and test samples"
            )
    names = sorted(train)
    widths = {x.shape[1] for x, _ in (*train.values(), *test.values())}
    if len(widths) > 1:
        raise DataError(f"{folder}: users' samples differ in length ({sorted(widths)} features)")
    x_train, y_train, train_at = _concatenate(train, names)
    x_test, y_test, test_at = _concatenate(test, names)
    features = x_train.shape[1]
    users = tuple(
        OwnUser(n, (int(train_at[u]), int(train_at[u + 1])), (int(test_at[u]), int(test_at[u + 1])))
        for u, n in enumerate(names)
    )
    return DataArrays(
        "leaf",
        x_train,
        y_train,
        x_test,
        y_test,
        SHAPES.get(features, (1, 1, features)),
        int(max(y_train.max(), y_test.max())) + 1,
        users,
    )


LEAF = Dataset(load_user_files, folder=True)
