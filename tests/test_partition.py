"""Partitioners on the real MNIST labels: the protocol's counts, disjointness, seeding."""

from __future__ import annotations

import numpy as np
import pytest

from perfed_ray.config import from_mapping, revise
from perfed_ray.data import DataError, partition


def _class_counts(labels: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return np.bincount(labels[idx], minlength=10)


def _assert_disjoint(users, attr: str) -> None:
    sets = [getattr(u, attr) for u in users]
    joined = np.concatenate(sets)
    assert len(np.unique(joined)) == len(joined)


def test_paper_split_has_the_protocol_counts(mnist):
    users = partition(from_mapping({"dataset": "mnist", "paper_a": 196}), mnist)
    assert len(users) == 50
    for u in users:
        train = _class_counts(mnist.y_train, u.train)
        test = _class_counts(mnist.y_test, u.test)
        if u.user < 25:
            assert u.group == "A"
            assert train.tolist() == [196] * 5 + [0] * 5
            assert test.tolist() == [32] * 5 + [0] * 5
        else:
            assert u.group == "B"
            j = (u.user - 25) % 5
            want = np.zeros(10, dtype=int)
            want[j], want[5 + j] = 98, 392
            assert train.tolist() == want.tolist()
            want_test = np.zeros(10, dtype=int)
            want_test[j], want_test[5 + j] = 16, 64
            assert test.tolist() == want_test.tolist()
    _assert_disjoint(users, "train")
    _assert_disjoint(users, "test")


def test_paper_diff_drops_group_b_minority_class(mnist):
    cfg = from_mapping({"dataset": "mnist", "partition": "paper-diff", "paper_a": 196})
    users = partition(cfg, mnist)
    for u in users[25:]:
        j = (u.user - 25) % 5
        counts = _class_counts(mnist.y_train, u.train)
        assert counts[j] == 0 and counts[5 + j] == 392 and counts.sum() == 392
    assert _class_counts(mnist.y_train, users[0].train).tolist() == [196] * 5 + [0] * 5


def test_same_seed_same_split_other_seed_other_split(mnist):
    cfg = from_mapping({"dataset": "mnist", "paper_a": 196})
    a, b = partition(cfg, mnist), partition(cfg, mnist)
    c = partition(revise(cfg, seed=1), mnist)
    assert all(
        np.array_equal(x.train, y.train) and np.array_equal(x.test, y.test)
        for x, y in zip(a, b, strict=True)
    )
    assert not np.array_equal(a[0].train, c[0].train)


@pytest.mark.parametrize(
    "extra", [{"partition": "iid"}, {"partition": "dirichlet", "dirichlet_alpha": 0.3}]
)
def test_iid_and_dirichlet_are_disjoint_and_share_out_everything(mnist, extra):
    users = partition(from_mapping({"dataset": "mnist", "n_users": 20, **extra}), mnist)
    _assert_disjoint(users, "train")
    _assert_disjoint(users, "test")
    assert sum(len(u.train) for u in users) == len(mnist.y_train)
    assert sum(len(u.test) for u in users) == len(mnist.y_test)
    assert min(len(u.train) for u in users) >= 40
    mixes = np.array([_class_counts(mnist.y_train, u.train) / len(u.train) for u in users])
    spread = mixes.std(axis=0).mean()
    if extra["partition"] == "iid":
        assert spread < 0.01
    else:
        assert spread > 0.05


def test_dirichlet_gives_every_user_a_test_image(mnist):
    """Dirichlet(0.3) over 1,000 users (the asynchronous experiment's split): seed 1's
    first draw left a user no test image, so its evaluation failed; the draw is
    resampled until every user has one, and a first draw that passes is kept."""
    values = {"dataset": "mnist", "partition": "dirichlet", "dirichlet_alpha": 0.3}
    cfg = from_mapping({**values, "n_users": 1000, "batch_size": 5, "seed": 1})
    assert min(len(u.test) for u in partition(cfg, mnist)) >= 1
    twenty = from_mapping({**values, "n_users": 20})  # passes at once: the same split
    assert [len(u.test) for u in partition(twenty, mnist)] == [
        len(u.test) for u in partition(twenty, mnist)
    ]


def test_too_many_users_for_the_paper_split_is_a_clear_error(mnist):
    pattern = r"training set has \d+ samples of class 0, but the partition needs .*lower n_users"
    with pytest.raises(DataError, match=pattern):
        partition(from_mapping({"dataset": "mnist", "n_users": 200, "paper_a": 196}), mnist)


def test_labels_gives_each_user_its_classes_and_shares_each_class_out_whole(mnist):
    """pFedMe's split: user u holds classes u and u + 1 (mod 10), every sample of the
    training set goes to someone, sizes differ between users and the test shards
    follow the training shards' class mix."""
    cfg = from_mapping({"dataset": "mnist", "partition": "labels", "n_users": 20})
    users = partition(cfg, mnist)
    _assert_disjoint(users, "train")
    _assert_disjoint(users, "test")
    assert sum(len(u.train) for u in users) == len(mnist.y_train)
    for u in users:
        train = _class_counts(mnist.y_train, u.train)
        assert set(np.flatnonzero(train)) == {u.user % 10, (u.user + 1) % 10}
        test = _class_counts(mnist.y_test, u.test)
        assert set(np.flatnonzero(test)) <= set(np.flatnonzero(train))
    assert len({len(u.train) for u in users}) > 10
    with pytest.raises(DataError, match="labels_per_user = 11 must be between 1 and the 10"):
        partition(from_mapping({**cfg.to_dict(), "labels_per_user": 11}), mnist)


def test_shards_deal_each_user_its_shards_and_matching_test_shards(cifar10):
    """FedRep's CIFAR-10 split: 100 users x 2 shards of 250 training images, each user's
    100 test images drawn from the classes of its shards, 50 per shard."""
    cfg = from_mapping({"dataset": "cifar10", "partition": "shards", "n_users": 100})
    users = partition(cfg, cifar10)
    assert len(users) == 100
    dealt = np.zeros(10, dtype=int)
    for u in users:
        train = _class_counts(cifar10.y_train, u.train)
        test = _class_counts(cifar10.y_test, u.test)
        assert train.sum() == 500 and test.sum() == 100
        assert set(np.flatnonzero(train)) == set(np.flatnonzero(test))
        assert (train % 250 == 0).all() and (test == train // 5).all()
        dealt += train // 250
    assert dealt.tolist() == [20] * 10  # every shard of every class dealt once
    _assert_disjoint(users, "train")
    _assert_disjoint(users, "test")
    other = partition(from_mapping({**cfg.to_dict(), "seed": 1}), cifar10)
    assert any((a.train != b.train).any() for a, b in zip(users, other, strict=True))


def test_shards_that_do_not_divide_among_the_classes_are_a_clear_error(mnist):
    cfg = from_mapping({"dataset": "mnist", "partition": "shards", "n_users": 7})
    with pytest.raises(DataError, match="multiple of 10"):
        partition(cfg, mnist)
