"""Shared fixtures: one real local Ray for the whole session, the real data root."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Tests and CI read the verified copies in ../shared/data unless told otherwise; made
# absolute, because tests run the CLI from other working directories.
os.environ["PERFED_DATA"] = str(
    Path(os.environ.get("PERFED_DATA", REPO.parent / "shared" / "data")).resolve())


@pytest.fixture(scope="session")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def mnist():
    """The real MNIST arrays, loaded once."""
    from perfed_ray.data import load_dataset

    return load_dataset("mnist", None, False, 0)
