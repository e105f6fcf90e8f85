"""Server optimisers (Reddi et al. 2021, Algorithm 2; Hsu et al. 2019) against the
formulas written out on flat vectors, a user's own one by dotted path, and their state
in checkpoints: a FedAdam run killed and resumed, or rolled back when an actor holding
per-user state dies, gives the rows of a run left alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import killed_mid_round

import perfed_ray
from perfed_ray.analysis import OUTCOME, outcome
from perfed_ray.config import ConfigError, from_mapping
from perfed_ray.runtime.checkpoint import Checkpoint, RunStore
from perfed_ray.strategy import ServerState, Strategy

PLUGINS = Path(__file__).resolve().parent / "plugins"
W0 = np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32)
# The users' mean model in three rounds: moves of different sizes and signs, one
# coordinate that never moves.
AGGREGATES = [
    np.array([1.5, -1.2, 2.0, 0.0], dtype=np.float32),
    np.array([1.0, -0.4, 1.0, 0.0], dtype=np.float32),
    np.array([3.0, -0.5, 1.2, 0.0], dtype=np.float32),
]


class ServerSteps:
    """A strategy's server step driven by hand from W0: its state after each round."""

    def __init__(self, cfg, template) -> None:
        self.strategy = Strategy(cfg)
        self.state = dataclasses.replace(self.strategy.init(template), weights=W0)

    def next_model(self, weights, total, weight_sum) -> np.ndarray:
        state = dataclasses.replace(self.state, weights=weights)
        self.state = self.strategy.aggregate(1, state, total, weight_sum)
        return self.state.weights


def _server(values) -> ServerSteps:
    cfg = from_mapping({"algorithm": "fedavg", **values})
    return ServerSteps(cfg, {"w": torch.zeros(len(W0))})


def _rounds(server: ServerSteps, aggregates=AGGREGATES) -> list[np.ndarray]:
    """The global model after each round, each aggregate reported as a sum over 2 users."""
    w, out = W0, []
    for a in aggregates:
        w = server.next_model(w, 2.0 * a.astype(np.float64), 2.0)
        out.append(w)
    return out


def _close(got, expected) -> None:
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)


def test_fedavgm_is_heavy_ball_on_the_pseudo_gradient():
    got = _rounds(_server({"server_optimizer": "fedavgm", "fedavgm": {"lr": 0.7}}))
    w, b, expected = W0, 0.0, []
    for a in AGGREGATES:
        delta = a.astype(np.float64) - w
        b = 0.9 * b + delta  # b_1 = Delta_1
        w = np.float32(w + 0.7 * b)
        expected.append(w)
    _close(got, expected)


@pytest.mark.parametrize("name", ["fedadagrad", "fedadam", "fedyogi"])
def test_adaptive_optimisers_follow_algorithm_2(name):
    lr, b1, b2, tau = 0.05, 0.8, 0.9, 0.01
    values = {"lr": lr, "beta1": b1, "tau": tau} | ({} if name == "fedadagrad" else {"beta2": b2})
    got = _rounds(_server({"server_optimizer": name, name: values}))
    w, m, v, expected = W0, 0.0, tau**2, []  # m_{-1} = 0, v_{-1} = tau^2
    for a in AGGREGATES:
        delta = a.astype(np.float64) - w
        m = b1 * m + (1 - b1) * delta
        if name == "fedadagrad":
            v = v + delta**2
        elif name == "fedadam":
            v = b2 * v + (1 - b2) * delta**2
        else:
            v = v - (1 - b2) * delta**2 * np.sign(v - delta**2)
        w = np.float32(w + lr * m / (np.sqrt(v) + tau))
        expected.append(w)
    _close(got, expected)


def test_fedadam_first_round_by_hand_and_yogi_lowers_v_by_a_bounded_step():
    """One coordinate, Delta = 1: m = 0.1, v = 0.99 tau^2 + 0.01, a step of
    eta m / (sqrt(v) + tau), about eta; a still coordinate does not move. Yogi's v
    then meets a smaller Delta^2 and falls by (1 - beta_2) Delta^2, not Adam's
    (1 - beta_2) (v - Delta^2)."""
    server = _server({"server_optimizer": "fedadam"})
    [w] = _rounds(server, AGGREGATES[:1])
    v = 0.99 * 1e-6 + 0.01
    assert w[0] == pytest.approx(0.5 + 0.01 * 0.1 / (np.sqrt(v) + 1e-3), rel=1e-6)
    assert w[3] == 0.0
    expected_v = [v, 0.99e-6 + 0.01 * 0.04, 0.99e-6, 0.99e-6]
    np.testing.assert_allclose(server.state.optimizer["v"], expected_v, rtol=1e-5)
    yogi = _server({"server_optimizer": "fedyogi"})
    [w] = _rounds(yogi, AGGREGATES[:1])
    v1 = yogi.state.optimizer["v"][0]
    assert v1 == pytest.approx(1e-6 + 0.01)
    target = w + np.float32(0.05)
    yogi.next_model(w, target.astype(np.float64), 1.0)
    delta = np.float64(target[0]) - np.float64(w[0])  # 0.05 as float32 arithmetic has it
    assert yogi.state.optimizer["v"][0] == pytest.approx(v1 - 0.01 * delta**2, rel=1e-12)


def test_the_target_is_the_methods_server_update_of_the_aggregate():
    """pFedMe's server mixes w <- w + beta (mean - w); FedAvgM with lr 1 and no momentum
    then is that rule itself, and FedAdam's Delta is the mixed move."""
    mixed = {"algorithm": "pfedme", "pfedme": {"beta": 0.5}}
    template = {"w": torch.zeros(len(W0))}
    plain = ServerSteps(from_mapping(mixed), template)
    momentumless = ServerSteps(
        from_mapping({**mixed, "server_optimizer": "fedavgm", "fedavgm.momentum": 0.0}),
        template,
    )
    total = AGGREGATES[0].astype(np.float64)
    expected = W0 + 0.5 * (AGGREGATES[0] - W0)
    np.testing.assert_allclose(plain.next_model(W0, total, 1.0), expected, rtol=1e-6)
    np.testing.assert_allclose(momentumless.next_model(W0, total, 1.0), expected, rtol=1e-6)
    adam = ServerSteps(from_mapping({**mixed, "server_optimizer": "fedadam"}), template)
    adam.next_model(W0, total, 1.0)
    np.testing.assert_allclose(adam.state.optimizer["m"], 0.1 * (expected - W0), rtol=1e-6)


def test_a_users_own_server_optimiser_is_named_by_dotted_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    server = _server({"server_optimizer": "halfway:Halfway", "halfway": {"share": 0.25}})
    got = _rounds(server)
    w = W0
    for a, g in zip(AGGREGATES, got, strict=True):
        w = np.float32(w + 0.25 * (a - w))
        np.testing.assert_allclose(g, w, rtol=1e-6)
    assert server.state.optimizer["rounds"].tolist() == [3.0]
    with pytest.raises(ConfigError, match=r"halfway.share = 2.0 is out of range"):
        from_mapping({"server_optimizer": "halfway:Halfway", "halfway.share": 2})
    with pytest.raises(ConfigError, match=r"not a subclass of perfed_ray.optimizers.server.Serv"):
        from_mapping({"server_optimizer": "halfway:Setting"})


def test_checkpoints_keep_the_server_state_and_older_ones_still_load(tmp_path):
    store = RunStore(tmp_path, "r")
    store.folder.mkdir(parents=True)
    state = {"m": np.arange(4.0), "v": np.full(4, 0.5)}
    store.save(Checkpoint(3, ServerState(W0, state), {"rounds": 3}, 1.0, None, {}))
    loaded = store.load()
    assert set(loaded.server.optimizer) == {"m", "v"}
    for k, v in state.items():
        np.testing.assert_array_equal(loaded.server.optimizer[k], v)
        assert loaded.server.optimizer[k].dtype == np.float64
    np.testing.assert_array_equal(loaded.server.weights, W0)

    # A checkpoint from before server optimisers kept state: no server arrays.
    meta = '{"round": 3, "rows": {}, "wall_seconds": 1.0, "accuracy": null}'
    with open(store.folder / "checkpoint.npz", "wb") as file:
        np.savez(file, weights=W0, meta=np.array(meta))
    old = store.load()
    assert old.server.optimizer == {} and old.round == 3


RUN = {
    "dataset": "gaussian",
    "n_users": 6,
    "fraction": 0.5,
    "rounds": 7,
    "tau": 2,
    "beta": 0.2,
    "eval_every": 2,
    "checkpoint_every": 3,
    "final_eval_draws": 2,
    "users_per_actor": 3,
    "server_optimizer": "fedadam",
    "fedadam": {"lr": 0.05},
}


def _assert_same(out: Path, expected: dict[str, pd.DataFrame]) -> None:
    got = outcome(out)
    if not got["events"].empty:  # the roll-back's record is the only event
        assert set(got["events"]["kind"]) == {"actor-died"}
        got["events"] = expected["events"]
    for name in OUTCOME:
        pd.testing.assert_frame_equal(got[name], expected[name], check_exact=True, obj=name)


@pytest.mark.slow
def test_a_fedadam_run_killed_and_resumed_gives_the_same_rows(ray_session, tmp_path):
    reference = tmp_path / "reference"
    perfed_ray.simulate({**RUN, "algorithm": "fedavg"}, reference)
    # Killed in round 5: the checkpoint after round 3 holds moments that round 4 moved on.
    out, run_dir, saved = killed_mid_round(ray_session, {**RUN, "algorithm": "fedavg"}, tmp_path)
    assert saved.round == 3 and set(saved.server.optimizer) == {"m", "v"}
    # the moments saved are those of the same run's first 3 rounds, made whole
    short = perfed_ray.simulate({**RUN, "algorithm": "fedavg", "rounds": 3}, tmp_path / "short")
    after_3 = RunStore(tmp_path / "short", short.run_id).load()
    assert after_3.round == 3 and np.abs(after_3.server.optimizer["m"]).max() > 0
    for moment in ("m", "v"):
        got, expected = saved.server.optimizer[moment], after_3.server.optimizer[moment]
        np.testing.assert_array_equal(got, expected)
    perfed_ray.simulate(resume=run_dir)  # in this process: only the kill needs its own
    _assert_same(out, outcome(reference))


@pytest.mark.slow
def test_the_server_state_rolls_back_with_the_model(ray_session, tmp_path, monkeypatch):
    """APFL keeps per-user state (a model and a mixing weight), so an actor dying in
    round 5 rolls every actor back to the checkpoint of round 3; FedAdam's moments must
    go back there too."""
    values = {**RUN, "algorithm": "apfl", "engine": "fused"}
    perfed_ray.simulate(values, tmp_path / "reference")
    monkeypatch.setenv("PERFED_FAULT", "actor@5")  # actor 0 SIGKILLs itself in round 5
    perfed_ray.simulate(values, tmp_path / "rolled")
    _assert_same(tmp_path / "rolled", outcome(tmp_path / "reference"))
    died = pd.read_parquet(tmp_path / "rolled" / "events").query("kind == 'actor-died'")
    assert died[["round", "actor"]].values.tolist() == [[5, 0]]
    assert "rolled back to the checkpoint of round 3" in died["detail"].iloc[0]


@pytest.mark.slow
def test_a_users_own_server_optimiser_runs_and_its_state_is_checkpointed(
    ray_session, tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(PLUGINS))
    values = {**RUN, "algorithm": "fedavg", "rounds": 3, "server_optimizer": "halfway:Halfway"}
    del values["fedadam"]
    result = perfed_ray.simulate({**values, "halfway": {"share": 0.25}}, tmp_path)
    assert result.table("runs")["status"].tolist() == ["finished"]
    assert result.table("rounds")["halfway.share"].eq(0.25).all()  # its own column
    saved = RunStore(tmp_path, result.run_id).load()
    assert saved.server.optimizer["rounds"].tolist() == [3.0]
