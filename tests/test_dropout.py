"""Dropout from the run's keyed streams: pfl-research's `simple_cnn` as they define it,
masks that depend on the user and round alone, applied the same way by every engine
(every method equals the sequential engine), and never in scoring."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_engines import METHODS, _assert_close
from test_engines import _expected as sequential_round
from test_engines import _run as run
from test_evaluation_engines import _assert_same, _scores, _vmaps
from torch import nn

from perfed_ray.engines.functional import FunctionalOps
from perfed_ray.errors import ConfigError
from perfed_ray.masks import round_masks, sites
from perfed_ray.models import build_model, params_of

IMAGE = (3, 8, 8)  # the smallest image simple_cnn takes whole: 64 x 2 x 2 after pooling
FEATURES = (math.prod(IMAGE),)


def test_simple_cnn_is_pfl_researchs_benchmark_cnn():
    """Their simple_cnn on CIFAR-10: conv 3->32 and 32->64 (3x3, no padding), dense
    12544 -> 128 -> 10; 1,626,442 parameters; Xavier-uniform weights; dropout 0.25 after
    the pooling and 0.5 after the dense layer's ReLU."""
    model = build_model("simple_cnn", (3, 32, 32), 10, seed=0)
    params = params_of(model)
    shapes = [tuple(v.shape) for v in params.values()]
    assert shapes[::2] == [(32, 3, 3, 3), (64, 32, 3, 3), (128, 12544), (10, 128)]
    assert sum(v.numel() for v in params.values()) == 1_626_442
    for key in list(params)[::2]:
        w = params[key]
        fan_in, fan_out = w[0].numel(), w.shape[0] * w[0, 0].numel()
        bound = math.sqrt(6 / (fan_in + fan_out))
        assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
    found = sites(model, (3 * 32 * 32,))
    assert [(s.name, s.p, s.shape) for s in found] == [
        ("features.5", 0.25, (64, 14, 14)),
        ("classifier.2", 0.5, (128,)),
    ]


def _work(users: int, tau: int, batch: int = 4, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(users, tau, 3, batch, *FEATURES, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (users, tau, 3, batch), generator=gen)
    model = build_model("simple_cnn", IMAGE, 10, seed=0)
    masks = round_masks(
        0, list(range(users)), (5,), [tau] * users, (3, batch), sites(model, FEATURES)
    )
    return x, y, masks


def _run(name, values, engine, x, y, masks, steps=None):
    values = {"model": "simple_cnn", **values}
    return run(name, values, engine, x, y, steps=steps, shape=IMAGE, masks=masks)


def _expected(name, values, x, y, masks, steps=None):
    """:func:`_run` on the sequential engine, made once for every engine compared with it."""
    values = {"model": "simple_cnn", **values}
    return sequential_round(name, values, x, y, steps=steps, shape=IMAGE, masks=masks)


@pytest.mark.parametrize(("name", "values"), METHODS)
@pytest.mark.parametrize("engine", ["vmap", "grouped"])
def test_every_engine_applies_the_masks_as_the_sequential_engine(name, values, engine):
    x, y, masks = _work(users=3, tau=2)
    expected = _expected(name, values, x, y, masks)
    _assert_close(_run(name, values, engine, x, y, masks), expected)
    without = _expected(name, values, x, y, None)
    assert not torch.allclose(without[1], expected[1])  # the masks were applied


@pytest.mark.parametrize("engine", ["vmap", "grouped"])
def test_users_with_different_numbers_of_steps_keep_their_own_masks(engine):
    x, y, _ = _work(users=4, tau=4)
    x, y = x[:, :, :1], y[:, :, :1]
    steps = torch.tensor([1, 4, 2, 3])
    model = build_model("simple_cnn", IMAGE, 10, seed=0)
    masks = round_masks(0, [0, 1, 2, 3], (5,), steps.tolist(), (1, 4), sites(model, FEATURES))
    values = {"local_epochs": 1}
    expected = _expected("fedavg", values, x, y, masks, steps)
    _assert_close(_run("fedavg", values, engine, x, y, masks, steps), expected)


def test_a_users_masks_depend_on_its_stream_alone():
    """Not on the other users of its block, its place there, or the block's longest
    user; a new round draws new masks."""
    found = sites(build_model("simple_cnn", IMAGE, 10), FEATURES)
    both = round_masks(7, [3, 9], (2,), [5, 2], (1, 4), found)
    alone = round_masks(7, [9], (2,), [2], (1, 4), found)
    for name, mask in both.items():
        assert torch.equal(mask[1, :2], alone[name][0])
        assert not mask[1, 2:].any()  # past the user's own steps: nothing
    later = round_masks(7, [9], (3,), [2], (1, 4), found)
    assert not torch.equal(later["features.5"], alone["features.5"])
    kept = round_masks(0, list(range(20)), (0,), [5] * 20, (1, 10), found)
    for site in found:  # each sample is kept with probability 1 - p
        assert kept[site.name].float().mean() == pytest.approx(1 - site.p, abs=0.01)


def test_the_masks_scale_what_they_keep_and_scoring_applies_none():
    """The loss with masks against the model's layers applied by hand; logits without
    masks are the model's in eval mode."""
    model = build_model("simple_cnn", IMAGE, 10, seed=1)
    found = sites(model, FEATURES)
    masks = round_masks(1, [0], (0,), [1], (6,), found)
    masks = {k: v[0, 0] for k, v in masks.items()}
    gen = torch.Generator().manual_seed(2)
    x, y = torch.rand(6, *FEATURES, generator=gen), torch.randint(0, 10, (6,), generator=gen)
    p = params_of(model)
    f = nn.functional
    h = f.relu(f.conv2d(x.view(-1, *IMAGE), p["features.0.weight"], p["features.0.bias"]))
    h = f.max_pool2d(f.relu(f.conv2d(h, p["features.2.weight"], p["features.2.bias"])), 2)
    h = (h * masks["features.5"] / 0.75).flatten(1)
    h = f.relu(f.linear(h, p["classifier.0.weight"], p["classifier.0.bias"]))
    h = h * masks["classifier.2"] / 0.5
    logits = f.linear(h, p["classifier.3.weight"], p["classifier.3.bias"])
    ops = FunctionalOps(model)
    torch.testing.assert_close(ops.loss(p, (x, y, masks)), f.cross_entropy(logits, y))
    torch.testing.assert_close(ops.logits(p, x), model.eval()(x))


def test_dropout_whose_masks_are_not_elementwise_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout2d(0.5))
    with pytest.raises(ConfigError, match="Dropout2d; perfed-ray draws keyed masks"):
        sites(model, (4,))


@pytest.mark.parametrize("engine", ["grouped", "sequential"])
@pytest.mark.parametrize("name", ["fedavg", "perfedavg-hf", "ditto"])
def test_each_engines_evaluation_with_dropout_equals_vmaps(name, engine):
    """Personalisation steps apply their own draw's masks, in every evaluation path."""
    _assert_same(_scores(name, {}, engine, model="simple_cnn"), _vmaps(name, {}, "simple_cnn"))


@pytest.mark.slow
def test_a_run_with_dropout_gives_the_same_rows_whatever_the_placement_and_engine(
    ray_session, tmp_path
):
    """pfl-research's CNN on CIFAR-10 through Ray: two actors on the sequential engine,
    and one actor for all on the grouped engine, write the same numbers."""
    import perfed_ray

    tiny = {
        "dataset": "cifar10",
        "partition": "iid",
        "n_users": 40,  # users of 1,250 images, four trained and two scored
        "fraction": 0.1,
        "eval_users": 2,
        "sample_final_eval": True,
        "model": "simple_cnn",
        "algorithm": "fedavg",
        "rounds": 1,
        "tau": 2,
        "batch_size": 8,
        "final_eval_draws": 1,
        "personalise_steps": 2,
    }
    spread = perfed_ray.simulate(
        {**tiny, "users_per_actor": 20, "engine": "sequential"}, tmp_path / "a", progress=False
    )
    packed = perfed_ray.simulate(
        {**tiny, "users_per_actor": 40, "engine": "grouped"}, tmp_path / "b", progress=False
    )
    placed = [r.table("runs")[["n_actors", "engine"]].iloc[0].tolist() for r in (spread, packed)]
    assert placed == [[2, "sequential"], [1, "grouped"]]  # two placements, two engines
    for table, columns in (("rounds", ["train_loss"]), ("evals", ["loss_after", "acc_after"])):
        a, b = (r.table(table) for r in (spread, packed))
        keys = [k for k in ("round", "user", "draw") if k in a.columns]
        a, b = a.sort_values(keys), b.sort_values(keys)
        assert len(a) and len(a) == len(b)
        for column in columns:
            np.testing.assert_allclose(a[column], b[column], rtol=1e-4)


def test_a_cnns_users_are_scored_in_blocks_whose_activations_fit():
    """The MLP's blocks keep EVAL_SAMPLES test samples; simple_cnn's layers' outputs
    for a CIFAR-10 image (32x30x30 and 64x28x28 twice each, 64x14x14 three times: its
    pooling, dropout and flatten, then 128 three times and 10) bound its blocks."""
    from perfed_ray.learner import EVAL_BYTES, EVAL_SAMPLES
    from perfed_ray.models import activation_bytes

    mlp = build_model("mlp", (1, 28, 28), 10)
    assert activation_bytes(mlp, (784,)) == 4 * (80 + 80 + 60 + 60 + 10)
    assert EVAL_BYTES // activation_bytes(mlp, (784,)) > EVAL_SAMPLES
    cnn = build_model("simple_cnn", (3, 32, 32), 10)
    per_image = 4 * (2 * 32 * 30 * 30 + 2 * 64 * 28 * 28 + 3 * 64 * 14 * 14 + 3 * 128 + 10)
    assert activation_bytes(cnn, (3072,)) == per_image
    assert EVAL_BYTES // per_image < 400
