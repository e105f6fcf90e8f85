"""Plug-ins' own keyed streams (perfed_ray.seeding.PluginStream): the same name gives the
same draws in any process, and no plug-in's key can be a built-in purpose's."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from perfed_ray.seeding import (
    PluginStream,
    Stream,
    numpy_rng,
    stream_seed,
    stream_seeds,
    torch_generator,
)

NOISE = PluginStream("dp_mean.noise")


def test_a_plugin_stream_draws_the_same_in_another_process():
    here = numpy_rng(7, NOISE, 3).normal(size=4).tolist()
    code = (
        "from perfed_ray.seeding import PluginStream, numpy_rng;"
        "print(numpy_rng(7, PluginStream('dp_mean.noise'), 3).normal(size=4).tolist())"
    )
    # another interpreter has another hash() salt: the key must not depend on it
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert there.strip() == str(here)
    first, again = torch_generator(7, NOISE, 3), torch_generator(7, NOISE, 3)
    assert torch.equal(torch.rand(5, generator=first), torch.rand(5, generator=again))


def test_plugin_keys_never_are_built_in_ones():
    words = NOISE.words
    assert len(words) == 5 and words[0] > max(Stream)  # a purpose word no built-in has
    seeds = {stream_seed(1, s, r) for s in Stream for r in range(50)}
    mine = {stream_seed(1, NOISE, r) for r in range(50)}
    assert len(mine) == 50 and not seeds & mine
    other = {stream_seed(1, PluginStream("dp_mean.noise2"), r) for r in range(50)}
    assert not other & mine


def test_the_vectorised_seeds_take_plugin_streams_too():
    keys = np.array([[0, 1], [5, 9], [2**32 - 1, 3]])
    assert stream_seeds(4, NOISE, keys).tolist() == [stream_seed(4, NOISE, *k) for k in keys]


def test_a_plugin_stream_needs_a_name():
    with pytest.raises(ValueError, match="needs a name"):
        PluginStream("")
