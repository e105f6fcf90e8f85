"""Data sets as plain arrays: MNIST, CIFAR-10 and a seeded synthetic one.

Images are kept as uint8, flattened in channel-height-width order (the
protocol's 784 and 3072 features), so one read-only copy can sit in Ray's
object store and be shared by every actor of a node; a user's shard is
turned into floats (by `input_scale`, see scaling.py) only inside the actor
that hosts it. Data sets that come split by user (userfiles.py) are kept the
same way, as one copy, with float features and their users' index ranges.
"""

from __future__ import annotations

import functools
import gzip
import math
import os
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfed_ray.data.download import fetch, reason
from perfed_ray.errors import DataError
from perfed_ray.seeding import Stream, numpy_rng

DATA_ENV = "PERFED_DATA"
DEFAULT_ROOT = Path("~/.cache/perfed-ray/data")


@dataclass(frozen=True)
class OwnUser:
    """A user that the data set's own files define: its name there, and where its
    samples lie in the concatenated arrays ([start, stop) of train and of test)."""

    name: str
    train: tuple[int, int]
    test: tuple[int, int]


@dataclass(frozen=True)
class DataArrays:
    """A whole data set, train and test, with what models and partitioners need to know;
    `users`, for a data set that comes split by user, are its own users in order."""

    name: str
    x_train: np.ndarray  # uint8 pixels, or float32 features already scaled [N, features]
    y_train: np.ndarray  # int64 [N]
    x_test: np.ndarray
    y_test: np.ndarray
    input_shape: tuple[int, int, int]  # (channels, height, width)
    n_classes: int
    users: tuple[OwnUser, ...] = ()


def resolve_root(data_root: str | None) -> Path:
    """The configured root, else $PERFED_DATA, else the per-user cache folder."""
    root = data_root or os.environ.get(DATA_ENV) or str(DEFAULT_ROOT)
    return Path(root).expanduser().resolve()


def default_root() -> Path:
    """The per-user cache folder: the one data root made when missing, to download into."""
    return resolve_root(str(DEFAULT_ROOT))


MNIST_ARCHIVES = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
]
MNIST_MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist/"  # torchvision's first


def read_idx(path: Path) -> np.ndarray:
    """An IDX file of unsigned bytes (MNIST's format: two zero bytes, type 0x08, the
    number of dimensions, each dimension as a big-endian uint32, then the data),
    gzipped or not; ValueError for anything else."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as file:
        raw = file.read()
    if len(raw) < 4 or raw[:3] != b"\0\0\x08":
        raise ValueError(f"{path.name} is not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != math.prod(dims):
        raise ValueError(f"{path.name} holds {data.size} bytes where its header says {dims}")
    return data.reshape(dims)


def load_mnist(root: Path, download: bool, seed: int) -> DataArrays:
    """MNIST from its four IDX files in `root/MNIST/raw` (gzipped, as published, or
    unpacked: torchvision's layout), read here without importing torchvision, which
    costs a second of every run's start; missing ones downloaded through torchvision
    (all or nothing) when `download` is on."""
    raw = root / "MNIST" / "raw"

    def found(name: str) -> Path | None:
        unpacked = raw / name.removesuffix(".gz")
        return unpacked if unpacked.is_file() else raw / name if (raw / name).is_file() else None

    if not all(map(found, MNIST_ARCHIVES)):
        absent = ", ".join(f for f in MNIST_ARCHIVES if not found(f))
        missing = f"MNIST not found under {raw} (missing {absent})"
        how = (
            f"download them from {MNIST_MIRROR} into that folder, or point data_root "
            f"(or ${DATA_ENV}) at a folder that has MNIST/raw"
        )
        if not download:
            raise DataError(f"{missing} and download is off: {how}, or set download: true")
        from torchvision.datasets import MNIST

        fetch(root, functools.partial(MNIST, download=True), ["MNIST/raw"], missing, how)
    try:
        x_train, y_train, x_test, y_test = (read_idx(found(f)) for f in MNIST_ARCHIVES)
        if len(x_train) != len(y_train) or len(x_test) != len(y_test):
            raise ValueError("images and labels differ in number")
    except (OSError, ValueError, EOFError, struct.error) as err:
        raise DataError(
            f"could not load MNIST from {raw}: {reason(err)}; check the files, "
            f"or point data_root / ${DATA_ENV} at a folder with MNIST/raw"
        ) from None
    return DataArrays(
        "mnist",
        x_train.reshape(len(x_train), -1),
        y_train.astype(np.int64),
        x_test.reshape(len(x_test), -1),
        y_test.astype(np.int64),
        (1, 28, 28),
        10,
    )


def _chw_flat(images: np.ndarray) -> np.ndarray:
    """(N, H, W, C) uint8 -> (N, C*H*W), the layout of torchvision's ToTensor."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2)).reshape(len(images), -1)


def load_cifar10(root: Path, download: bool, seed: int) -> DataArrays:
    """CIFAR-10 from torchvision's batches, else from a `cifar10.npz`, else downloaded."""
    from torchvision.datasets import CIFAR10

    npz = next(
        (p for p in (root / "cifar10.npz", root / "cifar10" / "cifar10.npz") if p.is_file()), None
    )
    batches = (root / "cifar-10-batches-py").is_dir()
    if npz is not None and not batches:
        try:
            with np.load(npz) as d:
                arrays = {k: d[k] for k in ("x_train", "y_train", "x_test", "y_test")}
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as err:
            raise DataError(
                f"{npz} is not a readable CIFAR-10 .npz ({err}); replace it "
                f"with a good copy (see docs/guide/data.md)"
            ) from None
        return DataArrays(
            "cifar10",
            _chw_flat(arrays["x_train"]),
            arrays["y_train"].astype(np.int64),
            _chw_flat(arrays["x_test"]),
            arrays["y_test"].astype(np.int64),
            (3, 32, 32),
            10,
        )
    if not batches:
        missing = f"CIFAR-10 not found under {root} (neither cifar-10-batches-py/ nor cifar10.npz)"
        how = (
            f"download {CIFAR10.url} and unpack it into that folder, or point data_root "
            f"(or ${DATA_ENV}) at a folder that has it"
        )
        if not download:
            raise DataError(f"{missing} and download is off: {how}, or set download: true")
        fetch(root, functools.partial(CIFAR10, download=True), [CIFAR10.base_folder], missing, how)
    try:
        train = CIFAR10(str(root), train=True)
        test = CIFAR10(str(root), train=False)
    except Exception as err:
        raise DataError(
            f"could not load CIFAR-10 from {root}: {reason(err)}; check the files, or point "
            f"data_root / ${DATA_ENV} elsewhere"
        ) from None
    return DataArrays(
        "cifar10",
        _chw_flat(train.data),
        np.asarray(train.targets, np.int64),
        _chw_flat(test.data),
        np.asarray(test.targets, np.int64),
        (3, 32, 32),
        10,
    )


def load_gaussian(root: Path, download: bool, seed: int) -> DataArrays:
    """Ten well-separated Gaussian clusters on 8x8 'images', generated from the seed.

    Small and easy, so tests can check that learning happens in seconds and
    without files; 1,000 training and 200 test samples per class.
    """
    rng = numpy_rng(seed, Stream.DATA)
    n_classes, shape = 10, (1, 8, 8)
    centres = rng.uniform(0.2, 0.8, size=(n_classes, int(np.prod(shape))))

    def draw(per_class: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.repeat(np.arange(n_classes), per_class)
        x = centres[y] + rng.normal(0.0, 0.12, size=(len(y), centres.shape[1]))
        return np.clip(np.rint(x * 255), 0, 255).astype(np.uint8), y.astype(np.int64)

    x_train, y_train = draw(1000)
    x_test, y_test = draw(200)
    return DataArrays("gaussian", x_train, y_train, x_test, y_test, shape, n_classes)


@dataclass(frozen=True)
class Dataset:
    """A registered data set (:data:`perfed_ray.registry.DATASETS`): how to load it, or
    (`load` None) how to generate one user's data from (seed, alpha, beta, user) inside
    the actors (:mod:`perfed_ray.data.synthetic`); whether it needs files under the
    data root, `a` of the paper split, and whether it comes split by user (`folder`:
    `load` is handed `data_folder` instead of the root, and the users are the files')."""

    load: Callable[[Path, bool, int], DataArrays] | None
    files: bool = True
    paper_a: int | None = None
    generate: Callable[[int, float, float, int], tuple[np.ndarray, ...]] | None = None
    folder: bool = False


MNIST = Dataset(load_mnist, paper_a=196)
CIFAR10 = Dataset(load_cifar10, paper_a=68)
GAUSSIAN = Dataset(load_gaussian, files=False, paper_a=40)


def dataset(name: str) -> Dataset:
    from perfed_ray.registry import DATASETS

    return DATASETS.load(name)


def paper_a(name: str) -> int | None:
    """The paper split's `a` for a data set (None where it has none)."""
    return dataset(name).paper_a


def load_dataset(
    name: str, data_root: str | None, download: bool, seed: int, data_folder: str = ""
) -> DataArrays:
    """Load a data set by its configuration name (one split by user from `data_folder`,
    absolute or relative to the data root); raises DataError with the fix."""
    root = resolve_root(data_root)
    spec = dataset(name)
    if spec.folder:
        return spec.load(root / Path(data_folder).expanduser(), download, seed)
    if spec.files and not root.is_dir() and not (download and root == default_root()):
        raise DataError(  # a typing error in data_root must not become a new folder
            f"data root {root} does not exist: set data_root or ${DATA_ENV} to the folder "
            f"that holds the data sets, or make the folder for them to be downloaded into"
        )
    return spec.load(root, download, seed)
