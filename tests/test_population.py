"""The simulated population: users' devices (a task's seconds), their availability (pure
functions of user and time), the samples each method's task is charged for, the bad
tables a run refuses, and FedScale's traces converted into tables."""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from test_bad_input import TINY_RUN, _run

from perfed_ray.cli import main
from perfed_ray.config import ConfigError, from_mapping, revise
from perfed_ray.learner import Learner
from perfed_ray.models import initial_model, params_of
from perfed_ray.population.availability import DAY
from perfed_ray.population.devices import Device, task_seconds
from perfed_ray.registry import AVAILABILITY, DEVICES
from perfed_ray.runtime import simulation


def _devices(values: dict):
    cfg = from_mapping({"fraction": 1.0, **values})
    return DEVICES.load(cfg.devices)(cfg)


def _availability(values: dict):
    cfg = from_mapping({"fraction": 1.0, **values})
    return AVAILABILITY.load(cfg.availability)(cfg)


# -- the samples a method's task is charged for -------------------------------------------


class CountingOps:
    """A method's model maths that counts the samples of every batch handed to it: the
    passes over data its local work really makes."""

    def __init__(self, ops) -> None:
        self.ops, self.samples = ops, 0

    def __getattr__(self, name: str):
        op = getattr(self.ops, name)

        def counted(*args):
            self.samples += sum(len(a[0]) for a in args if isinstance(a, tuple))
            return op(*args)

        return counted


BASE = {"dataset": "gaussian", "n_users": 4, "fraction": 1.0, "tau": 3, "batch_size": 7}
TASKS = [
    ("fedavg", {}, 1),
    ("local", {}, 1),
    ("fedprox", {}, 1),
    ("fedavg-ft", {}, 1),
    ("fedrep", {"fedrep.body_steps": 1}, 1),
    ("ditto", {}, 2),
    ("apfl", {}, 2),
    ("pfedme", {"pfedme.steps": 4}, 4),
    ("perfedavg-fo", {}, 2),
    ("perfedavg", {}, 3),
    ("perfedavg-hf", {}, 3),
    ("fedavg", {"local_epochs": 2}, 1),
    ("fedrep", {"local_epochs": 2, "fedrep.head_epochs": 1, "fedrep.body_epochs": 1}, 1),
    ("ditto", {"local_epochs": 1}, 2),
]


@pytest.mark.parametrize(
    ("name", "values", "passes"), TASKS, ids=[f"{n}-{sorted(v)}" for n, v, _ in TASKS]
)
def test_a_task_is_charged_for_the_samples_its_local_work_puts_through_the_model(
    name, values, passes
):
    """One user's round on the sequential engine, its model maths counted: the samples
    of every batch each pass receives add up to the method's task_samples, and to the
    passes a step (stated in its docstring) times its steps' batches."""
    cfg = from_mapping({**BASE, "algorithm": name, **values})
    prepared = simulation.prepare(revise(cfg, engine="sequential"))
    source = prepared.source([1])
    shards = source.shards([1], torch.device("cpu"), prepared.data)
    learner = Learner(prepared.cfg, initial_model(prepared.cfg, source), shards)
    counting = CountingOps(learner.engine.functional)
    learner.engine.functional = counting
    learner.train(params_of(learner.model), [1], round_=1)
    n_train = learner.n_train(1)
    steps = 3 if cfg.local_epochs is None else cfg.local_epochs * math.ceil(n_train / 7)
    assert counting.samples == learner.algorithm.task_samples(n_train) == passes * steps * 7


# -- devices ------------------------------------------------------------------------------


def test_a_task_takes_download_compute_and_upload_time():
    phone = Device(compute_ms_per_sample=20.0, download_kbps=8000.0, upload_kbps=2000.0)
    # 1 MB down at 8 Mbit/s: 1 s; 400 samples at 20 ms: 8 s; 0.5 MB up at 2 Mbit/s: 2 s
    assert task_seconds(phone, 1_000_000, 500_000, 400) == pytest.approx(11.0)


def test_equal_devices_are_the_configured_one_for_every_user():
    devices = _devices({"devices.compute_ms": 2.5, "devices.bandwidth_kbps": 4000, "n_users": 9})
    assert devices.device(8) == Device(2.5, 4000.0, 4000.0)
    many = devices.device_array(np.arange(9))
    assert (many.compute_ms_per_sample == 2.5).all() and (many.upload_kbps == 4000).all()


def test_a_tables_durations_are_the_formula_on_its_rows(tmp_path):
    rows = pd.DataFrame(
        {
            "user": [2, 0, 1],  # in any order
            "compute_ms_per_sample": [10.0, 1.5, 40.0],
            "download_kbps": [1000.0, 20000.0, 500.0],
            "upload_kbps": [250.0, 5000.0, 100.0],
        }
    )
    rows.to_parquet(tmp_path / "devices.parquet")
    rows.to_csv(tmp_path / "devices.csv", index=False)
    for name in ("devices.parquet", "devices.csv"):
        devices = _devices({"n_users": 3, "devices": "table", "devices.file": str(tmp_path / name)})
        seconds = task_seconds(devices.device_array(np.array([0, 1, 2])), 125_000, 62_500, 100)
        for user, row in rows.set_index("user").iterrows():
            expected = (
                125_000 * 8 / 1000 / row.download_kbps
                + 100 * row.compute_ms_per_sample / 1000
                + 62_500 * 8 / 1000 / row.upload_kbps
            )
            assert seconds[user] == pytest.approx(expected)
            assert task_seconds(devices.device(user), 125_000, 62_500, 100) == seconds[user]


def test_lognormal_devices_have_the_medians_and_spreads_asked_for():
    values = {
        "n_users": 100_000,
        "devices": "lognormal",
        "devices.compute_ms": 8.0,
        "devices.compute_sigma": 1.0,
        "devices.bandwidth_kbps": 3000.0,
        "devices.bandwidth_sigma": 0.5,
    }
    many = _devices(values).device_array(np.arange(100_000))
    compute, bandwidth = np.log(many.compute_ms_per_sample), np.log(many.download_kbps)
    # the standard error of a mean of 10^5 normals of sigma 1 is 0.003
    assert np.mean(compute) == pytest.approx(math.log(8.0), abs=0.015)
    assert np.std(compute) == pytest.approx(1.0, abs=0.015)
    assert np.mean(bandwidth) == pytest.approx(math.log(3000.0), abs=0.01)
    assert np.std(bandwidth) == pytest.approx(0.5, abs=0.01)
    assert abs(np.corrcoef(compute, bandwidth)[0, 1]) < 0.02  # drawn independently
    assert (many.upload_kbps == many.download_kbps).all()  # one link both ways
    other = _devices({**values, "seed": 1}).device_array(np.arange(100_000))
    assert not np.allclose(other.compute_ms_per_sample, many.compute_ms_per_sample)


def _in_another_process(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


def test_lognormal_devices_are_keyed_by_user_whatever_the_order_and_the_process():
    """The same draws asked for in two orders, and in another process that loads the
    population alone: which needs neither torch nor Ray."""
    values = {"n_users": 1000, "devices": "lognormal", "seed": 3}
    users = np.array([999, 5, 17, 5, 0])
    forwards = _devices(values).device_array(users).compute_ms_per_sample
    fresh = _devices(values)
    backwards = [fresh.device(int(u)).compute_ms_per_sample for u in users[::-1]]
    assert forwards.tolist() == backwards[::-1]
    assert forwards[1] == forwards[3]
    code = (
        "import sys\n"
        "from perfed_ray.population.devices import SETTINGS, DevicesHParams, LognormalDevices\n"
        "section = {k: s.default for k, s in SETTINGS.items()}\n"
        "hparams = DevicesHParams(section=section, seed=3, n_users=1000)\n"
        "print(repr(LognormalDevices(hparams).device(17).compute_ms_per_sample))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')))\n"
    )
    drawn, loaded = _in_another_process(code).splitlines()
    assert float(drawn) == forwards[2] and loaded == "[]"


# -- availability -------------------------------------------------------------------------


def test_always_online_users_are_online_for_good():
    always = _availability({"n_users": 5})
    assert always.online(4, 1e9) and always.online_until(4, 3.0) == math.inf
    assert always.next_online(2, 7.5) == 7.5


def test_diurnal_users_are_online_their_fraction_of_each_day_in_one_window():
    n = 20_000
    diurnal = _availability({"n_users": n, "availability": "diurnal", "availability.online": 0.3})
    users = np.arange(n)
    times = np.linspace(0, DAY, 97)[:-1]
    online = np.stack([diurnal.online_array(users, t) for t in times])
    assert online.mean() == pytest.approx(0.3, abs=0.005)  # of users and of times alike
    # the same window every day
    assert (online == np.stack([diurnal.online_array(users, t + 3 * DAY) for t in times])).all()
    # each user's online times one window: it goes off once a day at most
    assert ((online != np.roll(online, 1, axis=0)).sum(axis=0) <= 2).all()
    # windows open at all hours: users are spread over the day
    assert online.mean(axis=1).min() == pytest.approx(0.3, abs=0.03)
    t = 1234.5
    until, back = diurnal.online_until_array(users, t), diurnal.next_online_array(users, t)
    on = diurnal.online_array(users, t)
    assert (until[on] > t).all() and (until[on] <= t + 0.3 * DAY + 1e-6).all()
    assert (until[~on] == t).all() and (back[on] == t).all()
    assert not diurnal.online_array(users[on], until[on]).any()  # off at the window's end
    assert diurnal.online_array(users[~on], back[~on]).all()  # on when it opens
    assert not diurnal.online_array(users[~on], back[~on] - 1e-3).any()


def _intervals(tmp_path: Path, rows: list[tuple[int, float, float]], name="online.parquet"):
    path = tmp_path / name
    pd.DataFrame(rows, columns=["user", "start", "end"]).to_parquet(path)
    return str(path)


def test_table_availability_repeats_with_the_period(tmp_path):
    file = _intervals(
        tmp_path,
        [
            (0, 10, 20),
            (0, 50, 60),
            (0, 60, 70),  # touches the one before: one interval [50, 70)
            (1, 0, 5),
            (1, 90, 100),  # runs into [0, 5) of the next period
            (2, 0, 100),  # online for good
        ],
    )
    table = _availability(
        {
            "n_users": 3,
            "availability": "table",
            "availability.file": file,
            "availability.period": 100,
        }
    )
    for cycle in (0, 1, 7):
        base = 100.0 * cycle
        assert [table.online(0, base + s) for s in (9.9, 10, 19.9, 20, 55, 69.9, 70)] == [
            False,
            True,
            True,
            False,
            True,
            True,
            False,
        ]
        assert table.online_until(0, base + 12) == base + 20
        assert table.online_until(0, base + 52) == base + 70  # the touching ones are one
        assert table.online_until(0, base + 30) == base + 30  # offline: now
        assert table.next_online(0, base + 30) == base + 50
        assert table.next_online(0, base + 75) == base + 110  # the next period's first
        assert table.next_online(0, base + 5) == base + 10
        assert table.next_online(0, base + 15) == base + 15
        assert table.online_until(1, base + 95) == base + 105  # across the turn
        assert table.online_until(1, base + 2) == base + 5
        assert table.next_online(1, base + 50) == base + 90
        assert table.online_until(2, base + 42) == math.inf
    users = np.array([0, 1, 2, 0, 1])
    times = np.array([15.0, 3.0, 7.0, 275.0, 250.0])
    assert table.online_array(users, times).tolist() == [True, True, True, False, False]
    assert table.next_online_array(users, times).tolist() == [15.0, 3.0, 7.0, 310.0, 290.0]


def test_answers_do_not_depend_on_the_order_of_the_questions(tmp_path):
    """FedScale's is_active moves an index with each question; here two orders of the
    same questions, each to a fresh model and to one already asked, answer the same."""
    rng = np.random.default_rng(0)
    n = 50
    rows = [
        (u, s, s + rng.uniform(1, 3000))
        for u in range(n)
        for s in np.sort(rng.choice(np.arange(0, 80000, 4000), size=3, replace=False))
    ]
    file = _intervals(tmp_path, rows)
    for values in (
        {"availability": "diurnal"},
        {"availability": "table", "availability.file": file},
    ):
        model = _availability({"n_users": n, **values})
        users = rng.integers(0, n, 400)
        times = rng.uniform(0, 5 * DAY, 400)
        order = rng.permutation(400)
        for ask in ("online", "online_until", "next_online"):
            one_by_one = [getattr(model, ask)(int(u), t) for u, t in zip(users, times, strict=True)]
            again = _availability({"n_users": n, **values})
            shuffled = getattr(again, f"{ask}_array")(users[order], times[order])
            assert np.array_equal(shuffled, np.array(one_by_one)[order]), (values, ask)
            assert np.array_equal(getattr(model, f"{ask}_array")(users, times), one_by_one)


# -- bad input ----------------------------------------------------------------------------

DEVICE_ROWS = {
    "user": [0, 1, 2],
    "compute_ms_per_sample": [1.0, 2.0, 3.0],
    "download_kbps": [100.0, 200.0, 300.0],
    "upload_kbps": [10.0, 20.0, 30.0],
}


def _bad_tables(tmp_path: Path) -> list[tuple[dict, str]]:
    """(configuration, the one line it must be refused with) for each bad table."""

    def devices(name: str, **changes) -> dict:
        path = tmp_path / name
        frame = pd.DataFrame({**DEVICE_ROWS, **changes})
        frame.to_csv(path, index=False) if name.endswith(".csv") else frame.to_parquet(path)
        return {"devices": "table", "devices.file": str(path)}

    def online(name: str, rows: list) -> dict:
        return {"availability": "table", "availability.file": _intervals(tmp_path, rows, name)}

    everyone = [(0, 0, 10), (1, 0, 10), (2, 0, 10)]
    return [
        (
            {"devices": "table", "devices.file": str(tmp_path / "nowhere.parquet")},
            "devices.file = '{tmp}/nowhere.parquet': no such file",
        ),
        ({"devices": "table"}, "devices.file is not set: name a Parquet or CSV file"),
        (
            {"devices": "table", "devices.file": str(tmp_path / "devices.txt")},
            "devices.file = '{tmp}/devices.txt': the file must end in .parquet, .pq or .csv",
        ),
        (
            devices("slow.parquet", download_kbps=[100.0, 0.0, 300.0]),
            "devices.file = '{tmp}/slow.parquet': user 1 has download_kbps = 0; every speed "
            "must be positive",
        ),
        (
            devices("negative.csv", compute_ms_per_sample=[1.0, 2.0, -3.0]),
            "user 2 has compute_ms_per_sample = -3; every speed must be positive",
        ),
        (
            devices("unknown.parquet", user=[0, 1, 7]),
            "has rows for user 7, which the run does not have (users 0 to 2, n_users = 3)",
        ),
        (
            devices("twice.parquet", user=[0, 1, 1]),
            "has no row for user 2 (1 of the run's 3 users missing)",
        ),
        (
            devices("text.csv", upload_kbps=["fast", "20", "30"]),
            "devices.file = '{tmp}/text.csv', row 0: upload_kbps = 'fast' is not a finite number",
        ),
        (
            {**devices("columns.parquet"), "devices.file": _intervals(tmp_path, everyone)},
            "has no column compute_ms_per_sample, download_kbps, upload_kbps: it needs columns "
            "user, compute_ms_per_sample, download_kbps, upload_kbps",
        ),
        (
            online("overlap.parquet", [*everyone, (1, 5, 20)]),
            "user 1's intervals [0, 10) and [5, 20) overlap",
        ),
        (
            online("negative.parquet", [*everyone, (2, -5, -1)]),
            "user 2 has the interval [-5, -1); an interval needs 0 <= start < end <= "
            "availability.period = 86400",
        ),
        (
            online("late.parquet", [*everyone, (0, 86000, 90000)]),
            "user 0 has the interval [86000, 90000)",
        ),
        (online("empty.parquet", [*everyone, (0, 20, 20)]), "user 0 has the interval [20, 20)"),
        (online("missing.parquet", everyone[:2]), "has no row for user 2"),
        (
            {"devices.compute_sigma": -1.0},
            "devices.compute_sigma = -1.0 is out of range: a number >= 0",
        ),
        (
            {"devices.bandwidth_kbps": 0},
            "devices.bandwidth_kbps = 0.0 is out of range: a number > 0",
        ),
        ({"availability.online": 1.5}, "availability.online = 1.5 is out of range"),
        ({"availability": "weekly"}, "availability = 'weekly' is not allowed"),
    ]


def test_bad_tables_and_settings_are_refused_when_the_configuration_is_read(tmp_path):
    for values, message in _bad_tables(tmp_path):
        with pytest.raises(ConfigError) as refused:
            from_mapping({"n_users": 3, "fraction": 1.0, **values})
        assert message.format(tmp=tmp_path) in str(refused.value), values


def _refused_by_the_cli(tmp_path: Path, case: int) -> None:
    values, message = _bad_tables(tmp_path)[case]
    pairs = {**TINY_RUN, "n_users": 3, "fraction": 1.0, **values}
    line = _run(*[a for k, v in pairs.items() for a in ("--set", f"{k}={v}")], cwd=tmp_path)
    assert message.format(tmp=tmp_path) in line


def test_a_bad_table_exits_2_in_one_line_before_ray_starts(tmp_path):
    _refused_by_the_cli(tmp_path, 3)


@pytest.mark.slow
@pytest.mark.parametrize("case", [0, 5, 9, 14])
def test_more_bad_input_exits_2_in_one_line_before_ray_starts(tmp_path, case):
    _refused_by_the_cli(tmp_path, case)


# -- FedScale's traces --------------------------------------------------------------------


def _fedscale_traces(tmp_path: Path) -> tuple[Path, Path, dict]:
    """Two pickles in FedScale's formats (benchmark/dataset/data/device_info/README.md):
    capacities keyed by client id, traces keyed by anything, in the dictionary's order."""
    capacities = {
        1: {"computation": 10.0, "communication": 800.0},
        2: {"computation": 2.5, "communication": 20000.0},
        3: {"computation": np.float64(40.0), "communication": 150.0},  # NumPy values too
        4: {"computation": 1.0, "communication": 1.0},
    }
    traces = {
        "dev-a": {"duration": 1, "active": [0], "inactive": [1], "finish_time": 9, "model": "x"},
        "dev-b": {"active": [10, 50], "inactive": [20, 70], "finish_time": 100, "model": "y"},
        "dev-c": {"active": [0], "inactive": [10], "finish_time": 40, "model": "z"},
        # unsorted, one of no length, one up to the end (the next starts at 0)
        "dev-d": {"active": [90, 30, 0], "inactive": [100, 30, 5], "finish_time": 100},
    }
    paths = tmp_path / "client_device_capacity", tmp_path / "client_behave_trace"
    for path, data in zip(paths, (capacities, traces), strict=True):
        path.write_bytes(pickle.dumps(data))
    return *paths, traces


def _fedscale_online(trace: dict, t: float) -> bool:
    """FedScale's meaning of a trace: online in some [active, inactive] of the cycle."""
    cycle = t % trace["finish_time"]
    return any(a <= cycle <= b for a, b in zip(trace["active"], trace["inactive"], strict=True))


def test_fedscale_traces_become_tables_a_run_reads(tmp_path, capsys):
    device_pickle, behave_pickle, traces = _fedscale_traces(tmp_path)
    out = tmp_path / "tables"
    assert main(["convert-fedscale", str(device_pickle), str(behave_pickle), "--out", str(out),
                 "--users", "3"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "for 3 users" in printed and "1 users' traces repeat sooner" in printed
    settings = yaml.safe_load(printed.split("run them with:\n")[1])
    assert settings["availability.period"] == 100
    cfg = from_mapping({**settings, "fraction": 1.0})  # checked as a run checks them
    devices = DEVICES.load(cfg.devices)(cfg)
    # user u is FedScale's client u + 1: capacity key u + 1, a training sample 3 inferences
    for user, (compute, kbps) in enumerate([(10.0, 800.0), (2.5, 20000.0), (40.0, 150.0)]):
        assert devices.device(user) == Device(3 * compute, kbps, kbps)
        # FedScale's get_completion_time, its kbit as 1000 bits: 3 * B * steps * ms / 1000
        # + (upload + download kbit) / bandwidth
        model_kbit, batch, steps = 400.0, 20, 5
        fedscale = 3 * batch * steps * compute / 1000 + 2 * model_kbit / kbps
        ours = task_seconds(devices.device(user), model_kbit * 125, model_kbit * 125, batch * steps)
        assert ours == pytest.approx(fedscale)
    online = AVAILABILITY.load(cfg.availability)(cfg)
    keys = list(traces)
    times = np.arange(0, 100) + 0.5
    for user in range(3):
        trace = traces[keys[(user + 1) % len(keys)]]  # FedScale's client manager's pick
        ours = online.online_array(np.full(len(times), user), times)
        assert ours.tolist() == [_fedscale_online(trace, t) for t in times], user
        later = online.online_array(np.full(len(times), user), times + 300)
        assert (later == ours).all()  # the table's period: 100 s for every user
    assert online.online_until(2, 95.0) == 105.0  # [90, 100) runs into [0, 5)


def test_fedscale_traces_that_cannot_be_converted_exit_2(tmp_path, capsys):
    device_pickle, behave_pickle, _ = _fedscale_traces(tmp_path)
    convert = ["convert-fedscale", str(device_pickle), str(behave_pickle), "--out", str(tmp_path)]
    assert main([*convert, "--users", "4"]) == 2  # client 4 takes key 0, which is missing
    assert "has no entry 0 for client 4" in capsys.readouterr().err
    (tmp_path / "evil").write_bytes(pickle.dumps({1: os.getcwd}))
    assert main(["convert-fedscale", str(tmp_path / "evil"), *convert[2:]]) == 2
    assert "posix.getcwd is not plain trace data" in capsys.readouterr().err
