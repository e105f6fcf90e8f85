"""Users' devices: how fast each computes and communicates, hence how long its task takes
on the simulated clock (`devices`: equal, lognormal, table; the settings in the
`devices` section).

A task downloads the model, trains on `samples` training samples (what the method's
local work processes, :meth:`perfed_ray.algorithms.base.Algorithm.task_samples`) and
uploads the update; :func:`task_seconds` is FedScale's completion time
(fedscale/cloud/internal/client_metadata.py, ``get_completion_time``: computation plus
communication) with the two directions' bandwidths apart.

The defaults are an assumed phone, not a measurement: 5 ms per training sample is
FedScale's ``mean_seconds_per_sample`` (its ``get_completion_time_lognormal``, "adjusted
based on on-device benchmarks"), and `compute_sigma` 0.6 is that function's
``tail_skew`` (the lognormal spread it cites from Papaya and GFL); 10,000 kbit/s (10
Mbit/s, up and down) is the order of a phone's cellular link, an assumption of ours. A
per-sample time depends on the model: set `devices.compute_ms` for yours, or give
measured devices as a table (``perfed-ray convert-fedscale`` makes one from FedScale's
AI Benchmark and MobiPerf trace).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from perfed_ray.config.owners import HParams
from perfed_ray.config.schema import RunConfig
from perfed_ray.config.settings import Setting
from perfed_ray.errors import ConfigError
from perfed_ray.population import keyed, tables
from perfed_ray.seeding import Stream

COLUMNS = ("user", "compute_ms_per_sample", "download_kbps", "upload_kbps")

SETTINGS: dict[str, Setting] = {
    "compute_ms": Setting(
        5.0,
        "milliseconds a device takes per training sample (equal: every user's; "
        "lognormal: the median); FedScale's mean_seconds_per_sample",
        low=0,
        low_open=True,
    ),
    "bandwidth_kbps": Setting(
        10000.0,
        "kbit/s of a device's download and upload (equal: every user's; lognormal: the "
        "median); an assumed phone's cellular link",
        low=0,
        low_open=True,
    ),
    "compute_sigma": Setting(
        0.6,
        "lognormal: the standard deviation of log compute time (FedScale's tail_skew)",
        low=0,
    ),
    "bandwidth_sigma": Setting(0.6, "lognormal: the standard deviation of log bandwidth", low=0),
    "file": Setting(
        "",
        "table: a Parquet or CSV file with columns user, compute_ms_per_sample, "
        "download_kbps, upload_kbps, one row for each user 0 to n_users - 1 (read on the "
        "driver, relative to where the run starts)",
    ),
}


@dataclass(frozen=True)
class Device:
    """One user's device: milliseconds per training sample, download and upload kbit/s."""

    compute_ms_per_sample: float
    download_kbps: float
    upload_kbps: float


@dataclass(frozen=True)
class DeviceArray:
    """Many users' devices, one entry per user in each array (the same fields as
    :class:`Device`, so :func:`task_seconds` takes either)."""

    compute_ms_per_sample: np.ndarray
    download_kbps: np.ndarray
    upload_kbps: np.ndarray


def task_seconds(
    device: Device | DeviceArray,
    model_bytes: float | np.ndarray,
    update_bytes: float | np.ndarray,
    samples: float | np.ndarray,
) -> float | np.ndarray:
    """Seconds of one task: download `model_bytes`, train on `samples` samples, upload
    `update_bytes` (an array for a :class:`DeviceArray`)."""
    return (
        model_bytes * 8 / 1000 / device.download_kbps
        + samples * device.compute_ms_per_sample / 1000
        + update_bytes * 8 / 1000 / device.upload_kbps
    )


@dataclass(frozen=True, kw_only=True)
class DevicesHParams(HParams):
    """What a device model reads of a run: the `devices` section, the seed its draws
    are keyed by and the users it answers for."""

    key: ClassVar[str] = "devices"
    seed: int
    n_users: int


class Devices:
    """The devices of a run's users: :meth:`device_array` for many users at once,
    :meth:`device` for one. The base of every device model (a model of one's own
    subclasses it, implements :meth:`everyone` and is named by dotted path); answers
    are pure functions of the run's configuration and the user. Every user's device is
    made on first use (three float64 numbers a user: 24 MB for 10^6 users) and then
    looked up, so the clock's questions about many users cost an index each."""

    settings: ClassVar[dict[str, Setting]] = SETTINGS
    HParams: ClassVar[type[DevicesHParams]] = DevicesHParams

    def __init__(self, hparams: DevicesHParams | RunConfig) -> None:
        self.hparams = self.HParams.given(hparams)
        self.section = self.hparams.section
        self._everyone: DeviceArray | None = None

    @classmethod
    def validate(cls, hparams: DevicesHParams) -> None:
        """Raise ConfigError for settings (or a table) the model cannot use, when the
        configuration is read: before Ray starts."""

    def everyone(self) -> DeviceArray:
        """The devices of users 0 to n_users - 1, in order."""
        raise NotImplementedError

    def device_array(self, users: np.ndarray) -> DeviceArray:
        """The devices of `users` (an integer array)."""
        if self._everyone is None:
            self._everyone = self.everyone()
        every = self._everyone
        return DeviceArray(
            every.compute_ms_per_sample[users], every.download_kbps[users], every.upload_kbps[users]
        )

    def device(self, user: int) -> Device:
        """One user's device: the same numbers :meth:`device_array` gives it."""
        many = self.device_array(np.array([user], dtype=np.int64))
        return Device(
            float(many.compute_ms_per_sample[0]),
            float(many.download_kbps[0]),
            float(many.upload_kbps[0]),
        )


class EqualDevices(Devices):
    """`devices: equal`: every user's device computes at `compute_ms` and communicates
    at `bandwidth_kbps` both ways. Made for the users asked about, never for everyone:
    the default costs no memory in the population."""

    def everyone(self) -> DeviceArray:
        return self.device_array(np.arange(self.hparams.n_users))

    def device_array(self, users: np.ndarray) -> DeviceArray:
        bandwidth = np.full(len(users), self.section["bandwidth_kbps"])
        return DeviceArray(np.full(len(users), self.section["compute_ms"]), bandwidth, bandwidth)


class LognormalDevices(Devices):
    """`devices: lognormal`: each user's compute time per sample and bandwidth are drawn
    once, log-normally around the medians `compute_ms` and `bandwidth_kbps` with log
    deviations `compute_sigma` and `bandwidth_sigma`, independently, from streams keyed
    by (seed, devices, user, draw); one bandwidth serves both directions, as FedScale's
    single `communication` figure does."""

    def everyone(self) -> DeviceArray:
        users = np.arange(self.hparams.n_users, dtype=np.int64)
        seed, mine = self.hparams.seed, self.section
        compute = mine["compute_ms"] * np.exp(
            mine["compute_sigma"] * keyed.normals(seed, Stream.DEVICES, users, 0)
        )
        bandwidth = mine["bandwidth_kbps"] * np.exp(
            mine["bandwidth_sigma"] * keyed.normals(seed, Stream.DEVICES, users, 1)
        )
        return DeviceArray(compute, bandwidth, bandwidth)


class TableDevices(Devices):
    """`devices: table`: each user's device from `devices.file` (columns user,
    compute_ms_per_sample, download_kbps, upload_kbps; one row for each user of the run,
    every speed positive)."""

    @classmethod
    def validate(cls, hparams: DevicesHParams) -> None:
        _table(tables.stamp("devices.file", hparams.section["file"]), hparams.n_users)

    def everyone(self) -> DeviceArray:
        return _table(tables.stamp("devices.file", self.section["file"]), self.hparams.n_users)


@functools.lru_cache(maxsize=2)
def _table(stamp: tables.Stamp, n_users: int) -> DeviceArray:
    """A devices table's rows as every user's device, in user order, checked."""
    path = stamp[0]
    columns = tables.read("devices.file", path, COLUMNS)
    users = columns["user"]
    tables.check_users("devices.file", path, users, n_users, once=True)
    for column in COLUMNS[1:]:
        values = columns[column]
        if (values <= 0).any():
            row = int(np.flatnonzero(values <= 0)[0])
            raise ConfigError(
                f"devices.file = {path!r}: user {int(users[row])} has {column} = "
                f"{values[row]:g}; every speed must be positive"
            )
    order = np.argsort(users, kind="stable")
    return DeviceArray(*(columns[c][order] for c in COLUMNS[1:]))
