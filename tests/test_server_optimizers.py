"""Server optimisers (Reddi et al. 2021) against their equations written out by hand,
a user's own as a plug-in, and FedAdam's moments surviving a killed driver."""

from __future__ import annotations

import signal

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import run_cli

from perfed_ray.analysis import OUTCOME, outcome
from perfed_ray.config import ConfigError, from_mapping
from perfed_ray.registry import SERVER_OPTIMIZERS
from perfed_ray.runtime import simulation

W = np.array([1.0, -2.0, 0.5], np.float32)
TARGETS = [np.array([0.5, -1.0, 0.5], np.float32), np.array([0.0, -1.5, 1.0], np.float32)]


def _steps(name: str, **section) -> list[np.ndarray]:
    optimizer = SERVER_OPTIMIZERS.load(name)(
        from_mapping({"server_optimizer": name, name: section})
    )
    w, state, out = W, optimizer.init(W), []
    for target in TARGETS:
        w, state = optimizer.step(w, target, state)
        out.append(np.asarray(w, np.float64))
    return out


def test_mean_is_the_target_and_fedavgm_is_heavy_ball_on_the_move():
    assert [np.array_equal(a, b) for a, b in zip(_steps("mean"), TARGETS, strict=True)] == [
        True
    ] * 2
    got = _steps("fedavgm", lr=0.5, momentum=0.9)
    d1 = TARGETS[0] - W
    w1 = W + 0.5 * d1
    v2 = 0.9 * d1 + (TARGETS[1] - w1)
    np.testing.assert_allclose(got, [w1, w1 + 0.5 * v2], rtol=1e-6)


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_adaptive_server_optimisers_follow_algorithm_2(name):
    lr, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    got = _steps(name, lr=lr, beta1=b1, beta2=b2, tau=tau)
    w, m, v, want = W.astype(np.float64), 0.0, np.full(3, tau**2), []
    for target in TARGETS:
        d = target - w
        m = b1 * m + (1 - b1) * d
        if name == "fedadam":
            v = b2 * v + (1 - b2) * d * d
        elif name == "fedyogi":
            v = v - (1 - b2) * d * d * np.sign(v - d * d)
        else:
            v = v + d * d
        w = w + lr * m / (np.sqrt(v) + tau)
        want.append(w)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_users_own_server_optimiser_is_a_plugin(tmp_path, monkeypatch):
    (tmp_path / "halfway.py").write_text(
        "from perfed_ray.optimizers.server import ServerOptimizer\n"
        "from perfed_ray.settings import Setting\n\n\n"
        "class Halfway(ServerOptimizer):\n"
        "    settings = {'share': Setting(0.5, 'how far to move', low=0, high=1)}\n\n"
        "    def step(self, weights, target, state):\n"
        "        return weights + self.options['share'] * (target - weights), state\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = from_mapping({"server_optimizer": "halfway:Halfway", "halfway.share": 0.25})
    optimizer = SERVER_OPTIMIZERS.load(cfg.server_optimizer)(cfg)
    np.testing.assert_allclose(optimizer.step(W, TARGETS[0], {})[0], W + 0.25 * (TARGETS[0] - W))
    with pytest.raises(ConfigError, match=r"not a subclass of perfed_ray\.optimizers\.server"):
        from_mapping({"server_optimizer": "halfway:Setting"})


FEDADAM = {
    "dataset": "gaussian",
    "n_users": 4,
    "fraction": 0.5,
    "rounds": 8,
    "eval_every": 2,
    "checkpoint_every": 3,
    "tau": 2,
    "beta": 0.2,
    "users_per_actor": 2,
    "algorithm": "fedavg",
    "server_optimizer": "fedadam",
    "fedadam": {"lr": 0.05},
    "final_eval_draws": 2,
}


def test_fedadam_killed_and_resumed_gives_the_rows_of_a_run_left_alone(ray_session, tmp_path):
    alone = tmp_path / "alone"
    simulation.run(simulation.prepare(from_mapping(FEDADAM)), alone)
    address = ray_session.get_runtime_context().gcs_address
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(FEDADAM))
    out = tmp_path / "killed"
    killed = run_cli([str(config), "--out", str(out)], address, fault="driver-round@5")
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # after checkpoint 3
    [run_dir] = (out / "checkpoints").iterdir()
    done = run_cli(["--resume", str(run_dir)], address)
    assert done.returncode == 0, done.stderr
    want, got = outcome(alone), outcome(out)
    for name in OUTCOME:
        pd.testing.assert_frame_equal(got[name], want[name], check_exact=True, obj=name)
    plain = tmp_path / "mean"
    simulation.run(simulation.prepare(from_mapping({**FEDADAM, "server_optimizer": "mean"})), plain)
    assert not outcome(plain)["rounds"]["train_loss"].equals(want["rounds"]["train_loss"])
