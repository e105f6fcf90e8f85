"""Partitioners: which samples of a data set belong to which user.

Every partitioner but `natural` only decides a count matrix, how many samples
of each class each user gets (for train and for test); one function then draws
the samples, without replacement and with a seeded generator, so users' shards
are disjoint by construction whatever the partitioner. `natural` returns the
users that a data set split by user brings (`leaf`), exactly as its files have them.

- `paper`: Section 5 and Appendix I (Table 2) as `PROTOCOL.md` fixes it.
- `paper-diff`: the "diff. hetero." row of Table 1.
- `iid`: every user the same class mix, the whole data set shared out.
- `dirichlet`: class proportions over users drawn from Dir(concentration)
  (Hsu et al. 2019), the test set split with the same proportions.
- `labels`: `labels_per_user` classes per user in random amounts, pFedMe's MNIST
  split (Dinh et al. 2020).
- `shards`: `labels_per_user` equal shards of one class each per user, the
  "pathological" split of McMahan et al. 2017 as FedRep's and LG-FedAvg's authors make it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfed_ray.config.schema import RunConfig
from perfed_ray.data.datasets import DataArrays, DataError, paper_a
from perfed_ray.seeding import Stream, numpy_rng


@dataclass(frozen=True)
class UserIndices:
    """One user's disjoint train and test index sets and the group it belongs to."""

    user: int
    group: str
    train: np.ndarray
    test: np.ndarray


@dataclass(frozen=True)
class Counts:
    """Per-user, per-class sample counts for train and test, and each user's group."""

    train: np.ndarray  # int [n_users, n_classes]
    test: np.ndarray
    groups: list[str]


def paper_counts(n_users: int, a: int, a_test: int, n_classes: int, diff: bool) -> Counts:
    """Table 2: group A (users 0..n/2-1) get `a` of each class 0-4; user u of group B
    gets a/2 of class j = (u - n/2) mod 5 and 2a of class 5 + j (only the 2a with `diff`).
    """
    half = n_classes // 2

    def matrix(per: int) -> np.ndarray:
        counts = np.zeros((n_users, n_classes), dtype=np.int64)
        split = n_users // 2
        counts[:split, :half] = per
        for u in range(split, n_users):
            j = (u - split) % half
            counts[u, j] = 0 if diff else per // 2
            counts[u, half + j] = 2 * per
        return counts

    groups = ["A" if u < n_users // 2 else "B" for u in range(n_users)]
    return Counts(matrix(a), matrix(a_test), groups)


def proportional_counts(proportions: np.ndarray, class_totals: np.ndarray) -> np.ndarray:
    """Share each class's samples among users by `proportions` [users, classes]
    (columns sum to one), rounding by largest remainder so no sample is lost."""
    exact = proportions * class_totals[None, :]
    counts = np.floor(exact).astype(np.int64)
    for c in range(counts.shape[1]):
        short = int(class_totals[c] - counts[:, c].sum())
        if short:
            counts[np.argsort(counts[:, c] - exact[:, c], kind="stable")[:short], c] += 1
    return counts


def _class_totals(labels: np.ndarray, n_classes: int) -> np.ndarray:
    return np.bincount(labels, minlength=n_classes).astype(np.int64)


def draw_disjoint(
    labels: np.ndarray,
    counts: np.ndarray,
    rng: np.random.Generator,
    split: str,
    dataset: str,
    fix: str,
) -> list[np.ndarray]:
    """Draw counts[u, c] samples of class c for every user u, without replacement."""
    n_users, n_classes = counts.shape
    chosen: list[list[np.ndarray]] = [[] for _ in range(n_users)]
    for c in range(n_classes):
        pool = np.flatnonzero(labels == c)
        need = int(counts[:, c].sum())
        if need and not len(pool):
            raise DataError(
                f"{dataset} {split} set has no samples of class {c}, but the "
                f"partition needs classes 0 to {n_classes - 1}: the data files "
                f"are incomplete or not {dataset}; replace them"
            )
        if need > len(pool):
            raise DataError(
                f"{dataset} {split} set has {len(pool)} samples of class {c}, but "
                f"the partition needs {need}: {fix}"
            )
        pool = rng.permutation(pool)
        ends = np.cumsum(counts[:, c])
        for u in range(n_users):
            chosen[u].append(pool[ends[u] - counts[u, c] : ends[u]])
    return [np.sort(np.concatenate(parts)) for parts in chosen]


def _paper_split(cfg: RunConfig, data: DataArrays, diff: bool) -> Counts:
    a = cfg.paper_a or paper_a(data.name)
    a_test = a * len(data.y_test) // len(data.y_train)
    if data.n_classes < 10:
        raise DataError(
            f"partition {cfg.partition!r} needs 10 classes; {data.name} has "
            f"{data.n_classes}: use partition iid or dirichlet"
        )
    if a_test < 2:
        raise DataError(
            f"paper_a = {a} leaves {a_test} test images per class unit (a_test = "
            f"floor(a * N_test / N_train)); use a larger paper_a"
        )
    return paper_counts(cfg.n_users, a, a_test, data.n_classes, diff)


def paper(cfg: RunConfig, data: DataArrays, rng: np.random.Generator) -> Counts:
    """Table 2's split (Section 5, Appendix I)."""
    return _paper_split(cfg, data, diff=False)


def paper_diff(cfg: RunConfig, data: DataArrays, rng: np.random.Generator) -> Counts:
    """Table 1's "diff. hetero." row: group B without its classes 0-4."""
    return _paper_split(cfg, data, diff=True)


def natural(cfg: RunConfig, data: DataArrays, rng: np.random.Generator) -> list[UserIndices]:
    """The data set's own users, in its order, each its index ranges: those of a data
    set split by user (`leaf`). Generated data sets (synthetic) make theirs in the
    actors and never come here."""
    if not data.users:
        raise DataError(
            f"partition natural keeps the users of a data set split by user (leaf) or "
            f"generated (synthetic); {data.name} is a plain data set: use paper, iid or dirichlet"
        )
    if cfg.n_users != len(data.users):
        raise DataError(
            f"n_users = {cfg.n_users}, but the folder holds {len(data.users)} users: "
            f"set n_users: {len(data.users)}"
        )
    return [
        UserIndices(u, "all", np.arange(*own.train), np.arange(*own.test))
        for u, own in enumerate(data.users)
    ]


def iid(cfg: RunConfig, data: DataArrays, rng: np.random.Generator) -> Counts:
    """Every user the same class mix, the whole data set shared out."""
    proportions = np.full((cfg.n_users, data.n_classes), 1.0 / cfg.n_users)
    return _proportional(cfg, data, proportions)


def dirichlet(cfg: RunConfig, data: DataArrays, rng: np.random.Generator) -> Counts:
    """Class proportions over users from Dir(dirichlet_alpha) (Hsu et al. 2019)."""
    # Resampled until every user can fill a batch and has a test image to be scored on
    # (a draw that passes at once is kept, so earlier runs' splits do not change).
    for _ in range(100):
        proportions = rng.dirichlet(
            np.full(cfg.n_users, cfg.dirichlet_alpha), size=data.n_classes
        ).T
        counts = _proportional(cfg, data, proportions)
        if counts.train.sum(axis=1).min() >= cfg.batch_size and counts.test.sum(axis=1).min():
            return counts
    raise DataError(
        f"dirichlet partition with dirichlet_alpha = {cfg.dirichlet_alpha} keeps "
        f"leaving some of the {cfg.n_users} users fewer than batch_size = "
        f"{cfg.batch_size} training samples or no test sample: raise dirichlet_alpha or "
        f"lower n_users"
    )


def labels(cfg: RunConfig, data: DataArrays, rng: np.random.Generator) -> Counts:
    """`labels_per_user` classes per user, user u holding classes (u + j) mod C, each
    class shared among its holders in random sizes by the law of pFedMe's MNIST
    generator (Dinh et al. 2020, data/Mnist/generate_niid_20users.py): every holder but
    the last draws uniformly from [total / (holders + 1), total / 2) of what is left,
    the last takes the rest. Sizes are drawn on the training set and the test set is
    split in the same proportions (the generator pooled both and kept 75% to train)."""
    classes = data.n_classes
    if not 1 <= cfg.labels_per_user <= classes:
        raise DataError(
            f"labels_per_user = {cfg.labels_per_user} must be between 1 and the "
            f"{classes} classes of {data.name}"
        )
    holders = [
        [u for u in range(cfg.n_users) if (c - u) % classes < cfg.labels_per_user]
        for c in range(classes)
    ]
    proportions = np.zeros((cfg.n_users, classes))
    for c, users in enumerate(holders):
        left = 1.0
        for u in users[:-1]:
            share = rng.uniform(left / (len(users) + 1), left / 2)
            proportions[u, c], left = share, left - share
        if users:
            proportions[users[-1], c] = left
    return _proportional(cfg, data, proportions)


def shards(cfg: RunConfig, data: DataArrays, rng: np.random.Generator) -> Counts:
    """Each class cut into n_users * labels_per_user / classes equal shards; the shards'
    labels shuffled and dealt `labels_per_user` to a user (a user may hold two shards
    of one class); the test set cut into as many shards per class, each user getting
    the test shards of its train shards' labels. So FedRep's authors split CIFAR-10
    (lgcollins/FedRep, utils/sampling.py `noniid`, `--shard_per_user`): 100 users x 2
    shards give each user 500 training and 100 test images of at most two classes.
    Theirs spread a class's leftover samples (total mod shards) over its first shards;
    here they stay unused, so every shard of a class has the same size."""
    classes, per_user = data.n_classes, cfg.labels_per_user
    if (cfg.n_users * per_user) % classes:
        raise DataError(
            f"partition shards deals n_users x labels_per_user = {cfg.n_users} x "
            f"{per_user} shards over {classes} classes: make it a multiple of {classes}"
        )
    per_class = cfg.n_users * per_user // classes
    labels = rng.permutation(np.tile(np.arange(classes), per_class)).reshape(cfg.n_users, per_user)
    held = np.zeros((cfg.n_users, classes), dtype=np.int64)
    np.add.at(held, (np.repeat(np.arange(cfg.n_users), per_user), labels.ravel()), 1)
    train = held * (_class_totals(data.y_train, classes) // per_class)
    test = held * (_class_totals(data.y_test, classes) // per_class)
    return Counts(train, test, ["all"] * cfg.n_users)


def _proportional(cfg: RunConfig, data: DataArrays, proportions: np.ndarray) -> Counts:
    train = proportional_counts(proportions, _class_totals(data.y_train, data.n_classes))
    test = proportional_counts(proportions, _class_totals(data.y_test, data.n_classes))
    return Counts(train, test, ["all"] * cfg.n_users)


Partitioner = Callable[[RunConfig, DataArrays, np.random.Generator], Counts | list[UserIndices]]


def _drawn(data: DataArrays, counts: Counts, rng: np.random.Generator) -> list[UserIndices]:
    """Users whose samples are drawn to fill the counts."""
    fix = "lower n_users (or paper_a), or choose another partition"
    train = draw_disjoint(data.y_train, counts.train, rng, "training", data.name, fix)
    test = draw_disjoint(data.y_test, counts.test, rng, "test", data.name, fix)
    return [UserIndices(u, counts.groups[u], train[u], test[u]) for u in range(len(train))]


def partition(cfg: RunConfig, data: DataArrays) -> list[UserIndices]:
    """Split `data` among cfg.n_users users; the same seed gives the same split."""
    from perfed_ray.registry import PARTITIONERS

    need = cfg.n_users * cfg.batch_size
    if not data.users and need > len(data.y_train):  # said at once, before any per-user work
        raise DataError(
            f"{cfg.n_users} users of at least batch_size = {cfg.batch_size} training "
            f"samples each need {need} samples; the {data.name} training set has "
            f"{len(data.y_train)}: lower n_users or batch_size"
        )
    rng = numpy_rng(cfg.seed, Stream.PARTITION)
    partitioner: Partitioner = PARTITIONERS.load(cfg.partition)
    split = partitioner(cfg, data, rng)
    users = _drawn(data, split, rng) if isinstance(split, Counts) else split
    # A data set's own users are what they are: one smaller than a batch gets batches
    # of all its samples, filled up to batch_size (perfed_ray.data.batches.draw).
    small = [u for u in users if len(u.train) < cfg.batch_size]
    if small and isinstance(split, Counts):
        fix = "n_users"
        raise DataError(
            f"{len(small)} users (first: user {small[0].user}, "
            f"{len(small[0].train)} samples) have fewer training samples than "
            f"batch_size = {cfg.batch_size}: lower batch_size or {fix}"
        )
    return users
