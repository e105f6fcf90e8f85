"""experiments/reproduction/pfedme_authors.py: the stand-in for OpenML's MNIST, and (where
a checkout of the authors' repository and their environment are on this machine) their
code run for two rounds. Nothing is downloaded."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "experiments" / "reproduction" / "pfedme_authors.py"
CHECKOUT = Path(os.environ.get("PFEDME_CHECKOUT", "/tmp/pfedme"))
ENV = Path(os.environ.get("PFEDME_ENV", "/tmp/authors-env"))


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("pfedme_authors", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_openml_stand_in_is_mnist_in_openmls_order(script, mnist):
    data, target = script.openml_frames(Path(os.environ["PERFED_DATA"]) / "MNIST" / "raw")
    assert data.shape == (70_000, 784) and (data.dtypes == np.float64).all()
    assert list(data.columns[:2]) == ["pixel1", "pixel2"] and target.name == "class"
    assert list(target.cat.categories) == [str(i) for i in range(10)]
    pixels = data.to_numpy()
    assert np.array_equal(pixels[:60_000], mnist.x_train) and np.array_equal(
        pixels[60_000:], mnist.x_test
    )
    assert (target.astype(str).astype(int).to_numpy() == np.r_[mnist.y_train, mnist.y_test]).all()


def _tiny_leaf(folder: Path, users: int = 5) -> None:
    """Their MNIST layout (data/Mnist/data/{train,test}/*.json) with a few users."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 30), ("test", 10)):
        (folder / split).mkdir(parents=True, exist_ok=True)
        names = [f"f_{u:05d}" for u in range(users)]
        content = {
            "users": names,
            "num_samples": [n] * users,
            "user_data": {
                name: {
                    "x": rng.normal(size=(n, 784)).round(3).tolist(),
                    "y": rng.integers(0, 10, n).astype(float).tolist(),
                }
                for name in names
            },
        }
        (folder / split / f"mnist_{split}.json").write_text(json.dumps(content))


@pytest.mark.slow
@pytest.mark.skipif(
    not (CHECKOUT / "main.py").is_file() or not (ENV / "bin" / "python").is_file(),
    reason="no checkout of CharlieDinh/pFedMe ($PFEDME_CHECKOUT) or no authors' environment "
    "($PFEDME_ENV): see experiments/reproduction/pfedme_authors.py",
)
def test_their_code_runs_two_rounds_and_its_curves_are_kept(script, tmp_path):
    work = tmp_path / "work"
    script.prepare_work(CHECKOUT, work)
    _tiny_leaf(work / script.DATA_FOLDER)
    results = tmp_path / "results"
    args = ["--checkout", str(CHECKOUT), "--env", str(ENV), "--work", str(work)]
    args += ["--rounds", "2", "--times", "1", "--results", str(results)]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "train", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr + run.stdout
    curves = pd.read_parquet(results / "pfedme_curves.parquet")
    assert set(curves["model"]) == {"pFedMe", "pFedMe_p"} and len(curves) == 4
    assert curves["test_acc"].between(0, 1).all()
    made = subprocess.run(
        [sys.executable, str(SCRIPT), "summary", "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0 and "| pFedMe_p | 0 |" in (results / "summary.md").read_text()
    best = pd.read_parquet(results / "pfedme_best.parquet").set_index("model")
    assert (
        best.loc["pFedMe_p", "best_accuracy"]
        == 100 * curves.query("model == 'pFedMe_p'")["test_acc"].max()
    )
