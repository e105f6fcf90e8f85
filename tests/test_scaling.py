"""`input_scale`: the affine map from uint8 pixels to inputs, and runs that use it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from perfed_ray.config import ConfigError, from_mapping
from perfed_ray.data import DataArrays, DataError, input_scaling, load_dataset, partition

CPU = torch.device("cpu")


def _rgb() -> DataArrays:
    """Three channels with different statistics, the third constant."""
    rng = np.random.default_rng(0)
    x = (
        np.stack(
            [
                rng.integers(0, 256, (500, 16)),
                rng.integers(100, 120, (500, 16)),
                np.full((500, 16), 7),
            ],
            axis=1,
        )
        .reshape(500, -1)
        .astype(np.uint8)
    )
    y = np.zeros(500, dtype=np.int64)
    return DataArrays("rgb", x, y, x[:50], y[:50], (3, 4, 4), 10)


def test_unit_is_exactly_the_old_division_by_255():
    data = _rgb()
    got = input_scaling(data, "unit").apply(data.x_train, CPU)
    assert torch.equal(got, torch.from_numpy(data.x_train.astype(np.float32) / 255.0))


def test_raw_keeps_the_pixel_values():
    data = _rgb()
    got = input_scaling(data, "raw").apply(data.x_test, CPU)
    assert torch.equal(got, torch.from_numpy(data.x_test.astype(np.float32)))


def test_standardize_gives_each_channel_of_the_training_set_mean_0_and_std_1():
    data = _rgb()
    scaling = input_scaling(data, "standardize")
    per_channel = scaling.apply(data.x_train, CPU).double().view(500, 3, 16)
    mean = per_channel.mean(dim=(0, 2))
    std = per_channel.std(dim=(0, 2), unbiased=False)
    torch.testing.assert_close(mean, torch.zeros(3, dtype=torch.float64), atol=1e-5, rtol=0)
    # The constant channel maps to 0, not to a division by zero.
    torch.testing.assert_close(
        std, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64), atol=1e-5, rtol=0
    )
    expected = data.x_train.reshape(500, 3, 16).astype(np.float64)
    torch.testing.assert_close(scaling.offset, expected.mean(axis=(0, 2)))
    torch.testing.assert_close(scaling.divisor[:2], expected.std(axis=(0, 2))[:2])


def test_standardize_constants_come_from_the_whole_training_set():
    """One map for every user: computed from the data set, not from a shard."""
    data = load_dataset("gaussian", None, False, 0)
    scaling = input_scaling(data, "standardize")
    assert scaling.offset.shape == (1,)
    assert scaling.offset[0] == pytest.approx(data.x_train.mean())
    assert scaling.divisor[0] == pytest.approx(data.x_train.std())
    # and no user's shard has those statistics, so the check tells the two apart
    users = partition(from_mapping({"dataset": "gaussian", "n_users": 4, "fraction": 0.5}), data)
    for user in users:
        assert data.x_train[user.train].mean() != pytest.approx(scaling.offset[0])


def test_standardize_pixel_is_numpys_per_pixel_standardisation_of_mnist(mnist):
    """Every pixel by its own mean and standard deviation over the 60,000 training
    images (pFedMe's and FedProx's generators), constant pixels mapped to 0."""
    scaling = input_scaling(mnist, "standardize-pixel")
    pixels = mnist.x_train.astype(np.float64)
    mean, std = pixels.mean(axis=0), pixels.std(axis=0)
    np.testing.assert_allclose(scaling.offset, mean, rtol=1e-12, atol=1e-12)
    # ours from exact integer sums; numpy's two-pass float std differs by ~1e-12 here
    np.testing.assert_allclose(scaling.divisor, np.where(std > 0, std, 1.0), rtol=1e-9)
    assert (std == 0).any()  # MNIST's corners: the case that must not divide by zero
    rows = mnist.x_test[:100]
    expected = (rows - mean) / np.where(std > 0, std, 1.0)
    got = scaling.apply(rows, CPU).double().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_imagenet_is_torchvisions_to_tensor_then_normalize_of_cifar10(cifar10, mnist):
    import torchvision.transforms as T

    normalize = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    pixels = cifar10.x_train[:20]
    ours = input_scaling(cifar10, "imagenet").apply(pixels, CPU)
    theirs = torch.stack(
        [normalize(torch.from_numpy(p.reshape(3, 32, 32)).float() / 255) for p in pixels]
    )
    torch.testing.assert_close(ours, theirs.reshape(20, -1), rtol=1e-5, atol=1e-5)
    with pytest.raises(DataError, match="1 channel"):
        input_scaling(mnist, "imagenet")


def test_float_features_take_only_unit_and_stay_as_they_are():
    x = np.random.default_rng(0).normal(size=(20, 6)).astype(np.float32)
    y = np.zeros(20, dtype=np.int64)
    data = DataArrays("floats", x, y, x, y, (1, 1, 6), 2)
    assert torch.equal(input_scaling(data, "unit").apply(x, CPU), torch.from_numpy(x))
    with pytest.raises(DataError, match="floats has real-valued features"):
        input_scaling(data, "standardize")


def test_synthetic_features_are_not_pixels():
    with pytest.raises(ConfigError, match="input_scale = 'raw' applies to image pixels"):
        from_mapping({"dataset": "synthetic", "partition": "natural", "input_scale": "raw"})


@pytest.mark.slow
def test_a_run_with_standardized_inputs(tiny_results):
    runs = pd.read_parquet(tiny_results / "runs")
    assert set(runs["input_scale"]) == {"unit", "standardize"}
    evals = pd.read_parquet(tiny_results / "evals")
    start = (
        evals[(evals["round"] == 0) & (evals["algorithm"] == "perfedavg-hf") & (evals["seed"] == 0)]
        .groupby("input_scale")["loss_before"]
        .mean()
    )
    # The same initial model (same seed) sees different inputs: a different initial loss.
    assert start["unit"] != pytest.approx(start["standardize"], rel=1e-3)
    assert (runs.loc[runs["input_scale"] == "standardize", "status"] == "finished").all()
