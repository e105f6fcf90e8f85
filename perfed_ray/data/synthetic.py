"""Synthetic(alpha, beta): the federated benchmark of FedProx (Li et al., MLSys 2020,
Section 5.1; LEAF's "synthetic"), generated per user from (seed, user).

User k: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k ~ N(u_k, 1) (60 x 10),
b_k ~ N(u_k, 1); v_k ~ N(B_k, 1) (60); x ~ N(v_k, diag(j^-1.2));
y = argmax(softmax(W_k^T x + b_k)). Sample counts follow a power law,
floor(lognormal(4, 2)) + 50; 80% of a user's samples train, 20% test.

Because a user's data is a function of the seed and its id alone, each
actor generates its own users: 100,000 users cost no storage and no driver
memory, and a user's data do not depend on which actor hosts it.
"""

from __future__ import annotations

import numpy as np

from perfed_ray.data.datasets import Dataset
from perfed_ray.seeding import Stream, numpy_rng

SYNTHETIC = Dataset(load=None, files=False)  # users generated inside the actors

FEATURES, CLASSES = 60, 10
TRAIN_FRACTION = 0.8
_SCALE = np.arange(1, FEATURES + 1) ** -0.6  # sqrt of diag(j^-1.2)


def synthetic_user(
    seed: int, alpha: float, beta: float, user: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) of one user, float32 features."""
    rng = numpy_rng(seed, Stream.DATA, user)
    n = int(rng.lognormal(4, 2)) + 50
    mean_w = rng.normal(0, alpha)
    b_mean = rng.normal(0, beta)
    centre = rng.normal(b_mean, 1, FEATURES)
    weights = rng.normal(mean_w, 1, (FEATURES, CLASSES))
    bias = rng.normal(mean_w, 1, CLASSES)
    x = (centre + rng.normal(size=(n, FEATURES)) * _SCALE).astype(np.float32)
    y = np.argmax(x @ weights + bias, axis=1).astype(np.int64)
    cut = int(TRAIN_FRACTION * n)
    return x[:cut], y[:cut], x[cut:], y[cut:]
