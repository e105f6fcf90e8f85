"""`augment: crop-flip`, the CIFAR augmentation of FedRep's and LG-FedAvg's code: each
training image padded by 4 black pixels, cropped back at a random offset and flipped
left to right half the time; the same batches for a user whichever block, actor or
engine trains it; test images untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as tvf
from conftest import in_float64

from perfed_ray.config import from_mapping
from perfed_ray.data.augment import CropFlip, augmentation
from perfed_ray.data.scaling import input_scaling
from perfed_ray.errors import ConfigError
from perfed_ray.learner import Learner
from perfed_ray.models import initial_model
from perfed_ray.runtime import simulation

SHAPE = (3, 32, 32)


@pytest.mark.parametrize("scale", ["unit", "standardize"])
def test_crop_flip_is_torchvisions_pad_crop_and_flip(cifar10, scale):
    scaling = input_scaling(cifar10, scale)
    augment = augmentation("crop-flip", SHAPE, scaling)
    pixels = cifar10.x_train[:6]  # uint8 [6, 3*32*32]
    top, left = torch.tensor([0, 8, 3, 8, 0, 5]), torch.tensor([0, 8, 6, 0, 8, 2])
    flip = torch.tensor([False, True, True, False, True, False])
    ours = augment.apply(scaling.apply(pixels, torch.device("cpu")), top, left, flip)
    for i in range(len(pixels)):
        image = torch.from_numpy(pixels[i].reshape(SHAPE))
        theirs = tvf.crop(tvf.pad(image, 4, fill=0), int(top[i]), int(left[i]), 32, 32)
        if flip[i]:
            theirs = tvf.hflip(theirs)
        expected = scaling.apply(theirs.reshape(1, -1).numpy(), torch.device("cpu"))[0]
        assert torch.equal(ours[i], expected), i


def test_offsets_and_flips_are_drawn_uniformly():
    augment = CropFlip(SHAPE, (0.0, 0.0, 0.0))
    top, left, flip = augment.draws(90_000, torch.Generator().manual_seed(0))
    for offsets in (top, left):
        counts = np.bincount(offsets.numpy(), minlength=9)
        assert len(counts) == 9 and np.all(np.abs(counts / 90_000 - 1 / 9) < 0.01), counts
    assert abs(flip.float().mean().item() - 0.5) < 0.01


def _learner(augment: str, engine: str = "sequential", float64=False, **changes) -> Learner:
    """Three users of CIFAR-10 on the CNN; `float64` for comparisons of engines."""
    cfg = from_mapping(
        {
            "dataset": "cifar10",
            "partition": "shards",
            "n_users": 100,
            "labels_per_user": 2,
            "model": "cnn",
            "tau": 2,
            "batch_size": 8,
            "augment": augment,
            "engine": engine,
            **changes,
        }
    )
    prepared = simulation.prepare(cfg)
    users = [0, 1, 2]
    source = prepared.source(users)
    shards = source.shards(users, torch.device("cpu"), prepared.data)
    model = initial_model(prepared.cfg, source)
    if float64:
        model, shards = in_float64(model, shards)
    return Learner(
        prepared.cfg, model, shards, augment=augmentation(augment, SHAPE, source.scaling)
    )


def test_a_users_augmented_batches_are_its_own_whatever_its_block():
    plain, augmented = _learner("none"), _learner("crop-flip")
    x_plain, y_plain, *_ = plain.block_batches([0, 1, 2], round_=4)
    x_block, y_block, *_ = augmented.block_batches([0, 1, 2], round_=4)
    x_alone, y_alone, *_ = augmented.block_batches([2], round_=4)
    assert torch.equal(y_block, y_plain)  # the same samples, drawn as before
    assert not torch.equal(x_block, x_plain)
    assert torch.equal(x_block[2], x_alone[0]) and torch.equal(y_block[2], y_alone[0])
    # Crops move whole images: each augmented image holds the plain one's central
    # 24 x 24 pixels, shifted by at most 4 and perhaps mirrored.
    image = x_plain[0, 0, 0, 0].view(SHAPE)
    moved = x_block[0, 0, 0, 0].view(SHAPE)
    candidates = [
        (dy, dx, flip)
        for dy in range(-4, 5)
        for dx in range(-4, 5)
        for flip in (False, True)
        if torch.equal(
            (moved.flip(-1) if flip else moved)[:, 4 + dy : 28 + dy, 4 + dx : 28 + dx],
            image[:, 4:28, 4:28],
        )
    ]
    assert candidates


def test_users_of_different_sizes_get_the_same_augmented_batches_alone_or_together():
    learner = _learner(
        "crop-flip", algorithm="fedavg", local_epochs=1, partition="dirichlet", dirichlet_alpha=0.3
    )
    sizes = [len(learner.shards[u].y_train) for u in (0, 1, 2)]
    assert len(set(sizes)) > 1  # padded to the longest in a block
    x_block, _, steps, _ = learner.block_batches([0, 1, 2], round_=1)
    for i, u in enumerate((0, 1, 2)):
        x_alone, *_ = learner.block_batches([u], round_=1)
        own = int(steps[i])
        assert torch.equal(x_block[i, :own], x_alone[0, :own])


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["vmap", "grouped"])
def test_engines_train_on_the_same_augmented_batches(engine):
    reference = _learner("crop-flip", "sequential", float64=True)
    other = _learner("crop-flip", engine, float64=True)
    server = {k: v.detach().clone() for k, v in reference.model.named_parameters()}
    models_ref, _ = reference.train(server, [0, 1, 2], 2)
    models, _ = other.train(server, [0, 1, 2], 2)
    for key, value in models_ref.items():
        torch.testing.assert_close(models[key], value)


def test_personalisation_batches_are_augmented_test_images_never():
    plain, augmented = _learner("none"), _learner("crop-flip")
    server = {k: v.detach().clone() for k, v in plain.model.named_parameters()}
    before_plain = plain.evaluate(server, [0, 1, 2], round_=3, draws=1).to_pandas()
    before_aug = augmented.evaluate(server, [0, 1, 2], round_=3, draws=1).to_pandas()
    # Scored before any step: the same model on the same (untouched) test images.
    assert before_plain["loss_before"].tolist() == before_aug["loss_before"].tolist()
    assert before_plain["acc_before"].tolist() == before_aug["acc_before"].tolist()
    # Each user's step on its augmented batch moves its model elsewhere than the plain one.
    assert (before_plain["loss_after"] != before_aug["loss_after"]).all()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dataset": "synthetic", "partition": "natural"}, "augment = 'crop-flip' applies to"),
        ({"input_scale": "standardize-pixel"}, "standardize-pixel gives no one value"),
    ],
)
def test_crop_flip_where_it_cannot_apply_is_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        from_mapping({"augment": "crop-flip", **changes})


@pytest.mark.slow
def test_a_run_on_ray_trains_on_augmented_images_and_records_how(ray_session, tmp_path):
    import perfed_ray
    from perfed_ray.analysis import read_table

    tiny = {
        "dataset": "cifar10",
        "partition": "iid",
        # Users of 1,250 images, and two of them scored: a CNN's evaluation of whole
        # CIFAR-10 shards is what made this test slow, and it checks nothing here.
        "n_users": 40,
        "fraction": 0.05,
        "eval_users": 2,
        "sample_final_eval": True,
        "model": "cnn",
        "algorithm": "fedavg",
        "rounds": 1,
        "tau": 2,
        "batch_size": 8,
        "input_scale": "imagenet",
        "final_eval_draws": 1,
        "engine": "sequential",
    }
    runs = {}
    for how in ("none", "crop-flip"):
        result = perfed_ray.simulate({**tiny, "augment": how}, tmp_path, progress=False)
        runs[how] = result
    table = read_table(tmp_path, "runs").set_index("run_id")
    assert [table.loc[r.run_id, "augment"] for r in runs.values()] == ["none", "crop-flip"]
    rounds = {how: r.table("rounds") for how, r in runs.items()}
    # The same users and batches, other pixels: other training losses.
    drawn = {how: [list(users) for users in r["users"]] for how, r in rounds.items()}
    assert drawn["none"] == drawn["crop-flip"]
    assert rounds["none"]["train_loss"].iloc[0] != rounds["crop-flip"]["train_loss"].iloc[0]
