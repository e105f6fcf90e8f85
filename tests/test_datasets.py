"""The data sets' readers on the real files: MNIST read without torchvision equals
torchvision's reading of the same files, and damaged files are one clear error."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfed_ray.data import DataError, load_dataset
from perfed_ray.data.datasets import MNIST_ARCHIVES

ROOT = Path(os.environ.get("PERFED_DATA", Path(__file__).resolve().parents[2] / "shared/data"))


def _copy(tmp_path: Path) -> Path:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_ARCHIVES:
        shutil.copy(ROOT / "MNIST" / "raw" / name, raw / name)
    return raw


def test_mnist_read_here_is_torchvisions_mnist(mnist, tmp_path):
    from torchvision.datasets import MNIST

    _copy(tmp_path)  # torchvision unpacks the archives next to them (no network: they are there)
    train, test = (MNIST(str(tmp_path), train=t, download=True) for t in (True, False))
    np.testing.assert_array_equal(mnist.x_train, train.data.reshape(60_000, -1).numpy())
    np.testing.assert_array_equal(mnist.y_train, train.targets.numpy())
    np.testing.assert_array_equal(mnist.x_test, test.data.reshape(10_000, -1).numpy())
    np.testing.assert_array_equal(mnist.y_test, test.targets.numpy())
    assert mnist.x_train.dtype == np.uint8 and mnist.y_train.dtype == np.int64


def test_loading_mnist_imports_no_torchvision():
    """torchvision (and through it torch._dynamo) costs a second of every run's start."""
    code = (
        "import sys; from perfed_ray.data import load_dataset; "
        f"load_dataset('mnist', {str(ROOT)!r}, False, 0); "
        "print('torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unpacked_files_read_like_the_archives(tmp_path, mnist):
    raw = _copy(tmp_path)
    for name in MNIST_ARCHIVES:
        with gzip.open(raw / name) as packed:
            (raw / name.removesuffix(".gz")).write_bytes(packed.read())
        (raw / name).unlink()
    np.testing.assert_array_equal(load_dataset("mnist", tmp_path, False, 0).x_test, mnist.x_test)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: data[: len(data) // 2], "header says"),
        (lambda data: b"\x00\x00\x0d\x03" + data[4:], "not an IDX file of unsigned bytes"),
    ],
    ids=["truncated", "floats"],
)
def test_a_damaged_mnist_file_is_one_data_error(tmp_path, damage, reason):
    raw = _copy(tmp_path)
    images = raw / "t10k-images-idx3-ubyte.gz"
    with gzip.open(images) as packed:
        data = packed.read()
    with gzip.open(images, "wb") as out:
        out.write(damage(data))
    with pytest.raises(DataError, match=f"could not load MNIST from {raw}: .*{reason}"):
        load_dataset("mnist", tmp_path, False, 0)
