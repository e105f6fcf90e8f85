"""Synthetic(alpha, beta) and Synthetic-IID: the federated benchmarks of FedProx (Li et
al., MLSys 2020, Section 5.1 and its code's data/synthetic_*/ generators; LEAF's
"synthetic" is a different generator), made per user from (seed, user).

Synthetic(alpha, beta), user k: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k ~ N(u_k, 1)
(60 x 10), b_k ~ N(u_k, 1); v_k ~ N(B_k, 1) (60); x ~ N(v_k, diag(j^-1.2));
y = argmax(softmax(W_k^T x + b_k)). Synthetic-IID: one W, b ~ N(0, 1) for every user
(drawn from the seed alone) and v = 0. Sample counts follow a power law,
floor(lognormal(4, 2)) + 50; 80% of a user's samples train, 20% test (the paper's
split; the generators' code keeps 90%).

Because a user's data is a function of the seed and its id alone, each
actor generates its own users: 100,000 users cost no storage and no driver
memory, and a user's data do not depend on which actor hosts it.
"""

from __future__ import annotations

import numpy as np

from perfed_ray.data.datasets import Dataset
from perfed_ray.seeding import Stream, numpy_rng

FEATURES, CLASSES = 60, 10
TRAIN_FRACTION = 0.8
_SCALE = np.arange(1, FEATURES + 1) ** -0.6  # sqrt of diag(j^-1.2)


UserData = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _size(rng: np.random.Generator) -> int:
    """A user's sample count: the first draw of its stream, the power law."""
    return int(rng.lognormal(4, 2)) + 50


def train_size(seed: int, user: int) -> int:
    """A generated user's training-sample count, without generating its data (the
    driver's, for `sampling: samples`)."""
    return int(TRAIN_FRACTION * _size(numpy_rng(seed, Stream.DATA, user)))


def synthetic_user(seed: int, alpha: float, beta: float, user: int) -> UserData:
    """(x_train, y_train, x_test, y_test) of one Synthetic(alpha, beta) user, float32
    features."""
    rng = numpy_rng(seed, Stream.DATA, user)
    n = _size(rng)
    mean_w = rng.normal(0, alpha)
    b_mean = rng.normal(0, beta)
    centre = rng.normal(b_mean, 1, FEATURES)
    weights = rng.normal(mean_w, 1, (FEATURES, CLASSES))
    bias = rng.normal(mean_w, 1, CLASSES)
    return _labelled(centre + rng.normal(size=(n, FEATURES)) * _SCALE, weights, bias)


def synthetic_iid_user(seed: int, alpha: float, beta: float, user: int) -> UserData:
    """One Synthetic-IID user: the shared W, b (alpha and beta play no part)."""
    shared = numpy_rng(seed, Stream.SHARED_DATA)
    weights = shared.normal(0, 1, (FEATURES, CLASSES))
    bias = shared.normal(0, 1, CLASSES)
    rng = numpy_rng(seed, Stream.DATA, user)
    n = _size(rng)
    return _labelled(rng.normal(size=(n, FEATURES)) * _SCALE, weights, bias)


def _labelled(x: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> UserData:
    x = x.astype(np.float32)
    y = np.argmax(x @ weights + bias, axis=1).astype(np.int64)
    cut = int(TRAIN_FRACTION * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


SYNTHETIC = Dataset(load=None, files=False, generate=synthetic_user)
SYNTHETIC_IID = Dataset(load=None, files=False, generate=synthetic_iid_user)
