"""On a GPU (skipped where there is none, as in CI): a round's batches are the CPU's,
to the bit, and its local updates the CPU's to float64's tolerance (in float32 the
GPU's kernels, TF32 convolutions among them, round otherwise: tests/test_engines.py
says why float64), for each engine that runs there. The GPU runs its own paths: the
bulk shuffle for every round, one block of all users in the fused engine, the grouped
convolution for the CNN."""

from __future__ import annotations

import pytest
import torch
from conftest import in_float64

from perfed_ray.config import from_mapping
from perfed_ray.learner import Learner
from perfed_ray.models import params_of
from perfed_ray.runtime import simulation

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _round(cfg, prepared, device: str, users: list[int]):
    """Round 3's batches (inputs and labels) and local updates of `users`, on `device`."""
    model = simulation.initial_model(cfg, prepared.source([])).to(device)
    shards = prepared.source(users).shards(users, torch.device(device), prepared.data)
    model, shards = in_float64(model, shards)
    learner = Learner(cfg, model, shards)
    x, y, *_ = learner.block_batches(users, 3)
    models, losses = learner.train(params_of(model), users, 3)
    return (x.cpu(), y.cpu()), {k: v.cpu() for k, v in models.items()}, losses.cpu()


@pytest.mark.parametrize(
    ("values", "users"),
    [
        ({"algorithm": "fedavg", "engine": "fused"}, 4),  # the CPU draws with randperm
        ({"algorithm": "fedavg", "engine": "fused", "local_epochs": 1}, 4),  # ragged users
        ({"algorithm": "perfedavg-hf", "engine": "fused"}, 24),  # both shuffle in bulk
        ({"algorithm": "perfedavg", "engine": "fused"}, 24),
        ({"algorithm": "ditto", "engine": "vmap"}, 6),
        ({"algorithm": "fedavg", "engine": "grouped", "model": "cnn", "tau": 2}, 5),
        ({"algorithm": "perfedavg-hf", "engine": "grouped", "model": "cnn", "tau": 2}, 5),
        ({"algorithm": "fedavg", "engine": "grouped", "model": "simple_cnn", "tau": 2}, 5),
    ],
)
def test_a_round_on_the_gpu_is_the_cpus(values, users):
    cfg = from_mapping({"n_users": 50, "tau": 4, **values})  # MNIST, the paper's split
    prepared = simulation.prepare(cfg)
    chosen = list(range(0, 2 * users, 2))
    batches_cpu, models_cpu, losses_cpu = _round(prepared.cfg, prepared, "cpu", chosen)
    batches_gpu, models_gpu, losses_gpu = _round(prepared.cfg, prepared, "cuda", chosen)
    assert all(map(torch.equal, batches_cpu, batches_gpu))
    torch.testing.assert_close(losses_gpu, losses_cpu)
    for name, value in models_cpu.items():
        torch.testing.assert_close(models_gpu[name], value)
