"""Shards made on demand within a byte budget: the same numbers with any budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY

import perfed_ray
from perfed_ray.analysis import outcome
from perfed_ray.config import from_mapping
from perfed_ray.data.cache import ShardCache, shard_bytes
from perfed_ray.runtime import simulation

GENERATED = {
    "dataset": "synthetic",
    "partition": "natural",
    "n_users": 12,
    "fraction": 0.5,
    "rounds": 4,
    "eval_every": 2,
    "tau": 3,
    "beta": 0.05,
    "final_eval_draws": 2,
    "algorithm": "pfedme",  # per-user state beside the shards
    "pfedme.steps": 2,
}


def test_the_cache_keeps_the_most_recent_shards_within_its_budget():
    prepared = simulation.prepare(from_mapping(GENERATED))
    source = prepared.source(list(range(12)))
    one = shard_bytes(source.shards([0], torch.device("cpu"), None)[0])
    cache = ShardCache(source, range(12), torch.device("cpu"), None, budget_bytes=3 * one)
    for u in (0, 1, 0, 2, 3, 4):
        assert torch.equal(
            cache[u].x_train, source.shards([u], torch.device("cpu"), None)[u].x_train
        )
    assert cache.bytes <= 3 * one + max(shard_bytes(s) for s in cache.kept.values())
    assert 0 not in cache.kept and 4 in cache.kept  # least recently used went first
    assert cache.made == 5  # user 0's second use was a hit
    tiny = ShardCache(source, range(12), torch.device("cpu"), None, budget_bytes=1)
    tiny[5], tiny[6]
    assert list(tiny.kept) == [6]  # over budget alone: the shard in use is kept
    with pytest.raises(KeyError):
        tiny[12]  # not hosted here


@pytest.mark.slow
@pytest.mark.parametrize(
    "values",
    [GENERATED, {**TINY, "n_users": 8, "algorithm": "ditto", "data_transport": "data_root"}],
    ids=["generated", "partitioned"],
)
def test_results_do_not_depend_on_the_shard_budget(ray_session, tmp_path, values):
    """All shards kept, against a budget smaller than one user's shard (every use
    makes the shard again), with per-user state kept beside them."""
    perfed_ray.simulate({**values, "shard_cache_mb": "all"}, tmp_path / "all")
    perfed_ray.simulate({**values, "shard_cache_mb": 1e-6}, tmp_path / "tiny")
    kept, tiny = outcome(tmp_path / "all"), outcome(tmp_path / "tiny")
    # every round and evaluation is there to compare (rounds 1-4, evaluations 0, 2, 4)
    assert sorted(kept["rounds"]["round"]) == [1, 2, 3, 4]
    assert set(kept["evals"]["round"]) == {0, 2, 4}
    for table in ("rounds", "evals"):
        drop = ["run_id", "shard_cache_mb"]
        left = kept[table].drop(columns=drop, errors="ignore")
        right = tiny[table].drop(columns=drop, errors="ignore")
        assert left.equals(right), table


def test_the_state_store_keeps_each_users_row_on_disk():
    from perfed_ray.states import StateStore

    store = StateStore(range(100, 110))
    assert store.get(103) is None and len(store) == 0
    store.put(103, np.arange(4, dtype=np.float32))
    store.put(101, np.ones(4, dtype=np.float32))
    store.put(103, np.full(4, 2.5, dtype=np.float32))
    assert np.array_equal(store.get(103), np.full(4, 2.5, dtype=np.float32))
    assert [u for u, _ in store.items()] == [101, 103]
    assert isinstance(store.array, np.memmap) and store.array.shape == (10, 4)
    listed = StateStore([7, 3, 9])  # blocks that are not ranges
    listed.put(9, np.zeros(2, dtype=np.float32))
    assert [u for u, _ in listed.items()] == [9]
